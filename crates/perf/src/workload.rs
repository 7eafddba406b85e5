//! The PerfTest workload: topology, producers, consumers, and the reporter that prints a line
//! per interval and the summary at the end.
//!
//! Every producer and consumer owns one connection and runs as one task on a single runtime.
//! A producer encodes a batch of publishes into one buffer and writes it with one syscall; a
//! consumer parses every frame a read brought in and answers with one write of acks. Message
//! bodies carry PerfTest's layout (big-endian i32 sequence, i64 timestamp), with the timestamp
//! from CLOCK_MONOTONIC in nanoseconds as Java's `System.nanoTime()` on Linux, so warren perf
//! and PerfTest on one host read each other's timestamps.
//!
//! Back-of-the-envelope cost per message (1 KiB, confirms, one consumer): encode ~1.1 KB into
//! the batch buffer (a memcpy), one clock read, 1/N of a write syscall; on the consumer side
//! one frame parse, one clock read, one histogram sample buffered locally, 1/N of a read and of
//! an ack write. No allocation per message.

use crate::cli::WorkloadArgs;
use crate::client::wire::{
    self, method, FieldValue, FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
};
use crate::client::{Connection, Uri};
use crate::procfs;
use crate::rate_limiter::RateLimiter;
use crate::stats::{Counters, LocalStats, Percentiles, SharedStats};
use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch};

/// Messages one producer batch may hold: bounds the write buffer and the time between reads.
pub const BATCH_MESSAGES_MAX: usize = 256;
/// Bytes one producer batch may hold.
pub const BATCH_BYTES_MAX: usize = 1024 * 1024;
/// How long the run waits for consumers to catch up once every producer has finished.
pub const DRAIN_IDLE: Duration = Duration::from_secs(2);
/// How long stopping tasks may take before the run gives up on them.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Nanoseconds of CLOCK_MONOTONIC: the clock Java's `System.nanoTime()` reads on Linux.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// PerfTest's default test id: `test-HHMMSS-mmm` (UTC).
pub fn default_id() -> String {
    let ms = epoch_ms();
    let day_s = (ms / 1000) % 86_400;
    format!(
        "test-{:02}{:02}{:02}-{:03}",
        day_s / 3600,
        (day_s / 60) % 60,
        day_s % 60,
        ms % 1000
    )
}

/// Writes the timestamp layout into the first 12 bytes of a body.
pub fn stamp_body(body: &mut [u8], sequence: u32, timestamp: u64) {
    body[0..4].copy_from_slice(&sequence.to_be_bytes());
    body[4..12].copy_from_slice(&timestamp.to_be_bytes());
}

/// Reads the sequence and timestamp from a body's first 12 bytes.
pub fn read_stamp(head: &[u8; 12]) -> (u32, u64) {
    let mut seq = [0u8; 4];
    seq.copy_from_slice(&head[0..4]);
    let mut ts = [0u8; 8];
    ts.copy_from_slice(&head[4..12]);
    (u32::from_be_bytes(seq), u64::from_be_bytes(ts))
}

/// One interval of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
/// Missing fields read as defaults, so files from older versions still load.
#[serde(default)]
pub struct Sample {
    /// Seconds since the producers started, at the end of the interval.
    pub time_s: f64,
    pub sent_rate: f64,
    pub confirmed_rate: f64,
    pub nacked_rate: f64,
    pub returned_rate: f64,
    pub received_rate: f64,
    pub latency_us: Percentiles,
    pub confirm_latency_us: Percentiles,
}

/// Everything a run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
/// Missing fields read as defaults, so files from older versions still load.
#[serde(default)]
pub struct RunResult {
    pub id: String,
    pub started_unix_ms: u64,
    pub duration_s: f64,
    pub producers: u32,
    pub consumers: u32,
    pub size_bytes: usize,
    pub rate_per_producer: Option<f64>,
    pub confirm: i64,
    pub totals: Counters,
    pub send_rate_avg: f64,
    pub receive_rate_avg: f64,
    pub confirm_rate_avg: f64,
    pub latency_us: Percentiles,
    pub confirm_latency_us: Percentiles,
    pub samples: Vec<Sample>,
    /// CPU this process used during the run, seconds.
    pub client_cpu_s: f64,
    /// Client CPU per message handled (sent plus received), microseconds.
    pub client_cpu_us_per_msg: f64,
    /// Seconds at the start excluded from the averages and run percentiles (--warmup-seconds);
    /// `totals` and `samples` still cover the whole run.
    pub warmup_s: f64,
    pub stop_reason: String,
    pub errors: Vec<String>,
}

