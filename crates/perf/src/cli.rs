//! The command line: PerfTest's flags with PerfTest's meaning, plus the studies' own flags.
//!
//! PerfTest (Apache Commons CLI) accepts single-dash multi-letter options such as `-ct`, `-ad`
//! and `-qa`; clap would read `-ct` as `-c t`. [`normalize_argv`] rewrites those tokens to their
//! long forms before clap sees them, so a command copied from PerfTest's docs runs as written.

use crate::client::wire::FieldValue;
use clap::{ArgAction, Args, Parser};
use std::path::PathBuf;

/// PerfTest's single-dash multi-letter options and the long option each one means.
pub const MULTI_LETTER_SHORTS: &[(&str, &str)] = &[
    ("-ad", "--auto-delete"),
    ("-ct", "--confirm-timeout"),
    ("-qa", "--queue-args"),
    ("-qp", "--queue-pattern"),
    ("-qpf", "--queue-pattern-from"),
    ("-qpt", "--queue-pattern-to"),
    ("-prsd", "--producer-random-start-delay"),
    ("-hst", "--heartbeat-sender-threads"),
    ("-ms", "--use-millis"),
    ("-sb", "--skip-binding-queues"),
    ("-qq", "--quorum-queue"),
    ("-mf", "--metrics-format"),
];

/// Rewrites PerfTest's multi-letter short options to long ones (also in `-ct=5` form).
pub fn normalize_argv<S: AsRef<str>>(argv: &[S]) -> Vec<String> {
    argv.iter()
        .map(|a| {
            let a = a.as_ref();
            let (flag, value) = match a.split_once('=') {
                Some((f, v)) if f.starts_with('-') && !f.starts_with("--") => (f, Some(v)),
                _ => (a, None),
            };
            match MULTI_LETTER_SHORTS.iter().find(|(short, _)| *short == flag) {
                Some((_, long)) => match value {
                    Some(v) => format!("{long}={v}"),
                    None => long.to_string(),
                },
                None => a.to_string(),
            }
        })
        .collect()
}

