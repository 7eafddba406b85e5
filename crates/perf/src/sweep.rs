//! The increasing-intensity test of the cluster-sizing study (seed 000): the same workload at
//! a list of target rates, a fixed time per step, and per step the rates reached, end-to-end
//! latency percentiles and what the broker spent (CPU, memory, disk bytes). A step passes when
//! it reaches its target within [`TARGET_TOLERANCE`] and its p99 stays under the SLO.

use crate::charts::{Chart, Series};
use crate::cli::{ConfigArgs, SweepCli, WorkloadArgs};
use crate::client::Uri;
use crate::cost::{self, ConfigInfo};
use crate::output::write_text;
use crate::procfs::{self, ProcDelta};
use crate::stats::Percentiles;
use crate::workload::{self, RunResult, Sample};
use crate::{progress, report};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tokio::sync::watch;

/// A step reaches its target when its achieved rate is at least this fraction below it.
pub const TARGET_TOLERANCE: f64 = 0.05;
pub const STEP_SECONDS_DEFAULT: u64 = 30;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
/// Missing fields read as defaults, so files from older versions still load.
#[serde(default)]
pub struct SweepStep {
    pub target_rate: f64,
    pub duration_s: f64,
    pub publish_rate: f64,
    pub consume_rate: f64,
    pub confirm_rate: f64,
    /// What the step delivered, per copy: min of publish rate and consume rate / fan-out.
    pub achieved_rate: f64,
    pub latency_us: Percentiles,
    pub confirm_latency_us: Percentiles,
    pub reached_target: bool,
    pub slo_met: bool,
    pub pass: bool,
    pub broker: Option<ProcDelta>,
    pub client_cpu_us_per_msg: f64,
    /// Seconds since the start of the sweep at which this step started.
    pub offset_s: f64,
    pub samples: Vec<Sample>,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
/// Missing fields read as defaults, so files from older versions still load.
#[serde(default)]
pub struct SweepResult {
    pub id: String,
    pub config: ConfigInfo,
    pub workload: String,
    pub slo_ms: f64,
    /// The broker processes measured (summed): one per node on this host.
    pub broker_pids: Vec<u32>,
    pub steps: Vec<SweepStep>,
    pub stop_reason: String,
}

impl SweepResult {
    /// The highest rate any step delivered.
    pub fn top_rate(&self) -> f64 {
        self.steps
            .iter()
            .map(|s| s.achieved_rate)
            .fold(0.0, f64::max)
    }

