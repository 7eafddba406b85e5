//! Routing cost against the number of bindings, and bind/unbind cost against the number of
//! bindings already there: both should stay flat (O(1)) except for headers exchanges, which
//! test every binding of the exchange, as RabbitMQ does.
//!
//! Measurement times are short so the whole run stays well under five minutes on a shared
//! 2-core machine: `cargo bench -p warren-broker --bench routing`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use amq_protocol_types::{AMQPValue, FieldTable, LongString};
use criterion::{black_box, criterion_group, BenchmarkId, Criterion};
use warren_broker::routing::{Destination, ExchangeId, ExchangeKind, QueueId, RoutingTable};

const SIZES: [u32; 3] = [1, 1_000, 100_000];
const DIRECT: ExchangeId = ExchangeId(0);
const TOPIC: ExchangeId = ExchangeId(1);
const FANOUT: ExchangeId = ExchangeId(2);
const HEADERS: ExchangeId = ExchangeId(3);
/// Holds the bindings that only make the table big, for the fanout case.
const FILLER: ExchangeId = ExchangeId(4);

/// Counts live heap bytes, to report the table's memory per binding beside its speed.
struct CountingAllocator;

static HEAP_BYTES: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HEAP_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: forwards the caller's layout unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HEAP_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn queue(i: u32) -> Destination {
    Destination::Queue(QueueId(i))
}

fn headers_args(i: u32) -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(
        "x-match".into(),
        AMQPValue::LongString(LongString::from("all")),
    );
    t.insert("tenant".into(), AMQPValue::LongInt(i as i32));
    t.insert(
        "format".into(),
        AMQPValue::LongString(LongString::from("pdf")),
    );
    t
}

/// A topic binding key among three shapes, each with a word unique to `i`, so the trie has
/// about `n` branches at the first or second level.
fn topic_key(i: u32) -> String {
    match i % 3 {
        0 => format!("stock.s{i}.*"),
        1 => format!("s{i}.#"),
        _ => format!("*.s{i}.#.eu"),
    }
}

fn table_with(kind: ExchangeKind, exchange: ExchangeId, n: u32) -> RoutingTable {
    let mut t = RoutingTable::new();
    for (id, k) in [
        (DIRECT, ExchangeKind::Direct),
        (TOPIC, ExchangeKind::Topic),
        (FANOUT, ExchangeKind::Fanout),
        (HEADERS, ExchangeKind::Headers),
        (FILLER, ExchangeKind::Direct),
    ] {
        t.declare_exchange(id, k).unwrap();
    }
    let empty = FieldTable::default();
    for i in 0..n {
        match kind {
            ExchangeKind::Direct => t.bind(exchange, queue(i), format!("k{i}").as_bytes(), &empty),
            ExchangeKind::Topic => t.bind(exchange, queue(i), topic_key(i).as_bytes(), &empty),
            ExchangeKind::Headers => t.bind(exchange, queue(i), b"", &headers_args(i)),
            ExchangeKind::Fanout if i == 0 => t.bind(exchange, queue(i), b"", &empty),
            ExchangeKind::Fanout => t.bind(FILLER, queue(i), format!("k{i}").as_bytes(), &empty),
        }
        .unwrap();
    }
    t
}

