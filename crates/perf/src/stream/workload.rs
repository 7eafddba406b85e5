//! One `warren perf stream` run: producers publish batches of entries with a bounded number of
//! unconfirmed messages, consumers subscribe with chunk credit and count what each Deliver's
//! chunk holds, and the reporter prints stream-perf-test's line per interval and its summary.
//!
//! As in `crate::workload`, every producer and consumer owns one connection and runs as a task
//! on one current-thread runtime; counters and samples go to the shared stats once per read or
//! write. Back-of-the-envelope cost per 12-byte message: ~25 bytes encoded into the batch (a
//! clock read and a small memcpy), 1/100 of a write syscall at the default batch size; on the
//! consumer side an entry header and a Data section header read in place from the chunk, one
//! clock read per read syscall and one histogram sample. No allocation per message.

use super::chunk::{self, put_message, put_sub_batch};
use super::client::{encode_publish, StreamConnection, StreamUri, PUBLISH_HEADER_BYTES};
use crate::cli::StreamCli;
use crate::procfs;
use crate::rate_limiter::RateLimiter;
use crate::stats::{Counters, LocalStats, Percentiles, SharedStats};
use crate::workload::{default_id, epoch_ms, mono_ns};
use anyhow::{anyhow, bail, Context, Result};
use bytes::BufMut;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use warren_protocol::stream::constants::response_code_name;
use warren_protocol::stream::{Command, OffsetSpec};

/// Bytes a producer writes with one syscall at most (several Publish frames).
pub const WRITE_BYTES_MAX: usize = 1024 * 1024;
/// How long the run waits for consumers to catch up once every producer has finished.
pub const DRAIN_IDLE: Duration = Duration::from_secs(2);
/// How long stopping tasks may take before the run gives up on them.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// The one publisher and the one subscription each connection has.
const PUBLISHER_ID: u8 = 0;
const SUBSCRIPTION_ID: u8 = 0;

/// One interval of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamSample {
    pub time_s: f64,
    pub published_rate: f64,
    pub confirmed_rate: f64,
    pub errored_rate: f64,
    pub consumed_rate: f64,
    /// Messages per chunk delivered in the interval.
    pub chunk_size: f64,
    pub latency_us: Percentiles,
    pub confirm_latency_us: Percentiles,
}

/// Everything a run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamRunResult {
    pub id: String,
    pub started_unix_ms: u64,
    pub duration_s: f64,
    pub producers: u32,
    pub consumers: u32,
    pub streams: Vec<String>,
    pub size_bytes: usize,
    pub published: u64,
    pub confirmed: u64,
    /// Messages the broker answered with PublishError.
    pub errored: u64,
    pub consumed: u64,
    pub chunks: u64,
    pub published_rate_avg: f64,
    pub confirmed_rate_avg: f64,
    pub consumed_rate_avg: f64,
    pub chunk_size_avg: f64,
    /// End to end: the producer's clock in the body against the consumer's.
    pub latency_us: Percentiles,
    /// Publish to PublishConfirm.
    pub confirm_latency_us: Percentiles,
    pub samples: Vec<StreamSample>,
    pub client_cpu_s: f64,
    /// Client CPU per message published plus consumed, microseconds.
    pub client_cpu_us_per_msg: f64,
    pub stop_reason: String,
    pub errors: Vec<String>,
}

impl StreamRunResult {
    /// stream-perf-test's summary line, then ours (percentiles in full, totals, client CPU).
    pub fn summary_lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "Summary: published {:.0} msg/s, confirmed {:.0} msg/s, consumed {:.0} msg/s, latency 95th {} µs, chunk size {:.0}",
            self.published_rate_avg,
            self.confirmed_rate_avg,
            self.consumed_rate_avg,
            self.latency_us.p95,
            self.chunk_size_avg
        )];
        if self.latency_us.count > 0 {
            out.push(format!(
                "id: {}, latency min/median/75th/95th/99th {} µs, 99.9th/max {}/{} µs",
                self.id,
                self.latency_us.perftest(),
                self.latency_us.p999,
                self.latency_us.max
            ));
        }
        if self.confirm_latency_us.count > 0 {
            out.push(format!(
                "id: {}, confirm latency min/median/75th/95th/99th {} µs, 99.9th/max {}/{} µs",
                self.id,
                self.confirm_latency_us.perftest(),
                self.confirm_latency_us.p999,
                self.confirm_latency_us.max
            ));
        }
        out.push(format!(
            "id: {}, published {}, confirmed {}, errored {}, consumed {} messages in {} chunks, {:.1} s",
            self.id,
            self.published,
            self.confirmed,
            self.errored,
            self.consumed,
            self.chunks,
            self.duration_s
        ));
        out.push(format!(
            "id: {}, client CPU {:.2} s, {:.2} µs per message",
            self.id, self.client_cpu_s, self.client_cpu_us_per_msg
        ));
        out
    }
}

