//! Reports and charts from synthetic results: every promised file exists, CSVs have the
//! promised columns, PNGs decode to the chart size, HTML is self-contained, leaderboards rank.

use std::path::Path;
use warren_perf::cost::{self, ConfigInfo};
use warren_perf::persister::{self, IoSample, PersisterResult, Phase};
use warren_perf::procfs::ProcDelta;
use warren_perf::scale::{self, ScalePoint, ScaleResult};
use warren_perf::stats::Percentiles;
use warren_perf::sweep::{self, SweepResult};
use warren_perf::workload::{RunResult, Sample};

fn pct(base: u64) -> Percentiles {
    Percentiles {
        count: 1000,
        min: base / 2,
        p50: base,
        p75: base * 2,
        p95: base * 4,
        p99: base * 8,
        p999: base * 16,
        max: base * 32,
        mean: base as f64,
    }
}

fn samples(n: usize, rate: f64, lat: u64) -> Vec<Sample> {
    (1..=n)
        .map(|i| Sample {
            time_s: i as f64,
            sent_rate: rate,
            confirmed_rate: rate,
            received_rate: rate,
            latency_us: pct(lat),
            confirm_latency_us: pct(lat / 2),
            ..Default::default()
        })
        .collect()
}

fn synthetic_sweep(name: &str, instance: &str, nodes: u32, top: f64) -> SweepResult {
    let targets: [f64; 5] = [10_000.0, 20_000.0, 30_000.0, 40_000.0, 50_000.0];
    let steps = targets
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let achieved = t.min(top);
            let run = RunResult {
                send_rate_avg: achieved,
                receive_rate_avg: achieved,
                consumers: 1,
                duration_s: 5.0,
                latency_us: pct(500 * (i as u64 + 1)),
                samples: samples(5, achieved, 500 * (i as u64 + 1)),
                ..Default::default()
            };
            let broker = ProcDelta {
                elapsed_s: 5.0,
                cpu_s: 4.0,
                cpu_cores: 0.8,
                rss_bytes_end: 200 << 20,
                disk_read_bytes: 0,
                disk_write_bytes: 50 << 20,
            };
            sweep::step_from_run(t, &run, 1.0, 1000.0, Some(broker), i as f64 * 5.0)
        })
        .collect();
    let table = cost::load_table(None).unwrap();
    SweepResult {
        id: format!("test-{name}"),
        config: ConfigInfo {
            name: name.into(),
            instance_type: Some(instance.into()),
            nodes,
            storage: Some("gp2".into()),
            storage_gb: 1000,
            storage_iops: 0,
            monthly_usd: Some(
                table
                    .monthly_usd(instance, nodes, Some("gp2"), 1000, 0)
                    .unwrap(),
            ),
        },
        workload: "producers 1 consumers 1 size 1024 B".into(),
        slo_ms: 1000.0,
        broker_pids: vec![1],
        steps,
        stop_reason: "Completed every step".into(),
    }
}

fn assert_png(path: &Path) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1000, 560), "{}", path.display());
    // A chart is not a blank canvas: some pixels are not white.
    assert!(buf.iter().any(|&b| b < 200), "{} is blank", path.display());
}

fn csv_header(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .next()
        .unwrap()
        .split(',')
        .map(String::from)
        .collect()
}

#[test]
fn sweep_writes_json_csv_charts_and_a_self_contained_report() {
    let dir = tempfile::tempdir().unwrap();
    let r = synthetic_sweep("5 x c5.2xlarge gp2", "c5.2xlarge", 5, 30_000.0);
    let files = sweep::write_outputs(&r, dir.path()).unwrap();
    for f in &files {
        assert!(f.exists(), "{}", f.display());
    }
    for name in ["rates", "latency", "rates-over-time", "latency-over-time"] {
        assert_png(&dir.path().join(format!("{name}.png")));
        let svg = std::fs::read_to_string(dir.path().join(format!("{name}.svg"))).unwrap();
        assert!(svg.contains("<svg"), "{name}");
        let legend = if name.starts_with("rates") {
            "target"
        } else {
            "p99"
        };
        assert!(svg.contains(legend), "{name} lacks its {legend} series");
    }
    let header = csv_header(&dir.path().join("steps.csv"));
    assert_eq!(header.len(), 23);
    assert_eq!(header[0], "target_msg_s");
    assert!(header.contains(&"latency_us_p999".to_string()));
    assert!(header.contains(&"broker_disk_write_bytes".to_string()));
    let rows: Vec<String> = std::fs::read_to_string(dir.path().join("steps.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(String::from)
        .collect();
    assert_eq!(rows.len(), 5);
    assert!(rows.iter().all(|r| r.split(',').count() == 23));
    // 30k target met, 40k not (top is 30k): pass flags in the CSV say so.
    assert!(rows[2].contains(",true,true,true,"), "{}", rows[2]);
    assert!(rows[3].contains(",false,true,false,"), "{}", rows[3]);
    let timeline = std::fs::read_to_string(dir.path().join("timeline.csv")).unwrap();
    assert_eq!(timeline.lines().count(), 1 + 5 * 5);

    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert_eq!(html.matches("<svg").count(), 4);
    assert!(
        !html.contains("src=\""),
        "the report must not load external files"
    );
    assert!(html.contains("PASS") && html.contains("FAIL (rate)"));

    let back: SweepResult =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("sweep.json")).unwrap())
            .unwrap();
    assert_eq!(back, r);
}

