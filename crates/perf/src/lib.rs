//! The measuring toolkit behind `warren perf`: a PerfTest-compatible load generator and the studies.