/// The workload: every flag of `warren perf`, each with PerfTest's name and meaning.
#[derive(Args, Debug, Clone)]
pub struct WorkloadArgs {
    /// Connection URI(s), comma separated (PerfTest: -h/--uri).
    #[arg(short = 'h', long = "uri", default_value = "amqp://localhost")]
    pub uri: String,
    /// Connection URIs, comma separated; connections are spread over them round-robin.
    #[arg(short = 'H', long = "uris")]
    pub uris: Option<String>,
    /// Producer count (one connection each).
    #[arg(short = 'x', long = "producers", default_value_t = 1)]
    pub producers: u32,
    /// Consumer count (one connection each).
    #[arg(short = 'y', long = "consumers", default_value_t = 1)]
    pub consumers: u32,
    /// Queue name; default is server-named.
    #[arg(short = 'u', long = "queue")]
    pub queue: Option<String>,
    /// Exchange name.
    #[arg(short = 'e', long = "exchange", default_value = "direct")]
    pub exchange: String,
    /// Exchange type.
    #[arg(short = 't', long = "type", default_value = "direct")]
    pub exchange_type: String,
    /// Routing key; default is generated.
    #[arg(short = 'k', long = "routing-key")]
    pub routing_key: Option<String>,
    /// Message size in bytes (minimum 12: sequence number and timestamp).
    #[arg(short = 's', long = "size", default_value_t = 12)]
    pub size: usize,
    /// Producer rate limit in msg/s, per producer.
    #[arg(short = 'r', long = "rate")]
    pub rate: Option<f64>,
    /// Consumer rate limit in msg/s, per consumer.
    #[arg(short = 'R', long = "consumer-rate")]
    pub consumer_rate: Option<f64>,
    /// Run duration in seconds (unlimited by default).
    #[arg(short = 'z', long = "time")]
    pub time_s: Option<u64>,
    /// Messages per producer (0: no limit).
    #[arg(short = 'C', long = "pmessages", default_value_t = 0)]
    pub pmessages: u64,
    /// Messages per consumer (0: no limit).
    #[arg(short = 'D', long = "cmessages", default_value_t = 0)]
    pub cmessages: u64,
    /// Message flag: persistent or mandatory; repeat for several.
    #[arg(short = 'f', long = "flag", action = ArgAction::Append, value_parser = ["persistent", "mandatory"])]
    pub flags: Vec<String>,
    /// Max unconfirmed publishes per producer (-1: no confirms).
    #[arg(short = 'c', long = "confirm", default_value_t = -1, allow_negative_numbers = true)]
    pub confirm: i64,
    /// -ct: seconds an unconfirmed publish may wait before the producer fails (-1: forever).
    #[arg(
        long = "confirm-timeout",
        default_value_t = 30,
        allow_negative_numbers = true
    )]
    pub confirm_timeout_s: i64,
    /// Consumer prefetch count (0: unlimited).
    #[arg(short = 'q', long = "qos", default_value_t = 0)]
    pub qos: u16,
    /// Channel prefetch count (basic.qos global).
    #[arg(short = 'Q', long = "global-qos", default_value_t = 0)]
    pub global_qos: u16,
    /// Auto-ack: consumers do not acknowledge.
    #[arg(short = 'a', long = "autoack")]
    pub autoack: bool,
    /// -ad: whether declared queues are auto-delete (true/false).
    #[arg(long = "auto-delete", default_value_t = true, action = ArgAction::Set)]
    pub auto_delete: bool,
    /// -qa: queue arguments `k=v,k=v`; integer values are sent as integers.
    #[arg(long = "queue-args", value_parser = parse_queue_args)]
    pub queue_args: Option<QueueArgs>,
    /// -qq: declare quorum queues (adds x-queue-type=quorum).
    #[arg(long = "quorum-queue")]
    pub quorum_queue: bool,
    /// Use exchange and queues that exist already (declaring only what is missing), as
    /// PerfTest does; queues are bound either way.
    #[arg(short = 'p', long = "predeclared")]
    pub predeclared: bool,
    /// Ack with multiple=true every N messages (0: ack each message).
    #[arg(short = 'A', long = "multi-ack-every", default_value_t = 0)]
    pub multi_ack_every: u32,
    /// Consumer processing time per message in microseconds.
    #[arg(short = 'L', long = "consumer-latency", default_value_t = 0)]
    pub consumer_latency_us: u64,
    /// -qp: queue name pattern with %d, e.g. perf-test-%d.
    #[arg(long = "queue-pattern")]
    pub queue_pattern: Option<String>,
    /// -qpf: first number of the queue pattern (inclusive).
    #[arg(long = "queue-pattern-from")]
    pub queue_pattern_from: Option<u32>,
    /// -qpt: last number of the queue pattern (inclusive).
    #[arg(long = "queue-pattern-to")]
    pub queue_pattern_to: Option<u32>,
    /// -prsd: max random delay in seconds before each producer starts.
    #[arg(long = "producer-random-start-delay", default_value_t = 0)]
    pub producer_random_start_delay_s: u64,
    /// Requested heartbeat interval in seconds (0: take the broker's).
    #[arg(short = 'b', long = "heartbeat", default_value_t = 0)]
    pub heartbeat_s: u16,
    /// -hst: accepted for PerfTest compatibility; every connection runs on one runtime here.
    #[arg(long = "heartbeat-sender-threads")]
    pub heartbeat_sender_threads: Option<u32>,
    /// Test ID (default test-HHMMSS-mmm).
    #[arg(short = 'd', long = "id")]
    pub id: Option<String>,
    /// -ms: timestamps in epoch milliseconds instead of monotonic nanoseconds (for producers and
    /// consumers on different machines).
    #[arg(long = "use-millis")]
    pub use_millis: bool,
    /// -sb: do not bind queues to the exchange.
    #[arg(long = "skip-binding-queues")]
    pub skip_binding_queues: bool,
    /// Sampling interval in seconds for the per-interval lines.
    #[arg(short = 'i', long = "interval", default_value_t = 1)]
    pub interval_s: u64,
    /// -mf: accepted for PerfTest compatibility: default or compact.
    #[arg(long = "metrics-format", value_parser = ["default", "compact"])]
    pub metrics_format: Option<String>,
    /// Seconds at the start left out of the averages and run percentiles (ramp-up, random
    /// start delays); not a PerfTest flag. Per-second lines still show them.
    #[arg(long = "warmup-seconds", default_value_t = 0)]
    pub warmup_s: u64,
    /// Write the run's results (summary and per-interval samples) as JSON to this file.
    #[arg(long = "json")]
    pub json: Option<PathBuf>,
    /// Write the per-interval samples as CSV to this file.
    #[arg(long = "csv")]
    pub csv: Option<PathBuf>,
    /// Only print the summary, not a line per interval.
    #[arg(long = "quiet")]
    pub quiet: bool,
}