#[test]
fn leaderboard_ranks_by_throughput_and_by_cost_like_the_seed() {
    let runs = vec![
        (
            "5 x c5.2xlarge".to_string(),
            synthetic_sweep("a", "c5.2xlarge", 5, 42_000.0),
        ),
        (
            "3 x c5.9xlarge".to_string(),
            synthetic_sweep("b", "c5.9xlarge", 3, 37_000.0),
        ),
        (
            "7 x c5.4xlarge".to_string(),
            synthetic_sweep("c", "c5.4xlarge", 7, 25_000.0),
        ),
    ];
    let table = cost::load_table(None).unwrap();
    let lb = cost::leaderboard(&runs, &table, Some(30_000.0)).unwrap();
    let names = |v: &[cost::Entry]| v.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&lb.top_throughput),
        ["5 x c5.2xlarge", "3 x c5.9xlarge", "7 x c5.4xlarge"]
    );
    // Seed 000: 5 x c5.2xlarge on gp2 at 42k costs $41 per 1000 msg/s per month.
    assert_eq!(lb.cost_at_top[0].name, "5 x c5.2xlarge");
    assert_eq!(lb.cost_at_top[0].value.round(), 41.0);
    // The 7-node cluster topped out at 25k: it is not on the 30k board.
    assert_eq!(
        names(&lb.cost_at_target),
        ["5 x c5.2xlarge", "3 x c5.9xlarge"]
    );
    let md = cost::leaderboard_markdown(&lb);
    assert!(md.contains("1. 5 x c5.2xlarge. Cost: $41 (42k)"), "{md}");

    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (i, (_, r)) in runs.iter().enumerate() {
        let p = dir.path().join(format!("run{i}.json"));
        std::fs::write(&p, serde_json::to_string(r).unwrap()).unwrap();
        paths.push(p);
    }
    let mut argv: Vec<String> = vec!["leaderboard".into()];
    argv.extend(paths.iter().map(|p| p.display().to_string()));
    argv.extend(["--config-names", "x,y,z", "--target-rate", "30000", "--out"].map(String::from));
    argv.push(dir.path().join("lb").display().to_string());
    let cli = match warren_perf::cli::parse(&argv).unwrap() {
        warren_perf::cli::PerfCommand::Leaderboard(l) => l,
        other => panic!("{other:?}"),
    };
    cost::run_leaderboard(&cli).unwrap();
    let md = std::fs::read_to_string(dir.path().join("lb/leaderboard.md")).unwrap();
    assert!(md.contains("1. x. Rate: 42000 msg/s"), "{md}");
    let html = std::fs::read_to_string(dir.path().join("lb/leaderboard.html")).unwrap();
    assert_eq!(
        html.matches("<svg").count(),
        2,
        "rates and p99 overlays inline"
    );
    assert_png(&dir.path().join("lb/compare-rates.png"));
    assert_png(&dir.path().join("lb/compare-p99.png"));
}

#[test]
fn scale_writes_log_log_charts_and_csv() {
    let dir = tempfile::tempdir().unwrap();
    let mut points = Vec::new();
    for (q, b) in scale::grid(2, 4, 2) {
        points.push(ScalePoint {
            queues: q,
            bindings_per_queue: b,
            create_us_per_queue: 100.0 * b as f64,
            delete_us_per_queue: 80.0 * b as f64,
            route_us_per_msg: 2.0 * q as f64,
            route_us_per_msg_per_queue: 2.0,
            messages: 100,
        });
    }
    let r = ScaleResult {
        label: "synthetic".into(),
        base: 2,
        x: 4,
        y: 2,
        points,
        stop_reason: String::new(),
    };
    scale::write_outputs(&r, dir.path()).unwrap();
    for name in ["create", "delete", "route"] {
        assert_png(&dir.path().join(format!("{name}.png")));
    }
    let header = csv_header(&dir.path().join("scale.csv"));
    assert_eq!(
        header,
        scale::SCALE_CSV_HEADER
            .split(',')
            .map(String::from)
            .collect::<Vec<_>>()
    );
    let rows = std::fs::read_to_string(dir.path().join("scale.csv"))
        .unwrap()
        .lines()
        .count()
        - 1;
    assert_eq!(rows, scale::grid(2, 4, 2).len());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("report.html"))
            .unwrap()
            .matches("<svg")
            .count(),
        3
    );
}

