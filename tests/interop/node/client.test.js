// The interoperability suite through Node's amqplib (issue 12): what an amqplib application does
// and relies on, against WARREN_TEST_URI (RabbitMQ 3.10 or warren; scripts/interop.sh sets it).
// Each test passes on both brokers.
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const amqp = require('amqplib');

const URI = process.env.WARREN_TEST_URI;
if (!URI) {
  throw new Error('WARREN_TEST_URI names the broker under test (scripts/interop.sh sets it)');
}
const WAIT_MS = 10_000;

function queueName(t) {
  return `node.${t.name.replace(/\W+/g, '-').slice(0, 60)}.${crypto.randomUUID().slice(0, 8)}`;
}

/** Resolves with what `f` returns once it is truthy; rejects after WAIT_MS. */
async function waitFor(f, what) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function withConnection(f) {
  const conn = await amqp.connect(URI);
  try {
    return await f(conn);
  } finally {
    await conn.close().catch(() => {});
  }
}

test('server properties name the RabbitMQ version implemented', async () => {
  await withConnection(async (conn) => {
    const props = conn.connection.serverProperties;
    assert.match(String(props.version), /^3\.10\./);
    assert.equal(props.capabilities.consumer_cancel_notify, true);
    assert.equal(props.capabilities.publisher_confirms, true);
  });
});

test('publishing without waiting, then closing, completes the close', async (t) => {
  // The report: ~2,000 publishes still buffered when the application closes. amqplib
  // sends connection.close ahead of them, so the broker must read (and drop) what still comes
  // until the client has its close-ok, instead of resetting the socket under it (EPIPE, and a
  // close that never completes). What the broker took of them is not promised: no confirms.
  const q = queueName(t);
  const conn = await amqp.connect(URI);
  const errors = [];
  conn.on('error', (e) => errors.push(e));
  const ch = await conn.createChannel();
  await ch.assertQueue(q, { durable: false });
  const body = Buffer.alloc(1024, 'x');
  for (let i = 0; i < 2000; i++) ch.sendToQueue(q, body);
  await conn.close();
  assert.deepEqual(errors, []);
  await withConnection(async (c) => {
    const check = await c.createChannel();
    assert.ok((await check.checkQueue(q)).messageCount <= 2000);
    await check.deleteQueue(q);
  });
});

test('publisher confirms arrive for every message, one by one for a single publish', async (t) => {
  await withConnection(async (conn) => {
    const ch = await conn.createConfirmChannel();
    const q = queueName(t);
    await ch.assertQueue(q, { exclusive: true });
    const acks = [];
    ch.on('ack', (f) => acks.push([f.deliveryTag, f.multiple]));
    await new Promise((resolve, reject) =>
      ch.sendToQueue(q, Buffer.from('one'), {}, (err) => (err ? reject(err) : resolve())),
    );
    assert.deepEqual(acks, [[1, false]]);
    for (let i = 0; i < 100; i++) ch.sendToQueue(q, Buffer.from(`m${i}`));
    await ch.waitForConfirms();
    const confirmedUpTo = Math.max(...acks.map(([tag]) => tag));
    assert.equal(confirmedUpTo, 101);
    assert.equal((await ch.checkQueue(q)).messageCount, 101);
  });
});

test('a consumer whose queue is deleted is cancelled with a null message', async (t) => {
  // amqplib announces consumer_cancel_notify, so both brokers send basic.cancel.
  await withConnection(async (conn) => {
    const ch = await conn.createChannel();
    const q = queueName(t);
    await ch.assertQueue(q, { durable: false });
    const got = [];
    await ch.consume(q, (msg) => got.push(msg));
    ch.sendToQueue(q, Buffer.from('before'));
    await waitFor(() => got.length === 1, 'the delivery');
    const other = await conn.createChannel();
    await other.deleteQueue(q);
    await waitFor(() => got.length === 2, 'the cancel');
    assert.equal(got[0].content.toString(), 'before');
    assert.equal(got[1], null);
  });
});

test('a nacked message is dead-lettered with x-death', async (t) => {
  await withConnection(async (conn) => {
    const ch = await conn.createChannel();
    const q = queueName(t);
    const dlq = `${q}.dead`;
    await ch.assertQueue(dlq, { exclusive: true });
    await ch.assertQueue(q, {
      exclusive: true,
      deadLetterExchange: '',
      deadLetterRoutingKey: dlq,
    });
    ch.sendToQueue(q, Buffer.from('bad'), { headers: { origin: 'node' } });
    const msg = await waitFor(() => ch.get(q, { noAck: false }), 'the message');
    ch.nack(msg, false, false);
    const dead = await waitFor(() => ch.get(dlq, { noAck: true }), 'the dead letter');
    const [death] = dead.properties.headers['x-death'];
    assert.equal(death.reason, 'rejected');
    assert.equal(death.queue, q);
    assert.equal(death.count, 1);
    assert.equal(dead.properties.headers.origin, 'node');
    assert.equal(dead.properties.headers['x-first-death-reason'], 'rejected');
  });
});

test('a passive declare of a missing queue closes the channel with 404, not the connection', async (t) => {
  await withConnection(async (conn) => {
    const ch = await conn.createChannel();
    ch.on('error', () => {});
    await assert.rejects(ch.checkQueue(queueName(t)), (err) => err.code === 404);
    const ch2 = await conn.createChannel();
    const ok = await ch2.assertQueue('', { exclusive: true });
    assert.match(ok.queue, /^amq\.gen-/);
  });
});

test('a channel-wide prefetch holds back a no-ack consumer once ack-mode ones used it up', async (t) => {
  await withConnection(async (conn) => {
    const ch = await conn.createChannel();
    const acked = `${queueName(t)}.acked`;
    const free = `${acked}.free`;
    await ch.assertQueue(acked, { exclusive: true });
    await ch.assertQueue(free, { exclusive: true });
    await ch.prefetch(1, true);
    const got = [];
    await ch.consume(acked, (m) => got.push(m));
    await ch.consume(free, (m) => got.push(m), { noAck: true });
    ch.sendToQueue(acked, Buffer.from('a1'));
    await waitFor(() => got.length === 1, 'the first delivery');
    ch.sendToQueue(free, Buffer.from('n1'));
    const held = await waitFor(async () => (await ch.checkQueue(free)).messageCount === 1, 'n1 held');
    assert.ok(held);
    assert.equal(got.length, 1);
    ch.ack(got[0]);
    await waitFor(() => got.length === 2, 'n1 once the credit is free');
    assert.equal(got[1].content.toString(), 'n1');
  });
});
