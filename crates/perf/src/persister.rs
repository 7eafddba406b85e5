//! The persister test (seed 004): publish N persistent messages of S bytes with confirms into
//! a durable queue nobody consumes (lazy with --lazy, as the seed's disk-only queue), in one or
//! more rounds, then drain it with one consumer. Reports rates over time, total times, and the
//! bytes the broker wrote and read per payload byte in each phase (write amplification).
//!
//! Both phases reuse the PerfTest workload engine (one producer with -C, then one consumer with
//! -D), so their rates and latencies are measured exactly as `warren perf` measures them; a
//! sampler reads the broker's /proc/PID/io once a second beside them.

use crate::charts::{Chart, Series};
use crate::cli::{self, PerfCommand, PersisterCli};
use crate::client::{Connection, Uri};
use crate::output::write_text;
use crate::procfs::{self, ProcSample};
use crate::workload::{self, RunResult};
use crate::{progress, report};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// The broker's disk traffic over one sampling interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct IoSample {
    pub time_s: f64,
    pub write_bytes_s: f64,
    pub read_bytes_s: f64,
    pub cpu_cores: f64,
    pub rss_bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    pub messages: u64,
    pub payload_bytes: u64,
    pub duration_s: f64,
    pub rate_msg_s: f64,
    /// Seconds since the start of the test at which this phase started.
    pub offset_s: f64,
    pub broker_write_bytes: u64,
    pub broker_read_bytes: u64,
    pub write_bytes_per_payload_byte: f64,
    pub read_bytes_per_payload_byte: f64,
    pub run: RunResult,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
/// Missing fields read as defaults, so files from older versions still load.
#[serde(default)]
pub struct PersisterResult {
    pub queue: String,
    pub lazy: bool,
    pub size_bytes: usize,
    pub messages_per_round: u64,
    pub broker_pid: Option<u32>,
    pub phases: Vec<Phase>,
    pub io: Vec<IoSample>,
}

fn workload_args(argv: &[String]) -> Result<cli::WorkloadArgs> {
    match cli::parse(argv) {
        Ok(PerfCommand::Run(w)) => Ok(w),
        Ok(_) => bail!("internal: persister built a non-run command line"),
        Err(e) => bail!("internal: persister built a bad command line: {e}"),
    }
}

/// Samples the broker once a second until `done`.
fn spawn_io_sampler(
    pid: u32,
    start: Instant,
    done: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<IoSample>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        let mut prev: Option<(Instant, ProcSample)> =
            procfs::sample(Some(pid)).ok().map(|s| (Instant::now(), s));
        let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
        tick.tick().await;
        while !done.load(Ordering::Relaxed) {
            tick.tick().await;
            let Ok(now) = procfs::sample(Some(pid)) else {
                break;
            };
            let t = Instant::now();
            if let Some((pt, ps)) = prev {
                let d = now.delta(&ps, t.duration_since(pt).as_secs_f64());
                out.push(IoSample {
                    time_s: t.duration_since(start).as_secs_f64(),
                    write_bytes_s: d.disk_write_bytes as f64 / d.elapsed_s.max(1e-9),
                    read_bytes_s: d.disk_read_bytes as f64 / d.elapsed_s.max(1e-9),
                    cpu_cores: d.cpu_cores,
                    rss_bytes: now.rss_bytes,
                });
            }
            prev = Some((t, now));
        }
        out
    })
}

async fn phase(
    name: &str,
    argv: Vec<String>,
    messages: u64,
    size: usize,
    pid: Option<u32>,
    start: Instant,
    stop: watch::Receiver<bool>,
) -> Result<Phase> {
    let w = workload_args(&argv)?;
    let offset_s = start.elapsed().as_secs_f64();
    let before = pid.and_then(|p| procfs::sample(Some(p)).ok());
    let run = workload::run_workload(&w, stop, None).await?;
    let after = pid.and_then(|p| procfs::sample(Some(p)).ok());
    let (w_bytes, r_bytes) = match (before, after) {
        (Some(b), Some(a)) => (
            a.disk_write_bytes.saturating_sub(b.disk_write_bytes),
            a.disk_read_bytes.saturating_sub(b.disk_read_bytes),
        ),
        _ => (0, 0),
    };
    if !run.errors.is_empty() {
        bail!("{name} phase failed: {}", run.errors.join("; "));
    }
    let done = if name == "drain" {
        run.totals.received
    } else {
        run.totals.confirmed
    };
    let payload = done * size as u64;
    let p = Phase {
        name: name.to_string(),
        messages: done,
        payload_bytes: payload,
        duration_s: run.duration_s,
        rate_msg_s: done as f64 / run.duration_s.max(1e-9),
        offset_s,
        broker_write_bytes: w_bytes,
        broker_read_bytes: r_bytes,
        write_bytes_per_payload_byte: w_bytes as f64 / payload.max(1) as f64,
        read_bytes_per_payload_byte: r_bytes as f64 / payload.max(1) as f64,
        run,
    };
    if p.messages < messages {
        eprintln!(
            "warren perf persister: {name} handled {} of {messages} messages ({})",
            p.messages, p.run.stop_reason
        );
    }
    Ok(p)
}