#[test]
fn persister_writes_phases_with_write_amplification() {
    let dir = tempfile::tempdir().unwrap();
    let phase = |name: &str, offset: f64| Phase {
        name: name.into(),
        messages: 1000,
        payload_bytes: 1024 * 1000,
        duration_s: 2.0,
        rate_msg_s: 500.0,
        offset_s: offset,
        broker_write_bytes: 2 * 1024 * 1000,
        broker_read_bytes: 0,
        write_bytes_per_payload_byte: 2.0,
        read_bytes_per_payload_byte: 0.0,
        run: RunResult {
            samples: samples(2, 500.0, 100),
            ..Default::default()
        },
    };
    let r = PersisterResult {
        queue: "q".into(),
        lazy: true,
        size_bytes: 1024,
        messages_per_round: 1000,
        broker_pid: Some(1),
        phases: vec![phase("publish 1", 0.0), phase("drain", 2.0)],
        io: (0..4)
            .map(|i| IoSample {
                time_s: i as f64,
                write_bytes_s: 1e6,
                read_bytes_s: 0.0,
                cpu_cores: 0.5,
                rss_bytes: 1 << 20,
            })
            .collect(),
    };
    persister::write_outputs(&r, dir.path()).unwrap();
    assert_png(&dir.path().join("rates.png"));
    assert_png(&dir.path().join("disk.png"));
    let csv = std::fs::read_to_string(dir.path().join("phases.csv")).unwrap();
    assert_eq!(csv.lines().next().unwrap(), persister::PHASES_CSV_HEADER);
    assert!(
        csv.contains("publish 1,1000,1024000,2.000,500.0,2048000,0,2.0000,0.0000"),
        "{csv}"
    );
}

#[test]
fn run_json_round_trips_and_run_csv_has_a_row_per_interval() {
    let dir = tempfile::tempdir().unwrap();
    let r = RunResult {
        id: "test-1".into(),
        duration_s: 3.0,
        latency_us: pct(300),
        samples: samples(3, 1000.0, 300),
        stop_reason: "Reached time limit".into(),
        ..Default::default()
    };
    let json = dir.path().join("out/run.json");
    let csv = dir.path().join("out/run.csv");
    warren_perf::output::write_run_json(&json, &r).unwrap();
    warren_perf::output::write_run_csv(&csv, &r).unwrap();
    let back: RunResult = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(back, r);
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    let header: Vec<&str> = lines[0].split(',').collect();
    assert_eq!(header.len(), 20);
    assert_eq!(header[5], "received_msg_s");
    assert_eq!(header[10], "latency_us_p99");
    let row: Vec<&str> = lines[1].split(',').collect();
    assert_eq!((row[5], row[10]), ("1000.0", "2400"));
    // PerfTest's summary words are there for scripts that grep them.
    let summary = r.summary_lines().join("\n");
    assert!(summary.contains("id: test-1, sending rate avg: 0 msg/s"));
    assert!(summary.contains("consumer latency min/median/75th/95th/99th 150/300/600/1200/2400 µs"));
}

#[test]
fn scale_compare_draws_two_runs_on_one_set_of_charts() {
    let dir = tempfile::tempdir().unwrap();
    let run = |label: &str, factor: f64| ScaleResult {
        label: label.into(),
        base: 2,
        x: 2,
        y: 2,
        points: scale::grid(2, 2, 2)
            .into_iter()
            .map(|(q, b)| ScalePoint {
                queues: q,
                bindings_per_queue: b,
                create_us_per_queue: factor * b as f64,
                delete_us_per_queue: factor,
                route_us_per_msg: factor * q as f64,
                route_us_per_msg_per_queue: factor,
                messages: 10,
            })
            .collect(),
        stop_reason: String::new(),
    };
    let (a, b) = (run("rabbitmq", 100.0), run("warren", 10.0));
    let merged = scale::compare_charts(&[a.clone(), b.clone()]);
    let create = &merged.iter().find(|(n, _)| *n == "create").unwrap().1;
    // Three bindings-per-queue series per run, the second run dashed in the same colours.
    assert_eq!(create.series.len(), 6);
    assert!(create.series[3].name.starts_with("warren: ") && create.series[3].dashed);
    assert_eq!(create.series[0].color, create.series[3].color);

    let pa = dir.path().join("a.json");
    let pb = dir.path().join("b.json");
    std::fs::write(&pa, serde_json::to_string(&a).unwrap()).unwrap();
    std::fs::write(&pb, serde_json::to_string(&b).unwrap()).unwrap();
    let argv: Vec<String> = vec![
        "scale".into(),
        "--compare".into(),
        format!("{},{}", pa.display(), pb.display()),
        "--out".into(),
        dir.path().join("cmp").display().to_string(),
    ];
    let warren_perf::cli::PerfCommand::Scale(cli) = warren_perf::cli::parse(&argv).unwrap() else {
        panic!()
    };
    scale::run_compare(&cli).unwrap();
    for name in ["create", "delete", "route"] {
        assert_png(&dir.path().join(format!("cmp/{name}.png")));
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("cmp/report.html"))
            .unwrap()
            .matches("<svg")
            .count(),
        3
    );
}
