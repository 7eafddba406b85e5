package warren.interop.stream;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.DefaultConsumer;
import com.rabbitmq.client.Envelope;
import com.rabbitmq.stream.ConfirmationStatus;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.Message;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * A stream's messages are the same entries whichever protocol wrote them: what a stream client
 * publishes an AMQP 0-9-1 consumer reads (application properties as headers), and the other way
 * round. Needs the stream listener (WARREN_TEST_STREAM_PORT) and AMQP (WARREN_TEST_URI).
 */
class AmqpInteropTest {
  private static final long WAIT_MS = 10_000;
  private static final String HOST =
      System.getenv().getOrDefault("WARREN_TEST_STREAM_HOST", "127.0.0.1");

  private Environment env;
  private Connection amqp;
  private String stream;

  @BeforeEach
  void connect() throws Exception {
    String port = System.getenv("WARREN_TEST_STREAM_PORT");
    String uri = System.getenv("WARREN_TEST_URI");
    Assumptions.assumeTrue(
        port != null && !port.isEmpty() && uri != null && !uri.isEmpty(),
        "needs WARREN_TEST_STREAM_PORT and WARREN_TEST_URI");
    env = Environment.builder().host(HOST).port(Integer.parseInt(port)).build();
    ConnectionFactory cf = new ConnectionFactory();
    cf.setUri(uri);
    amqp = cf.newConnection();
    stream = "java-interop." + UUID.randomUUID().toString().substring(0, 8);
    env.streamCreator().stream(stream).create();
  }

  @AfterEach
  void close() throws Exception {
    if (env != null) {
      env.deleteStream(stream);
      env.close();
    }
    if (amqp != null) {
      amqp.close();
    }
  }

  @Test
  void anAmqpConsumerReadsWhatAStreamClientPublished() throws Exception {
    try (Producer p = env.producerBuilder().stream(stream).build()) {
      CompletableFuture<ConfirmationStatus> confirmed = new CompletableFuture<>();
      p.send(
          p.messageBuilder()
              .properties()
              .messageId("id-1")
              .contentType("text/plain")
              .messageBuilder()
              .applicationProperties()
              .entry("colour", "blue")
              .messageBuilder()
              .addData("from the stream protocol".getBytes(StandardCharsets.UTF_8))
              .build(),
          confirmed::complete);
      assertTrue(confirmed.get(WAIT_MS, TimeUnit.MILLISECONDS).isConfirmed());
    }
    Channel ch = amqp.createChannel();
    ch.basicQos(10);
    CompletableFuture<Object[]> got = new CompletableFuture<>();
    ch.basicConsume(
        stream,
        false,
        Map.of("x-stream-offset", "first"),
        new DefaultConsumer(ch) {
          @Override
          public void handleDelivery(
              String tag, Envelope envelope, AMQP.BasicProperties props, byte[] body) {
            got.complete(new Object[] {props, new String(body, StandardCharsets.UTF_8)});
          }
        });
    Object[] delivery = got.get(WAIT_MS, TimeUnit.MILLISECONDS);
    AMQP.BasicProperties props = (AMQP.BasicProperties) delivery[0];
    assertEquals("from the stream protocol", delivery[1]);
    assertEquals("id-1", props.getMessageId());
    assertEquals("text/plain", props.getContentType());
    assertEquals("blue", String.valueOf(props.getHeaders().get("colour")));
    assertEquals(0L, ((Number) props.getHeaders().get("x-stream-offset")).longValue());
    ch.close();
  }

  @Test
  void aStreamClientReadsWhatAnAmqpPublisherSent() throws Exception {
    Channel ch = amqp.createChannel();
    ch.confirmSelect();
    AMQP.BasicProperties props =
        new AMQP.BasicProperties.Builder()
            .messageId("id-2")
            .contentType("text/plain")
            .headers(Map.of("colour", "green"))
            .build();
    ch.basicPublish("", stream, props, "from AMQP 0-9-1".getBytes(StandardCharsets.UTF_8));
    ch.waitForConfirmsOrDie(WAIT_MS);
    ch.close();
    List<Message> got = new CopyOnWriteArrayList<>();
    List<Long> offsets = new CopyOnWriteArrayList<>();
    try (Consumer c =
        env.consumerBuilder()
            .stream(stream)
            .offset(OffsetSpecification.first())
            .messageHandler(
                (ctx, m) -> {
                  offsets.add(ctx.offset());
                  got.add(m);
                })
            .build()) {
      long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(WAIT_MS);
      while (got.isEmpty() && System.nanoTime() < deadline) {
        Thread.sleep(10);
      }
    }
    assertEquals(1, got.size());
    Message m = got.get(0);
    assertEquals("from AMQP 0-9-1", new String(m.getBodyAsBinary(), StandardCharsets.UTF_8));
    assertEquals("id-2", m.getProperties().getMessageIdAsString());
    assertEquals("green", String.valueOf(m.getApplicationProperties().get("colour")));
    assertEquals(List.of(0L), offsets);
  }
}