pub async fn run(cli: &PersisterCli, stop: watch::Receiver<bool>) -> Result<PersisterResult> {
    let uri = Uri::parse(&cli.uri)?;
    std::fs::create_dir_all(&cli.out).with_context(|| format!("creating {}", cli.out.display()))?;
    let pid = match cli.broker_pid {
        Some(p) => Some(p),
        None => match procfs::find_pid_by_port(uri.port) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("warren perf persister: broker disk bytes not measured: {e:#}");
                None
            }
        },
    };
    // Start from an empty queue: a leftover from an earlier run would skew the drain.
    let mut setup = Connection::open(&uri, 0, "warren-perf-persister-setup").await?;
    setup.open_channel(1).await?;
    setup.delete_queue(1, &cli.queue).await?;
    setup.close().await;

    let mut qargs: Vec<String> = Vec::new();
    if cli.lazy {
        qargs.push("x-queue-mode=lazy".into());
    }
    if let Some(extra) = &cli.queue_args {
        qargs.push(workload::describe_args(&extra.0));
    }
    let mut result = PersisterResult {
        queue: cli.queue.clone(),
        lazy: cli.lazy,
        size_bytes: cli.size,
        messages_per_round: cli.messages,
        broker_pid: pid,
        ..Default::default()
    };
    let start = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let sampler = pid.map(|p| spawn_io_sampler(p, start, done.clone()));
    let bar = progress::for_steps(cli.rounds as u64 + u64::from(!cli.no_drain), "persister");
    let s = |v: &dyn ToString| v.to_string();
    for round in 1..=cli.rounds {
        if *stop.borrow() {
            break;
        }
        bar.set_message(format!("publish round {round}"));
        let mut argv = vec![
            s(&"-h"),
            cli.uri.clone(),
            s(&"-x"),
            s(&1),
            s(&"-y"),
            s(&0),
            s(&"-C"),
            s(&cli.messages),
            s(&"-s"),
            s(&cli.size),
            s(&"-f"),
            s(&"persistent"),
            s(&"-c"),
            s(&cli.confirm),
            s(&"-u"),
            cli.queue.clone(),
            s(&"-e"),
            String::new(),
            s(&"--auto-delete"),
            s(&"false"),
            s(&"--quiet"),
            s(&"--id"),
            format!("persister-publish-{round}"),
        ];
        if !qargs.is_empty() {
            argv.push("--queue-args".into());
            argv.push(qargs.join(","));
        }
        let p = phase(
            &format!("publish {round}"),
            argv,
            cli.messages,
            cli.size,
            pid,
            start,
            stop.clone(),
        )
        .await?;
        bar.println(&phase_line(&p));
        result.phases.push(p);
        bar.inc(1);
    }
    if !cli.no_drain && !*stop.borrow() {
        bar.set_message("drain".into());
        if cli.drop_caches {
            drop_page_cache();
        }
        let total = cli.messages * cli.rounds as u64;
        let argv = vec![
            s(&"-h"),
            cli.uri.clone(),
            s(&"-x"),
            s(&0),
            s(&"-y"),
            s(&1),
            s(&"-D"),
            s(&total),
            s(&"-u"),
            cli.queue.clone(),
            s(&"-p"),
            s(&"-q"),
            s(&cli.qos),
            s(&"-A"),
            s(&(cli.qos / 2).max(1)),
            s(&"--quiet"),
            s(&"--id"),
            s(&"persister-drain"),
        ];
        let p = phase("drain", argv, total, cli.size, pid, start, stop.clone()).await?;
        bar.println(&phase_line(&p));
        result.phases.push(p);
        bar.inc(1);
        let mut cleanup = Connection::open(&uri, 0, "warren-perf-persister-cleanup").await?;
        cleanup.open_channel(1).await?;
        cleanup.delete_queue(1, &cli.queue).await?;
        cleanup.close().await;
    }
    bar.finish();
    done.store(true, Ordering::Relaxed);
    if let Some(h) = sampler {
        result.io = h.await.unwrap_or_default();
    }
    for f in write_outputs(&result, &cli.out)? {
        println!("wrote {}", f.display());
    }
    Ok(result)
}

