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
    ("-ca", "--consumer-args"),
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
    normalize_argv_with(argv, MULTI_LETTER_SHORTS)
}

/// Rewrites the multi-letter short options of `table` to their long forms.
pub fn normalize_argv_with<S: AsRef<str>>(argv: &[S], table: &[(&str, &str)]) -> Vec<String> {
    argv.iter()
        .map(|a| {
            let a = a.as_ref();
            let (flag, value) = match a.split_once('=') {
                Some((f, v)) if f.starts_with('-') && !f.starts_with("--") => (f, Some(v)),
                _ => (a, None),
            };
            match table.iter().find(|(short, _)| *short == flag) {
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
    /// -ca: basic.consume arguments `k=v,k=v` (e.g. `x-stream-offset=first`, `x-priority=10`);
    /// integer values are sent as integers, as with -qa.
    #[arg(long = "consumer-args", value_parser = parse_queue_args)]
    pub consumer_args: Option<QueueArgs>,
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

    /// Arguments sent with basic.consume (-ca).
    pub fn consumer_arguments(&self) -> Vec<(String, FieldValue)> {
        self.consumer_args.clone().unwrap_or_default().0
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
    after_help = "Studies (each with its own -?): warren perf sweep | scale | persister | leaderboard | stream"
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
    Stream(StreamCli),
}

fn value_error(cmd: clap::Command, msg: String) -> clap::Error {
    let mut cmd = cmd;
    cmd.error(clap::error::ErrorKind::ValueValidation, msg)
}

/// Parses the arguments after `warren perf`. Errors are clap errors (exit code 2, or 0 for
/// help) that name the offending flag.
pub fn parse(argv: &[String]) -> Result<PerfCommand, clap::Error> {
    use clap::CommandFactory;
    if argv.first().map(String::as_str) == Some("stream") {
        let rest = normalize_argv_with(&argv[1..], STREAM_MULTI_LETTER_SHORTS);
        let cli = StreamCli::try_parse_from(
            std::iter::once("warren perf stream".to_string()).chain(rest),
        )?;
        cli.validate()
            .map_err(|m| value_error(StreamCli::command(), m))?;
        return Ok(PerfCommand::Stream(cli));
    }
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

/// stream-perf-test's single-dash multi-letter options and the long option each one means.
pub const STREAM_MULTI_LETTER_SHORTS: &[(&str, &str)] = &[
    ("-st", "--streams"),
    ("-bs", "--batch-size"),
    ("-ses", "--sub-entry-size"),
    ("-mlb", "--max-length-bytes"),
    ("-smssb", "--stream-max-segment-size-bytes"),
    ("-ma", "--max-age"),
    ("-ll", "--leader-locator"),
    ("-icr", "--initial-credits"),
    ("-ds", "--delete-streams"),
];

/// `warren perf stream`: RabbitMQ's stream-perf-test flags with their meaning, over the stream
/// protocol.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "warren perf stream",
    disable_help_flag = true,
    about = "stream-perf-test-compatible load generator for RabbitMQ's stream protocol"
)]
pub struct StreamCli {
    /// Servers, comma separated: rabbitmq-stream://user:pass@host:port/vhost; connections go
    /// round-robin over them.
    #[arg(
        short = 'u',
        long = "uris",
        default_value = "rabbitmq-stream://localhost:5552"
    )]
    pub uris: String,
    /// Producer count (one connection each).
    #[arg(short = 'x', long = "producers", default_value_t = 1)]
    pub producers: u32,
    /// Consumer count (one connection each).
    #[arg(short = 'y', long = "consumers", default_value_t = 1)]
    pub consumers: u32,
    /// -st: streams, comma separated; producer i publishes to stream i mod n, consumer j reads
    /// stream j mod n.
    #[arg(long = "streams", default_value = "stream")]
    pub streams: String,
    /// Message body size in bytes (at least 8: the producer's clock is written at its start).
    #[arg(short = 's', long = "size", default_value_t = 10)]
    pub size: usize,
    /// Maximum rate of published messages per producer, msg/s (-1: unlimited).
    #[arg(short = 'r', long = "rate", default_value_t = -1.0, allow_negative_numbers = true)]
    pub rate: f64,
    /// -bs: entries per Publish frame.
    #[arg(long = "batch-size", default_value_t = 100)]
    pub batch_size: u32,
    /// -ses: messages packed into one entry (a sub-batch, uncompressed); 1 for plain entries.
    #[arg(long = "sub-entry-size", default_value_t = 1)]
    pub sub_entry_size: u32,
    /// Where consumers start: first, last, next, an offset, or an ISO 8601 timestamp
    /// (2026-11-29T12:00:00Z).
    #[arg(short = 'o', long = "offset", default_value = "first", value_parser = parse_offset_spec)]
    pub offset: warren_protocol::stream::OffsetSpec,
    /// Outstanding (unconfirmed) messages per producer.
    #[arg(short = 'c', long = "confirms", default_value_t = 10_000)]
    pub confirms: u32,
    /// Run duration in seconds (unlimited by default).
    #[arg(short = 'z', long = "time")]
    pub time_s: Option<u64>,
    /// Messages per producer (0: no limit); not a stream-perf-test flag.
    #[arg(short = 'C', long = "pmessages", default_value_t = 0)]
    pub pmessages: u64,
    /// Messages per consumer (0: no limit); not a stream-perf-test flag.
    #[arg(short = 'D', long = "cmessages", default_value_t = 0)]
    pub cmessages: u64,
    /// -mlb: max-length-bytes of created streams (kb, mb, gb, tb: powers of 1000).
    #[arg(long = "max-length-bytes", default_value = "20gb", value_parser = parse_byte_capacity)]
    pub max_length_bytes: u64,
    /// -smssb: stream-max-segment-size-bytes of created streams.
    #[arg(
        long = "stream-max-segment-size-bytes",
        alias = "max-segment-size",
        default_value = "500mb",
        value_parser = parse_byte_capacity
    )]
    pub stream_max_segment_size_bytes: u64,
    /// -ma: max-age of created streams, in RabbitMQ's form (7D, 12h, 30m, 10s).
    #[arg(long = "max-age")]
    pub max_age: Option<String>,
    /// -ll: queue-leader-locator of created streams (client-local, balanced, least-leaders,
    /// random).
    #[arg(long = "leader-locator", value_parser = ["client-local", "balanced", "least-leaders", "random"])]
    pub leader_locator: Option<String>,
    /// -icr: chunks a consumer lets the broker send ahead; one more is granted per chunk read.
    #[arg(long = "initial-credits", default_value_t = 10)]
    pub initial_credits: u16,
    /// Use streams that exist already; create none.
    #[arg(short = 'p', long = "pre-declared")]
    pub pre_declared: bool,
    /// -ds: delete the streams at the end of the run.
    #[arg(long = "delete-streams")]
    pub delete_streams: bool,
    /// Test ID (default test-HHMMSS-mmm).
    #[arg(short = 'd', long = "id")]
    pub id: Option<String>,
    /// Sampling interval in seconds for the per-interval lines.
    #[arg(short = 'i', long = "interval", default_value_t = 1)]
    pub interval_s: u64,
    /// Write the run's results (summary and per-interval samples) as JSON to this file.
    #[arg(long = "json")]
    pub json: Option<PathBuf>,
    /// Only print the summary, not a line per interval.
    #[arg(long = "quiet")]
    pub quiet: bool,
    #[arg(short = '?', long = "help", action = ArgAction::Help)]
    help: Option<bool>,
}