/// Queue arguments as PerfTest reads them: `k=v` pairs, integers detected.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueueArgs(pub Vec<(String, FieldValue)>);

pub fn parse_queue_args(s: &str) -> Result<QueueArgs, String> {
    let mut out = Vec::new();
    for pair in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("expected key=value, got {pair:?}"))?;
        if k.is_empty() {
            return Err(format!("empty key in {pair:?}"));
        }
        let value = match v.parse::<i64>() {
            Ok(n) => FieldValue::Long(n),
            Err(_) => FieldValue::Str(v.to_string()),
        };
        out.push((k.to_string(), value));
    }
    Ok(QueueArgs(out))
}

impl WorkloadArgs {
    pub fn uris(&self) -> Vec<String> {
        let list = self.uris.as_deref().unwrap_or(&self.uri);
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    }

    pub fn persistent(&self) -> bool {
        self.flags.iter().any(|f| f == "persistent")
    }

    pub fn mandatory(&self) -> bool {
        self.flags.iter().any(|f| f == "mandatory")
    }

    /// Queue names when a pattern is given, in PerfTest's order.
    pub fn pattern_queues(&self) -> Option<Vec<String>> {
        let pattern = self.queue_pattern.as_ref()?;
        let from = self.queue_pattern_from.unwrap_or(1);
        let to = self.queue_pattern_to.unwrap_or(from);
        Some(
            (from..=to)
                .map(|i| pattern.replacen("%d", &i.to_string(), 1))
                .collect(),
        )
    }

    /// Arguments sent with queue.declare: -qa plus x-queue-type when -qq is set.
    pub fn declare_arguments(&self) -> Vec<(String, FieldValue)> {
        let mut args = self.queue_args.clone().unwrap_or_default().0;
        if self.quorum_queue && !args.iter().any(|(k, _)| k == "x-queue-type") {
            args.push(("x-queue-type".into(), FieldValue::Str("quorum".into())));
        }
        args
    }

    /// Checks combinations clap cannot express, naming the offending flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.size < 12 {
            return Err(format!(
                "--size must be at least 12 (sequence and timestamp), got {}",
                self.size
            ));
        }
        if self.size > MESSAGE_SIZE_MAX {
            return Err(format!(
                "--size must be at most {MESSAGE_SIZE_MAX}, got {}",
                self.size
            ));
        }
        if let Some(r) = self.rate {
            if !(r.is_finite() && r >= 0.0) {
                return Err(format!("--rate must be a non-negative number, got {r}"));
            }
        }
        if let Some(r) = self.consumer_rate {
            if !(r.is_finite() && r >= 0.0) {
                return Err(format!(
                    "--consumer-rate must be a non-negative number, got {r}"
                ));
            }
        }
        if self.confirm == 0 || self.confirm < -1 || self.confirm > CONFIRM_WINDOW_MAX as i64 {
            return Err(format!(
                "--confirm must be -1 (off) or between 1 and {CONFIRM_WINDOW_MAX}, got {}",
                self.confirm
            ));
        }
        if self.queue_pattern.is_some() {
            let from = self.queue_pattern_from.unwrap_or(1);
            let to = self.queue_pattern_to.unwrap_or(from);
            if to < from {
                return Err(format!(
                    "--queue-pattern-to ({to}) is below --queue-pattern-from ({from})"
                ));
            }
            if to - from >= QUEUES_MAX {
                return Err(format!(
                    "--queue-pattern range covers more than {QUEUES_MAX} queues"
                ));
            }
            if !self.queue_pattern.as_deref().unwrap_or("").contains("%d") {
                return Err("--queue-pattern must contain %d".into());
            }
        }
        if self.producers + self.consumers > CONNECTIONS_MAX {
            return Err(format!(
                "--producers plus --consumers must be at most {CONNECTIONS_MAX}"
            ));
        }
        if self.interval_s == 0 {
            return Err("--interval must be at least 1 second".into());
        }
        if self.uris().is_empty() {
            return Err("--uri must name at least one broker".into());
        }
        for u in self.uris() {
            crate::client::Uri::parse(&u).map_err(|e| format!("--uri: {e}"))?;
        }
        Ok(())
    }
}