    /// The highest target a step met (rate and SLO).
    pub fn top_passing_target(&self) -> Option<f64> {
        self.steps
            .iter()
            .filter(|s| s.pass)
            .map(|s| s.target_rate)
            .reduce(f64::max)
    }
}

/// How many copies of each message the consumers get: PerfTest gives each consumer its own
/// queue when no queue name or pattern is set.
pub fn fanout(w: &WorkloadArgs) -> f64 {
    if w.queue.is_none() && w.queue_pattern.is_none() {
        w.consumers.max(1) as f64
    } else {
        1.0
    }
}

pub fn step_from_run(
    target: f64,
    run: &RunResult,
    fanout: f64,
    slo_ms: f64,
    broker: Option<ProcDelta>,
    offset_s: f64,
) -> SweepStep {
    let consumed_per_copy = run.receive_rate_avg / fanout.max(1.0);
    let achieved = if run.consumers == 0 {
        run.send_rate_avg
    } else {
        run.send_rate_avg.min(consumed_per_copy)
    };
    let reached_target = achieved >= target * (1.0 - TARGET_TOLERANCE);
    let slo_met = run.consumers == 0
        || (run.latency_us.count > 0 && (run.latency_us.p99 as f64) < slo_ms * 1000.0);
    SweepStep {
        target_rate: target,
        duration_s: run.duration_s,
        publish_rate: run.send_rate_avg,
        consume_rate: run.receive_rate_avg,
        confirm_rate: run.confirm_rate_avg,
        achieved_rate: achieved,
        latency_us: run.latency_us,
        confirm_latency_us: run.confirm_latency_us,
        reached_target,
        slo_met,
        pass: reached_target && slo_met && run.errors.is_empty(),
        broker,
        client_cpu_us_per_msg: run.client_cpu_us_per_msg,
        offset_s,
        samples: run.samples.clone(),
        errors: run.errors.clone(),
    }
}

/// The broker processes to measure: given, or every distinct process listening on a URI's
/// port on this host (a local cluster is summed node by node).
fn broker_pids(cli: &SweepCli) -> Vec<u32> {
    if !cli.broker_pid.is_empty() {
        return cli.broker_pid.clone();
    }
    let mut pids = Vec::new();
    for u in cli.workload.uris() {
        let Ok(uri) = Uri::parse(&u) else { continue };
        match procfs::find_pid_by_port(uri.port) {
            Ok(pid) if !pids.contains(&pid) => pids.push(pid),
            Ok(_) => {}
            Err(e) => eprintln!("warren perf sweep: broker at {u} not measured: {e:#}"),
        }
    }
    pids
}

pub async fn run(cli: &SweepCli, mut stop: watch::Receiver<bool>) -> Result<SweepResult> {
    std::fs::create_dir_all(&cli.out).with_context(|| format!("creating {}", cli.out.display()))?;
    let table = cost::load_table(cli.config.instances.as_deref())?;
    let config = config_info(&cli.config, &table)?;
    let step_s = cli
        .step_s
        .or(cli.workload.time_s)
        .unwrap_or(STEP_SECONDS_DEFAULT);
    let pids = broker_pids(cli);
    let id = cli.workload.id.clone().unwrap_or_else(workload::default_id);
    let fan = fanout(&cli.workload);
    let mut result = SweepResult {
        id: id.clone(),
        config,
        workload: describe_workload(&cli.workload),
        slo_ms: cli.slo_ms,
        broker_pids: pids.clone(),
        steps: Vec::new(),
        stop_reason: "Completed every step".into(),
    };
    let bar = progress::for_steps(cli.rates.0.len() as u64, "sweep");
    let sweep_start = Instant::now();
    for (i, &target) in cli.rates.0.iter().enumerate() {
        if *stop.borrow() {
            result.stop_reason = "Interrupted".into();
            break;
        }
        bar.set_message(format!("step {} at {target:.0} msg/s", i + 1));
        let mut w = cli.workload.clone();
        w.rate = Some(target / w.producers.max(1) as f64);
        // Producers that start at random within -prsd seconds would drag the step's average
        // below its target: unless told otherwise, that ramp is the warm-up, and the step runs
        // its full measured length after it.
        if w.warmup_s == 0 {
            w.warmup_s = w.producer_random_start_delay_s;
        }
        w.time_s = Some(step_s + w.warmup_s);
        w.id = Some(format!("{id}-step{}", i + 1));
        w.json = None;
        w.csv = None;
        let offset_s = sweep_start.elapsed().as_secs_f64();
        let before = (!pids.is_empty())
            .then(|| procfs::sample_all(&pids).ok())
            .flatten();
        let t0 = Instant::now();
        let print = |line: &str| bar.println(line);
        let run = workload::run_workload(
            &w,
            stop.clone(),
            (!w.quiet).then_some(&print as &dyn Fn(&str)),
        )
        .await?;
        let broker = before.and_then(|b| {
            procfs::sample_all(&pids)
                .ok()
                .map(|a| a.delta(&b, t0.elapsed().as_secs_f64()))
        });
        let step = step_from_run(target, &run, fan, cli.slo_ms, broker, offset_s);
        bar.println(&step_line(&id, &step));
        result.steps.push(step);
        bar.inc(1);
        if run.stop_reason == "Interrupted"
            || stop.has_changed().unwrap_or(false) && *stop.borrow_and_update()
        {
            result.stop_reason = "Interrupted".into();
            break;
        }
    }
    bar.finish();
    let files = write_outputs(&result, &cli.out)?;
    println!(
        "sweep: {} steps, top rate {:.0} msg/s, highest passing target {}",
        result.steps.len(),
        result.top_rate(),
        result
            .top_passing_target()
            .map(|t| format!("{t:.0} msg/s"))
            .unwrap_or_else(|| "none".into())
    );
    for f in files {
        println!("wrote {}", f.display());
    }
    Ok(result)
}

pub fn config_info(c: &ConfigArgs, table: &cost::PriceTable) -> Result<ConfigInfo> {
    let monthly = match &c.instance_type {
        Some(t) => Some(table.monthly_usd(
            t,
            c.nodes,
            c.storage.as_deref(),
            c.storage_gb,
            c.storage_iops,
        )?),
        None => None,
    };
    let name = c
        .config_name
        .clone()
        .unwrap_or_else(|| match &c.instance_type {
            Some(t) => format!(
                "{} x {t}{}",
                c.nodes,
                c.storage
                    .as_deref()
                    .map(|s| format!(" {s}"))
                    .unwrap_or_default()
            ),
            None => "this broker".into(),
        });
    Ok(ConfigInfo {
        name,
        instance_type: c.instance_type.clone(),
        nodes: c.nodes,
        storage: c.storage.clone(),
        storage_gb: c.storage_gb,
        storage_iops: c.storage_iops,
        monthly_usd: monthly,
    })
}

fn describe_workload(w: &WorkloadArgs) -> String {
    let mut s = format!(
        "producers {} consumers {} size {} B confirm {} qos {}",
        w.producers, w.consumers, w.size, w.confirm, w.qos
    );
    if !w.flags.is_empty() {
        let _ = write!(s, " flags {}", w.flags.join("+"));
    }
    let args = w.declare_arguments();
    if !args.is_empty() {
        let _ = write!(s, " queue-args {}", workload::describe_args(&args));
    }
    if let Some(qs) = w.pattern_queues() {
        let _ = write!(s, " queues {}", qs.len());
    }
    s
}

pub fn step_line(id: &str, s: &SweepStep) -> String {
    let broker = s
        .broker
        .map(|b| {
            format!(
                ", broker cpu {:.2} cores rss {:.0} MiB disk write {:.1} MB/s read {:.1} MB/s",
                b.cpu_cores,
                b.rss_bytes_end as f64 / 1048576.0,
                b.disk_write_bytes as f64 / 1e6 / b.elapsed_s.max(1e-9),
                b.disk_read_bytes as f64 / 1e6 / b.elapsed_s.max(1e-9)
            )
        })
        .unwrap_or_default();
    format!(
        "id: {id}, step target {:.0} msg/s: published {:.0} msg/s, consumed {:.0} msg/s, latency p50/p99/p99.9 {}/{}/{} µs, {}{}",
        s.target_rate,
        s.publish_rate,
        s.consume_rate,
        s.latency_us.p50,
        s.latency_us.p99,
        s.latency_us.p999,
        if s.pass { "PASS" } else if !s.reached_target { "FAIL (rate)" } else { "FAIL (latency)" },
        broker
    )
}

pub const STEPS_CSV_HEADER: &str = "target_msg_s,duration_s,publish_msg_s,consume_msg_s,confirm_msg_s,achieved_msg_s,\
latency_us_min,latency_us_p50,latency_us_p75,latency_us_p95,latency_us_p99,latency_us_p999,latency_us_max,\
confirm_latency_us_p50,confirm_latency_us_p99,reached_target,slo_met,pass,\
broker_cpu_cores,broker_rss_bytes,broker_disk_write_bytes,broker_disk_read_bytes,client_cpu_us_per_msg";

pub fn steps_csv(r: &SweepResult) -> String {
    let mut out = String::from(STEPS_CSV_HEADER);
    out.push('\n');
    for s in &r.steps {
        let l = &s.latency_us;
        let b = s.broker.unwrap_or_default();
        let _ = writeln!(
            out,
            "{:.0},{:.3},{:.1},{:.1},{:.1},{:.1},{},{},{},{},{},{},{},{},{},{},{},{},{:.3},{},{},{},{:.3}",
            s.target_rate,
            s.duration_s,
            s.publish_rate,
            s.consume_rate,
            s.confirm_rate,
            s.achieved_rate,
            l.min,
            l.p50,
            l.p75,
            l.p95,
            l.p99,
            l.p999,
            l.max,
            s.confirm_latency_us.p50,
            s.confirm_latency_us.p99,
            s.reached_target,
            s.slo_met,
            s.pass,
            b.cpu_cores,
            b.rss_bytes_end,
            b.disk_write_bytes,
            b.disk_read_bytes,
            s.client_cpu_us_per_msg
        );
    }
    out
}

/// Latency over the whole sweep, one row per interval, time from the start of the sweep.
pub fn timeline_csv(r: &SweepResult) -> String {
    let mut out = String::from("time_s,target_msg_s,sent_msg_s,received_msg_s,latency_us_p50,latency_us_p75,latency_us_p95,latency_us_p99,latency_us_p999,latency_us_max\n");
    for s in &r.steps {
        for x in &s.samples {
            let _ = writeln!(
                out,
                "{:.3},{:.0},{:.1},{:.1},{},{},{},{},{},{}",
                s.offset_s + x.time_s,
                s.target_rate,
                x.sent_rate,
                x.received_rate,
                x.latency_us.p50,
                x.latency_us.p75,
                x.latency_us.p95,
                x.latency_us.p99,
                x.latency_us.p999,
                x.latency_us.max
            );
        }
    }
    out
}

pub fn charts(r: &SweepResult) -> Vec<(&'static str, Chart)> {
    let steps = &r.steps;
    let rates = Chart {
        title: format!("{}: rate reached per step", r.config.name),
        x_label: "target rate (msg/s)".into(),
        y_label: "msg/s".into(),
        log_x: false,
        log_y: false,
        series: vec![
            Series::new(
                "target",
                steps
                    .iter()
                    .map(|s| (s.target_rate, s.target_rate))
                    .collect(),
            )
            .dashed(),
            Series::new(
                "published",
                steps
                    .iter()
                    .map(|s| (s.target_rate, s.publish_rate))
                    .collect(),
            )
            .with_markers(),
            Series::new(
                "consumed",
                steps
                    .iter()
                    .map(|s| (s.target_rate, s.consume_rate))
                    .collect(),
            )
            .with_markers(),
        ],
    };
    let pct = |name: &str, f: fn(&Percentiles) -> u64| {
        Series::new(
            name,
            steps
                .iter()
                .map(|s| (s.target_rate, f(&s.latency_us) as f64 / 1000.0))
                .collect(),
        )
        .with_markers()
    };
    let mut lat_series = vec![
        pct("p50", |p| p.p50),
        pct("p75", |p| p.p75),
        pct("p95", |p| p.p95),
        pct("p99", |p| p.p99),
        pct("p99.9", |p| p.p999),
    ];
    lat_series.push(
        Series::new(
            "SLO",
            steps.iter().map(|s| (s.target_rate, r.slo_ms)).collect(),
        )
        .dashed(),
    );
    let latency = Chart {
        title: format!("{}: end-to-end latency per step", r.config.name),
        x_label: "target rate (msg/s)".into(),
        y_label: "latency (ms, log)".into(),
        log_x: false,
        log_y: true,
        series: lat_series,
    };
    let over_time = |name: &str, f: fn(&Percentiles) -> u64| {
        Series::new(
            name,
            steps
                .iter()
                .flat_map(|s| {
                    s.samples
                        .iter()
                        .map(move |x| (s.offset_s + x.time_s, f(&x.latency_us) as f64 / 1000.0))
                })
                .collect(),
        )
    };
    let timeline = Chart {
        title: format!("{}: end-to-end latency over time", r.config.name),
        x_label: "time (s)".into(),
        y_label: "latency (ms, log)".into(),
        log_x: false,
        log_y: true,
        series: vec![
            over_time("p50", |p| p.p50),
            over_time("p95", |p| p.p95),
            over_time("p99", |p| p.p99),
            over_time("max", |p| p.max),
        ],
    };
    let per_second = |name: &str, f: fn(&Sample) -> f64| {
        Series::new(
            name,
            steps
                .iter()
                .flat_map(|s| s.samples.iter().map(move |x| (s.offset_s + x.time_s, f(x))))
                .collect(),
        )
    };
    // The target as a staircase: flat over each step's samples.
    let target_steps = Series::new(
        "target",
        steps
            .iter()
            .flat_map(|s| {
                let first = s
                    .samples
                    .first()
                    .map(|x| s.offset_s + x.time_s - 1.0)
                    .unwrap_or(s.offset_s);
                let last = s
                    .samples
                    .last()
                    .map(|x| s.offset_s + x.time_s)
                    .unwrap_or(s.offset_s);
                [
                    (first.max(s.offset_s), s.target_rate),
                    (last, s.target_rate),
                ]
            })
            .collect(),
    )
    .dashed();
    let rates_over_time = Chart {
        title: format!("{}: rates over time", r.config.name),
        x_label: "time (s)".into(),
        y_label: "msg/s".into(),
        log_x: false,
        log_y: false,
        series: vec![
            target_steps,
            per_second("sent", |x| x.sent_rate),
            per_second("received", |x| x.received_rate),
        ],
    };
    vec![
        ("rates", rates),
        ("latency", latency),
        ("rates-over-time", rates_over_time),
        ("latency-over-time", timeline),
    ]
}

/// Writes sweep.json, steps.csv, timeline.csv, the charts (PNG and SVG) and report.html.
pub fn write_outputs(r: &SweepResult, out: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut files = Vec::new();
    let json = out.join("sweep.json");
    write_text(&json, &serde_json::to_string_pretty(r)?)?;
    files.push(json);
    let csv = out.join("steps.csv");
    write_text(&csv, &steps_csv(r))?;
    files.push(csv);
    let tl = out.join("timeline.csv");
    write_text(&tl, &timeline_csv(r))?;
    files.push(tl);
    let mut svgs = Vec::new();
    for (name, chart) in charts(r) {
        let (png, svg) = chart.write(&out.join(name))?;
        svgs.push((chart.title.clone(), svg.clone()));
        files.push(png);
        files.push(svg);
    }
    let html = out.join("report.html");
    write_text(&html, &report::sweep_html(r, &svgs)?)?;
    files.push(html);
    Ok(files)
}
