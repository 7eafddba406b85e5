//! The command as a user runs it: exit codes for bad flags, and Ctrl-C ending a run with the
//! results so far (against WARREN_PERF_TEST_URI).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_warren-perf"));
    c.arg("perf");
    c
}

#[test]
fn bad_flag_exits_2_naming_it_and_help_exits_0() {
    let out = bin().args(["-x", "1", "--bogus"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bogus"));

    let out = bin().args(["-ct", "soon"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--confirm-timeout"));

    let out = bin().arg("-?").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--queue-pattern"));
}

#[test]
fn unreachable_broker_is_an_error_not_a_hang() {
    // Port 1 on loopback: nothing listens there.
    let start = Instant::now();
    let out = bin()
        .args(["-h", "amqp://127.0.0.1:1", "-z", "5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot connect"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn ctrl_c_ends_the_run_with_the_summary_so_far() {
    let Ok(uri) = std::env::var("WARREN_PERF_TEST_URI") else {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "skipping ctrl_c_ends_the_run: WARREN_PERF_TEST_URI is not set"
        );
        return;
    };
    let queue = format!("warren-perf-test-sigint-{}", std::process::id());
    let json = tempfile::NamedTempFile::new().unwrap();
    let child = bin()
        .args([
            "-h", &uri, "-x", "1", "-y", "1", "-r", "200", "-z", "120", "-u", &queue, "--json",
        ])
        .arg(json.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    // SAFETY: sending SIGINT to the child we spawned.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let start = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?} to stop",
        start.elapsed()
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("test stopped (Interrupted)"), "{stdout}");
    assert!(stdout.contains("sending rate avg:"), "{stdout}");
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json.path()).unwrap()).unwrap();
    let sent = result["totals"]["sent"].as_u64().unwrap();
    // About 2.5 s at 200 msg/s.
    assert!((300..=700).contains(&sent), "sent {sent}");
}