impl RunResult {
    /// PerfTest's closing lines, in its own words, plus ours (p99.9, max, client CPU).
    pub fn summary_lines(&self) -> Vec<String> {
        let id = &self.id;
        let mut out = vec![
            format!(
                "id: {id}, sending rate avg: {:.0} msg/s",
                self.send_rate_avg
            ),
            format!(
                "id: {id}, receiving rate avg: {:.0} msg/s",
                self.receive_rate_avg
            ),
        ];
        if self.latency_us.count > 0 {
            out.push(format!(
                "id: {id}, consumer latency min/median/75th/95th/99th {} µs",
                self.latency_us.perftest()
            ));
        }
        if self.confirm_latency_us.count > 0 {
            out.push(format!(
                "id: {id}, confirm latency min/median/75th/95th/99th {} µs",
                self.confirm_latency_us.perftest()
            ));
        }
        if self.latency_us.count > 0 {
            out.push(format!(
                "id: {id}, consumer latency 99.9th/max {}/{} µs",
                self.latency_us.p999, self.latency_us.max
            ));
        }
        out.push(format!(
            "id: {id}, client CPU {:.2} s, {:.2} µs per message",
            self.client_cpu_s, self.client_cpu_us_per_msg
        ));
        out
    }
}

/// PerfTest's per-interval line.
pub fn interval_line(id: &str, s: &Sample, confirms: bool, mandatory: bool) -> String {
    let mut line = format!(
        "id: {id}, time {:.3} s, sent: {:.0} msg/s",
        s.time_s, s.sent_rate
    );
    if confirms {
        line.push_str(&format!(
            ", confirmed: {:.0} msg/s, nacked: {:.0} msg/s",
            s.confirmed_rate, s.nacked_rate
        ));
    }
    if mandatory {
        line.push_str(&format!(", returned: {:.0} msg/s", s.returned_rate));
    }
    line.push_str(&format!(", received: {:.0} msg/s", s.received_rate));
    if s.latency_us.count > 0 {
        line.push_str(&format!(
            ", min/median/75th/95th/99th consumer latency: {} µs",
            s.latency_us.perftest()
        ));
    }
    if confirms && s.confirm_latency_us.count > 0 {
        line.push_str(&format!(
            ", confirm latency: {} µs",
            s.confirm_latency_us.perftest()
        ));
    }
    line
}

/// How queues are laid out, as PerfTest does it.
#[derive(Debug, Clone, PartialEq)]
enum Topology {
    /// No -u and no pattern: each consumer declares its own server-named exclusive queue bound
    /// with the routing key, so every consumer gets every message.
    PerConsumer { routing_key: String },
    /// Named queues (-u, or --queue-pattern): producer i publishes to queue i mod n with the
    /// queue's routing key, consumer j consumes queue j mod n.
    Named {
        queues: Vec<String>,
        routing_keys: Vec<String>,
    },
}

fn topology(args: &WorkloadArgs, id: &str) -> Topology {
    if let Some(queues) = args.pattern_queues() {
        let routing_keys = queues.clone();
        return Topology::Named {
            queues,
            routing_keys,
        };
    }
    if let Some(q) = &args.queue {
        let rk = if args.exchange.is_empty() {
            q.clone()
        } else {
            args.routing_key.clone().unwrap_or_else(|| q.clone())
        };
        return Topology::Named {
            queues: vec![q.clone()],
            routing_keys: vec![rk],
        };
    }
    Topology::PerConsumer {
        routing_key: args
            .routing_key
            .clone()
            .unwrap_or_else(|| format!("warren-perf-{id}")),
    }
}

struct Run {
    shared: Arc<SharedStats>,
    producers_done: AtomicUsize,
    consumers_done: AtomicUsize,
}

/// PerfTest's --predeclared: whether exchange (or queue) `name` is missing and must be
/// declared. A passive declare tells; its 404 closed `channel`, so another is opened then.
async fn missing(
    setup: &mut Connection,
    channel: &mut u16,
    exchange: bool,
    name: &str,
) -> Result<bool> {
    let exists = if exchange {
        setup.exchange_exists(*channel, name).await?
    } else {
        setup.queue_exists(*channel, name).await?
    };
    if !exists {
        *channel += 1;
        setup.open_channel(*channel).await?;
    }
    Ok(!exists)
}

