//! Stand-alone `warren-perf`, parsed exactly as the `warren perf` subcommand is, for running the
//! toolkit before (or without) the main binary.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "warren-perf-dev")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The measuring toolkit.
    Perf(warren_perf::PerfArgs),
}

fn main() -> anyhow::Result<()> {
    let Command::Perf(args) = Cli::parse().command;
    warren_perf::run(args)
}
