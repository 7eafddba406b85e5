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
