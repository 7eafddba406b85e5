//! `warren perf stream` against a real stream protocol server named by
//! WARREN_PERF_TEST_STREAM_URI, e.g. RabbitMQ 3.10's stream plugin started by
//! `RMQ_PLUGINS=rabbitmq_stream RMQ_STREAM_PORT=P ../shared/rabbitmq/rabbitmq.sh start`
//! (`rabbitmq-stream://guest:guest@127.0.0.1:P/%2f`). Each test prints why it skipped when the
//! variable is unset.

use tokio::sync::watch;
use warren_perf::cli::{parse, PerfCommand, StreamCli};
use warren_perf::stream::StreamRunResult;

fn stream_uri(test: &str) -> Option<String> {
    match std::env::var("WARREN_PERF_TEST_STREAM_URI") {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "skipping {test}: WARREN_PERF_TEST_STREAM_URI is not set (point it at a stream protocol listener)"
            );
            None
        }
    }
}

fn unique(name: &str) -> String {
    format!(
        "warren-perf-stream-test-{name}-{}-{}",
        std::process::id(),
        warren_perf::workload::epoch_ms()
    )
}

fn stream_args(s: String) -> StreamCli {
    let argv: Vec<String> = s.split_whitespace().map(String::from).collect();
    match parse(&argv).unwrap_or_else(|e| panic!("{s}: {e}")) {
        PerfCommand::Stream(a) => a,
        other => panic!("{s}: parsed as {other:?}"),
    }
}

fn run(s: String) -> StreamRunResult {
    let args = stream_args(s);
    let (tx, rx) = watch::channel(false);
    let r = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(warren_perf::stream::run(&args, rx, None))
        .unwrap();
    drop(tx);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    r
}

#[test]
fn counted_stream_run_confirms_and_consumes_every_message_with_ordered_percentiles() {
    let Some(uri) = stream_uri("counted_stream_run") else {
        return;
    };
    let s = unique("counted");
    let r = run(format!(
        "stream --uris {uri} --streams {s} -x 2 -y 1 -C 20000 -D 40000 -s 64 -z 60 -ds"
    ));
    assert_eq!(r.published, 40000);
    assert_eq!(r.confirmed, 40000);
    assert_eq!(r.errored, 0);
    assert_eq!(r.consumed, 40000, "stopped: {}", r.stop_reason);
    assert!(r.chunks >= 1 && r.chunks <= 40000);
    assert_eq!(r.latency_us.count, 40000, "every message's clock is read");
    assert!(r.confirm_latency_us.count > 0 && r.confirm_latency_us.count <= 40000);
    for l in [r.latency_us, r.confirm_latency_us] {
        assert!(
            l.min <= l.p50 && l.p50 <= l.p99 && l.p99 <= l.p999 && l.p999 <= l.max,
            "{l:?}"
        );
        assert!(l.min >= 1 && (l.max as f64) < r.duration_s * 1e6, "{l:?}");
    }
}

/// Offsets as stream-perf-test's --offset means them: a numeric offset reads from exactly that
/// message (the rest of its chunk is skipped), `next` reads nothing of what is there, `last`
/// reads the last chunk only, a timestamp before the stream reads all of it.
#[test]
fn consumers_start_where_the_offset_says() {
    let Some(uri) = stream_uri("consumers_start_where_the_offset_says") else {
        return;
    };
    let s = unique("offsets");
    let filled = run(format!(
        "stream --uris {uri} --streams {s} -x 1 -y 0 -C 1000 -s 16 -bs 10"
    ));
    assert_eq!(filled.confirmed, 1000);
    let from_990 = run(format!(
        "stream --uris {uri} --streams {s} -x 0 -y 1 -p --offset 990 -z 3"
    ));
    assert_eq!(from_990.consumed, 10);
    let next = run(format!(
        "stream --uris {uri} --streams {s} -x 0 -y 1 -p --offset next -z 1"
    ));
    assert_eq!(next.consumed, 0);
    let last = run(format!(
        "stream --uris {uri} --streams {s} -x 0 -y 1 -p --offset last -z 1"
    ));
    assert!(
        last.consumed >= 1 && last.consumed < 1000,
        "the last chunk only: {}",
        last.consumed
    );
    let since_2020 = run(format!(
        "stream --uris {uri} --streams {s} -x 0 -y 1 -p --offset 2020-01-01T00:00:00Z -D 1000 -z 10 -ds"
    ));
    assert_eq!(since_2020.consumed, 1000);
}

/// Sub-entry batches: ten messages an entry, one publishing id (and one confirm) an entry,
/// every message counted by the consumer.
#[test]
fn sub_entry_batches_are_confirmed_and_consumed_message_by_message() {
    let Some(uri) = stream_uri("sub_entry_batches") else {
        return;
    };
    let s = unique("subentry");
    let r = run(format!(
        "stream --uris {uri} --streams {s} -x 1 -y 1 -C 5000 -D 5000 -ses 10 -s 32 -z 60 -ds"
    ));
    assert_eq!((r.published, r.confirmed, r.consumed), (5000, 5000, 5000));
    assert_eq!(r.confirm_latency_us.count, 500, "one confirm per entry");
}

#[test]
fn a_missing_stream_is_an_error_that_names_it() {
    let Some(uri) = stream_uri("a_missing_stream_is_an_error") else {
        return;
    };
    let s = unique("missing");
    let args = stream_args(format!(
        "stream --uris {uri} --streams {s} -x 1 -y 0 -p -C 1"
    ));
    let (_tx, rx) = watch::channel(false);
    let e = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(warren_perf::stream::run(&args, rx, None))
        .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains(&s) && msg.contains("stream does not exist"),
        "{msg}"
    );
}
