//! What a process costs, read from Linux's /proc: CPU time, resident memory, bytes through
//! the storage layer. Used for the broker (found by its listening port) and for ourselves
//! (CPU per message, to prove the load generator stays cheap).

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fs;

/// One reading of a process's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcSample {
    /// User plus system CPU time, seconds.
    pub cpu_s: f64,
    pub rss_bytes: u64,
    /// Bytes the process caused to be read from / written to storage (`read_bytes`,
    /// `write_bytes` of /proc/PID/io).
    pub disk_read_bytes: u64,
    pub disk_write_bytes: u64,
    /// Bytes through read/write syscalls of any kind (`rchar`, `wchar`).
    pub rchar: u64,
    pub wchar: u64,
}

/// The difference between two samples, as rates and totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcDelta {
    pub elapsed_s: f64,
    pub cpu_s: f64,
    /// CPU used over the interval: 1.0 is one core fully busy.
    pub cpu_cores: f64,
    pub rss_bytes_end: u64,
    pub disk_read_bytes: u64,
    pub disk_write_bytes: u64,
}

impl ProcSample {
    pub fn delta(&self, earlier: &ProcSample, elapsed_s: f64) -> ProcDelta {
        let cpu_s = (self.cpu_s - earlier.cpu_s).max(0.0);
        ProcDelta {
            elapsed_s,
            cpu_s,
            cpu_cores: if elapsed_s > 0.0 {
                cpu_s / elapsed_s
            } else {
                0.0
            },
            rss_bytes_end: self.rss_bytes,
            disk_read_bytes: self.disk_read_bytes.saturating_sub(earlier.disk_read_bytes),
            disk_write_bytes: self
                .disk_write_bytes
                .saturating_sub(earlier.disk_write_bytes),
        }
    }
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime and stime from a /proc/PID/stat line, whose second field (the command) may hold spaces
/// and parentheses: fields are counted from the last ')'.
pub fn parse_stat_cpu_ticks(stat: &str) -> Result<(u64, u64)> {
    let close = stat
        .rfind(')')
        .ok_or_else(|| anyhow!("malformed stat line"))?;
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    // After the command: state(0) ppid(1) ... utime is field 14 overall, i.e. index 11 here.
    let utime = fields
        .get(11)
        .ok_or_else(|| anyhow!("stat line too short"))?
        .parse()?;
    let stime = fields
        .get(12)
        .ok_or_else(|| anyhow!("stat line too short"))?
        .parse()?;
    Ok((utime, stime))
}

fn field_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn io_field(io: &str, key: &str) -> u64 {
    io.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// Reads a process's counters; `pid` None means this process.
pub fn sample(pid: Option<u32>) -> Result<ProcSample> {
    let dir = match pid {
        Some(p) => format!("/proc/{p}"),
        None => "/proc/self".to_string(),
    };
    let stat =
        fs::read_to_string(format!("{dir}/stat")).with_context(|| format!("reading {dir}/stat"))?;
    let (utime, stime) = parse_stat_cpu_ticks(&stat)?;
    let status = fs::read_to_string(format!("{dir}/status")).unwrap_or_default();
    // /proc/PID/io needs ptrace rights over the process; without them, disk bytes read as 0.
    let io = fs::read_to_string(format!("{dir}/io")).unwrap_or_default();
    Ok(ProcSample {
        cpu_s: (utime + stime) as f64 / clock_ticks_per_s(),
        rss_bytes: field_kib(&status, "VmRSS:").unwrap_or(0) * 1024,
        disk_read_bytes: io_field(&io, "read_bytes:"),
        disk_write_bytes: io_field(&io, "write_bytes:"),
        rchar: io_field(&io, "rchar:"),
        wchar: io_field(&io, "wchar:"),
    })
}

/// The sum over several processes (the nodes of a cluster on one host).
pub fn sample_all(pids: &[u32]) -> Result<ProcSample> {
    let mut total = ProcSample::default();
    for &pid in pids {
        let s = sample(Some(pid))?;
        total.cpu_s += s.cpu_s;
        total.rss_bytes += s.rss_bytes;
        total.disk_read_bytes += s.disk_read_bytes;
        total.disk_write_bytes += s.disk_write_bytes;
        total.rchar += s.rchar;
        total.wchar += s.wchar;
    }
    Ok(total)
}

/// Socket inodes listening on `port` (IPv4 and IPv6), from /proc/net/tcp{,6}.
pub fn listening_inodes(port: u16) -> Vec<u64> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        out.extend(parse_listening_inodes(&text, port));
    }
    out
}

pub fn parse_listening_inodes(table: &str, port: u16) -> Vec<u64> {
    const TCP_LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local = f.get(1)?;
            let state = f.get(3)?;
            let inode = f.get(9)?.parse::<u64>().ok()?;
            let local_port = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            (local_port == port && *state == TCP_LISTEN).then_some(inode)
        })
        .collect()
}

/// The process that holds the socket listening on `port`: the broker under test.
pub fn find_pid_by_port(port: u16) -> Result<u32> {
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        bail!("no process listens on port {port}");
    }
    let targets: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = fs::read_link(fd.path()) {
                if targets.iter().any(|t| link.as_os_str() == t.as_str()) {
                    return Ok(pid);
                }
            }
        }
    }
    bail!("port {port} is listening but its process is not visible (run as the same user or root, or pass --broker-pid)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_ticks_survive_spaces_in_the_command_name() {
        let line = "1234 (beam (smp) x) S 1 2 3 4 5 6 7 8 9 10 111 222 0 0 20 0 1 0";
        assert_eq!(parse_stat_cpu_ticks(line).unwrap(), (111, 222));
    }

    #[test]
    fn listening_inode_found_by_hex_port_and_state() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1630 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5555 1 0\n\
   1: 0100007F:1630 0100007F:9999 01 00000000:00000000 00:00000000 00000000     0        0 6666 1 0\n";
        assert_eq!(parse_listening_inodes(table, 0x1630), vec![5555]);
        assert!(parse_listening_inodes(table, 5672).is_empty());
    }

    #[test]
    fn cluster_sample_sums_its_nodes() {
        let me = std::process::id();
        let one = sample(Some(me)).unwrap();
        let two = sample_all(&[me, me]).unwrap();
        // RSS moves a little between reads; the sum of two reads is about twice one.
        let ratio = two.rss_bytes as f64 / one.rss_bytes as f64;
        assert!((1.8..2.2).contains(&ratio), "ratio {ratio}");
        assert!(sample_all(&[u32::MAX]).is_err());
    }

    #[test]
    fn own_process_sample_reads_cpu_and_rss() {
        let s = sample(None).unwrap();
        assert!(s.rss_bytes > 0);
        assert!(s.cpu_s >= 0.0);
    }
}
