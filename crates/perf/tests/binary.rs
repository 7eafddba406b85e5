//! The command as a user runs it: exit codes for bad flags, and Ctrl-C ending a run with the
//! results so far (against WARREN_PERF_TEST_URI).

use std::io::{BufRead, BufReader};
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
    let spawned = Instant::now();
    let mut child = bin()
        .args([
            "-h", &uri, "-x", "1", "-y", "1", "-r", "200", "-z", "120", "-u", &queue, "--json",
        ])
        .arg(json.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (line_tx, lines) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = line_tx.send(line.clone());
            all.push(line);
        }
        all
    });
    // Interrupt once the per-second samples show 100 messages sent, however long the start
    // took: the run is sending, and its Ctrl-C handler is in place (before it, SIGINT would
    // just kill it). Their rates are printed rounded: take half a message a second off each.
    let (mut seen, mut last_t) = (0.0, 0.0);
    let mut before: Vec<String> = Vec::new();
    while seen < 100.0 {
        let left = (spawned + Duration::from_secs(60)).saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("{e}: the run sent too little: {before:?}"));
        if let Some((t, rate)) = sample(&line) {
            seen += (rate - 0.5).max(0.0) * (t - last_t);
            last_t = t;
        }
        before.push(line);
    }
    // SAFETY: sending SIGINT to the child we spawned.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let interrupted = Instant::now();
    let out = child.wait_with_output().unwrap();
    // A run that ignored the interrupt would go on for its 120 s.
    assert!(
        interrupted.elapsed() < Duration::from_secs(30),
        "took {:?} to stop",
        interrupted.elapsed()
    );
    let ran_s = spawned.elapsed().as_secs_f64();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = reader.join().unwrap().join("\n");
    assert!(stdout.contains("test stopped (Interrupted)"), "{stdout}");
    assert!(stdout.contains("sending rate avg:"), "{stdout}");
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json.path()).unwrap()).unwrap();
    let sent = result["totals"]["sent"].as_u64().unwrap();
    // The summary holds at least what was seen sent before the interrupt...
    assert!(
        sent as f64 >= seen,
        "sent {sent}, before the interrupt: {before:?}"
    );
    // ... and no more than 200 msg/s (plus the limiter's burst) for as long as it ran.
    assert!(
        sent as f64 <= 200.0 * ran_s + 50.0,
        "sent {sent} in {ran_s:.1} s"
    );
}

/// The time and sending rate of a per-second line: "id: ..., time 1.000 s, sent: 200 msg/s, ...".
fn sample(line: &str) -> Option<(f64, f64)> {
    let field = |after: &str, until: &str| -> Option<f64> {
        let rest = &line[line.find(after)? + after.len()..];
        rest[..rest.find(until)?].trim().parse().ok()
    };
    Some((field(", time ", " s,")?, field(", sent: ", " msg/s")?))
}