/// Bounds that keep one process from exhausting memory or file descriptors.
pub const MESSAGE_SIZE_MAX: usize = 64 * 1024 * 1024;
pub const CONFIRM_WINDOW_MAX: usize = 1 << 20;
pub const QUEUES_MAX: u32 = 100_000;
pub const CONNECTIONS_MAX: u32 = 20_000;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "warren perf",
    disable_help_flag = true,
    about = "PerfTest-compatible load generator",
    after_help = "Studies (each with its own -?): warren perf sweep | scale | persister | leaderboard"
)]
pub struct RunCli {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[arg(short = '?', long = "help", action = ArgAction::Help)]
    help: Option<bool>,
}

/// The increasing-intensity study of seed 000.
#[derive(Parser, Debug, Clone)]
#[command(name = "warren perf sweep", disable_help_flag = true)]
pub struct SweepCli {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Total target rates in msg/s (spread over the producers): `1000,2000,5000` or a range
    /// `1000-10000:1000` (from-to:step).
    #[arg(long = "rates", value_parser = parse_rates)]
    pub rates: Rates,
    /// Seconds per step (default: -z, else 30).
    #[arg(long = "step-seconds")]
    pub step_s: Option<u64>,
    /// p99 end-to-end latency objective in milliseconds: a step passes below it.
    #[arg(long = "slo-ms", default_value_t = 1000.0)]
    pub slo_ms: f64,
    /// The broker's process ID(s), comma separated for a cluster on this host (default: the
    /// processes listening on the URIs' ports).
    #[arg(long = "broker-pid", value_delimiter = ',')]
    pub broker_pid: Vec<u32>,
    /// Directory for CSV, JSON, charts and the HTML report.
    #[arg(long = "out", default_value = "warren-perf-sweep")]
    pub out: PathBuf,
    #[command(flatten)]
    pub config: ConfigArgs,
    #[arg(short = '?', long = "help", action = ArgAction::Help)]
    help: Option<bool>,
}

/// What cluster a run measured, to price it.
#[derive(Args, Debug, Clone)]
pub struct ConfigArgs {
    /// A name for this configuration in reports and leaderboards.
    #[arg(long = "config-name")]
    pub config_name: Option<String>,
    /// Instance type from the instances table (e.g. c5.2xlarge).
    #[arg(long = "instance-type")]
    pub instance_type: Option<String>,
    /// Number of broker nodes.
    #[arg(long = "nodes", default_value_t = 1)]
    pub nodes: u32,
    /// Storage kind from the instances table (e.g. gp2, io1).
    #[arg(long = "storage")]
    pub storage: Option<String>,
    /// Storage size per node in GB.
    #[arg(long = "storage-gb", default_value_t = 1000)]
    pub storage_gb: u32,
    /// Provisioned IOPS per node (io1).
    #[arg(long = "storage-iops", default_value_t = 0)]
    pub storage_iops: u32,
    /// Instances and prices table (TOML); default is the one shipped with warren.
    #[arg(long = "instances")]
    pub instances: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rates(pub Vec<f64>);

/// Upper bound on sweep steps, so a typo in a range cannot schedule a week of testing.
pub const SWEEP_STEPS_MAX: usize = 1000;

pub fn parse_rates(s: &str) -> Result<Rates, String> {
    let bad = |what: &str| format!("{what} in {s:?}: expected `1000,2000` or `1000-10000:1000`");
    let mut out = Vec::new();
    if let Some((range, step)) = s.split_once(':') {
        let (from, to) = range
            .split_once('-')
            .ok_or_else(|| bad("range without '-'"))?;
        let from: f64 = from.trim().parse().map_err(|_| bad("bad range start"))?;
        let to: f64 = to.trim().parse().map_err(|_| bad("bad range end"))?;
        let step: f64 = step.trim().parse().map_err(|_| bad("bad step"))?;
        if step <= 0.0 || from <= 0.0 || to < from {
            return Err(bad("empty range"));
        }
        let mut r = from;
        while r <= to * (1.0 + 1e-9) {
            out.push(r);
            if out.len() > SWEEP_STEPS_MAX {
                return Err(format!("more than {SWEEP_STEPS_MAX} steps in {s:?}"));
            }
            r += step;
        }
    } else {
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let r: f64 = part.trim().parse().map_err(|_| bad("bad rate"))?;
            if r <= 0.0 || !r.is_finite() {
                return Err(bad("rates must be positive"));
            }
            out.push(r);
        }
    }
    if out.is_empty() || out.len() > SWEEP_STEPS_MAX {
        return Err(bad("no rates"));
    }
    Ok(Rates(out))
}

