//! Command lines from the seed articles and PerfTest's docs parse to the values PerfTest would
//! use; bad flags are refused with an error that names the flag and exits with code 2.

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};
use warren_perf::cli::{parse, PerfCommand};
use warren_perf::client::wire::FieldValue;

fn argv(s: &str) -> Vec<String> {
    // Shell-like split that honours single quotes, enough for the seeds' commands.
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in s.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

fn run_args(s: &str) -> warren_perf::cli::WorkloadArgs {
    match parse(&argv(s)) {
        Ok(PerfCommand::Run(w)) => w,
        other => panic!("expected a run command from {s:?}, got {other:?}"),
    }
}

/// The increasing-intensity command of seed 000, as printed in the article.
const SEED_000: &str = "-H amqp://guest:guest@10.0.0.1:5672/%2f,amqp://guest:guest@10.0.0.2:5672/%2f,amqp://guest:guest@10.0.0.3:5672/%2f \
-z 1800 -f persistent -q 1000 -c 1000 -ct -1 -ad false --rate 50 --size 1024 \
--queue-pattern 'perf-test-%d' --queue-pattern-from 1 --queue-pattern-to 100 \
-qa auto-delete=false,durable=false,x-queue-type=quorum --producers 200 --consumers 200 \
--consumer-latency 10000 --producer-random-start-delay 30";

#[test]
fn seed_000_sizing_command_parses_to_perftest_values() {
    let w = run_args(SEED_000);
    assert_eq!(w.uris().len(), 3);
    assert_eq!(w.uris()[1], "amqp://guest:guest@10.0.0.2:5672/%2f");
    assert_eq!(w.time_s, Some(1800));
    assert!(w.persistent());
    assert!(!w.mandatory());
    assert_eq!(w.qos, 1000);
    assert_eq!(w.confirm, 1000);
    assert_eq!(w.confirm_timeout_s, -1);
    assert!(!w.auto_delete);
    assert_eq!(w.rate, Some(50.0));
    assert_eq!(w.size, 1024);
    let queues = w.pattern_queues().unwrap();
    assert_eq!(queues.len(), 100);
    assert_eq!(
        (queues[0].as_str(), queues[99].as_str()),
        ("perf-test-1", "perf-test-100")
    );
    assert_eq!(
        w.declare_arguments(),
        vec![
            ("auto-delete".to_string(), FieldValue::Str("false".into())),
            ("durable".to_string(), FieldValue::Str("false".into())),
            ("x-queue-type".to_string(), FieldValue::Str("quorum".into())),
        ]
    );
    assert_eq!((w.producers, w.consumers), (200, 200));
    assert_eq!(w.consumer_latency_us, 10_000);
    assert_eq!(w.producer_random_start_delay_s, 30);
}

#[test]
fn short_flags_and_defaults_match_perftest() {
    let w = run_args("-h amqp://localhost:5680 -x 2 -y 3 -u q -e ex -t fanout -k rk -s 100 -r 10 -R 5 -C 7 -D 9 -f mandatory -c 50 -q 10 -a -p -A 4 -L 20 -b 15 -d my-id -i 2");
    assert_eq!(w.uris(), vec!["amqp://localhost:5680".to_string()]);
    assert_eq!((w.producers, w.consumers), (2, 3));
    assert_eq!(w.queue.as_deref(), Some("q"));
    assert_eq!(
        (w.exchange.as_str(), w.exchange_type.as_str()),
        ("ex", "fanout")
    );
    assert_eq!(w.routing_key.as_deref(), Some("rk"));
    assert_eq!(
        (w.size, w.rate, w.consumer_rate),
        (100, Some(10.0), Some(5.0))
    );
    assert_eq!((w.pmessages, w.cmessages), (7, 9));
    assert!(w.mandatory() && !w.persistent());
    assert_eq!((w.confirm, w.qos), (50, 10));
    assert!(w.autoack && w.predeclared);
    assert_eq!(
        (w.multi_ack_every, w.consumer_latency_us, w.heartbeat_s),
        (4, 20, 15)
    );
    assert_eq!(w.id.as_deref(), Some("my-id"));
    assert_eq!(w.interval_s, 2);

    let d = run_args("");
    assert_eq!(d.uris(), vec!["amqp://localhost".to_string()]);
    assert_eq!(
        (d.producers, d.consumers, d.size, d.confirm),
        (1, 1, 12, -1)
    );
    assert_eq!(
        (d.exchange.as_str(), d.exchange_type.as_str()),
        ("direct", "direct")
    );
    assert!(d.auto_delete);
    assert_eq!(d.confirm_timeout_s, 30);
}

#[test]
fn queue_args_detect_integers_and_quorum_flag_adds_the_type() {
    let w = run_args("-qa x-max-length=10,x-overflow=reject-publish -qq");
    assert_eq!(
        w.declare_arguments(),
        vec![
            ("x-max-length".to_string(), FieldValue::Long(10)),
            (
                "x-overflow".to_string(),
                FieldValue::Str("reject-publish".into())
            ),
            ("x-queue-type".to_string(), FieldValue::Str("quorum".into())),
        ]
    );
}

#[test]
fn multi_letter_shorts_also_work_with_equals() {
    let w = run_args("-ct=5 -ad=false -prsd 3");
    assert_eq!(w.confirm_timeout_s, 5);
    assert!(!w.auto_delete);
    assert_eq!(w.producer_random_start_delay_s, 3);
}

fn err_of(s: &str) -> clap::Error {
    match parse(&argv(s)) {
        Err(e) => e,
        Ok(c) => panic!("{s:?} should not parse, got {c:?}"),
    }
}

#[test]
fn unknown_flag_is_named_and_exits_2() {
    let e = err_of("-x 1 --no-such-flag");
    assert_eq!(e.kind(), ErrorKind::UnknownArgument);
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("--no-such-flag"), "{e}");
}