/// stream-perf-test's line per interval, with confirm latency added.
pub fn interval_line(s: &StreamSample) -> String {
    let mut line = format!(
        "{:.0}, published {:.0} msg/s, confirmed {:.0} msg/s, consumed {:.0} msg/s",
        s.time_s, s.published_rate, s.confirmed_rate, s.consumed_rate
    );
    if s.errored_rate > 0.0 {
        line.push_str(&format!(", errored {:.0} msg/s", s.errored_rate));
    }
    if s.latency_us.count > 0 {
        line.push_str(&format!(
            ", latency min/median/75th/95th/99th {} µs",
            s.latency_us.perftest()
        ));
    }
    if s.confirm_latency_us.count > 0 {
        line.push_str(&format!(
            ", confirm latency min/median/75th/95th/99th {} µs",
            s.confirm_latency_us.perftest()
        ));
    }
    line.push_str(&format!(", chunk size {:.0}", s.chunk_size));
    line
}

struct Run {
    shared: SharedStats,
    chunks: AtomicU64,
    producers_done: AtomicUsize,
    consumers_done: AtomicUsize,
}

/// Runs until -z, the message limits, an error, or `stop`; lines go to `print_line`.
pub async fn run(
    args: &StreamCli,
    mut stop: watch::Receiver<bool>,
    print_line: Option<&dyn Fn(&str)>,
) -> Result<StreamRunResult> {
    let id = args.id.clone().unwrap_or_else(default_id);
    let uris: Vec<StreamUri> = args
        .uri_list()
        .iter()
        .map(|u| StreamUri::parse(u))
        .collect::<Result<_>>()?;
    let streams = args.stream_list();
    if !args.pre_declared {
        let mut setup = StreamConnection::open(&uris[0], &format!("{id}-setup")).await?;
        for s in &streams {
            setup.create_stream(s, &args.create_arguments()).await?;
        }
        setup.close().await;
    }

    let run = Arc::new(Run {
        shared: SharedStats::default(),
        chunks: AtomicU64::new(0),
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
        let stream = &streams[i % streams.len()];
        let mut conn = StreamConnection::open(&next_uri(), &format!("{id}-consumer-{i}")).await?;
        conn.subscribe(SUBSCRIPTION_ID, stream, args.offset, args.initial_credits)
            .await?;
        let cfg = ConsumerCfg {
            limit: args.cmessages,
            offset_min: match args.offset {
                OffsetSpec::Offset(o) => o,
                _ => 0,
            },
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
        let stream = &streams[i % streams.len()];
        let mut conn = StreamConnection::open(&next_uri(), &format!("{id}-producer-{i}")).await?;
        conn.declare_publisher(PUBLISHER_ID, stream).await?;
        let cfg = ProducerCfg {
            size: args.size,
            rate: (args.rate >= 0.0).then_some(args.rate),
            batch_entries: args.batch_size,
            sub_entry_size: args.sub_entry_size,
            window: args.confirms as u64,
            limit: args.pmessages,
        };
        producers.push((conn, cfg));
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
    let mut samples = Vec::new();
    let mut errors = Vec::new();
    let mut last = Counters::default();
    let mut last_chunks = 0u64;
    let mut last_t = 0.0f64;
    let mut last_progress = (0u64, Instant::now());
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
                let chunks = run.chunks.load(Ordering::Relaxed);
                let t = start.elapsed().as_secs_f64();
                let dt = (t - last_t).max(1e-9);
                let d = snap.totals.minus(&last);
                let sample = StreamSample {
                    time_s: t,
                    published_rate: d.sent as f64 / dt,
                    confirmed_rate: d.confirmed as f64 / dt,
                    errored_rate: d.nacked as f64 / dt,
                    consumed_rate: d.received as f64 / dt,
                    chunk_size: d.received as f64 / (chunks - last_chunks).max(1) as f64,
                    latency_us: snap.latency_us,
                    confirm_latency_us: snap.confirm_latency_us,
                };
                if let Some(print) = print_line {
                    print(&interval_line(&sample));
                }
                samples.push(sample);
                last = snap.totals;
                last_chunks = chunks;
                last_t = t;
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
        let producers_done = run.producers_done.load(Ordering::Relaxed) == args.producers as usize;
        let consumers_done = run.consumers_done.load(Ordering::Relaxed) == args.consumers as usize;
        let totals = run.shared.totals();
        if totals.received != last_progress.0 {
            last_progress = (totals.received, Instant::now());
        }
        let limited_producers = args.pmessages > 0 || args.producers == 0 || args.rate == 0.0;
        if limited_producers && producers_done {
            if args.consumers == 0 || consumers_done {
                stop_reason = "Producer(s) and consumer(s) reached message limit".into();
                break;
            }
            if args.cmessages == 0 && args.producers > 0 && last_progress.1.elapsed() > DRAIN_IDLE {
                stop_reason = "Consumer(s) idle after producers finished".into();
                break;
            }
        }
        if args.cmessages > 0 && consumers_done && (args.producers == 0 || producers_done) {
            stop_reason = "Consumer(s) reached message limit".into();
            break;
        }
    }
    let duration_s = start.elapsed().as_secs_f64().max(1e-9);
    let _ = stop_tx.send(true);
    for t in tasks {
        if tokio::time::timeout(SHUTDOWN_TIMEOUT, t).await.is_err() {
            errors.push("a task did not stop within the shutdown timeout".into());
        }
    }
    while let Ok(e) = err_rx.try_recv() {
        errors.push(e);
    }
    if args.delete_streams {
        match StreamConnection::open(&uris[0], &format!("{id}-teardown")).await {
            Ok(mut c) => {
                for s in &streams {
                    if let Err(e) = c.delete_stream(s).await {
                        errors.push(format!("{e:#}"));
                    }
                }
                c.close().await;
            }
            Err(e) => errors.push(format!("deleting the streams: {e:#}")),
        }
    }
    let cpu_after = procfs::sample(None).map(|s| s.cpu_s).unwrap_or(cpu_before);
    let totals = run.shared.totals();
    let chunks = run.chunks.load(Ordering::Relaxed);
    let (latency_us, confirm_latency_us) = run.shared.run_percentiles();
    let client_cpu_s = cpu_after - cpu_before;
    Ok(StreamRunResult {
        id,
        started_unix_ms,
        duration_s,
        producers: args.producers,
        consumers: args.consumers,
        streams,
        size_bytes: args.size,
        published: totals.sent,
        confirmed: totals.confirmed,
        errored: totals.nacked,
        consumed: totals.received,
        chunks,
        published_rate_avg: totals.sent as f64 / duration_s,
        confirmed_rate_avg: totals.confirmed as f64 / duration_s,
        consumed_rate_avg: totals.received as f64 / duration_s,
        chunk_size_avg: totals.received as f64 / chunks.max(1) as f64,
        latency_us,
        confirm_latency_us,
        samples,
        client_cpu_s,
        client_cpu_us_per_msg: client_cpu_s * 1e6 / (totals.sent + totals.received).max(1) as f64,
        stop_reason,
        errors,
    })
}

// ---------------------------------------------------------------------------------------------
// Producer

struct ProducerCfg {
    size: usize,
    rate: Option<f64>,
    batch_entries: u32,
    sub_entry_size: u32,
    /// Unconfirmed messages allowed.
    window: u64,
    limit: u64,
}

/// Marks an entry whose confirm arrived ahead of older ones.
const CONFIRMED: u64 = u64::MAX;

/// Entries sent and not yet confirmed, by publishing id (one per entry, from 1).
struct Unconfirmed {
    base_id: u64,
    sent_ns: VecDeque<u64>,
    messages_per_entry: u64,
}

impl Unconfirmed {
    fn messages(&self) -> u64 {
        self.sent_ns.len() as u64 * self.messages_per_entry
    }

    /// Settles one entry; confirms and errors may come in any order.
    fn settle(&mut self, id: u64, now_ns: u64, local: &mut LocalStats, error: bool) {
        if id < self.base_id {
            return;
        }
        let Some(slot) = self.sent_ns.get_mut((id - self.base_id) as usize) else {
            return;
        };
        if *slot == CONFIRMED {
            return;
        }
        if error {
            local.nacked += self.messages_per_entry;
        } else {
            local.confirmed += self.messages_per_entry;
            local
                .confirm_latency_us
                .push(now_ns.saturating_sub(*slot) / 1000);
        }
        *slot = CONFIRMED;
        while self.sent_ns.front() == Some(&CONFIRMED) {
            self.sent_ns.pop_front();
            self.base_id += 1;
        }
    }
}

async fn producer_task(
    conn: &mut StreamConnection,
    cfg: ProducerCfg,
    run: &Run,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    let mut local = LocalStats::default();
    let mut body = vec![0u8; cfg.size];
    let mut limiter = cfg.rate.map(RateLimiter::new);
    let ses = cfg.sub_entry_size as u64;
    let mut unconfirmed = Unconfirmed {
        base_id: 1,
        sent_ns: VecDeque::with_capacity((cfg.window / ses) as usize + 1),
        messages_per_entry: ses,
    };
    let mut next_id: u64 = 1;
    let mut published: u64 = 0;
    let message_bytes = 4 + chunk::message_bytes(cfg.size);
    let entry_bytes = 8 + if ses == 1 {
        message_bytes
    } else {
        11 + message_bytes * ses as usize
    };
    let frame_room = (conn.frame_max as usize)
        .saturating_sub(PUBLISH_HEADER_BYTES)
        .max(1);
    if conn.frame_max != 0 && entry_bytes > frame_room {
        bail!(
            "one entry ({entry_bytes} bytes) does not fit the negotiated frame size {}: lower --size or --sub-entry-size",
            conn.frame_max
        );
    }
    let entries_per_frame = (cfg.batch_entries as usize)
        .min(frame_room / entry_bytes)
        .max(1) as u64;
    let entries_per_write = (WRITE_BYTES_MAX / entry_bytes).max(1) as u64;

    loop {
        if *stop.borrow() {
            break;
        }
        while conn.try_fill()? {}
        let now_ns = mono_ns();
        while let Some(c) = conn.decode_next()? {
            match c {
                Command::PublishConfirm { publishing_ids, .. } => {
                    for id in publishing_ids {
                        unconfirmed.settle(id, now_ns, &mut local, false);
                    }
                }
                Command::PublishError { errors, .. } => {
                    for (id, _code) in errors {
                        unconfirmed.settle(id, now_ns, &mut local, true);
                    }
                }
                other => handle_other(conn, other)?,
            }
            if local.full() {
                run.shared.absorb(&mut local);
            }
        }
        conn.flush().await?;

        let finished = cfg.limit > 0 && published >= cfg.limit;
        if finished && unconfirmed.sent_ns.is_empty() {
            break;
        }
        // Whole entries: the window, the limit and the rate are counted in messages.
        let mut messages = if finished { 0 } else { entries_per_write * ses };
        messages = messages.min(cfg.window.saturating_sub(unconfirmed.messages()));
        if cfg.limit > 0 {
            messages = messages.min(cfg.limit - published.min(cfg.limit));
        }
        if let Some(l) = limiter.as_mut() {
            if messages > 0 {
                messages = messages.min(l.available());
            }
        }
        let mut entries = messages / ses;
        if entries == 0 && cfg.limit > 0 && messages > 0 && published + messages >= cfg.limit {
            // The last, partial entry of a limited run.
            entries = 1;
        }
        if entries > 0 {
            let mut left_messages = messages;
            let mut left = entries;
            while left > 0 {
                let in_frame = left.min(entries_per_frame);
                let now = mono_ns();
                body[..chunk::BODY_TIMESTAMP_BYTES].copy_from_slice(&now.to_be_bytes());
                let mut frame_messages = 0u64;
                encode_publish(
                    &mut conn.wbuf,
                    PUBLISHER_ID,
                    next_id,
                    in_frame as u32,
                    |out, _| {
                        let n = ses.min(left_messages);
                        left_messages -= n;
                        frame_messages += n;
                        if ses == 1 {
                            out.put_u32(chunk::message_bytes(body.len()) as u32);
                            put_message(out, &body);
                        } else {
                            put_sub_batch(out, std::iter::repeat_n(&body[..], n as usize));
                        }
                    },
                );
                for _ in 0..in_frame {
                    unconfirmed.sent_ns.push_back(now);
                }
                next_id += in_frame;
                left -= in_frame;
                published += frame_messages;
                local.sent += frame_messages;
                if let Some(l) = limiter.as_mut() {
                    l.take(frame_messages);
                }
            }
            conn.flush().await?;
            run.shared.absorb(&mut local);
            // Let consumers on the same runtime run between batches.
            tokio::task::yield_now().await;
            continue;
        }

        run.shared.absorb(&mut local);
        let mut wait = Duration::from_secs(1);
        if let Some(l) = &limiter {
            if !finished {
                wait = wait.min(l.wait());
            }
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

/// Commands either side may get besides its data: heartbeats answered, the rest ended on.
fn handle_other(conn: &mut StreamConnection, command: Command) -> Result<()> {
    match command {
        Command::Heartbeat => {
            warren_protocol::stream::encode(&mut conn.wbuf, &Command::Heartbeat);
            Ok(())
        }
        Command::Close { code, reason, .. } => Err(anyhow!(
            "the broker closed the connection: {} ({reason})",
            response_code_name(code)
        )),
        Command::MetadataUpdate { code, stream } => Err(anyhow!(
            "stream {stream:?} is no longer available here: {}",
            response_code_name(code)
        )),
        Command::CreditResponse { code, .. } => Err(anyhow!(
            "the broker refused credit: {}",
            response_code_name(code)
        )),
        // Responses to nothing we asked, tune repeats: nothing to act on.
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// Consumer

struct ConsumerCfg {
    limit: u64,
    /// Messages before this offset come with the first chunk of a numeric --offset and are
    /// not the subscription's: skipped, as the stream clients skip them.
    offset_min: u64,
}

async fn consumer_task(
    conn: &mut StreamConnection,
    cfg: ConsumerCfg,
    run: &Run,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    let mut local = LocalStats::default();
    let mut received: u64 = 0;
    let mut chunks: u64 = 0;
    loop {
        if *stop.borrow() {
            break;
        }
        while conn.try_fill()? {}
        let now_ns = mono_ns();
        let mut credit: u16 = 0;
        while let Some(c) = conn.decode_next()? {
            match c {
                Command::Deliver { chunk: bytes, .. } => {
                    chunks += 1;
                    credit = credit.saturating_add(1);
                    let limit = cfg.limit;
                    chunk::for_each_message(&bytes, |offset, message| {
                        if offset < cfg.offset_min || (limit > 0 && received >= limit) {
                            return;
                        }
                        received += 1;
                        local.received += 1;
                        if let Some(ts) =
                            chunk::message_body(message).and_then(chunk::body_timestamp)
                        {
                            if ts <= now_ns {
                                local.latency_us.push((now_ns - ts) / 1000);
                                // A read may bring tens of thousands of messages: hand the
                                // samples over when the buffer is full rather than drop them.
                                if local.full() {
                                    run.shared.absorb(&mut local);
                                }
                            }
                        }
                    })
                    .context("reading a Deliver")?;
                }
                other => handle_other(conn, other)?,
            }
        }
        if credit > 0 {
            warren_protocol::stream::encode(
                &mut conn.wbuf,
                &Command::Credit {
                    subscription_id: SUBSCRIPTION_ID,
                    credit,
                },
            );
        }
        conn.flush().await?;
        run.chunks
            .fetch_add(std::mem::take(&mut chunks), Ordering::Relaxed);
        run.shared.absorb(&mut local);
        if cfg.limit > 0 && received >= cfg.limit {
            break;
        }
        tokio::select! {
            r = conn.stream.readable() => { r?; }
            _ = stop.changed() => {}
        }
    }
    run.shared.absorb(&mut local);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confirms_in_any_order_settle_each_entry_once() {
        let mut u = Unconfirmed {
            base_id: 1,
            sent_ns: (0..4).map(|i| 1000 * i).collect(),
            messages_per_entry: 10,
        };
        let mut local = LocalStats::default();
        u.settle(3, 10_000, &mut local, false);
        assert_eq!((u.base_id, u.messages()), (1, 40), "a gap keeps the window");
        u.settle(1, 10_000, &mut local, false);
        u.settle(1, 10_000, &mut local, false);
        u.settle(2, 10_000, &mut local, true);
        assert_eq!((u.base_id, u.messages()), (4, 10));
        assert_eq!((local.confirmed, local.nacked), (20, 10));
        assert_eq!(local.confirm_latency_us, vec![8, 10]);
        u.settle(99, 10_000, &mut local, false);
        assert_eq!(u.messages(), 10, "an unknown id settles nothing");
    }
}