fn route(c: &mut Criterion) {
    let mut group = c.benchmark_group("route");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for n in SIZES {
        let mut out = Vec::with_capacity(16);

        let mut t = table_with(ExchangeKind::Direct, DIRECT, n);
        let key = format!("k{}", n / 2);
        group.bench_with_input(BenchmarkId::new("direct_1_match", n), &n, |b, _| {
            b.iter(|| {
                out.clear();
                t.route(DIRECT, black_box(key.as_bytes()), None, &mut out)
                    .unwrap();
                assert_eq!(out.len(), 1);
            })
        });

        let mut t = table_with(ExchangeKind::Topic, TOPIC, n);
        // Matches the bindings `s{j}.#` and `*.s{j}.#.eu` of two neighbouring ids.
        // (With one binding, `stock.s0.*`, nothing matches: the cost of a miss.)
        let j = (n / 2) / 3 * 3 + 1;
        let key = format!("s{j}.s{}.x.eu", j + 1);
        let expected = if n > j + 1 { 2 } else { 0 };
        group.bench_with_input(BenchmarkId::new("topic_wildcards", n), &n, |b, _| {
            b.iter(|| {
                out.clear();
                t.route(TOPIC, black_box(key.as_bytes()), None, &mut out)
                    .unwrap();
                assert_eq!(out.len(), expected);
            })
        });

        let mut t = table_with(ExchangeKind::Fanout, FANOUT, n);
        group.bench_with_input(BenchmarkId::new("fanout_1_destination", n), &n, |b, _| {
            b.iter(|| {
                out.clear();
                t.route(FANOUT, black_box(b"any"), None, &mut out).unwrap();
                assert_eq!(out.len(), 1);
            })
        });

        let mut t = table_with(ExchangeKind::Headers, HEADERS, n);
        let mut headers = FieldTable::default();
        headers.insert("tenant".into(), AMQPValue::LongInt((n / 2) as i32));
        headers.insert(
            "format".into(),
            AMQPValue::LongString(LongString::from("pdf")),
        );
        group.bench_with_input(BenchmarkId::new("headers_1_match", n), &n, |b, _| {
            b.iter(|| {
                out.clear();
                t.route(HEADERS, b"", black_box(Some(&headers)), &mut out)
                    .unwrap();
                assert_eq!(out.len(), 1);
            })
        });
    }

    // Cost per matching destination: a fanout exchange bound to every one of 1k queues.
    let mut t = RoutingTable::new();
    t.declare_exchange(FANOUT, ExchangeKind::Fanout).unwrap();
    for i in 0..1_000 {
        t.bind(FANOUT, queue(i), b"", &FieldTable::default())
            .unwrap();
    }
    let mut out = Vec::with_capacity(1_000);
    group.bench_function("fanout_1000_destinations", |b| {
        b.iter(|| {
            out.clear();
            t.route(FANOUT, b"", None, &mut out).unwrap();
            assert_eq!(out.len(), 1_000);
        })
    });
    group.finish();
}

/// One bind and one unbind of a fresh binding, on a table that already holds `n`.
fn bind_unbind(c: &mut Criterion) {
    let mut group = c.benchmark_group("bind_unbind");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    let empty = FieldTable::default();
    for n in [1_000, 100_000] {
        let mut t = table_with(ExchangeKind::Direct, DIRECT, n);
        let key = b"fresh-key";
        group.bench_with_input(BenchmarkId::new("direct", n), &n, |b, _| {
            b.iter(|| {
                assert!(t.bind(DIRECT, queue(n + 1), key, &empty).unwrap());
                assert!(t.unbind(DIRECT, queue(n + 1), key, &empty).unwrap().existed);
            })
        });

        let mut t = table_with(ExchangeKind::Topic, TOPIC, n);
        let key = b"fresh.*.key.#";
        group.bench_with_input(BenchmarkId::new("topic", n), &n, |b, _| {
            b.iter(|| {
                assert!(t.bind(TOPIC, queue(n + 1), key, &empty).unwrap());
                assert!(t.unbind(TOPIC, queue(n + 1), key, &empty).unwrap().existed);
            })
        });

        let mut t = table_with(ExchangeKind::Headers, HEADERS, n);
        let args = headers_args(n + 1);
        group.bench_with_input(BenchmarkId::new("headers", n), &n, |b, _| {
            b.iter(|| {
                assert!(t.bind(HEADERS, queue(n + 1), b"", &args).unwrap());
                assert!(t.unbind(HEADERS, queue(n + 1), b"", &args).unwrap().existed);
            })
        });

        // Deleting a queue with its 10 bindings, then binding them again.
        let mut t = table_with(ExchangeKind::Direct, DIRECT, n);
        group.bench_with_input(BenchmarkId::new("queue_with_10_bindings", n), &n, |b, _| {
            b.iter(|| {
                for k in 0..10u8 {
                    t.bind(DIRECT, queue(n + 1), &[b'q', k], &empty).unwrap();
                }
                t.remove_destination(queue(n + 1)).unwrap();
            })
        });
    }
    group.finish();
}

/// Heap bytes per binding (requested sizes, before allocator overhead) at 100k bindings.
fn report_memory() {
    const N: u32 = 100_000;
    for (name, kind, exchange) in [
        ("direct", ExchangeKind::Direct, DIRECT),
        ("topic", ExchangeKind::Topic, TOPIC),
        ("headers", ExchangeKind::Headers, HEADERS),
    ] {
        let before = HEAP_BYTES.load(Ordering::Relaxed);
        let t = table_with(kind, exchange, N);
        let after = HEAP_BYTES.load(Ordering::Relaxed);
        println!(
            "memory/{name}: {} bytes per binding at {N} bindings",
            (after - before) / N as usize
        );
        drop(t);
    }
}

criterion_group!(benches, route, bind_unbind);

fn main() {
    report_memory();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