#[test]
fn bad_values_are_named_and_exit_2() {
    for (cmd, flag) in [
        ("-x many", "--producers"),
        ("-r fast", "--rate"),
        ("-f durable", "--flag"),
        ("-ct soon", "--confirm-timeout"),
        ("-ad maybe", "--auto-delete"),
        ("-qa novalue", "--queue-args"),
    ] {
        let e = err_of(cmd);
        assert_eq!(e.exit_code(), 2, "{cmd}");
        assert!(e.to_string().contains(flag), "{cmd}: {e}");
    }
}

#[test]
fn impossible_combinations_are_refused_naming_the_flag() {
    for (cmd, flag) in [
        ("-s 4", "--size"),
        ("-c 0", "--confirm"),
        (
            "--queue-pattern q-%d --queue-pattern-from 5 --queue-pattern-to 1",
            "--queue-pattern-to",
        ),
        (
            "--queue-pattern q --queue-pattern-from 1 --queue-pattern-to 2",
            "--queue-pattern",
        ),
        ("-h http://x", "--uri"),
    ] {
        let e = err_of(cmd);
        assert_eq!(e.exit_code(), 2, "{cmd}");
        assert!(e.to_string().contains(flag), "{cmd}: {e}");
    }
}

#[test]
fn help_is_question_mark_because_h_is_the_uri() {
    let e = err_of("-?");
    assert_eq!(e.kind(), ErrorKind::DisplayHelp);
    assert_eq!(e.exit_code(), 0);
    assert!(e.to_string().contains("--consumer-latency"));
}

