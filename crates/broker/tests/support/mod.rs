//! A harness that drives one [`VHost`] the way the server does (channel open, consume then
//! kick, close channels before the connection) and decodes what lands in each channel's
//! outbox into deliveries, get-oks and cancels, so tests assert on the frames a client sees.
#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use warren_broker::backlog::{MemoryBudget, Paging, PayloadSource};
use warren_broker::error::AmqpError;
use warren_broker::message::Message;
use warren_broker::outbox::Outbox;
use warren_broker::persistence::StoreOp;
use warren_broker::queue::{ChannelKey, ConnId};
use warren_broker::vhost::{DeclareOk, GetResult, PublishOutcome, VHost};
use warren_protocol::amqp::{basic, AMQPClass};
use warren_protocol::content::{ContentHeader, Properties};
use warren_protocol::frame::{self, FRAME_BODY, FRAME_HEADER, FRAME_METHOD};
use warren_protocol::method::Method;
use warren_protocol::{AMQPValue, FieldArray, FieldTable, LongString};

/// Large enough that a message body always fits in one frame in these tests.
pub const FRAME_MAX_BYTES: u32 = 131_072;

/// A message as a client receives it, by basic.deliver or basic.get-ok.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// `None` for a basic.get-ok.
    pub consumer_tag: Option<String>,
    pub delivery_tag: u64,
    pub redelivered: bool,
    pub exchange: String,
    pub routing_key: String,
    pub properties: Properties,
    pub body: Vec<u8>,
    /// The get-ok's message-count, for basic.get.
    pub message_count: Option<u32>,
}

impl Delivery {
    pub fn body_str(&self) -> &str {
        std::str::from_utf8(&self.body).expect("test bodies are utf-8")
    }

    pub fn headers(&self) -> FieldTable {
        self.properties
            .headers_table()
            .expect("well-formed headers")
            .unwrap_or_default()
    }

    pub fn header(&self, name: &str) -> Option<AMQPValue> {
        self.headers().inner().get(name).cloned()
    }
}

/// What a channel's outbox held, frame sequence by frame sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Deliver(Delivery),
    GetOk(Delivery),
    /// A server-sent basic.cancel (queue deleted, ...), by consumer tag.
    Cancel(String),
    Other(Method),
}

/// The storage engine as the vhost sees it: logs of payloads that appends fill and releases
/// empty, so a paging backlog that read back a released entry would find it missing.
#[derive(Default)]
pub struct FakeStore {
    logs: Mutex<HashMap<u64, BTreeMap<u64, Bytes>>>,
}

impl FakeStore {
    pub fn apply(&self, ops: Vec<StoreOp>) {
        let mut logs = self.logs.lock().unwrap();
        for op in ops {
            match op {
                StoreOp::Append {
                    log,
                    index,
                    payload,
                } => {
                    let l = logs.entry(log).or_default();
                    assert!(
                        l.keys().next_back().is_none_or(|last| *last < index),
                        "appends in index order"
                    );
                    l.insert(index, payload);
                }
                StoreOp::Release { log, index } => {
                    logs.entry(log).or_default().remove(&index);
                }
                StoreOp::ReleasePrefix { log, index } => {
                    let l = logs.entry(log).or_default();
                    *l = l.split_off(&(index + 1));
                }
                StoreOp::DeleteLog { log } => {
                    logs.remove(&log);
                }
            }
        }
    }

    /// Entries not released, over every log.
    pub fn live(&self) -> usize {
        self.logs.lock().unwrap().values().map(|l| l.len()).sum()
    }
}

impl PayloadSource for FakeStore {
    fn read(
        &self,
        log: u64,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Bytes)>, String> {
        let logs = self.logs.lock().unwrap();
        let mut out = Vec::new();
        let mut bytes = 0;
        for (i, p) in logs.get(&log).into_iter().flat_map(|l| l.range(from..to)) {
            if !out.is_empty() && bytes >= max_bytes {
                break;
            }
            bytes += p.len();
            out.push((*i, p.clone()));
        }
        Ok(out)
    }
}