/// Writes dirty pages out and drops the page cache, so the drain's reads hit the disk.
fn drop_page_cache() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    if let Err(e) = std::fs::write("/proc/sys/vm/drop_caches", "3") {
        eprintln!("warren perf persister: --drop-caches failed ({e}); the drain may read from the page cache");
    }
}

pub fn phase_line(p: &Phase) -> String {
    format!(
        "{}: {} messages in {:.2} s ({:.0} msg/s), broker wrote {:.1} MB ({:.2} bytes per payload byte), read {:.1} MB ({:.2} per payload byte)",
        p.name,
        p.messages,
        p.duration_s,
        p.rate_msg_s,
        p.broker_write_bytes as f64 / 1e6,
        p.write_bytes_per_payload_byte,
        p.broker_read_bytes as f64 / 1e6,
        p.read_bytes_per_payload_byte
    )
}

pub const PHASES_CSV_HEADER: &str = "phase,messages,payload_bytes,duration_s,rate_msg_s,broker_write_bytes,broker_read_bytes,write_bytes_per_payload_byte,read_bytes_per_payload_byte";

pub fn charts(r: &PersisterResult) -> Vec<(&'static str, Chart)> {
    let mut rate_series = Vec::new();
    for p in &r.phases {
        let drain = p.name == "drain";
        let pts = p
            .run
            .samples
            .iter()
            .map(|s| {
                (
                    p.offset_s + s.time_s,
                    if drain {
                        s.received_rate
                    } else {
                        s.confirmed_rate
                    },
                )
            })
            .collect();
        rate_series.push(Series::new(p.name.clone(), pts));
    }
    vec![
        (
            "rates",
            Chart {
                title: format!(
                    "persister: {} B messages, {}",
                    r.size_bytes,
                    if r.lazy {
                        "lazy queue"
                    } else {
                        "durable queue"
                    }
                ),
                x_label: "time (s)".into(),
                y_label: "msg/s (confirmed while publishing, received while draining)".into(),
                log_x: false,
                log_y: false,
                series: rate_series,
            },
        ),
        (
            "disk",
            Chart {
                title: "broker disk traffic".into(),
                x_label: "time (s)".into(),
                y_label: "MB/s".into(),
                log_x: false,
                log_y: false,
                series: vec![
                    Series::new(
                        "written",
                        r.io.iter()
                            .map(|s| (s.time_s, s.write_bytes_s / 1e6))
                            .collect(),
                    ),
                    Series::new(
                        "read",
                        r.io.iter()
                            .map(|s| (s.time_s, s.read_bytes_s / 1e6))
                            .collect(),
                    ),
                ],
            },
        ),
    ]
}

pub fn write_outputs(r: &PersisterResult, out: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out)?;
    let mut csv = String::from(PHASES_CSV_HEADER);
    csv.push('\n');
    for p in &r.phases {
        let _ = writeln!(
            csv,
            "{},{},{},{:.3},{:.1},{},{},{:.4},{:.4}",
            p.name,
            p.messages,
            p.payload_bytes,
            p.duration_s,
            p.rate_msg_s,
            p.broker_write_bytes,
            p.broker_read_bytes,
            p.write_bytes_per_payload_byte,
            p.read_bytes_per_payload_byte
        );
    }
    let mut files = vec![out.join("persister.json"), out.join("phases.csv")];
    write_text(&files[0], &serde_json::to_string_pretty(r)?)?;
    write_text(&files[1], &csv)?;
    let mut svgs = Vec::new();
    for (name, chart) in charts(r) {
        let (png, svg) = chart.write(&out.join(name))?;
        svgs.push((chart.title.clone(), svg.clone()));
        files.push(png);
        files.push(svg);
    }
    let mut body = String::from("<table><tr><th>phase</th><th>messages</th><th>seconds</th><th>msg/s</th><th>broker wrote MB</th><th>written per payload byte</th><th>broker read MB</th><th>read per payload byte</th></tr>");
    for p in &r.phases {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.0}</td><td>{:.1}</td><td>{:.2}</td><td>{:.1}</td><td>{:.2}</td></tr>",
            report::escape(&p.name), p.messages, p.duration_s, p.rate_msg_s, p.broker_write_bytes as f64 / 1e6,
            p.write_bytes_per_payload_byte, p.broker_read_bytes as f64 / 1e6, p.read_bytes_per_payload_byte
        );
    }
    body.push_str("</table>");
    body.push_str(&report::inline_svgs(&svgs)?);
    let html = out.join("report.html");
    write_text(&html, &report::page("warren perf persister", &body))?;
    files.push(html);
    Ok(files)
}