/// Runs the workload until -z, message limits, a task error, or `stop` turns true; each
/// interval's line goes to `print_line` (so a progress bar can print it above itself).
pub async fn run_workload(
    args: &WorkloadArgs,
    mut stop: watch::Receiver<bool>,
    print_line: Option<&dyn Fn(&str)>,
) -> Result<RunResult> {
    let id = args.id.clone().unwrap_or_else(default_id);
    let uris: Vec<Uri> = args
        .uris()
        .iter()
        .map(|u| Uri::parse(u))
        .collect::<Result<_>>()?;
    let topo = topology(args, &id);
    let persistent = args.persistent();
    let args_table = args.declare_arguments();

    {
        // As PerfTest: everything is declared, except with --predeclared what exists already
        // (a passive declare tells; its 404 closes the channel, so the next check opens
        // another). Queues are bound either way.
        let mut setup =
            Connection::open(&uris[0], args.heartbeat_s, &format!("{id}-setup")).await?;
        let mut channel = 1;
        setup.open_channel(channel).await?;
        // PerfTest declares its exchange durable; declaring it otherwise would fail once
        // PerfTest has run against the same broker.
        if !args.exchange.is_empty() && !args.exchange.starts_with("amq.") {
            let declare = !args.predeclared
                || missing(&mut setup, &mut channel, true, &args.exchange).await?;
            if declare {
                setup
                    .declare_exchange(channel, &args.exchange, &args.exchange_type, true)
                    .await?;
            }
        }
        if let Topology::Named {
            queues,
            routing_keys,
        } = &topo
        {
            for (q, rk) in queues.iter().zip(routing_keys) {
                let declare =
                    !args.predeclared || missing(&mut setup, &mut channel, false, q).await?;
                if declare {
                    setup
                        .declare_queue(channel, q, persistent, false, args.auto_delete, &args_table)
                        .await?;
                }
                if !args.exchange.is_empty() && !args.skip_binding_queues {
                    setup.bind_queue(channel, q, &args.exchange, rk).await?;
                }
            }
        }
        setup.close().await;
    }

    let run = Arc::new(Run {
        shared: Arc::new(SharedStats::default()),
        producers_done: AtomicUsize::new(0),
        consumers_done: AtomicUsize::new(0),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let (err_tx, mut err_rx) = mpsc::channel::<String>(64);
    let mut connection_index = 0usize;
    let mut next_uri = || {
        let u = uris[connection_index % uris.len()].clone();
        connection_index += 1;
        u
    };

    let mut tasks = Vec::new();
    for i in 0..args.consumers as usize {
        let uri = next_uri();
        let mut conn =
            Connection::open(&uri, args.heartbeat_s, &format!("{id}-consumer-{i}")).await?;
        conn.open_channel(1).await?;
        if args.global_qos > 0 {
            wire::basic_qos(&mut conn.wbuf, 1, args.global_qos, true);
            conn.call(1, method::BASIC_QOS_OK).await?;
        }
        if args.qos > 0 {
            conn.qos(1, args.qos).await?;
        }
        let queue = match &topo {
            Topology::Named { queues, .. } => queues[i % queues.len()].clone(),
            Topology::PerConsumer { routing_key } => {
                let (q, _) = conn
                    .declare_queue(1, "", persistent, true, true, &args_table)
                    .await?;
                if !args.exchange.is_empty() && !args.skip_binding_queues {
                    conn.bind_queue(1, &q, &args.exchange, routing_key).await?;
                }
                q
            }
        };
        conn.consume(
            1,
            &queue,
            &format!("warren-perf-{i}"),
            args.autoack,
            &args.consumer_arguments(),
        )
        .await?;
        let cfg = ConsumerCfg {
            autoack: args.autoack,
            multi_ack_every: args.multi_ack_every as u64,
            latency: Duration::from_micros(args.consumer_latency_us),
            rate: args.consumer_rate,
            limit: args.cmessages,
            use_millis: args.use_millis,
        };
        let (run, stop, err_tx) = (run.clone(), stop_rx.clone(), err_tx.clone());
        tasks.push(tokio::spawn(async move {
            let result = consumer_task(&mut conn, cfg, &run, stop).await;
            run.consumers_done.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = result {
                let _ = err_tx.send(format!("consumer {i}: {e:#}")).await;
            }
            conn.close().await;
        }));
    }

    let mut producers = Vec::new();
    for i in 0..args.producers as usize {
        let uri = next_uri();
        let mut conn =
            Connection::open(&uri, args.heartbeat_s, &format!("{id}-producer-{i}")).await?;
        conn.open_channel(1).await?;
        if args.confirm > 0 {
            conn.confirm_select(1).await?;
        }
        let routing_key = match &topo {
            Topology::Named { routing_keys, .. } => routing_keys[i % routing_keys.len()].clone(),
            Topology::PerConsumer { routing_key } => routing_key.clone(),
        };
        producers.push((
            conn,
            ProducerCfg {
                exchange: args.exchange.clone(),
                routing_key,
                mandatory: args.mandatory(),
                persistent,
                size: args.size,
                rate: args.rate,
                confirm_window: (args.confirm > 0).then_some(args.confirm as usize),
                confirm_timeout: (args.confirm_timeout_s > 0)
                    .then(|| Duration::from_secs(args.confirm_timeout_s as u64)),
                limit: args.pmessages,
                use_millis: args.use_millis,
                start_delay: if args.producer_random_start_delay_s > 0 {
                    Duration::from_millis(
                        rand::random::<u64>() % (args.producer_random_start_delay_s * 1000),
                    )
                } else {
                    Duration::ZERO
                },
            },
        ));
    }

    let cpu_before = procfs::sample(None).map(|s| s.cpu_s).unwrap_or(0.0);
    let started_unix_ms = epoch_ms();
    let start = Instant::now();
    for (i, (mut conn, cfg)) in producers.into_iter().enumerate() {
        let (run, stop, err_tx) = (run.clone(), stop_rx.clone(), err_tx.clone());
        tasks.push(tokio::spawn(async move {
            let result = producer_task(&mut conn, cfg, &run, stop).await;
            run.producers_done.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = result {
                let _ = err_tx.send(format!("producer {i}: {e:#}")).await;
            }
            conn.close().await;
        }));
    }
    drop(err_tx);

    let interval = Duration::from_secs(args.interval_s);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    let deadline = args.time_s.map(|s| start + Duration::from_secs(s));
    let fanout = match &topo {
        Topology::PerConsumer { .. } => args.consumers as u64,
        Topology::Named { .. } => 1,
    };
    let mut samples = Vec::new();
    let mut errors = Vec::new();
    let mut last = Counters::default();
    let mut last_t = 0.0f64;
    let mut last_progress = (0u64, Instant::now());
    let warmup_s = args.warmup_s as f64;
    // Where the measured part of the run starts: time and totals at the end of the warm-up.
    let mut measured_from: Option<(f64, Counters)> =
        (args.warmup_s == 0).then(|| (0.0, Counters::default()));
    let stop_reason;
    loop {
        let deadline_sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = ticker.tick() => {
                let snap = run.shared.take_interval();
                let t = start.elapsed().as_secs_f64();
                let dt = (t - last_t).max(1e-9);
                let d = snap.totals.minus(&last);
                let sample = Sample {
                    time_s: t,
                    sent_rate: d.sent as f64 / dt,
                    confirmed_rate: d.confirmed as f64 / dt,
                    nacked_rate: d.nacked as f64 / dt,
                    returned_rate: d.returned as f64 / dt,
                    received_rate: d.received as f64 / dt,
                    latency_us: snap.latency_us,
                    confirm_latency_us: snap.confirm_latency_us,
                };
                if let Some(print) = print_line {
                    print(&interval_line(&id, &sample, args.confirm > 0, args.mandatory()));
                }
                samples.push(sample);
                last = snap.totals;
                last_t = t;
                if measured_from.is_none() && t + 1e-3 >= warmup_s {
                    run.shared.reset_run();
                    measured_from = Some((t, snap.totals));
                }
            }
            _ = deadline_sleep => { stop_reason = "Reached time limit".to_string(); break; }
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    stop_reason = "Interrupted".to_string();
                    break;
                }
            }
            Some(e) = err_rx.recv() => {
                errors.push(e);
                stop_reason = "Error".to_string();
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        // Message limits: the run is over when producers are done and consumers have what
        // was sent (or their own -D), or have stopped making progress.
        let producers_done = run.producers_done.load(Ordering::Relaxed) == args.producers as usize;
        let consumers_done = run.consumers_done.load(Ordering::Relaxed) == args.consumers as usize;
        let totals = run.shared.totals();
        if totals.received != last_progress.0 {
            last_progress = (totals.received, Instant::now());
        }
        let limited_producers = args.pmessages > 0 || args.producers == 0 || args.rate == Some(0.0);
        if limited_producers && producers_done {
            if args.consumers == 0 || consumers_done {
                stop_reason = "Producer(s) and consumer(s) reached message limit".into();
                break;
            }
            if args.cmessages == 0 && args.producers > 0 {
                if totals.received >= totals.sent * fanout {
                    stop_reason = "Consumer(s) received every message sent".into();
                    break;
                }
                if last_progress.1.elapsed() > DRAIN_IDLE {
                    stop_reason = "Consumer(s) idle after producers finished".into();
                    break;
                }
            }
        }
        if args.cmessages > 0 && consumers_done && (args.producers == 0 || producers_done) {
            stop_reason = "Consumer(s) reached message limit".into();
            break;
        }
    }
    let duration_s = start.elapsed().as_secs_f64();
    // A run that ended inside its warm-up is measured whole.
    let (measured_from_s, base) = measured_from.unwrap_or((0.0, Counters::default()));
    let measured_s = (duration_s - measured_from_s).max(1e-9);
    let _ = stop_tx.send(true);
    for t in tasks {
        if tokio::time::timeout(SHUTDOWN_TIMEOUT, t).await.is_err() {
            errors.push("a task did not stop within the shutdown timeout".into());
        }
    }
    while let Ok(e) = err_rx.try_recv() {
        errors.push(e);
    }
    let cpu_after = procfs::sample(None).map(|s| s.cpu_s).unwrap_or(cpu_before);
    let totals = run.shared.totals();
    let (latency_us, confirm_latency_us) = run.shared.run_percentiles();
    let client_cpu_s = cpu_after - cpu_before;
    let handled = (totals.sent + totals.received).max(1);
    Ok(RunResult {
        id,
        started_unix_ms,
        duration_s,
        producers: args.producers,
        consumers: args.consumers,
        size_bytes: args.size,
        rate_per_producer: args.rate,
        confirm: args.confirm,
        totals,
        send_rate_avg: (totals.sent - base.sent) as f64 / measured_s,
        receive_rate_avg: (totals.received - base.received) as f64 / measured_s,
        confirm_rate_avg: (totals.confirmed - base.confirmed) as f64 / measured_s,
        latency_us,
        confirm_latency_us,
        samples,
        client_cpu_s,
        client_cpu_us_per_msg: client_cpu_s * 1e6 / handled as f64,
        warmup_s: measured_from_s,
        stop_reason,
        errors,
    })
}

// ---------------------------------------------------------------------------------------------
// Shared I/O helpers

/// Reads whatever the socket has without waiting; false when it had nothing.
fn try_fill(conn: &mut Connection) -> Result<bool> {
    if conn.rstart > 0 && conn.rstart == conn.rend {
        conn.rstart = 0;
        conn.rend = 0;
    }
    if conn.rend == conn.rbuf.len() {
        if conn.rstart == 0 {
            return Ok(false);
        }
        conn.rbuf.copy_within(conn.rstart..conn.rend, 0);
        conn.rend -= conn.rstart;
        conn.rstart = 0;
    }
    match conn.stream.try_read(&mut conn.rbuf[conn.rend..]) {
        Ok(0) => bail!("the broker closed the connection"),
        Ok(n) => {
            conn.rend += n;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn handle_close(
    id: (u16, u16),
    args: wire::Args<'_>,
    conn_wbuf: &mut bytes::BytesMut,
) -> Result<()> {
    if id == method::CONNECTION_CLOSE {
        let reason = wire::parse_close(args)?;
        wire::connection_close_ok(conn_wbuf);
        bail!("broker closed the connection: {reason}");
    }
    if id == method::CHANNEL_CLOSE {
        let reason = wire::parse_close(args)?;
        bail!("broker closed the channel: {reason}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Producer

struct ProducerCfg {
    exchange: String,
    routing_key: String,
    mandatory: bool,
    persistent: bool,
    size: usize,
    rate: Option<f64>,
    confirm_window: Option<usize>,
    confirm_timeout: Option<Duration>,
    limit: u64,
    use_millis: bool,
    start_delay: Duration,
}

/// Marks a slot of the unconfirmed window whose confirm has arrived out of order.
const CONFIRMED: u64 = u64::MAX;

/// Publishes already sent but not yet confirmed, by publish sequence number.
struct Unconfirmed {
    base_seqno: u64,
    sent_ns: VecDeque<u64>,
}

impl Unconfirmed {
    fn settle(
        &mut self,
        tag: u64,
        multiple: bool,
        now_ns: u64,
        local: &mut LocalStats,
        nack: bool,
    ) {
        let record = |sent: u64, local: &mut LocalStats| {
            if nack {
                local.nacked += 1;
            } else {
                local.confirmed += 1;
                local
                    .confirm_latency_us
                    .push(now_ns.saturating_sub(sent) / 1000);
            }
        };
        if multiple {
            while self.base_seqno <= tag {
                let Some(sent) = self.sent_ns.pop_front() else {
                    break;
                };
                self.base_seqno += 1;
                if sent != CONFIRMED {
                    record(sent, local);
                }
            }
        } else if tag >= self.base_seqno {
            let idx = (tag - self.base_seqno) as usize;
            if let Some(slot) = self.sent_ns.get_mut(idx) {
                if *slot != CONFIRMED {
                    record(*slot, local);
                    *slot = CONFIRMED;
                }
            }
        }
        while self.sent_ns.front() == Some(&CONFIRMED) {
            self.sent_ns.pop_front();
            self.base_seqno += 1;
        }
    }
}

async fn producer_task(
    conn: &mut Connection,
    cfg: ProducerCfg,
    run: &Run,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    if !cfg.start_delay.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(cfg.start_delay) => {}
            _ = stop.changed() => return Ok(()),
        }
    }
    let mut local = LocalStats::default();
    let mut body = vec![0u8; cfg.size];
    let mut limiter = cfg.rate.map(RateLimiter::new);
    let mut unconfirmed = Unconfirmed {
        base_seqno: 1,
        sent_ns: VecDeque::with_capacity(cfg.confirm_window.unwrap_or(0)),
    };
    let mut published: u64 = 0;
    let mut sequence: u32 = 0;
    let mut blocked = false;
    let heartbeat =
        (conn.heartbeat_s > 0).then(|| Duration::from_secs(conn.heartbeat_s as u64) / 2);
    let mut last_write = Instant::now();
    let per_message_bytes = cfg.size + cfg.exchange.len() + cfg.routing_key.len() + 64;
    let batch_max = (BATCH_BYTES_MAX / per_message_bytes).clamp(1, BATCH_MESSAGES_MAX) as u64;
    conn.wbuf
        .reserve(BATCH_BYTES_MAX.min(per_message_bytes * batch_max as usize));

    loop {
        if *stop.borrow() {
            break;
        }
        // Confirms, returns and flow control first, without waiting.
        while try_fill(conn)? {}
        let now_ns = mono_ns();
        while let Some((frame, used)) =
            wire::parse_frame(&conn.rbuf[conn.rstart..conn.rend], conn.frame_max)?
        {
            if frame.kind == FRAME_METHOD {
                let (id, mut a) = wire::method_of(frame.payload)?;
                match id {
                    method::BASIC_ACK | method::BASIC_NACK => {
                        let tag = a.u64()?;
                        let multiple = a.u8()? & 1 == 1;
                        unconfirmed.settle(
                            tag,
                            multiple,
                            now_ns,
                            &mut local,
                            id == method::BASIC_NACK,
                        );
                    }
                    // The returned message's header and body frames follow; nothing to measure.
                    method::BASIC_RETURN => local.returned += 1,
                    method::CONNECTION_BLOCKED => blocked = true,
                    method::CONNECTION_UNBLOCKED => blocked = false,
                    _ => handle_close(id, a, &mut conn.wbuf)?,
                }
            }
            conn.rstart += used;
        }
        if local.full() {
            run.shared.absorb(&mut local);
        }
        if let (Some(timeout), Some(&oldest)) = (cfg.confirm_timeout, unconfirmed.sent_ns.front()) {
            if oldest != CONFIRMED
                && Duration::from_nanos(mono_ns().saturating_sub(oldest)) > timeout
            {
                bail!("a publish waited more than {timeout:?} for its confirm (--confirm-timeout)");
            }
        }

        let finished = cfg.limit > 0 && published >= cfg.limit;
        if finished && unconfirmed.sent_ns.is_empty() {
            break;
        }
        let mut n = if blocked || finished { 0 } else { batch_max };
        if cfg.limit > 0 {
            n = n.min(cfg.limit.saturating_sub(published));
        }
        if let Some(w) = cfg.confirm_window {
            n = n.min(w.saturating_sub(unconfirmed.sent_ns.len()) as u64);
        }
        if let Some(l) = limiter.as_mut() {
            if n > 0 {
                n = n.min(l.available());
            }
        }

        if n > 0 {
            for _ in 0..n {
                let now = mono_ns();
                let stamp = if cfg.use_millis { epoch_ms() } else { now };
                stamp_body(&mut body, sequence, stamp);
                sequence = sequence.wrapping_add(1);
                wire::basic_publish(
                    &mut conn.wbuf,
                    1,
                    &cfg.exchange,
                    &cfg.routing_key,
                    cfg.mandatory,
                    cfg.persistent,
                    &body,
                    conn.frame_max,
                );
                if cfg.confirm_window.is_some() {
                    unconfirmed.sent_ns.push_back(now);
                }
            }
            conn.flush().await?;
            last_write = Instant::now();
            if let Some(l) = limiter.as_mut() {
                l.take(n);
            }
            published += n;
            local.sent += n;
            run.shared.absorb(&mut local);
            // Let consumers on the same runtime run between batches.
            tokio::task::yield_now().await;
            continue;
        }

        run.shared.absorb(&mut local);
        let mut wait = Duration::from_secs(1);
        if let Some(l) = &limiter {
            if !blocked && !finished {
                wait = wait.min(l.wait());
            }
        }
        if let Some(hb) = heartbeat {
            let since = last_write.elapsed();
            if since >= hb {
                wire::heartbeat(&mut conn.wbuf);
                conn.flush().await?;
                last_write = Instant::now();
            }
            wait = wait.min(hb.saturating_sub(last_write.elapsed()));
        }
        tokio::select! {
            r = conn.stream.readable() => { r?; }
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {}
        }
    }
    run.shared.absorb(&mut local);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Consumer

struct ConsumerCfg {
    autoack: bool,
    multi_ack_every: u64,
    latency: Duration,
    rate: Option<f64>,
    limit: u64,
    use_millis: bool,
}

/// Where the consumer is within a delivery: method, then header, then body frames.
enum Delivery {
    Idle,
    AwaitHeader {
        tag: u64,
    },
    Body {
        tag: u64,
        remaining: u64,
        head: [u8; 12],
        head_len: usize,
    },
}

struct ConsumerState {
    delivery: Delivery,
    received: u64,
    unacked_since_multi: u64,
    last_tag: u64,
}

async fn consumer_task(
    conn: &mut Connection,
    cfg: ConsumerCfg,
    run: &Run,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    let mut local = LocalStats::default();
    let mut st = ConsumerState {
        delivery: Delivery::Idle,
        received: 0,
        unacked_since_multi: 0,
        last_tag: 0,
    };
    let mut limiter = cfg.rate.map(RateLimiter::new);
    let per_message_pause = !cfg.latency.is_zero() || limiter.is_some();
    let heartbeat =
        (conn.heartbeat_s > 0).then(|| Duration::from_secs(conn.heartbeat_s as u64) / 2);
    let mut last_write = Instant::now();

    loop {
        if *stop.borrow() {
            break;
        }
        // Parse every complete frame in the buffer; with a consumer latency or rate, stop after
        // each message to pause as PerfTest's consumer thread does.
        let mut completed_one = false;
        while let Some((frame, used)) =
            wire::parse_frame(&conn.rbuf[conn.rstart..conn.rend], conn.frame_max)?
        {
            conn.rstart += used;
            let done_msg = consume_frame(frame, &mut st, &cfg, &mut local, &mut conn.wbuf)?;
            if local.full() {
                run.shared.absorb(&mut local);
            }
            if done_msg {
                completed_one = true;
                if cfg.limit > 0 && st.received >= cfg.limit {
                    break;
                }
                if per_message_pause {
                    break;
                }
            }
        }
        if !conn.wbuf.is_empty() {
            conn.flush().await?;
            last_write = Instant::now();
        }
        run.shared.absorb(&mut local);
        if cfg.limit > 0 && st.received >= cfg.limit {
            break;
        }
        if let Some(hb) = heartbeat {
            if last_write.elapsed() >= hb {
                wire::heartbeat(&mut conn.wbuf);
                conn.flush().await?;
                last_write = Instant::now();
            }
        }
        if completed_one && per_message_pause {
            let mut pause = cfg.latency;
            if let Some(l) = limiter.as_mut() {
                if l.available() >= 1 {
                    l.take(1);
                } else {
                    l.take(1);
                    pause = pause.max(l.wait());
                }
            }
            if !pause.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.changed() => {}
                }
            }
            continue;
        }
        let wait = heartbeat
            .map(|hb| hb.saturating_sub(last_write.elapsed()))
            .unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            r = conn.fill() => { r?; }
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {}
        }
    }
    run.shared.absorb(&mut local);
    Ok(())
}

/// Advances the delivery state machine by one frame; true when a message is complete.
fn consume_frame(
    frame: wire::Frame<'_>,
    st: &mut ConsumerState,
    cfg: &ConsumerCfg,
    local: &mut LocalStats,
    wbuf: &mut bytes::BytesMut,
) -> Result<bool> {
    match frame.kind {
        FRAME_METHOD => {
            let (id, mut a) = wire::method_of(frame.payload)?;
            if id == method::BASIC_DELIVER {
                let _consumer_tag = a.shortstr()?;
                let tag = a.u64()?;
                st.delivery = Delivery::AwaitHeader { tag };
                return Ok(false);
            }
            if id == method::BASIC_CANCEL {
                bail!("the broker cancelled the consumer (queue deleted?)");
            }
            handle_close(id, a, wbuf)?;
            Ok(false)
        }
        FRAME_HEADER => {
            let Delivery::AwaitHeader { tag } = st.delivery else {
                return Err(anyhow!("content header without a delivery"));
            };
            let size = wire::content_body_size(frame.payload)?;
            st.delivery = Delivery::Body {
                tag,
                remaining: size,
                head: [0; 12],
                head_len: 0,
            };
            if size == 0 {
                finish_message(st, cfg, local, wbuf);
                return Ok(true);
            }
            Ok(false)
        }
        FRAME_BODY => {
            let Delivery::Body {
                remaining,
                head,
                head_len,
                ..
            } = &mut st.delivery
            else {
                return Err(anyhow!("content body without a header"));
            };
            let take = (12 - *head_len).min(frame.payload.len());
            head[*head_len..*head_len + take].copy_from_slice(&frame.payload[..take]);
            *head_len += take;
            *remaining = remaining.saturating_sub(frame.payload.len() as u64);
            if *remaining == 0 {
                finish_message(st, cfg, local, wbuf);
                return Ok(true);
            }
            Ok(false)
        }
        FRAME_HEARTBEAT => Ok(false),
        _ => bail!("unknown frame type {}", frame.kind),
    }
}

fn finish_message(
    st: &mut ConsumerState,
    cfg: &ConsumerCfg,
    local: &mut LocalStats,
    wbuf: &mut bytes::BytesMut,
) {
    let Delivery::Body {
        tag,
        head,
        head_len,
        ..
    } = std::mem::replace(&mut st.delivery, Delivery::Idle)
    else {
        return;
    };
    st.received += 1;
    local.received += 1;
    if head_len == 12 {
        let (_seq, ts) = read_stamp(&head);
        let latency_us = if cfg.use_millis {
            epoch_ms().saturating_sub(ts) * 1000
        } else {
            mono_ns().saturating_sub(ts) / 1000
        };
        local.latency_us.push(latency_us);
    }
    if !cfg.autoack {
        st.last_tag = tag;
        if cfg.multi_ack_every > 0 {
            st.unacked_since_multi += 1;
            if st.unacked_since_multi >= cfg.multi_ack_every {
                wire::basic_ack(wbuf, 1, tag, true);
                st.unacked_since_multi = 0;
            }
        } else {
            wire::basic_ack(wbuf, 1, tag, false);
        }
    }
}

/// The queue arguments as text, for reports.
pub fn describe_args(args: &[(String, FieldValue)]) -> String {
    args.iter()
        .map(|(k, v)| match v {
            FieldValue::Bool(b) => format!("{k}={b}"),
            FieldValue::Long(n) => format!("{k}={n}"),
            FieldValue::Str(s) => format!("{k}={s}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_is_perftest_layout_big_endian() {
        let mut body = vec![0u8; 16];
        stamp_body(&mut body, 7, 0x0102030405060708);
        assert_eq!(&body[..12], &[0, 0, 0, 7, 1, 2, 3, 4, 5, 6, 7, 8]);
        let head: [u8; 12] = body[..12].try_into().unwrap();
        assert_eq!(read_stamp(&head), (7, 0x0102030405060708));
    }

    #[test]
    fn out_of_order_and_multiple_confirms_settle_each_publish_once() {
        let mut u = Unconfirmed {
            base_seqno: 1,
            sent_ns: (0..5).map(|i| 1000 * i).collect(),
        };
        let mut local = LocalStats::default();
        u.settle(3, false, 10_000, &mut local, false);
        assert_eq!((local.confirmed, u.sent_ns.len()), (1, 5));
        u.settle(2, true, 10_000, &mut local, false);
        // 1 and 2 settled by the multiple ack, 3 already: the window slides past 3.
        assert_eq!((local.confirmed, u.base_seqno, u.sent_ns.len()), (3, 4, 2));
        u.settle(5, true, 10_000, &mut local, true);
        assert_eq!((local.confirmed, local.nacked, u.sent_ns.len()), (3, 2, 0));
    }

    #[test]
    fn deliveries_encoded_by_the_protocol_crate_are_counted_timed_and_acked() {
        use warren_protocol::{content, frame, method as wpm};
        let mut inbound = bytes::BytesMut::new();
        let sent_at = mono_ns();
        for tag in 1..=3u64 {
            let mut body = vec![0u8; 200];
            stamp_body(&mut body, tag as u32, sent_at);
            wpm::encode_deliver(&mut inbound, 1, b"ctag", tag, false, b"direct", b"rk");
            content::encode_header(&mut inbound, 1, 60, body.len() as u64, &[]);
            frame::encode_body(&mut inbound, 1, &body, 4096 + 8);
        }
        let cfg = ConsumerCfg {
            autoack: false,
            multi_ack_every: 0,
            latency: Duration::ZERO,
            rate: None,
            limit: 0,
            use_millis: false,
        };
        let mut st = ConsumerState {
            delivery: Delivery::Idle,
            received: 0,
            unacked_since_multi: 0,
            last_tag: 0,
        };
        let mut local = LocalStats::default();
        let mut acks = bytes::BytesMut::new();
        let mut at = 0;
        let mut completed = 0;
        while let Some((f, used)) = wire::parse_frame(&inbound[at..], 1 << 20).unwrap() {
            completed += consume_frame(f, &mut st, &cfg, &mut local, &mut acks).unwrap() as u32;
            at += used;
        }
        assert_eq!((completed, st.received, local.latency_us.len()), (3, 3, 3));
        // One ack per message, each decodable by the protocol crate with the right tag.
        for tag in 1..=3u64 {
            let f = frame::decode(&mut acks, 0).unwrap().unwrap();
            match wpm::Method::decode(f.payload).unwrap() {
                wpm::Method::Ack(a) => assert_eq!((a.delivery_tag, a.multiple), (tag, false)),
                other => panic!("expected basic.ack, got {other:?}"),
            }
        }
        assert!(acks.is_empty());
    }
}
