package warren.interop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.DefaultConsumer;
import com.rabbitmq.client.Envelope;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.ShutdownSignalException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The interoperability suite through the RabbitMQ Java client (issue 12): what a Java application
 * does and relies on, against WARREN_TEST_URI (RabbitMQ 3.10 or warren; scripts/interop.sh sets
 * it). Each test passes on both brokers.
 */
class ClientTest {
  private static final long WAIT_MS = 10_000;

  private Connection conn;
  private Channel ch;

  @BeforeEach
  void connect() throws Exception {
    String uri = System.getenv("WARREN_TEST_URI");
    assertNotNull(uri, "WARREN_TEST_URI names the broker under test");
    ConnectionFactory f = new ConnectionFactory();
    f.setUri(uri);
    f.setAutomaticRecoveryEnabled(false);
    conn = f.newConnection("warren-interop-java");
    ch = conn.createChannel();
  }

  @AfterEach
  void close() throws Exception {
    if (conn.isOpen()) {
      conn.close();
    }
  }

  private static String name(String what) {
    return "java." + what + "." + UUID.randomUUID().toString().substring(0, 8);
  }

  private static void waitFor(BooleanSupplier condition, String what) throws InterruptedException {
    long deadline = System.currentTimeMillis() + WAIT_MS;
    while (!condition.getAsBoolean()) {
      if (System.currentTimeMillis() > deadline) {
        throw new AssertionError("timed out waiting for " + what);
      }
      Thread.sleep(20);
    }
  }

  private static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  @Test
  void serverPropertiesNameTheRabbitMqVersionImplemented() {
    Object version = conn.getServerProperties().get("version");
    assertTrue(version.toString().startsWith("3.10."), "version " + version);
  }

  @Test
  void aConfirmOfASinglePublishIsNotMultiple() throws Exception {
    String q = ch.queueDeclare("", false, true, true, null).getQueue();
    ch.confirmSelect();
    List<String> acks = new CopyOnWriteArrayList<>();
    ch.addConfirmListener(
        (tag, multiple) -> acks.add(tag + ":" + multiple), (tag, multiple) -> acks.add("nack"));
    ch.basicPublish("", q, null, bytes("one"));
    ch.waitForConfirmsOrDie(WAIT_MS);
    assertEquals(List.of("1:false"), acks);
    for (int i = 0; i < 100; i++) {
      ch.basicPublish("", q, null, bytes("m" + i));
    }
    ch.waitForConfirmsOrDie(WAIT_MS);
    assertFalse(acks.contains("nack"));
    assertEquals(101, ch.messageCount(q));
  }

  @Test
  void aTransactionalAckOfAnUnknownTagClosesTheChannelAtOnce() throws Exception {
    ch.txSelect();
    ch.basicAck(99, false);
    // Not held back until tx.commit: the broker closes the channel without being asked more.
    waitFor(() -> !ch.isOpen(), "the channel to be closed");
    AMQP.Channel.Close close = (AMQP.Channel.Close) ch.getCloseReason().getReason();
    assertEquals(406, close.getReplyCode());
    assertEquals("PRECONDITION_FAILED - unknown delivery tag 99", close.getReplyText());
  }

  @Test
  void recoverLeavesWhatAnOpenTransactionAcked() throws Exception {
    String q = ch.queueDeclare("", false, true, true, null).getQueue();
    Channel other = conn.createChannel();
    for (String body : List.of("m1", "m2")) {
      other.basicPublish("", q, null, bytes(body));
    }
    waitFor(() -> count(other, q) == 2, "the messages");
    ch.txSelect();
    GetResponse first = ch.basicGet(q, false);
    GetResponse second = ch.basicGet(q, false);
    assertNotNull(second);
    ch.basicAck(first.getEnvelope().getDeliveryTag(), false);
    ch.basicRecover(true);
    waitFor(() -> count(other, q) == 1, "m2 requeued");
    GetResponse again = other.basicGet(q, true);
    assertEquals("m2", new String(again.getBody(), StandardCharsets.UTF_8));
    assertTrue(again.getEnvelope().isRedeliver());
    ch.txCommit();
    assertEquals(0, count(other, q));
  }

  private static long count(Channel c, String q) {
    try {
      return c.messageCount(q);
    } catch (IOException e) {
      throw new AssertionError(e);
    }
  }

  @Test
  void aConsumerIsToldWhenItsQueueIsDeleted() throws Exception {
    String q = name("cancelled");
    ch.queueDeclare(q, false, false, false, null);
    CountDownLatch cancelled = new CountDownLatch(1);
    ch.basicConsume(
        q,
        true,
        new DefaultConsumer(ch) {
          @Override
          public void handleCancel(String consumerTag) {
            cancelled.countDown();
          }
        });
    conn.createChannel().queueDelete(q);
    assertTrue(cancelled.await(WAIT_MS, TimeUnit.MILLISECONDS), "basic.cancel received");
  }

  @Test
  void aPassiveDeclareOfAMissingQueueIs404() throws Exception {
    String q = name("missing");
    IOException e = assertThrows(IOException.class, () -> ch.queueDeclarePassive(q));
    ShutdownSignalException why = (ShutdownSignalException) e.getCause();
    AMQP.Channel.Close close = (AMQP.Channel.Close) why.getReason();
    assertEquals(404, close.getReplyCode());
    assertEquals("NOT_FOUND - no queue '" + q + "' in vhost '/'", close.getReplyText());
    assertTrue(conn.isOpen(), "a channel error leaves the connection open");
  }

  @Test
  void aChannelLimitServesEveryQueueOfAConsumer() throws Exception {
    // Freed credit goes round the channel's queues: none waits for another to drain, nor is
    // left behind once the other is empty.
    String a = ch.queueDeclare("", false, true, true, null).getQueue();
    String b = ch.queueDeclare("", false, true, true, null).getQueue();
    for (int i = 0; i < 10; i++) {
      ch.basicPublish("", a, null, bytes("a" + i));
      ch.basicPublish("", b, null, bytes("b" + i));
    }
    waitFor(() -> count(ch, a) == 10 && count(ch, b) == 10, "the messages");
    ch.basicQos(1, true);
    List<String> got = new CopyOnWriteArrayList<>();
    DefaultConsumer acking =
        new DefaultConsumer(ch) {
          @Override
          public void handleDelivery(
              String tag, Envelope env, AMQP.BasicProperties props, byte[] body)
              throws IOException {
            got.add(new String(body, StandardCharsets.UTF_8));
            getChannel().basicAck(env.getDeliveryTag(), false);
          }
        };
    ch.basicConsume(a, false, acking);
    ch.basicConsume(b, false, acking);
    // The order between the queues is RabbitMQ's random pick (test_client_compat.py holds
    // warren to its strict turn); that both queues are served through is common ground.
    waitFor(() -> got.size() == 20, "all 20 deliveries");
  }
}
