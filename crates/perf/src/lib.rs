//! The measuring toolkit behind `warren perf`: a PerfTest-compatible load generator and the
//! studies of the seed articles, usable against any AMQP 0-9-1 broker.
//!
//! Map of the crate:
//! - `cli`: PerfTest's flags (single-dash multi-letter ones included) and the studies' flags.
//! - `client`: a small AMQP client; `client::wire` is the framing.
//! - `workload`: producers, consumers and the per-interval reporter of one run;
//!   `rate_limiter`: their pacing under -r and -R.
//! - `stats`: counters and HdrHistograms shared by a run's tasks.
//! - `procfs`: CPU, memory and disk bytes of the broker (and of ourselves) from /proc.
//! - `sweep`: increasing-intensity steps (seed 000) with pass/fail per step.
//! - `cost`: the instances price table and the leaderboards.
//! - `scale`: the queues x bindings ScalabilityTest (seed 002).
//! - `persister`: fill a durable queue and drain it, counting disk bytes (seed 004).
//! - `stream`: stream-perf-test over RabbitMQ's stream protocol: its client, chunks and run.
//! - `charts`, `report`, `output`: PNG/SVG charts, the HTML report, JSON and CSV.
//!
//! A command flows: argv -> `cli::parse` -> a study -> `workload::run_workload` (one or many
//! times) -> results -> files and a summary on stdout.

pub mod charts;
pub mod cli;
pub mod client;
pub mod cost;
pub mod output;
pub mod persister;
pub mod procfs;
pub mod progress;
pub mod rate_limiter;
pub mod report;
pub mod scale;
pub mod stats;
pub mod stream;
pub mod sweep;
pub mod workload;

use anyhow::{bail, Result};
use cli::PerfCommand;
use tokio::sync::watch;

/// `warren perf ...`: everything after `perf` is passed through untouched and parsed here, so
/// PerfTest's `-ct`, `-qa`, `-h <uri>` and negative values survive the outer parser.
#[derive(clap::Args, Debug, Clone, Default)]
#[command(disable_help_flag = true)]
pub struct PerfArgs {
    /// PerfTest flags, or a study: sweep, scale, persister, leaderboard, stream. `-?` for help.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub argv: Vec<String>,
}

/// Runs `warren perf`. Bad flags print clap's message and exit with code 2, as PerfTest does
/// with its usage error; `-?`/`--help` prints help and exits 0. The toolkit runs on its own
/// thread and runtime, so the caller may or may not be inside a tokio runtime.
pub fn run(args: PerfArgs) -> Result<()> {
    let command = match cli::parse(&args.argv) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let handle = std::thread::Builder::new()
        .name("warren-perf".into())
        .spawn(move || run_command(command))?;
    match handle.join() {
        Ok(r) => r,
        Err(_) => bail!("warren perf panicked"),
    }
}

/// Runs a parsed command on a fresh single-threaded runtime: one thread keeps the load
/// generator's CPU cost low on machines it shares with the broker.
pub fn run_command(command: PerfCommand) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("interrupted: stopping and reporting the results so far");
                let _ = stop_tx.send(true);
            }
        });
        match command {
            PerfCommand::Run(w) => run_perftest(&w, stop_rx).await,
            PerfCommand::Sweep(s) => sweep::run(&s, stop_rx).await.map(|_| ()),
            PerfCommand::Scale(s) => scale::run(&s, stop_rx).await.map(|_| ()),
            PerfCommand::Persister(p) => persister::run(&p, stop_rx).await.map(|_| ()),
            PerfCommand::Leaderboard(l) => cost::run_leaderboard(&l),
            PerfCommand::Stream(s) => run_stream(&s, stop_rx).await,
        }
    })
}

async fn run_perftest(w: &cli::WorkloadArgs, stop: watch::Receiver<bool>) -> Result<()> {
    let progress = progress::for_duration(w.time_s.filter(|_| w.quiet), "run");
    let print = |line: &str| println!("{line}");
    let result =
        workload::run_workload(w, stop, (!w.quiet).then_some(&print as &dyn Fn(&str))).await;
    progress.finish();
    let result = result?;
    println!("test stopped ({})", result.stop_reason);
    for line in result.summary_lines() {
        println!("{line}");
    }
    if let Some(p) = &w.json {
        output::write_run_json(p, &result)?;
    }
    if let Some(p) = &w.csv {
        output::write_run_csv(p, &result)?;
    }
    if !result.errors.is_empty() {
        bail!("the run stopped on errors: {}", result.errors.join("; "));
    }
    Ok(())
}

async fn run_stream(s: &cli::StreamCli, stop: watch::Receiver<bool>) -> Result<()> {
    let progress = progress::for_duration(s.time_s.filter(|_| s.quiet), "stream run");
    let print = |line: &str| println!("{line}");
    let result = stream::run(s, stop, (!s.quiet).then_some(&print as &dyn Fn(&str))).await;
    progress.finish();
    let result = result?;
    println!("test stopped ({})", result.stop_reason);
    for line in result.summary_lines() {
        println!("{line}");
    }
    if let Some(p) = &s.json {
        output::write_text(p, &serde_json::to_string_pretty(&result)?)?;
    }
    if !result.errors.is_empty() {
        bail!("the run stopped on errors: {}", result.errors.join("; "));
    }
    Ok(())
}
