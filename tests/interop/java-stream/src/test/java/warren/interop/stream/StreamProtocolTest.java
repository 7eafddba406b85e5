package warren.interop.stream;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.stream.AuthenticationFailureException;
import com.rabbitmq.stream.ByteCapacity;
import com.rabbitmq.stream.ConfirmationStatus;
import com.rabbitmq.stream.Constants;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.NoOffsetException;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import com.rabbitmq.stream.StreamDoesNotExistException;
import com.rabbitmq.stream.StreamException;
import com.rabbitmq.stream.impl.Client;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * RabbitMQ's stream protocol through the official Java client (issue 36): what a stream
 * application does and relies on, against WARREN_TEST_STREAM_HOST/PORT. Every expectation was read
 * off RabbitMQ 3.10.8 first; warren's stream listener must pass the same tests.
 */
class StreamProtocolTest {
  private static final long WAIT_MS = 10_000;
  /**
   * How long a consumer is given to receive what it is not owed: a stream never delivers what it
   * does not hold, so a longer wait only slows the tests that expect nothing.
   */
  private static final long SETTLE_MS = 600;

  private static final String BROKER = env("WARREN_TEST_BROKER", "warren");
  private static final String HOST = env("WARREN_TEST_STREAM_HOST", "127.0.0.1");
  private static final String USER = env("WARREN_TEST_STREAM_USER", "guest");
  private static final String PASS = env("WARREN_TEST_STREAM_PASSWORD", "guest");

  private static String env(String name, String otherwise) {
    return System.getenv().getOrDefault(name, otherwise);
  }

  private int port;
  private Environment env;
  private Client client;
  private final List<String> streams = new ArrayList<>();

  @BeforeEach
  void connect() {
    String p = System.getenv("WARREN_TEST_STREAM_PORT");
    if (p == null || p.isEmpty()) {
      Assumptions.assumeFalse(
          "warren".equals(BROKER), "warren has no stream listener yet (issue 36)");
      throw new AssertionError("WARREN_TEST_STREAM_PORT names the stream listener under test");
    }
    port = Integer.parseInt(p);
    env = Environment.builder().host(HOST).port(port).username(USER).password(PASS).build();
    client = client(USER, PASS);
  }

  @AfterEach
  void close() {
    if (client != null) {
      for (String s : streams) {
        client.delete(s);
      }
      client.close();
    }
    if (env != null) {
      env.close();
    }
  }

  private Client client(String user, String password) {
    return new Client(
        new Client.ClientParameters().host(HOST).port(port).username(user).password(password));
  }

  private String stream(String what) {
    String s = "java-stream." + what + "." + UUID.randomUUID().toString().substring(0, 8);
    streams.add(s);
    return s;
  }

  private String createdStream(String what) {
    String s = stream(what);
    env.streamCreator().stream(s).create();
    return s;
  }