#[test]
fn sweep_scale_persister_and_leaderboard_parse() {
    match parse(&argv("sweep -x 2 -y 2 --rates 1000-3000:1000 --step-seconds 5 --slo-ms 250 --instance-type c5.4xlarge --nodes 3 --storage gp2")) {
        Ok(PerfCommand::Sweep(s)) => {
            assert_eq!(s.rates.0, vec![1000.0, 2000.0, 3000.0]);
            assert_eq!((s.step_s, s.slo_ms), (Some(5), 250.0));
            assert_eq!(s.workload.producers, 2);
            assert_eq!((s.config.instance_type.as_deref(), s.config.nodes), (Some("c5.4xlarge"), 3));
        }
        other => panic!("{other:?}"),
    }
    // Seed 002's ScalabilityTest command line.
    match parse(&argv("scale -b 2 -x 15 -y 11 -f LABEL")) {
        Ok(PerfCommand::Scale(s)) => {
            assert_eq!((s.base, s.x, s.y, s.label.as_str()), (2, 15, 11, "LABEL"))
        }
        other => panic!("{other:?}"),
    }
    match parse(&argv("persister -C 3000000 -s 1024 --lazy")) {
        Ok(PerfCommand::Persister(p)) => {
            assert_eq!((p.messages, p.size, p.lazy), (3_000_000, 1024, true))
        }
        other => panic!("{other:?}"),
    }
    match parse(&argv(
        "leaderboard a.json b.json --config-names 5x8,7x16 --target-rate 30000",
    )) {
        Ok(PerfCommand::Leaderboard(l)) => {
            assert_eq!(l.runs.len(), 2);
            assert_eq!(l.target_rate, Some(30000.0));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(err_of("sweep --rates 0,-1").exit_code(), 2);
    assert_eq!(err_of("scale -b 1").exit_code(), 2);
    assert_eq!(err_of("scale -b 10 -x 7").exit_code(), 2);
}

#[derive(Parser)]
struct Outer {
    #[command(subcommand)]
    command: OuterCommand,
}

#[derive(Subcommand)]
enum OuterCommand {
    Perf(warren_perf::PerfArgs),
}

#[test]
fn perf_args_pass_perftest_flags_through_an_outer_clap_parser() {
    let outer = Outer::try_parse_from(argv("warren perf -h amqp://x -ct -1 -qa a=1 -?")).unwrap();
    let OuterCommand::Perf(args) = outer.command;
    assert_eq!(args.argv, argv("-h amqp://x -ct -1 -qa a=1 -?"));
    let outer = Outer::try_parse_from(argv("warren perf sweep --rates 1,2")).unwrap();
    let OuterCommand::Perf(args) = outer.command;
    assert_eq!(args.argv, argv("sweep --rates 1,2"));
}

fn stream_args(s: &str) -> warren_perf::cli::StreamCli {
    match parse(&argv(s)) {
        Ok(PerfCommand::Stream(a)) => a,
        other => panic!("expected a stream command from {s:?}, got {other:?}"),
    }
}

/// A stream-perf-test command line, its single-dash multi-letter options included, means what
/// stream-perf-test means by it.
#[test]
fn stream_perf_test_command_parses_to_its_values() {
    use warren_protocol::stream::OffsetSpec;
    let a = stream_args(
        "stream --uris rabbitmq-stream://u:p@10.0.0.1:5552/%2f,rabbitmq-stream://10.0.0.2 \
         -x 3 -y 6 -st s1,s2 -s 1024 -r 5000 -bs 50 -ses 10 -o 2026-11-29T12:00:00.5Z -c 2000 \
         -z 60 -mlb 10gb -smssb 250mb -ma 12h -ll least-leaders -icr 5 -ds",
    );
    assert_eq!(a.uri_list().len(), 2);
    assert_eq!((a.producers, a.consumers), (3, 6));
    assert_eq!(a.stream_list(), vec!["s1", "s2"]);
    assert_eq!(
        (a.size, a.rate, a.batch_size, a.sub_entry_size),
        (1024, 5000.0, 50, 10)
    );
    assert_eq!(a.offset, OffsetSpec::Timestamp(1_795_953_600_500));
    assert_eq!(
        (a.confirms, a.time_s, a.initial_credits),
        (2000, Some(60), 5)
    );
    assert_eq!(a.max_length_bytes, 10_000_000_000);
    assert_eq!(a.stream_max_segment_size_bytes, 250_000_000);
    assert!(a.delete_streams && !a.pre_declared);
    assert_eq!(
        a.create_arguments(),
        vec![
            ("max-length-bytes".to_string(), "10000000000".to_string()),
            ("stream-max-segment-size-bytes".into(), "250000000".into()),
            ("max-age".into(), "12h".into()),
            ("queue-leader-locator".into(), "least-leaders".into()),
        ]
    );
    // stream-perf-test's defaults.
    let d = stream_args("stream");
    assert_eq!(d.uri_list(), vec!["rabbitmq-stream://localhost:5552"]);
    assert_eq!(
        (d.producers, d.consumers, d.size, d.confirms),
        (1, 1, 10, 10_000)
    );
    assert_eq!((d.batch_size, d.sub_entry_size, d.rate), (100, 1, -1.0));
    assert_eq!(d.offset, OffsetSpec::First);
    assert_eq!(d.max_length_bytes, 20_000_000_000);
    for (flag, want) in [
        ("first", OffsetSpec::First),
        ("last", OffsetSpec::Last),
        ("next", OffsetSpec::Next),
        ("42", OffsetSpec::Offset(42)),
        ("1970-01-02T00:00:00Z", OffsetSpec::Timestamp(86_400_000)),
    ] {
        assert_eq!(stream_args(&format!("stream -o {flag}")).offset, want);
    }
}

#[test]
fn bad_stream_flags_are_refused_naming_the_flag() {
    for (line, names) in [
        ("stream -s 7", "--size"),
        ("stream -bs 0", "--batch-size"),
        ("stream -ses 70000", "--sub-entry-size"),
        ("stream -c 0", "--confirms"),
        ("stream -r -2", "--rate"),
        ("stream -o yesterday", "--offset"),
        ("stream -o 2026-13-01T00:00:00Z", "--offset"),
        ("stream -mlb 10zb", "--max-length-bytes"),
        ("stream --uris amqp://localhost", "--uris"),
        ("stream -st ,", "--streams"),
        ("stream -ll nearest", "--leader-locator"),
    ] {
        let e = parse(&argv(line)).expect_err(line);
        assert_eq!(e.exit_code(), 2, "{line}");
        assert!(e.to_string().contains(names), "{line}: {e}");
    }
}

/// PerfTest's -ca: consumer arguments, integers as integers, as -qa.
#[test]
fn consumer_args_reach_basic_consume_as_perftest_sends_them() {
    let w = run_args("-u s -ca x-stream-offset=first,x-priority=10 -qa x-queue-type=stream");
    assert_eq!(
        w.consumer_arguments(),
        vec![
            (
                "x-stream-offset".to_string(),
                FieldValue::Str("first".into())
            ),
            ("x-priority".to_string(), FieldValue::Long(10)),
        ]
    );
    assert!(run_args("-u s").consumer_arguments().is_empty());
}
