//! The `warren` binary: wires the server and the perf toolkit into one command line.

fn main() {
    println!("warren {}", env!("CARGO_PKG_VERSION"));
}
