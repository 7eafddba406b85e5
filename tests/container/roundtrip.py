"""A pika round trip through warren nodes in containers, from the host: the container test's
client (scripts/container-test.sh).

    roundtrip.py USER PASS QUEUE_TYPE HOST:PORT [HOST:PORT ...]

Through each node in turn: declare QUEUE (durable, of QUEUE_TYPE), publish a persistent
message with publisher confirms, and consume it back through the next node given (the first,
for the last), so that with several nodes every node both accepts a publish and serves a
delivery. Exits 0 with one line per hop, else 1 with what went wrong.

    roundtrip.py --refused USER PASS HOST:PORT

Exits 0 when the node refuses USER's login (ACCESS_REFUSED), 1 when it lets it in.
"""
import sys
import time
import uuid

import pika

CONNECT_ATTEMPTS_MAX = 60  # once a second: a node in a container may take a while to be served


def connect(addr, user, password):
    host, port = addr.rsplit(":", 1)
    params = pika.ConnectionParameters(
        host=host, port=int(port), credentials=pika.PlainCredentials(user, password),
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=30)
    return pika.BlockingConnection(params)


def connect_eventually(addr, user, password):
    """Retries refused logins too: in a cluster the default user is imported once the
    metadata group has a leader, which may be after the AMQP port opens."""
    last = None
    for _ in range(CONNECT_ATTEMPTS_MAX):
        try:
            return connect(addr, user, password)
        except pika.exceptions.AMQPError as e:
            last = e
            time.sleep(1)
    raise SystemExit(f"roundtrip: cannot connect to {addr}: {last!r}")


def declare_eventually(ch_of, queue, queue_type):
    """A cluster's first declare may wait for its metadata leader: retried on a 541 close."""
    for _ in range(CONNECT_ATTEMPTS_MAX):
        conn, ch = ch_of()
        try:
            ch.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
            return conn, ch
        except (pika.exceptions.ConnectionClosedByBroker, pika.exceptions.ChannelClosedByBroker) as e:
            print(f"roundtrip: declare refused for now: {e}", flush=True)
            try:
                conn.close()
            except pika.exceptions.AMQPError:
                pass
            time.sleep(1)
    raise SystemExit(f"roundtrip: queue {queue} could not be declared")


def hop(publish_addr, consume_addr, user, password, queue_type):
    queue = f"container-test-{queue_type}"
    body = uuid.uuid4().hex.encode()

    def open_channel():
        conn = connect_eventually(publish_addr, user, password)
        return conn, conn.channel()

    conn, ch = declare_eventually(open_channel, queue, queue_type)
    ch.confirm_delivery()
    ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    conn.close()

    conn = connect_eventually(consume_addr, user, password)
    ch = conn.channel()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        method, _, got = ch.basic_get(queue)
        if method is not None:
            ch.basic_ack(method.delivery_tag)
            conn.close()
            if got != body:
                raise SystemExit(f"roundtrip: {queue} gave {got!r}, published {body!r}")
            print(f"roundtrip: {queue_type} queue: published via {publish_addr}, "
                  f"consumed via {consume_addr}", flush=True)
            return
        time.sleep(0.2)
    raise SystemExit(f"roundtrip: the message published via {publish_addr} never reached "
                     f"{consume_addr}")


def main(argv):
    if argv[:1] == ["--refused"]:
        user, password, addr = argv[1:4]
        try:
            connect(addr, user, password).close()
        except pika.exceptions.ProbableAuthenticationError as e:
            print(f"roundtrip: {user} refused by {addr} as expected: {e}")
            return 0
        print(f"roundtrip: {user} was let in by {addr}", file=sys.stderr)
        return 1
    user, password, queue_type, *addrs = argv
    for i, addr in enumerate(addrs):
        hop(addr, addrs[(i + 1) % len(addrs)], user, password, queue_type)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
