//! Files a run leaves behind: JSON (everything) and CSV (one row per interval).

use crate::workload::{RunResult, Sample};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::path::Path;

pub const SAMPLES_CSV_HEADER: &str = "time_s,sent_msg_s,confirmed_msg_s,nacked_msg_s,returned_msg_s,received_msg_s,\
latency_us_min,latency_us_p50,latency_us_p75,latency_us_p95,latency_us_p99,latency_us_p999,latency_us_max,\
confirm_latency_us_min,confirm_latency_us_p50,confirm_latency_us_p75,confirm_latency_us_p95,confirm_latency_us_p99,\
confirm_latency_us_p999,confirm_latency_us_max";

pub fn samples_csv(samples: &[Sample]) -> String {
    let mut out = String::from(SAMPLES_CSV_HEADER);
    out.push('\n');
    for s in samples {
        let l = &s.latency_us;
        let c = &s.confirm_latency_us;
        let _ = writeln!(
            out,
            "{:.3},{:.1},{:.1},{:.1},{:.1},{:.1},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            s.time_s,
            s.sent_rate,
            s.confirmed_rate,
            s.nacked_rate,
            s.returned_rate,
            s.received_rate,
            l.min,
            l.p50,
            l.p75,
            l.p95,
            l.p99,
            l.p999,
            l.max,
            c.min,
            c.p50,
            c.p75,
            c.p95,
            c.p99,
            c.p999,
            c.max
        );
    }
    out
}

/// Writes to a file, or to stdout when the path is `-`.
pub fn write_text(path: &Path, text: &str) -> Result<()> {
    if path.as_os_str() == "-" {
        print!("{text}");
        return Ok(());
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

pub fn write_run_json(path: &Path, result: &RunResult) -> Result<()> {
    write_text(path, &serde_json::to_string_pretty(result)?)
}

pub fn write_run_csv(path: &Path, result: &RunResult) -> Result<()> {
    write_text(path, &samples_csv(&result.samples))
}