pub struct Harness {
    pub vh: VHost,
    /// Set by [`Harness::enable_paging`]: where stored messages go and are read back from.
    pub store: Option<Arc<FakeStore>>,
    /// The clock handed to every command, in broker milliseconds.
    pub now_ms: u64,
    outboxes: HashMap<ChannelKey, (u16, Arc<Outbox>)>,
    channels_by_conn: HashMap<ConnId, Vec<ChannelKey>>,
    next_key: ChannelKey,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        Harness {
            vh: VHost::new("/"),
            store: None,
            now_ms: 1_000_000,
            outboxes: HashMap::new(),
            channels_by_conn: HashMap::new(),
            next_key: 1,
        }
    }

    /// Gives the vhost a store to page durable queues' bodies out to, with a node budget.
    pub fn enable_paging(&mut self, budget_bytes: usize) -> Arc<MemoryBudget> {
        let store = Arc::new(FakeStore::default());
        let budget = Arc::new(MemoryBudget::new(budget_bytes));
        self.vh.set_paging(Paging {
            source: store.clone(),
            budget: budget.clone(),
            unix_ms_at_epoch: 0,
        });
        self.store = Some(store);
        budget
    }

    /// What the server does after each command: hand the storage work to the store, then let
    /// queues page out.
    pub fn settle_store(&mut self) {
        if let Some(store) = &self.store {
            store.apply(self.vh.take_store_ops());
            self.vh.page_out();
        }
    }

    pub fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
    }

    pub fn tick(&mut self) {
        self.vh.tick(self.now_ms);
    }

    /// Opens a channel on connection `conn`; returns the channel's key.
    pub fn open(&mut self, conn: ConnId) -> ChannelKey {
        self.open_with_frame_max(conn, FRAME_MAX_BYTES)
    }

    /// Opens a channel whose connection negotiated `frame_max` (bodies split into frames).
    pub fn open_with_frame_max(&mut self, conn: ConnId, frame_max: u32) -> ChannelKey {
        let key = self.next_key;
        self.next_key += 1;
        let number = (key % 2000) as u16 + 1;
        let outbox = Outbox::new(frame_max, Box::new(|| {}));
        self.vh
            .channel_open(key, conn, number, outbox.clone(), "guest");
        self.outboxes.insert(key, (number, outbox));
        self.channels_by_conn.entry(conn).or_default().push(key);
        key
    }

    pub fn close(&mut self, ch: ChannelKey) {
        self.vh.channel_close(ch, self.now_ms);
        for chans in self.channels_by_conn.values_mut() {
            chans.retain(|c| *c != ch);
        }
    }

    /// Closes a connection as the server does: its channels first, then its exclusive queues.
    pub fn close_connection(&mut self, conn: ConnId) {
        for ch in self.channels_by_conn.remove(&conn).unwrap_or_default() {
            self.vh.channel_close(ch, self.now_ms);
        }
        self.vh.connection_closed(conn);
    }

    // ---- declarations ----------------------------------------------------------------------

    pub fn declare(&mut self, name: &str) -> DeclareOk {
        self.declare_with(1, name, false, FieldTable::default())
            .expect("queue declare")
    }

    pub fn declare_args(&mut self, name: &str, args: FieldTable) -> Result<DeclareOk, AmqpError> {
        self.declare_with(1, name, false, args)
    }

    pub fn declare_with(
        &mut self,
        conn: ConnId,
        name: &str,
        durable: bool,
        args: FieldTable,
    ) -> Result<DeclareOk, AmqpError> {
        self.vh
            .queue_declare(conn, name, false, durable, false, false, args, self.now_ms)
    }

    pub fn exchange(&mut self, name: &str, kind: &str) {
        self.exchange_args(name, kind, FieldTable::default());
    }

    pub fn exchange_args(&mut self, name: &str, kind: &str, args: FieldTable) {
        self.vh
            .exchange_declare(name, kind, false, false, false, false, args)
            .expect("exchange declare");
    }

    pub fn bind(&mut self, queue: &str, exchange: &str, key: &str) {
        self.bind_args(queue, exchange, key, FieldTable::default());
    }

    pub fn bind_args(&mut self, queue: &str, exchange: &str, key: &str, args: FieldTable) {
        self.vh
            .queue_bind(1, queue, exchange, key, &args)
            .expect("queue bind");
    }

    // ---- publishing ------------------------------------------------------------------------

    pub fn publish(&mut self, exchange: &str, routing_key: &str, body: &str) -> PublishOutcome {
        self.publish_props(exchange, routing_key, Properties::default(), body)
            .expect("publish")
    }

    pub fn publish_props(
        &mut self,
        exchange: &str,
        routing_key: &str,
        props: Properties,
        body: &str,
    ) -> Result<PublishOutcome, AmqpError> {
        let raw = props.encode();
        let props = Properties::decode(&raw).expect("encoded properties decode");
        let message = Message::new(
            Bytes::copy_from_slice(exchange.as_bytes()),
            Bytes::copy_from_slice(routing_key.as_bytes()),
            raw,
            &props,
            Bytes::copy_from_slice(body.as_bytes()),
        );
        self.vh.publish(0, exchange, message, &props, self.now_ms)
    }

    // ---- consuming -------------------------------------------------------------------------

    /// basic.consume followed by the dispatch the server runs after consume-ok.
    pub fn consume(&mut self, ch: ChannelKey, queue: &str, tag: &str, no_ack: bool) -> String {
        self.consume_with(ch, queue, tag, no_ack, false, FieldTable::default())
            .expect("basic.consume")
    }

    pub fn consume_with(
        &mut self,
        ch: ChannelKey,
        queue: &str,
        tag: &str,
        no_ack: bool,
        exclusive: bool,
        args: FieldTable,
    ) -> Result<String, AmqpError> {
        let tag = self
            .vh
            .basic_consume(ch, queue, tag, no_ack, exclusive, args, self.now_ms)?;
        self.vh.kick(queue, self.now_ms);
        Ok(tag)
    }

    pub fn cancel(&mut self, ch: ChannelKey, tag: &str) -> bool {
        self.vh.basic_cancel(ch, tag, self.now_ms)
    }

    pub fn qos(&mut self, ch: ChannelKey, prefetch: u16, global: bool) {
        self.vh.basic_qos(ch, prefetch, global, self.now_ms);
    }

    pub fn ack(&mut self, ch: ChannelKey, tag: u64, multiple: bool) -> Result<(), AmqpError> {
        self.vh.basic_ack(ch, tag, multiple, self.now_ms)
    }

    pub fn nack(
        &mut self,
        ch: ChannelKey,
        tag: u64,
        multiple: bool,
        requeue: bool,
    ) -> Result<(), AmqpError> {
        self.vh.basic_nack(ch, tag, multiple, requeue, self.now_ms)
    }

    pub fn recover(&mut self, ch: ChannelKey) {
        self.vh.basic_recover(ch, self.now_ms);
    }

    /// basic.get; `None` for get-empty.
    pub fn get(&mut self, ch: ChannelKey, queue: &str, no_ack: bool) -> Option<Delivery> {
        self.try_get(ch, queue, no_ack).expect("basic.get")
    }

    pub fn try_get(
        &mut self,
        ch: ChannelKey,
        queue: &str,
        no_ack: bool,
    ) -> Result<Option<Delivery>, AmqpError> {
        // Earlier frames on the channel must not be mistaken for this get's answer.
        assert!(
            self.outbox(ch).buffered_bytes() == 0,
            "take the channel's events before basic.get"
        );
        match self.vh.basic_get(ch, queue, no_ack, self.now_ms)? {
            GetResult::Empty => Ok(None),
            GetResult::Delivered => {
                let mut events = self.events(ch);
                assert_eq!(events.len(), 1, "basic.get writes exactly one get-ok");
                match events.pop() {
                    Some(Event::GetOk(d)) => Ok(Some(d)),
                    other => panic!("expected get-ok, got {other:?}"),
                }
            }
            GetResult::Relayed(_) => panic!("a local channel's get-ok goes to its outbox"),
        }
    }

    /// Gets (no-ack) everything ready in `queue`; their bodies in order.
    pub fn drain(&mut self, ch: ChannelKey, queue: &str) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(d) = self.get(ch, queue, true) {
            out.push(d.body_str().to_string());
        }
        out
    }

    // ---- what the client sees --------------------------------------------------------------

    pub fn outbox(&self, ch: ChannelKey) -> &Arc<Outbox> {
        &self.outboxes[&ch].1
    }

    /// Everything written to the channel since the last call, decoded.
    pub fn events(&mut self, ch: ChannelKey) -> Vec<Event> {
        let (number, outbox) = &self.outboxes[&ch];
        decode_events(*number, outbox.take())
    }

    pub fn deliveries(&mut self, ch: ChannelKey) -> Vec<Delivery> {
        self.events(ch)
            .into_iter()
            .map(|e| match e {
                Event::Deliver(d) => d,
                other => panic!("expected only deliveries, got {other:?}"),
            })
            .collect()
    }

    /// Bodies delivered on the channel since the last call.
    pub fn bodies(&mut self, ch: ChannelKey) -> Vec<String> {
        self.deliveries(ch)
            .iter()
            .map(|d| d.body_str().to_string())
            .collect()
    }

    pub fn ready(&self, queue: &str) -> usize {
        self.vh.queue_stats(queue).expect("queue exists").0
    }

    pub fn unacked(&self, queue: &str) -> usize {
        self.vh.queue_stats(queue).expect("queue exists").1
    }

    pub fn exists(&self, queue: &str) -> bool {
        self.vh.queue_stats(queue).is_some()
    }
}