/// The ScalabilityTest of seed 002.
#[derive(Parser, Debug, Clone)]
#[command(name = "warren perf scale", disable_help_flag = true)]
pub struct ScaleCli {
    #[arg(short = 'h', long = "uri", default_value = "amqp://localhost")]
    pub uri: String,
    /// Base of each order of magnitude.
    #[arg(short = 'b', long = "base", default_value_t = 2)]
    pub base: u32,
    /// Exponent of the largest queue count.
    #[arg(short = 'x', long = "queue-exponent", default_value_t = 8)]
    pub x: u32,
    /// Exponent of the largest bindings-per-queue count.
    #[arg(short = 'y', long = "binding-exponent", default_value_t = 6)]
    pub y: u32,
    /// Label of this series in charts.
    #[arg(short = 'f', long = "label", default_value = "broker")]
    pub label: String,
    /// Messages published per grid point to time routing.
    #[arg(short = 'n', long = "messages", default_value_t = 1000)]
    pub messages: u32,
    #[arg(long = "out", default_value = "warren-perf-scale")]
    pub out: PathBuf,
    /// Instead of running, draw earlier runs' scale.json files (comma separated) on the same
    /// log-log charts, as the article compares two brokers.
    #[arg(long = "compare", value_delimiter = ',')]
    pub compare: Vec<PathBuf>,
    #[arg(short = '?', long = "help", action = ArgAction::Help)]
    help: Option<bool>,
}

/// The persister test of seed 004.
#[derive(Parser, Debug, Clone)]
#[command(name = "warren perf persister", disable_help_flag = true)]
pub struct PersisterCli {
    #[arg(short = 'h', long = "uri", default_value = "amqp://localhost")]
    pub uri: String,
    /// Messages per round.
    #[arg(short = 'C', long = "messages", default_value_t = 100_000)]
    pub messages: u64,
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 1024)]
    pub size: usize,
    /// Publish rounds before draining (the seed ran 3 x 1M into the same queue).
    #[arg(long = "rounds", default_value_t = 1)]
    pub rounds: u32,
    /// Max unconfirmed publishes.
    #[arg(short = 'c', long = "confirm", default_value_t = 1000)]
    pub confirm: u32,
    /// Declare the queue with x-queue-mode=lazy (disk-only, as in the seed).
    #[arg(long = "lazy")]
    pub lazy: bool,
    /// Extra queue arguments `k=v,k=v`.
    #[arg(long = "queue-args", value_parser = parse_queue_args)]
    pub queue_args: Option<QueueArgs>,
    #[arg(short = 'u', long = "queue", default_value = "warren-perf-persister")]
    pub queue: String,
    /// Consumer prefetch while draining.
    #[arg(short = 'q', long = "qos", default_value_t = 1000)]
    pub qos: u16,
    /// Publish only: leave the messages in the queue.
    #[arg(long = "no-drain")]
    pub no_drain: bool,
    /// Drop the kernel's page cache before draining (needs root), as the seed did, so the drain
    /// reads from the disk rather than from memory. Slows everything else on the machine.
    #[arg(long = "drop-caches")]
    pub drop_caches: bool,
    #[arg(long = "broker-pid")]
    pub broker_pid: Option<u32>,
    #[arg(long = "out", default_value = "warren-perf-persister")]
    pub out: PathBuf,
    #[arg(short = '?', long = "help", action = ArgAction::Help)]
    help: Option<bool>,
}