  private static void waitFor(String what, BooleanSupplier cond) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(WAIT_MS);
    while (!cond.getAsBoolean()) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError("timed out waiting for " + what);
      }
      Thread.sleep(10);
    }
  }

  private static byte[] utf8(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  /** Sends one message and waits for its confirm, so that it ends up in a chunk of its own. */
  private static ConfirmationStatus sendConfirmed(Producer producer, byte[] body, Long publishingId)
      throws Exception {
    CompletableFuture<ConfirmationStatus> confirmed = new CompletableFuture<>();
    var builder = producer.messageBuilder().addData(body);
    if (publishingId != null) {
      builder.publishingId(publishingId);
    }
    producer.send(builder.build(), confirmed::complete);
    return confirmed.get(WAIT_MS, TimeUnit.MILLISECONDS);
  }

  /** Publishes bodies one chunk each, every one confirmed. */
  private void publishEach(String s, String... bodies) throws Exception {
    try (Producer producer = env.producerBuilder().stream(s).build()) {
      for (String body : bodies) {
        ConfirmationStatus status = sendConfirmed(producer, utf8(body), null);
        assertTrue(status.isConfirmed(), "confirm for " + body + ": code " + status.getCode());
      }
    }
  }

  private static String[] bodies(String prefix, int from, int to) {
    String[] out = new String[to - from];
    for (int i = from; i < to; i++) {
      out[i - from] = prefix + i;
    }
    return out;
  }

  /** What a consumer got: offsets, bodies and chunk timestamps, in delivery order. */
  private static final class Received {
    final List<Long> offsets = new CopyOnWriteArrayList<>();
    final List<String> bodies = new CopyOnWriteArrayList<>();
    final List<Long> timestamps = new CopyOnWriteArrayList<>();
    final List<String> streams = new CopyOnWriteArrayList<>();
  }

  private Consumer consume(String s, OffsetSpecification spec, Received into) {
    return env.consumerBuilder()
        .stream(s)
        .offset(spec)
        .messageHandler(
            (ctx, msg) -> {
              into.offsets.add(ctx.offset());
              into.bodies.add(new String(msg.getBodyAsBinary(), StandardCharsets.UTF_8));
              into.timestamps.add(ctx.timestamp());
              into.streams.add(ctx.stream());
            })
        .build();
  }

  private static List<Long> range(long from, long to) {
    List<Long> out = new ArrayList<>();
    for (long i = from; i < to; i++) {
      out.add(i);
    }
    return out;
  }

  /** rabbitmqctl (RabbitMQ) or `warren ctl` (warren): the one place users are made. */
  private static void ctl(String... args) throws Exception {
    List<String> cmd = new ArrayList<>();
    if ("rabbitmq".equals(BROKER)) {
      cmd.addAll(List.of(System.getenv("RABBITMQ_SH"), "ctl", "1"));
    } else {
      cmd.addAll(warrenCtl());
    }
    cmd.addAll(Arrays.asList(args));
    run(cmd);
  }

  private static List<String> warrenCtl() {
    // `warren ctl` talks to the management API, not to AMQP.
    return List.of(
        System.getenv("WARREN_BIN"),
        "ctl",
        "--uri",
        env("WARREN_TEST_MANAGEMENT_URI", "http://guest:guest@127.0.0.1:15672"));
  }

  /** rabbitmq-streams (RabbitMQ) or `warren ctl` (warren, which has its commands too). */
  private static void streamsCli(String... args) throws Exception {
    List<String> cmd = new ArrayList<>();
    if ("rabbitmq".equals(BROKER)) {
      cmd.addAll(List.of(System.getenv("RABBITMQ_SH"), "tool", "1", "rabbitmq-streams"));
    } else {
      cmd.addAll(warrenCtl());
    }
    cmd.addAll(Arrays.asList(args));
    run(cmd);
  }

  private static void run(List<String> cmd) throws Exception {
    Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    if (!p.waitFor(60, TimeUnit.SECONDS)) {
      p.destroyForcibly();
      throw new IOException(cmd + " did not finish in 60 s");
    }
    if (p.exitValue() != 0 && !out.contains("already exists")) {
      throw new IOException(cmd + " exited " + p.exitValue() + ": " + out);
    }
  }

  // --- create and delete ---------------------------------------------------------------------

  @Test
  void createWithRetentionArgumentsThenDelete() {
    String s = stream("create");
    env.streamCreator()
        .stream(s)
        .maxLengthBytes(ByteCapacity.MB(10))
        .maxAge(Duration.ofHours(12))
        .maxSegmentSizeBytes(ByteCapacity.kB(500))
        .create();
    assertTrue(env.streamExists(s));
    env.deleteStream(s);
    assertFalse(env.streamExists(s));
  }

  @Test
  void createOfAnExistingStreamSaysItExistsOnlyWhenTheArgumentsMatch() {
    String s = stream("exists");
    assertTrue(client.create(s, Map.of("max-length-bytes", "1000")).isOk());
    assertEquals(
        Constants.RESPONSE_CODE_STREAM_ALREADY_EXISTS,
        client.create(s, Map.of("max-length-bytes", "1000")).getResponseCode());
    // RabbitMQ 3.10 answers a create with other arguments (or none) as AMQP 0-9-1 answers an
    // inequivalent redeclare: a precondition failure, not "already exists".
    assertEquals(
        Constants.RESPONSE_CODE_PRECONDITION_FAILED,
        client.create(s, Map.of("max-length-bytes", "2000")).getResponseCode());
    assertEquals(Constants.RESPONSE_CODE_PRECONDITION_FAILED, client.create(s).getResponseCode());
  }

  @Test
  void createWithAnUnreadableArgumentIsAPreconditionFailure() {
    for (Map<String, String> args :
        List.of(Map.of("max-age", "bogus"), Map.of("max-length-bytes", "lots"))) {
      // Not in `streams`: it is never created, and its delete would only wait on RabbitMQ.
      String s = "java-stream.bad-arg." + UUID.randomUUID().toString().substring(0, 8);
      if ("rabbitmq".equals(BROKER)) {
        // RabbitMQ 3.10's stream manager crashes on these (badarg in check_max_age, in
        // binary_to_integer) and never answers: the client times out and the connection
        // closes. warren answers PRECONDITION_FAILED instead.
        try (Client c =
            new Client(
                new Client.ClientParameters()
                    .host(HOST)
                    .port(port)
                    .username(USER)
                    .password(PASS)
                    .rpcTimeout(Duration.ofSeconds(2)))) {
          assertThrows(StreamException.class, () -> c.create(s, args), args.toString());
        }
      } else {
        assertEquals(
            Constants.RESPONSE_CODE_PRECONDITION_FAILED,
            client.create(s, args).getResponseCode(),
            args.toString());
      }
      assertFalse(env.streamExists(s), args.toString());
    }
  }

  @Test
  void deleteOfAMissingStreamSaysItDoesNotExist() {
    assertEquals(
        Constants.RESPONSE_CODE_STREAM_DOES_NOT_EXIST,
        client.delete("java-stream.never-created").getResponseCode());
    StreamException e =
        assertThrows(StreamException.class, () -> env.deleteStream("java-stream.never-created"));
    assertEquals(Constants.RESPONSE_CODE_STREAM_DOES_NOT_EXIST, e.getCode());
  }

  // --- publish and consume -------------------------------------------------------------------

  @Test
  void publishedMessagesAreConfirmedAndReadBackInOrderWithTheirOffsets() throws Exception {
    String s = createdStream("publish");
    int n = 200;
    Set<Long> confirmed = ConcurrentHashMap.newKeySet();
    try (Producer producer = env.producerBuilder().stream(s).build()) {
      for (int i = 0; i < n; i++) {
        long id = i;
        producer.send(
            producer.messageBuilder().addData(utf8("m" + i)).build(),
            status -> {
              if (status.isConfirmed()) {
                confirmed.add(id);
              }
            });
      }
      waitFor("200 confirms", () -> confirmed.size() == n);
    }
    Received got = new Received();
    try (Consumer c = consume(s, OffsetSpecification.first(), got)) {
      waitFor("200 deliveries", () -> got.offsets.size() >= n);
      Thread.sleep(SETTLE_MS);
    }
    assertEquals(range(0, n), got.offsets);
    assertEquals(List.of(bodies("m", 0, n)), got.bodies);
  }

  @Test
  void offsetFirstReadsFromTheStart() throws Exception {
    String s = createdStream("first");
    publishEach(s, bodies("m", 0, 5));
    Received got = new Received();
    try (Consumer c = consume(s, OffsetSpecification.first(), got)) {
      waitFor("5 deliveries", () -> got.offsets.size() >= 5);
    }
    assertEquals(range(0, 5), got.offsets);
  }

  @Test
  void offsetLastReadsFromTheLastChunkThenWhatFollows() throws Exception {
    String s = createdStream("last");
    publishEach(s, bodies("m", 0, 5)); // one chunk each: the last chunk holds offset 4 alone
    Received got = new Received();
    try (Consumer c = consume(s, OffsetSpecification.last(), got)) {
      waitFor("the last chunk", () -> got.offsets.size() >= 1);
      Thread.sleep(SETTLE_MS);
      assertEquals(List.of(4L), got.offsets);
      publishEach(s, "m5");
      waitFor("the next message", () -> got.offsets.size() >= 2);
    }
    assertEquals(List.of(4L, 5L), got.offsets);
    assertEquals(List.of("m4", "m5"), got.bodies);
  }

  @Test
  void offsetLastOfAnEmptyStreamWaitsForTheFirstMessage() throws Exception {
    String s = createdStream("last-empty");
    Received got = new Received();
    try (Consumer c = consume(s, OffsetSpecification.last(), got)) {
      Thread.sleep(SETTLE_MS);
      assertTrue(got.offsets.isEmpty());
      publishEach(s, "m0");
      waitFor("the first message", () -> got.offsets.size() >= 1);
    }
    assertEquals(List.of(0L), got.offsets);
  }

  @Test
  void offsetNextReadsOnlyWhatIsPublishedAfterTheSubscription() throws Exception {
    String s = createdStream("next");
    publishEach(s, bodies("m", 0, 3));
    Received got = new Received();
    try (Consumer c = consume(s, OffsetSpecification.next(), got)) {
      Thread.sleep(SETTLE_MS);
      assertTrue(got.offsets.isEmpty(), "next delivered what was there: " + got.offsets);
      publishEach(s, "m3", "m4");
      waitFor("2 new messages", () -> got.offsets.size() >= 2);
    }
    assertEquals(List.of(3L, 4L), got.offsets);
  }

  @Test
  void numericOffsetReadsFromThatOffset() throws Exception {
    String s = createdStream("offset");
    publishEach(s, bodies("m", 0, 10));
    Received got = new Received();
    try (Consumer c = consume(s, OffsetSpecification.offset(6), got)) {
      waitFor("4 deliveries", () -> got.offsets.size() >= 4);
      Thread.sleep(SETTLE_MS);
    }
    assertEquals(range(6, 10), got.offsets);
    assertEquals(List.of(bodies("m", 6, 10)), got.bodies);
  }

  @Test
  void numericOffsetInsideABatchSkipsTheChunksEarlierMessages() throws Exception {
    String s = createdStream("offset-in-chunk");
    // Ten messages sent before any confirm: fewer chunks than messages, and the client drops
    // the part of a chunk before the offset asked for, so the consumer sees exactly 3..9.
    Set<Long> confirmed = ConcurrentHashMap.newKeySet();
    try (Producer producer = env.producerBuilder().stream(s).build()) {
      for (int i = 0; i < 10; i++) {
        long id = i;
        producer.send(
            producer.messageBuilder().addData(utf8("m" + i)).build(),
            st -> confirmed.add(id));
      }
      waitFor("10 confirms", () -> confirmed.size() == 10);
    }
    Received got = new Received();
    try (Consumer c = consume(s, OffsetSpecification.offset(3), got)) {
      waitFor("7 deliveries", () -> got.offsets.size() >= 7);
      Thread.sleep(SETTLE_MS);
    }
    assertEquals(range(3, 10), got.offsets);
  }

  @Test
  void numericOffsetPastTheEndStartsAtTheEnd() throws Exception {
    String s = createdStream("offset-past-end");
    publishEach(s, bodies("m", 0, 3));
    Received got = new Received();
    try (Consumer c = consume(s, OffsetSpecification.offset(5), got)) {
      Thread.sleep(SETTLE_MS);
      assertTrue(got.offsets.isEmpty(), "delivered before offset 5 existed: " + got.offsets);
      publishEach(s, bodies("m", 3, 7));
      waitFor("offsets 5 and 6", () -> got.offsets.contains(6L));
      Thread.sleep(SETTLE_MS);
    }
    // RabbitMQ 3.10 attaches a reader asked for an offset past the end at the end (3), and
    // the client drops only the first chunk's messages before the offset it asked for: so 3
    // is dropped, 4 is delivered.
    assertEquals(range(4, 7), got.offsets);
  }

  @Test
  void timestampReadsFromTheFirstChunkWrittenAtOrAfterIt() throws Exception {
    String s = createdStream("timestamp");
    publishEach(s, bodies("a", 0, 3));
    Received before = new Received();
    try (Consumer c = consume(s, OffsetSpecification.first(), before)) {
      waitFor("3 deliveries", () -> before.offsets.size() >= 3);
    }
    long lastOfA = before.timestamps.get(2);
    // The broker stamps a chunk with its own clock when it writes it: wait until that clock has
    // surely moved past the last chunk of the first batch.
    Thread.sleep(50);
    publishEach(s, bodies("b", 3, 6));
    Received got = new Received();
    try (Consumer c = consume(s, OffsetSpecification.timestamp(lastOfA + 1), got)) {
      waitFor("3 deliveries", () -> got.offsets.size() >= 3);
      Thread.sleep(SETTLE_MS);
    }
    assertEquals(range(3, 6), got.offsets);
    assertEquals(List.of(bodies("b", 3, 6)), got.bodies);
    assertTrue(got.timestamps.get(0) > lastOfA);

    Received all = new Received();
    try (Consumer c = consume(s, OffsetSpecification.timestamp(0), all)) {
      waitFor("6 deliveries", () -> all.offsets.size() >= 6);
    }
    assertEquals(range(0, 6), all.offsets);
  }

  @Test
  void timestampInTheFutureReadsOnlyNewMessages() throws Exception {
    String s = createdStream("timestamp-future");
    publishEach(s, bodies("m", 0, 3));
    Received got = new Received();
    long tomorrow = System.currentTimeMillis() + 86_400_000L;
    try (Consumer c = consume(s, OffsetSpecification.timestamp(tomorrow), got)) {
      Thread.sleep(SETTLE_MS);
      assertTrue(got.offsets.isEmpty(), "delivered old messages: " + got.offsets);
      publishEach(s, "m3");
      waitFor("the new message", () -> got.offsets.size() >= 1);
    }
    assertEquals(List.of(3L), got.offsets);
  }

  // --- retention -----------------------------------------------------------------------------

  @Test
  void maxLengthBytesDropsTheOldestSegmentsAndKeepsTheLast() throws Exception {
    String s = stream("retention");
    env.streamCreator()
        .stream(s)
        .maxSegmentSizeBytes(ByteCapacity.B(2_000))
        .maxLengthBytes(ByteCapacity.B(6_000))
        .create();
    int n = 100;
    String pad = "x".repeat(200);
    publishEach(s, bodies(pad, 0, n));
    // Retention runs when a segment is closed, in the background: wait until a reader from
    // `first` no longer starts at offset 0.
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(WAIT_MS);
    Received got;
    while (true) {
      got = new Received();
      Received r = got;
      try (Consumer c = consume(s, OffsetSpecification.first(), r)) {
        waitFor("the last message", () -> r.offsets.contains((long) n - 1));
      }
      if (got.offsets.get(0) > 0 || System.nanoTime() > deadline) {
        break;
      }
      Thread.sleep(100);
    }
    long firstKept = got.offsets.get(0);
    assertTrue(firstKept > 0, "no segment was removed");
    assertEquals(range(firstKept, n), got.offsets, "what is kept is one contiguous tail");
    // 6000 bytes kept at most, a message takes about 240 bytes on disk: well under 100 remain,
    // and retention never removes the segment being written.
    assertTrue(n - firstKept < 60, "kept " + (n - firstKept) + " messages");
    assertTrue(n - firstKept >= 1);
    Received later = new Received();
    try (Consumer c = consume(s, OffsetSpecification.offset(0), later)) {
      waitFor("the last message", () -> later.offsets.contains((long) n - 1));
    }
    assertTrue(later.offsets.get(0) >= firstKept, "offset 0 reads from the oldest kept chunk");
  }

  @Test
  void maxAgeDropsSegmentsOlderThanItWhenANewSegmentStarts() throws Exception {
    String s = stream("max-age");
    env.streamCreator()
        .stream(s)
        .maxSegmentSizeBytes(ByteCapacity.B(2_000))
        .maxAge(Duration.ofSeconds(1))
        .create();
    String pad = "x".repeat(200);
    publishEach(s, bodies(pad, 0, 20));
    Thread.sleep(1_500);
    // Retention is evaluated when a segment closes: these fill and close the segments that
    // hold nothing older than a second, and the old ones go.
    publishEach(s, bodies(pad, 20, 40));
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(WAIT_MS);
    long firstKept;
    while (true) {
      Received r = new Received();
      try (Consumer c = consume(s, OffsetSpecification.first(), r)) {
        waitFor("the last message", () -> r.offsets.contains(39L));
      }
      firstKept = r.offsets.get(0);
      assertEquals(range(firstKept, 40), r.offsets);
      if (firstKept > 0 || System.nanoTime() > deadline) {
        break;
      }
      Thread.sleep(100);
    }
    assertTrue(firstKept > 0, "no segment older than max-age was removed");
  }

  // --- deduplication -------------------------------------------------------------------------

  @Test
  void namedProducerResendsAreConfirmedButStoredOnce() throws Exception {
    String s = createdStream("dedup");
    try (Producer p = env.producerBuilder().stream(s).name("dedup-producer").build()) {
      // RabbitMQ 3.10 answers 0 for a producer name it never saw (not -1), so a client cannot
      // tell "never published" from "published id 0": ids should start at 1.
      assertEquals(0, p.getLastPublishingId());
      for (long id = 0; id < 10; id++) {
        assertTrue(sendConfirmed(p, utf8("m" + id), id).isConfirmed());
      }
      assertEquals(9, p.getLastPublishingId());
    }
    assertEquals(9, client.queryPublisherSequence("dedup-producer", s));
    try (Producer p = env.producerBuilder().stream(s).name("dedup-producer").build()) {
      assertEquals(9, p.getLastPublishingId());
      for (long id = 5; id < 15; id++) {
        ConfirmationStatus st = sendConfirmed(p, utf8("again" + id), id);
        assertTrue(st.isConfirmed(), "resent id " + id + " confirmed, code " + st.getCode());
      }
      assertEquals(14, p.getLastPublishingId());
    }
    Received got = new Received();
    try (Consumer c = consume(s, OffsetSpecification.first(), got)) {
      waitFor("15 deliveries", () -> got.offsets.size() >= 15);
      Thread.sleep(SETTLE_MS);
    }
    List<String> expected = new ArrayList<>(List.of(bodies("m", 0, 10)));
    expected.addAll(List.of(bodies("again", 10, 15)));
    assertEquals(expected, got.bodies);
  }

  @Test
  void publisherSequenceOfAnUnknownProducerIsZero() {
    String s = createdStream("dedup-unknown");
    assertEquals(0, client.queryPublisherSequence("nobody", s));
  }

  // --- server-side offset tracking -----------------------------------------------------------

  @Test
  void storedOffsetIsReturnedByQueryOffset() throws Exception {
    String s = createdStream("tracking");
    publishEach(s, bodies("m", 0, 10));
    assertEquals(
        Constants.RESPONSE_CODE_NO_OFFSET, client.queryOffset("app", s).getResponseCode());
    client.storeOffset("app", s, 7);
    waitFor("offset 7 stored", () -> client.queryOffset("app", s).getOffset() == 7);
    assertTrue(client.queryOffset("app", s).isOk());
    client.storeOffset("app", s, 3);
    waitFor("offset 3 stored", () -> client.queryOffset("app", s).getOffset() == 3);
  }

  @Test
  void namedConsumerStoresAndResumesFromItsOffset() throws Exception {
    String s = createdStream("tracking-consumer");
    publishEach(s, bodies("m", 0, 10));
    Received got = new Received();
    Consumer c =
        env.consumerBuilder()
            .stream(s)
            .name("reader")
            .offset(OffsetSpecification.first())
            .manualTrackingStrategy()
            .builder()
            .messageHandler(
                (ctx, msg) -> {
                  got.offsets.add(ctx.offset());
                  if (ctx.offset() == 4) {
                    ctx.storeOffset();
                  }
                })
            .build();
    waitFor("10 deliveries", () -> got.offsets.size() >= 10);
    waitFor("offset 4 stored", () -> c.storedOffset() == 4);
    c.close();
    // A client resumes from the stored offset + 1, as the client's documentation tells.
    long resumeAt = client.queryOffset("reader", s).getOffset() + 1;
    Received again = new Received();
    try (Consumer c2 = consume(s, OffsetSpecification.offset(resumeAt), again)) {
      waitFor("5 deliveries", () -> again.offsets.size() >= 5);
    }
    assertEquals(range(5, 10), again.offsets);
  }

  @Test
  void storedOffsetOfANamedConsumerWithNoneSaysNoOffset() {
    String s = createdStream("tracking-none");
    try (Consumer c =
        env.consumerBuilder()
            .stream(s)
            .name("nothing-stored")
            .manualTrackingStrategy()
            .builder()
            .messageHandler((ctx, msg) -> {})
            .build()) {
      assertThrows(NoOffsetException.class, c::storedOffset);
    }
  }

  @Test
  void queryOffsetOfAMissingStreamSaysItDoesNotExist() {
    assertEquals(
        Constants.RESPONSE_CODE_STREAM_DOES_NOT_EXIST,
        client.queryOffset("app", "java-stream.never-created").getResponseCode());
  }

  // --- super streams -------------------------------------------------------------------------

  @Test
  void superStreamRoutesByKeyAndIsConsumedAcrossAllPartitions() throws Exception {
    String name = "java-super." + UUID.randomUUID().toString().substring(0, 8);
    streamsCli("add_super_stream", name, "--partitions", "3");
    try {
      List<String> partitions = List.of(name + "-0", name + "-1", name + "-2");
      assertEquals(partitions, client.partitions(name));
      assertEquals(List.of(name + "-1"), client.route("1", name));
      assertEquals(List.of(), client.route("no-such-key", name));

      // Routing by key: a message's routing key picks the partition bound with that key.
      Map<String, String> partitionOf = new ConcurrentHashMap<>();
      Received got = new Received();
      Consumer consumer =
          env.consumerBuilder()
              .superStream(name)
              .offset(OffsetSpecification.first())
              .messageHandler(
                  (ctx, msg) -> {
                    String body = new String(msg.getBodyAsBinary(), StandardCharsets.UTF_8);
                    got.bodies.add(body);
                    partitionOf.put(body, ctx.stream());
                  })
              .build();
      int n = 30;
      Set<Long> confirmed = ConcurrentHashMap.newKeySet();
      try (Producer p =
          env.producerBuilder()
              .superStream(name)
              .routing(msg -> msg.getApplicationProperties().get("key").toString())
              .key()
              .producerBuilder()
              .build()) {
        for (int i = 0; i < n; i++) {
          long id = i;
          p.send(
              p.messageBuilder()
                  .applicationProperties()
                  .entry("key", String.valueOf(i % 3))
                  .messageBuilder()
                  .addData(utf8("k" + (i % 3) + "-" + i))
                  .build(),
              st -> {
                if (st.isConfirmed()) {
                  confirmed.add(id);
                }
              });
        }
        waitFor("30 confirms", () -> confirmed.size() == n);
      }
      waitFor("30 deliveries across the partitions", () -> got.bodies.size() >= n);
      consumer.close();
      assertEquals(n, new HashSet<>(got.bodies).size());
      for (int i = 0; i < n; i++) {
        String body = "k" + (i % 3) + "-" + i;
        assertEquals(name + "-" + (i % 3), partitionOf.get(body), body);
      }

      // Routing by hash: the same key always lands on the same partition, and a consumer of
      // the super stream sees every message once.
      Received hashed = new Received();
      Consumer hc =
          env.consumerBuilder()
              .superStream(name)
              .offset(OffsetSpecification.next())
              .messageHandler(
                  (ctx, msg) -> {
                    hashed.bodies.add(new String(msg.getBodyAsBinary(), StandardCharsets.UTF_8));
                    hashed.streams.add(ctx.stream());
                  })
              .build();
      Set<Long> hashConfirmed = ConcurrentHashMap.newKeySet();
      try (Producer p =
          env.producerBuilder()
              .superStream(name)
              .routing(msg -> msg.getProperties().getMessageIdAsString())
              .producerBuilder()
              .build()) {
        for (int i = 0; i < 20; i++) {
          long id = i;
          p.send(
              p.messageBuilder()
                  .properties()
                  .messageId("id-" + (i % 4))
                  .messageBuilder()
                  .addData(utf8("id-" + (i % 4) + "/" + i))
                  .build(),
              st -> {
                if (st.isConfirmed()) {
                  hashConfirmed.add(id);
                }
              });
        }
        waitFor("20 confirms", () -> hashConfirmed.size() == 20);
      }
      waitFor("20 hashed deliveries", () -> hashed.bodies.size() >= 20);
      hc.close();
      Map<String, Set<String>> partitionsOfKey = new HashMap<>();
      for (int i = 0; i < hashed.bodies.size(); i++) {
        String key = hashed.bodies.get(i).split("/")[0];
        partitionsOfKey.computeIfAbsent(key, k -> new HashSet<>()).add(hashed.streams.get(i));
      }
      assertEquals(4, partitionsOfKey.size());
      partitionsOfKey.forEach((k, ps) -> assertEquals(1, ps.size(), k + " went to " + ps));
    } finally {
      streamsCli("delete_super_stream", name);
    }
    assertFalse(env.streamExists(name + "-0"));
  }

  @Test
  void partitionsAndRouteOfAMissingSuperStreamAreEmpty() {
    // RabbitMQ 3.10 answers STREAM_DOES_NOT_EXIST, which the client turns into no partitions.
    assertEquals(List.of(), client.partitions("java-super.never-created"));
    assertEquals(List.of(), client.route("k", "java-super.never-created"));
  }

  // --- single active consumer ----------------------------------------------------------------

  @Test
  void singleActiveConsumerHandsOverWhenTheActiveOneCloses() throws Exception {
    // RabbitMQ 3.10 does not have it (3.11 does): with the single-active-consumer property both
    // consumers of the group wait for a consumer update that never comes and get nothing.
    Assumptions.assumeFalse(
        "rabbitmq".equals(BROKER),
        "RabbitMQ 3.10 has no single active consumer on streams (3.11 does)");
    String s = createdStream("sac");
    Received[] got = {new Received(), new Received()};
    Consumer[] consumers = new Consumer[2];
    for (int i = 0; i < 2; i++) {
      Received into = got[i];
      consumers[i] =
          env.consumerBuilder()
              .stream(s)
              .name("group")
              .singleActiveConsumer()
              .offset(OffsetSpecification.first())
              .noTrackingStrategy()
              // Without offset tracking the client's guide has the application say where an
              // activated consumer starts; the client's own default looks a stored offset up
              // on the connection whose frame thread runs this listener.
              .consumerUpdateListener(context -> OffsetSpecification.first())
              .messageHandler((ctx, msg) -> into.offsets.add(ctx.offset()))
              .build();
    }
    publishEach(s, bodies("m", 0, 5));
    waitFor(
        "5 deliveries to one consumer",
        () -> got[0].offsets.size() + got[1].offsets.size() >= 5);
    Thread.sleep(SETTLE_MS);
    int active = got[0].offsets.isEmpty() ? 1 : 0;
    int standby = 1 - active;
    assertEquals(range(0, 5), got[active].offsets);
    assertTrue(got[standby].offsets.isEmpty(), "the inactive consumer got " + got[standby].offsets);
    consumers[active].close();
    publishEach(s, bodies("m", 5, 10));
    // The new active consumer starts where its offset specification says (first: no offset
    // was stored), so it reads the whole stream.
    waitFor("the other consumer takes over", () -> got[standby].offsets.contains(9L));
    consumers[standby].close();
    assertEquals(range(0, 10), got[standby].offsets);
  }

  // --- metadata ------------------------------------------------------------------------------

  @Test
  void metadataOfAStreamNamesItsLeaderOnTheAdvertisedPort() {
    String s = createdStream("metadata");
    Client.StreamMetadata m = client.metadata(s).get(s);
    assertTrue(m.isResponseOk());
    assertEquals(port, m.getLeader().getPort());
    assertEquals(List.of(), m.getReplicas());
  }

  @Test
  void metadataOfAMissingStreamSaysItDoesNotExist() {
    String missing = "java-stream.never-created";
    Map<String, Client.StreamMetadata> all = client.metadata(missing);
    Client.StreamMetadata m = all.get(missing);
    assertNotNull(m);
    assertEquals(Constants.RESPONSE_CODE_STREAM_DOES_NOT_EXIST, m.getResponseCode());
    assertNull(m.getLeader());
    assertTrue(m.getReplicas().isEmpty());
  }

  // --- the protocol's own commands, through the client's low-level API ---------------------

  @Test
  void aReaderAskedForAnOffsetPastTheEndGetsChunksFromTheEnd() throws Exception {
    String s = createdStream("raw-past-end");
    publishEach(s, bodies("m", 0, 3));
    List<Long> chunkOffsets = new CopyOnWriteArrayList<>();
    try (Client raw =
        new Client(
            new Client.ClientParameters()
                .host(HOST)
                .port(port)
                .username(USER)
                .password(PASS)
                .chunkListener(
                    (c, subscriptionId, offset, messageCount, dataSize) -> {
                      chunkOffsets.add(offset);
                      c.credit(subscriptionId, 1);
                      return null;
                    }))) {
      assertTrue(raw.subscribe((byte) 0, s, OffsetSpecification.offset(5), 10).isOk());
      Thread.sleep(SETTLE_MS);
      assertTrue(chunkOffsets.isEmpty(), "chunks before any was written: " + chunkOffsets);
      publishEach(s, bodies("m", 3, 7));
      waitFor("4 chunks", () -> chunkOffsets.size() >= 4);
    }
    // Not 5: RabbitMQ 3.10 attaches the reader at the end of the stream as it was.
    assertEquals(List.of(3L, 4L, 5L, 6L), chunkOffsets);
  }

  @Test
  void aReaderAskedForAnOffsetInsideAChunkGetsTheWholeChunk() throws Exception {
    String s = createdStream("raw-in-chunk");
    try (Producer producer = env.producerBuilder().stream(s).build()) {
      // Sent before any confirm: the client batches them, and the broker writes one chunk per
      // batch it is handed.
      Set<Long> confirmed = ConcurrentHashMap.newKeySet();
      for (int i = 0; i < 10; i++) {
        long id = i;
        producer.send(
            producer.messageBuilder().addData(utf8("m" + i)).build(), st -> confirmed.add(id));
      }
      waitFor("10 confirms", () -> confirmed.size() == 10);
    }
    List<long[]> chunks = new CopyOnWriteArrayList<>();
    try (Client raw =
        new Client(
            new Client.ClientParameters()
                .host(HOST)
                .port(port)
                .username(USER)
                .password(PASS)
                .chunkListener(
                    (c, subscriptionId, offset, messageCount, dataSize) -> {
                      chunks.add(new long[] {offset, messageCount});
                      c.credit(subscriptionId, 1);
                      return null;
                    }))) {
      assertTrue(raw.subscribe((byte) 0, s, OffsetSpecification.offset(7), 10).isOk());
      waitFor("the chunk holding offset 9", () -> chunks.stream().anyMatch(c -> c[0] + c[1] == 10));
    }
    long[] first = chunks.get(0);
    assertTrue(first[0] <= 7 && 7 < first[0] + first[1], "first chunk " + Arrays.toString(first));
  }

  @Test
  void publishingThroughAnUndeclaredPublisherIsAPublishError() throws Exception {
    String s = createdStream("raw-publish");
    List<Short> errors = new CopyOnWriteArrayList<>();
    try (Client raw =
        new Client(
            new Client.ClientParameters()
                .host(HOST)
                .port(port)
                .username(USER)
                .password(PASS)
                .publishErrorListener((publisherId, publishingId, code) -> errors.add(code)))) {
      raw.publish((byte) 7, List.of(raw.messageBuilder().addData(utf8("lost")).build()));
      waitFor("a publish error", () -> !errors.isEmpty());
      assertEquals(List.of(Constants.RESPONSE_CODE_PUBLISHER_DOES_NOT_EXIST), errors);
      assertEquals(
          Constants.RESPONSE_CODE_PUBLISHER_DOES_NOT_EXIST,
          raw.deletePublisher((byte) 7).getResponseCode());
      assertTrue(raw.declarePublisher((byte) 1, null, s).isOk());
      assertTrue(raw.deletePublisher((byte) 1).isOk());
    }
  }

  @Test
  void subscriptionIdsAreOneSubscriptionEach() {
    String s = createdStream("raw-subscribe");
    assertTrue(client.subscribe((byte) 3, s, OffsetSpecification.first(), 1).isOk());
    assertEquals(
        Constants.RESPONSE_CODE_SUBSCRIPTION_ID_ALREADY_EXISTS,
        client.subscribe((byte) 3, s, OffsetSpecification.first(), 1).getResponseCode());
    assertTrue(client.unsubscribe((byte) 3).isOk());
    assertEquals(
        Constants.RESPONSE_CODE_SUBSCRIPTION_ID_DOES_NOT_EXIST,
        client.unsubscribe((byte) 3).getResponseCode());
  }

  // --- errors --------------------------------------------------------------------------------

  @Test
  void producerAndConsumerOfAMissingStreamAreRefused() {
    String missing = "java-stream.never-created";
    assertThrows(
        StreamDoesNotExistException.class, () -> env.producerBuilder().stream(missing).build());
    assertThrows(
        StreamDoesNotExistException.class,
        () -> env.consumerBuilder().stream(missing).messageHandler((c, m) -> {}).build());
    assertEquals(
        Constants.RESPONSE_CODE_STREAM_DOES_NOT_EXIST,
        client.declarePublisher((byte) 1, null, missing).getResponseCode());
    assertEquals(
        Constants.RESPONSE_CODE_STREAM_DOES_NOT_EXIST,
        client.subscribe((byte) 1, missing, OffsetSpecification.first(), 10).getResponseCode());
  }

  @Test
  void wrongPasswordIsAnAuthenticationFailure() {
    assertThrows(AuthenticationFailureException.class, () -> client(USER, "not-the-password"));
  }

  @Test
  void userWithoutPermissionsIsRefused() throws Exception {
    String user = "java-stream-noperm";
    ctl("add_user", user, "pw");
    ctl("set_permissions", "-p", "/", user, "^$", "^$", "^$");
    String s = createdStream("perm");
    try (Client limited = client(user, "pw")) {
      assertEquals(
          Constants.RESPONSE_CODE_ACCESS_REFUSED,
          limited.create(stream("perm-create")).getResponseCode());
      assertEquals(Constants.RESPONSE_CODE_ACCESS_REFUSED, limited.delete(s).getResponseCode());
      assertEquals(
          Constants.RESPONSE_CODE_ACCESS_REFUSED,
          limited.declarePublisher((byte) 1, null, s).getResponseCode());
      assertEquals(
          Constants.RESPONSE_CODE_ACCESS_REFUSED,
          limited.subscribe((byte) 1, s, OffsetSpecification.first(), 10).getResponseCode());
    }
    assertTrue(env.streamExists(s));
  }

  @Test
  void userWithoutAccessToTheVhostCannotOpenIt() throws Exception {
    String user = "java-stream-novhost";
    ctl("add_user", user, "pw");
    StreamException e = assertThrows(StreamException.class, () -> client(user, "pw"));
    assertTrue(
        e.getMessage().contains(String.valueOf(Constants.RESPONSE_CODE_VIRTUAL_HOST_ACCESS_FAILURE))
            || e.getMessage().toLowerCase().contains("virtual host"),
        e.getMessage());
  }
}