/// Splits an outbox's bytes into frames and groups method + header + body frames.
pub fn decode_events(number: u16, mut buf: BytesMut) -> Vec<Event> {
    let mut frames = Vec::new();
    while let Some(f) = frame::decode(&mut buf, FRAME_MAX_BYTES).expect("well-formed frames") {
        assert_eq!(f.channel, number, "frame on the channel's own number");
        frames.push(f);
    }
    assert!(buf.is_empty(), "no partial frame left in the outbox");
    let mut out = Vec::new();
    let mut it = frames.into_iter();
    while let Some(f) = it.next() {
        assert_eq!(f.kind, FRAME_METHOD, "content frames follow their method");
        let method = Method::decode(f.payload).expect("decodable method");
        let mut content =
            |consumer_tag, delivery_tag, redelivered, exchange, routing_key, count| {
                let h = it.next().expect("content header follows");
                assert_eq!(h.kind, FRAME_HEADER);
                let header = ContentHeader::decode(h.payload).expect("content header");
                let mut body = Vec::new();
                while (body.len() as u64) < header.body_size {
                    let b = it.next().expect("body frame follows");
                    assert_eq!(b.kind, FRAME_BODY);
                    body.extend_from_slice(&b.payload);
                }
                assert_eq!(body.len() as u64, header.body_size);
                Delivery {
                    consumer_tag,
                    delivery_tag,
                    redelivered,
                    exchange,
                    routing_key,
                    properties: Properties::decode(&header.properties).expect("properties"),
                    body,
                    message_count: count,
                }
            };
        let text = |b: &Bytes| String::from_utf8(b.to_vec()).expect("utf-8");
        out.push(match method {
            Method::Deliver(d) => Event::Deliver(content(
                Some(text(&d.consumer_tag)),
                d.delivery_tag,
                d.redelivered,
                text(&d.exchange),
                text(&d.routing_key),
                None,
            )),
            Method::GetOk(g) => Event::GetOk(content(
                None,
                g.delivery_tag,
                g.redelivered,
                text(&g.exchange),
                text(&g.routing_key),
                Some(g.message_count),
            )),
            Method::Other(AMQPClass::Basic(basic::AMQPMethod::Cancel(c))) => {
                Event::Cancel(c.consumer_tag.as_str().to_string())
            }
            other => Event::Other(other),
        });
    }
    out
}