/// Merges sweep results into leaderboards.
#[derive(Parser, Debug, Clone)]
#[command(name = "warren perf leaderboard", disable_help_flag = true)]
pub struct LeaderboardCli {
    /// sweep.json files written by `warren perf sweep`.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Names for the runs, comma separated, in the same order (default: each run's own).
    #[arg(long = "config-names")]
    pub config_names: Option<String>,
    /// Instances and prices table (TOML).
    #[arg(long = "instances")]
    pub instances: Option<PathBuf>,
    /// Also rank by cost at this total rate (msg/s), as the seed's "at a target of 30k".
    #[arg(long = "target-rate")]
    pub target_rate: Option<f64>,
    /// Write leaderboard.md, leaderboard.json and leaderboard.html here.
    #[arg(long = "out", default_value = "warren-perf-leaderboard")]
    pub out: PathBuf,
    #[arg(short = '?', long = "help", action = ArgAction::Help)]
    help: Option<bool>,
}

/// A parsed `warren perf` command line.
// Built once per process: variant sizes do not matter, and unboxed fields keep matching simple.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum PerfCommand {
    Run(WorkloadArgs),
    Sweep(SweepCli),
    Scale(ScaleCli),
    Persister(PersisterCli),
    Leaderboard(LeaderboardCli),
}

fn value_error(cmd: clap::Command, msg: String) -> clap::Error {
    let mut cmd = cmd;
    cmd.error(clap::error::ErrorKind::ValueValidation, msg)
}

/// Parses the arguments after `warren perf`. Errors are clap errors (exit code 2, or 0 for
/// help) that name the offending flag.
pub fn parse(argv: &[String]) -> Result<PerfCommand, clap::Error> {
    use clap::CommandFactory;
    let argv = normalize_argv(argv);
    let (sub, rest) = match argv.first().map(String::as_str) {
        Some(s @ ("sweep" | "scale" | "persister" | "leaderboard")) => {
            (Some(s.to_string()), &argv[1..])
        }
        _ => (None, &argv[..]),
    };
    let with_name = |name: &str| std::iter::once(name.to_string()).chain(rest.iter().cloned());
    match sub.as_deref() {
        None => {
            let cli = RunCli::try_parse_from(with_name("warren perf"))?;
            cli.workload
                .validate()
                .map_err(|m| value_error(RunCli::command(), m))?;
            Ok(PerfCommand::Run(cli.workload))
        }
        Some("sweep") => {
            let cli = SweepCli::try_parse_from(with_name("warren perf sweep"))?;
            cli.workload
                .validate()
                .map_err(|m| value_error(SweepCli::command(), m))?;
            if cli.slo_ms <= 0.0 {
                return Err(value_error(
                    SweepCli::command(),
                    "--slo-ms must be positive".into(),
                ));
            }
            Ok(PerfCommand::Sweep(cli))
        }
        Some("scale") => {
            let cli = ScaleCli::try_parse_from(with_name("warren perf scale"))?;
            if cli.base < 2 {
                return Err(value_error(
                    ScaleCli::command(),
                    "-b/--base must be at least 2".into(),
                ));
            }
            let top = (cli.base as f64).powi(cli.x.max(cli.y) as i32);
            if top > 1e6 {
                return Err(value_error(
                    ScaleCli::command(),
                    format!("-b^max(-x,-y) = {top} is above the 1,000,000 queues/bindings bound"),
                ));
            }
            Ok(PerfCommand::Scale(cli))
        }
        Some("persister") => {
            let cli = PersisterCli::try_parse_from(with_name("warren perf persister"))?;
            if cli.size < 12 || cli.size > MESSAGE_SIZE_MAX {
                return Err(value_error(
                    PersisterCli::command(),
                    format!("--size must be between 12 and {MESSAGE_SIZE_MAX}"),
                ));
            }
            if cli.confirm == 0 || cli.confirm as usize > CONFIRM_WINDOW_MAX {
                return Err(value_error(
                    PersisterCli::command(),
                    format!("--confirm must be between 1 and {CONFIRM_WINDOW_MAX}"),
                ));
            }
            Ok(PerfCommand::Persister(cli))
        }
        Some(_) => Ok(PerfCommand::Leaderboard(LeaderboardCli::try_parse_from(
            with_name("warren perf leaderboard"),
        )?)),
    }
}