/// Bytes of a body's timestamp: the least `--size` a stream run accepts.
pub const STREAM_SIZE_MIN: usize = 8;
/// Entries of one Publish frame, and messages of one sub-batch: the Java client's bounds.
pub const STREAM_BATCH_MAX: u32 = 65_535;

impl StreamCli {
    pub fn uri_list(&self) -> Vec<String> {
        self.uris
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    }

    pub fn stream_list(&self) -> Vec<String> {
        self.streams
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    }

    /// The Create arguments, in RabbitMQ's names.
    pub fn create_arguments(&self) -> Vec<(String, String)> {
        let mut args = vec![
            (
                "max-length-bytes".to_string(),
                self.max_length_bytes.to_string(),
            ),
            (
                "stream-max-segment-size-bytes".to_string(),
                self.stream_max_segment_size_bytes.to_string(),
            ),
        ];
        if let Some(a) = &self.max_age {
            args.push(("max-age".into(), a.clone()));
        }
        if let Some(l) = &self.leader_locator {
            args.push(("queue-leader-locator".into(), l.clone()));
        }
        args
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.size < STREAM_SIZE_MIN || self.size > MESSAGE_SIZE_MAX {
            return Err(format!(
                "--size must be between {STREAM_SIZE_MIN} (the timestamp) and {MESSAGE_SIZE_MAX}, got {}",
                self.size
            ));
        }
        if !(self.rate.is_finite() && (self.rate >= 0.0 || self.rate == -1.0)) {
            return Err(format!(
                "--rate must be -1 (unlimited) or at least 0, got {}",
                self.rate
            ));
        }
        if self.batch_size == 0 || self.batch_size > STREAM_BATCH_MAX {
            return Err(format!(
                "--batch-size must be between 1 and {STREAM_BATCH_MAX}"
            ));
        }
        if self.sub_entry_size == 0 || self.sub_entry_size > STREAM_BATCH_MAX {
            return Err(format!(
                "--sub-entry-size must be between 1 and {STREAM_BATCH_MAX}"
            ));
        }
        if self.confirms == 0 || self.confirms as usize > CONFIRM_WINDOW_MAX {
            return Err(format!(
                "--confirms must be between 1 and {CONFIRM_WINDOW_MAX}"
            ));
        }
        if self.confirms < self.sub_entry_size {
            return Err("--confirms must be at least --sub-entry-size".into());
        }
        if self.initial_credits == 0 {
            return Err("--initial-credits must be at least 1".into());
        }
        if self.producers + self.consumers > CONNECTIONS_MAX {
            return Err(format!(
                "--producers plus --consumers must be at most {CONNECTIONS_MAX}"
            ));
        }
        if self.interval_s == 0 {
            return Err("--interval must be at least 1 second".into());
        }
        if self.stream_list().is_empty() {
            return Err("--streams must name at least one stream".into());
        }
        if self.uri_list().is_empty() {
            return Err("--uris must name at least one broker".into());
        }
        for u in self.uri_list() {
            crate::stream::client::StreamUri::parse(&u).map_err(|e| format!("--uris: {e}"))?;
        }
        Ok(())
    }
}