// ---- building values -----------------------------------------------------------------------

pub fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert((*k).into(), v.clone());
    }
    t
}

pub fn long_str(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

pub fn int(i: i64) -> AMQPValue {
    AMQPValue::LongLongInt(i)
}

pub fn array(items: &[AMQPValue]) -> AMQPValue {
    AMQPValue::FieldArray(FieldArray::from(items.to_vec()))
}

pub fn str_array(items: &[&str]) -> AMQPValue {
    array(&items.iter().map(|s| long_str(s)).collect::<Vec<_>>())
}

pub fn with_headers(headers: FieldTable) -> Properties {
    let mut p = Properties::default();
    p.set_headers_table(Some(&headers));
    p
}

pub fn with_expiration(ms: &str) -> Properties {
    Properties {
        expiration: Some(Bytes::copy_from_slice(ms.as_bytes())),
        ..Properties::default()
    }
}

pub fn with_priority(p: u8) -> Properties {
    Properties {
        priority: Some(p),
        ..Properties::default()
    }
}

/// A string-ish header value as text (long or short string).
pub fn text(v: &AMQPValue) -> String {
    match v {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_string(),
        other => panic!("not a string: {other:?}"),
    }
}

pub fn integer(v: &AMQPValue) -> i64 {
    warren_broker::args::integer(v).unwrap_or_else(|| panic!("not an integer: {v:?}"))
}

/// The x-death header's entries, newest first.
pub fn x_death(d: &Delivery) -> Vec<FieldTable> {
    match d.header("x-death") {
        Some(AMQPValue::FieldArray(a)) => a
            .as_slice()
            .iter()
            .map(|v| match v {
                AMQPValue::FieldTable(t) => t.clone(),
                other => panic!("x-death entry is not a table: {other:?}"),
            })
            .collect(),
        other => panic!("no x-death array: {other:?}"),
    }
}
