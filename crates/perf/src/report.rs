//! Self-contained HTML reports: tables and the SVG charts inlined, no external assets, so a
//! report can be mailed or attached to an issue as one file.

use crate::cost::Leaderboard;
use crate::sweep::SweepResult;
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::path::PathBuf;

pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const STYLE: &str =
    "body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}\
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f3f3f3}\
.pass{color:#2a7a2a;font-weight:bold}.fail{color:#b22;font-weight:bold}figure{margin:1em 0}";

/// Reads SVG files and strips their XML prolog so they can sit inside HTML.
pub fn inline_svgs(svgs: &[(String, PathBuf)]) -> Result<String> {
    let mut out = String::new();
    for (title, path) in svgs {
        let svg =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let svg = match svg.find("<svg") {
            Some(i) => &svg[i..],
            None => &svg[..],
        };
        let _ = writeln!(
            out,
            "<figure>{svg}<figcaption>{}</figcaption></figure>",
            escape(title)
        );
    }
    Ok(out)
}

pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title><style>{STYLE}</style></head>\n<body><h1>{t}</h1>\n{body}</body></html>\n",
        t = escape(title)
    )
}

pub fn sweep_html(r: &SweepResult, svgs: &[(String, PathBuf)]) -> Result<String> {
    let mut b = String::new();
    let _ = writeln!(
        b,
        "<p>Configuration: <b>{}</b>{}. Workload: {}. SLO: p99 &lt; {} ms; a step passes when it reaches its target within 5% and meets the SLO.</p>",
        escape(&r.config.name),
        r.config.monthly_usd.map(|m| format!(" (${m:.0} per month)")).unwrap_or_default(),
        escape(&r.workload),
        r.slo_ms
    );
    let _ = writeln!(
        b,
        "<p>Top rate: <b>{:.0} msg/s</b>. Highest passing target: <b>{}</b>.{}</p>",
        r.top_rate(),
        r.top_passing_target()
            .map(|t| format!("{t:.0} msg/s"))
            .unwrap_or_else(|| "none".into()),
        r.config
            .monthly_usd
            .and_then(|m| crate::cost::cost_per_1k(m, r.top_rate()))
            .map(|c| format!(" Cost per 1000 msg/s per month at top rate: <b>${c:.0}</b>."))
            .unwrap_or_default()
    );
    b.push_str("<table><tr><th>target msg/s</th><th>published</th><th>consumed</th><th>p50 ms</th><th>p75 ms</th><th>p95 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>max ms</th><th>broker CPU cores</th><th>broker RSS MiB</th><th>disk write MB</th><th>disk read MB</th><th>result</th></tr>\n");
    for s in &r.steps {
        let l = &s.latency_us;
        let ms = |v: u64| format!("{:.2}", v as f64 / 1000.0);
        let (cpu, rss, w, rd) = match s.broker {
            Some(d) => (
                format!("{:.2}", d.cpu_cores),
                format!("{:.0}", d.rss_bytes_end as f64 / 1048576.0),
                format!("{:.1}", d.disk_write_bytes as f64 / 1e6),
                format!("{:.1}", d.disk_read_bytes as f64 / 1e6),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let verdict = if s.pass {
            "<span class=pass>PASS</span>"
        } else if !s.reached_target {
            "<span class=fail>FAIL (rate)</span>"
        } else {
            "<span class=fail>FAIL (latency)</span>"
        };
        let _ = writeln!(
            b,
            "<tr><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{cpu}</td><td>{rss}</td><td>{w}</td><td>{rd}</td><td>{verdict}</td></tr>",
            s.target_rate,
            s.publish_rate,
            s.consume_rate,
            ms(l.p50),
            ms(l.p75),
            ms(l.p95),
            ms(l.p99),
            ms(l.p999),
            ms(l.max)
        );
    }
    b.push_str("</table>\n");
    b.push_str(&inline_svgs(svgs)?);
    Ok(page(&format!("warren perf sweep {}", r.id), &b))
}

pub fn leaderboard_html(
    lb: &Leaderboard,
    runs: &[(String, SweepResult)],
    svgs: &[(String, PathBuf)],
) -> Result<String> {
    let mut b = String::new();
    let list = |b: &mut String, title: &str, rows: Vec<String>| {
        let _ = write!(b, "<h2>{}</h2><ol>", escape(title));
        for r in rows {
            let _ = write!(b, "<li>{}</li>", escape(&r));
        }
        b.push_str("</ol>\n");
    };
    list(
        &mut b,
        "Top throughput",
        lb.top_throughput
            .iter()
            .map(|e| format!("{}. Rate: {:.0} msg/s", e.name, e.value))
            .collect(),
    );
    list(
        &mut b,
        "Matched target throughput",
        lb.matched_target
            .iter()
            .map(|e| format!("{}. Target met: {:.0} msg/s", e.name, e.value))
            .collect(),
    );
    list(
        &mut b,
        "Cost per 1000 msg/s per month, at top throughput",
        lb.cost_at_top
            .iter()
            .map(|e| {
                format!(
                    "{}. Cost: ${:.0} ({:.0}k)",
                    e.name,
                    e.value,
                    e.rate / 1000.0
                )
            })
            .collect(),
    );
    if let Some(t) = lb.target_rate {
        list(
            &mut b,
            &format!(
                "Cost per 1000 msg/s per month at a target of {:.0} msg/s",
                t
            ),
            lb.cost_at_target
                .iter()
                .map(|e| format!("{}. Cost: ${:.0}", e.name, e.value))
                .collect(),
        );
    }
    b.push_str("<h2>Runs</h2><table><tr><th>configuration</th><th>steps</th><th>top rate</th><th>monthly $</th><th>workload</th></tr>");
    for (name, r) in runs {
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td>{:.0}</td><td>{}</td><td>{}</td></tr>",
            escape(name),
            r.steps.len(),
            r.top_rate(),
            r.config
                .monthly_usd
                .map(|m| format!("{m:.0}"))
                .unwrap_or_else(|| "-".into()),
            escape(&r.workload)
        );
    }
    b.push_str("</table>\n");
    b.push_str(&inline_svgs(svgs)?);
    Ok(page("warren perf leaderboard", &b))
}