/// stream-perf-test's byte capacities: a number with an optional kb, mb, gb or tb (powers of
/// 1000, case-insensitive).
pub fn parse_byte_capacity(s: &str) -> Result<u64, String> {
    let lower = s.trim().to_ascii_lowercase();
    let (digits, unit) = match lower.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => lower.split_at(i),
        None => (lower.as_str(), ""),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("expected a size such as 20gb or 500mb, got {s:?}"))?;
    let unit_bytes: u64 = match unit {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {s:?}: use kb, mb, gb or tb"
            ))
        }
    };
    n.checked_mul(unit_bytes)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// stream-perf-test's --offset: first, last, next, an unsigned offset, or an ISO 8601 UTC
/// timestamp (`2026-11-29T12:00:00Z`, fractions of a second allowed).
pub fn parse_offset_spec(s: &str) -> Result<warren_protocol::stream::OffsetSpec, String> {
    use warren_protocol::stream::OffsetSpec;
    match s {
        "first" => return Ok(OffsetSpec::First),
        "last" => return Ok(OffsetSpec::Last),
        "next" => return Ok(OffsetSpec::Next),
        _ => {}
    }
    if let Ok(n) = s.parse::<u64>() {
        return Ok(OffsetSpec::Offset(n));
    }
    parse_iso8601_utc_ms(s).map(OffsetSpec::Timestamp).ok_or_else(|| {
        format!("expected first, last, next, an offset or a timestamp like 2026-11-29T12:00:00Z, got {s:?}")
    })
}

/// Milliseconds since the epoch of `YYYY-MM-DDTHH:MM:SS[.fff]Z`.
fn parse_iso8601_utc_ms(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-');
    let (y, mo, day): (i64, i64, i64) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    let (hms, frac) = match time.split_once('.') {
        Some((h, f)) => (h, f),
        None => (time, ""),
    };
    let mut t = hms.split(':');
    let (h, mi, sec): (i64, i64, i64) = (
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
    );
    if d.next().is_some()
        || t.next().is_some()
        || !(1..=12).contains(&mo)
        || !(1..=31).contains(&day)
        || h > 23
        || mi > 59
        || sec > 60
    {
        return None;
    }
    let ms_frac: i64 = if frac.is_empty() {
        0
    } else {
        if !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        format!("{:0<3}", &frac[..frac.len().min(3)]).parse().ok()?
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y_adj = if mo <= 2 { y - 1 } else { y };
    let era = y_adj.div_euclid(400);
    let yoe = y_adj - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + h) * 60 + mi) * 60_000 + sec * 1000 + ms_frac)
}
