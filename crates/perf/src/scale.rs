//! The routing ScalabilityTest (seed 002): for each point of the (queues, bindings per queue)
//! grid, the time to create a queue with its bindings, to route a message to every bound queue,
//! and to delete a queue. Both axes grow in powers of `-b`; the grid is cut along the diagonal
//! `i + j <= (x + y) / 2`, as the article does, so the largest points stay affordable.
//!
//! Every queue is bound with the same keys `k0..k{bpq-1}` to one direct exchange, so each
//! published message is routed to all the queues: routing cost per message grows with the
//! queues it reaches and, if routing scales, not with the number of bindings.

use crate::charts::{Chart, Series};
use crate::cli::ScaleCli;
use crate::client::wire::{self, method, FRAME_METHOD};
use crate::client::{Connection, Uri};
use crate::output::write_text;
use crate::{progress, report};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub const EXCHANGE: &str = "warren-perf-scale";
/// Operations written before waiting for their replies: amortises round trips without letting
/// the broker's backlog grow without bound.
pub const PIPELINE_OPS_MAX: usize = 512;
/// Longest wait for a batch of confirms while timing routing.
pub const CONFIRM_WAIT_MAX: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ScalePoint {
    pub queues: u64,
    pub bindings_per_queue: u64,
    pub create_us_per_queue: f64,
    pub delete_us_per_queue: f64,
    pub route_us_per_msg: f64,
    pub route_us_per_msg_per_queue: f64,
    pub messages: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
/// Missing fields read as defaults, so files from older versions still load.
#[serde(default)]
pub struct ScaleResult {
    pub label: String,
    pub base: u32,
    pub x: u32,
    pub y: u32,
    pub points: Vec<ScalePoint>,
    pub stop_reason: String,
}

/// The grid points in run order: bindings per queue outer, queues inner.
pub fn grid(base: u32, x: u32, y: u32) -> Vec<(u64, u64)> {
    let limit = (x + y) / 2;
    let mut out = Vec::new();
    for j in 0..=y {
        for i in 0..=x {
            if i + j <= limit {
                out.push(((base as u64).pow(i), (base as u64).pow(j)));
            }
        }
    }
    out
}

/// Waits for `n` replies of kind `want` on `channel` (pipelined calls answer in order).
async fn expect_n(conn: &mut Connection, channel: u16, want: (u16, u16), n: usize) -> Result<()> {
    for _ in 0..n {
        conn.expect(channel, want).await?;
    }
    Ok(())
}

fn queue_name(i: u64) -> String {
    format!("warren-perf-scale-{i}")
}

async fn create(conn: &mut Connection, queues: u64, bpq: u64) -> Result<Duration> {
    let t = Instant::now();
    let mut pending_declares = 0usize;
    let mut pending_binds = 0usize;
    for q in 0..queues {
        let name = queue_name(q);
        // Exclusive: the broker removes them if this process dies mid-test.
        let decl = wire::QueueDeclare {
            name: &name,
            exclusive: true,
            ..Default::default()
        };
        wire::queue_declare(&mut conn.wbuf, 1, &decl);
        pending_declares += 1;
        for b in 0..bpq {
            wire::queue_bind(&mut conn.wbuf, 1, &name, EXCHANGE, &format!("k{b}"));
            pending_binds += 1;
        }
        if pending_declares + pending_binds >= PIPELINE_OPS_MAX {
            conn.flush().await?;
            // Replies come in order: declare-ok then its bind-oks, queue after queue.
            drain_replies(conn, &mut pending_declares, &mut pending_binds).await?;
        }
    }
    conn.flush().await?;
    drain_replies(conn, &mut pending_declares, &mut pending_binds).await?;
    Ok(t.elapsed())
}

async fn drain_replies(
    conn: &mut Connection,
    declares: &mut usize,
    binds: &mut usize,
) -> Result<()> {
    while *declares + *binds > 0 {
        loop {
            let Some((frame, used)) =
                wire::parse_frame(&conn.rbuf[conn.rstart..conn.rend], conn.frame_max)?
            else {
                conn.fill().await?;
                continue;
            };
            let outcome = if frame.kind == FRAME_METHOD {
                let (id, a) = wire::method_of(frame.payload)?;
                if id == method::CHANNEL_CLOSE || id == method::CONNECTION_CLOSE {
                    let reason = wire::parse_close(a)?;
                    bail!("broker closed the channel during create: {reason}");
                }
                Some(id)
            } else {
                None
            };
            conn.rstart += used;
            match outcome {
                Some(id) if id == method::QUEUE_DECLARE_OK => {
                    *declares = declares.saturating_sub(1)
                }
                Some(id) if id == method::QUEUE_BIND_OK => *binds = binds.saturating_sub(1),
                _ => {}
            }
            break;
        }
    }
    Ok(())
}

async fn route(conn: &mut Connection, bpq: u64, messages: u32) -> Result<Duration> {
    let body = [0u8; 12];
    let t = Instant::now();
    let mut confirmed = 0u64;
    let mut sent = 0u64;
    while sent < messages as u64 {
        let batch = (messages as u64 - sent).min(PIPELINE_OPS_MAX as u64);
        for _ in 0..batch {
            let key = format!("k{}", sent % bpq);
            wire::basic_publish(
                &mut conn.wbuf,
                2,
                EXCHANGE,
                &key,
                false,
                false,
                &body,
                conn.frame_max,
            );
            sent += 1;
        }
        conn.flush().await?;
        confirmed = wait_confirms(conn, confirmed, sent).await?;
    }
    Ok(t.elapsed())
}

async fn wait_confirms(conn: &mut Connection, mut confirmed: u64, until: u64) -> Result<u64> {
    let deadline = Instant::now() + CONFIRM_WAIT_MAX;
    while confirmed < until {
        while let Some((frame, used)) =
            wire::parse_frame(&conn.rbuf[conn.rstart..conn.rend], conn.frame_max)?
        {
            if frame.kind == FRAME_METHOD {
                let (id, mut a) = wire::method_of(frame.payload)?;
                if id == method::BASIC_ACK || id == method::BASIC_NACK {
                    let tag = a.u64()?;
                    let multiple = a.u8()? & 1 == 1;
                    if id == method::BASIC_NACK {
                        bail!("broker nacked publish {tag} while timing routing");
                    }
                    confirmed = if multiple {
                        confirmed.max(tag)
                    } else {
                        confirmed + 1
                    };
                } else if id == method::CHANNEL_CLOSE || id == method::CONNECTION_CLOSE {
                    bail!(
                        "broker closed the channel during routing: {}",
                        wire::parse_close(a)?
                    );
                }
            }
            conn.rstart += used;
        }
        if confirmed >= until {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("confirms for routed messages did not arrive within {CONFIRM_WAIT_MAX:?}");
        }
        tokio::time::timeout(left, conn.fill())
            .await
            .context("waiting for confirms")??;
    }
    Ok(confirmed)
}

async fn delete(conn: &mut Connection, queues: u64) -> Result<Duration> {
    let t = Instant::now();
    let mut q = 0;
    while q < queues {
        let batch = (queues - q).min(PIPELINE_OPS_MAX as u64);
        for i in q..q + batch {
            wire::queue_delete(&mut conn.wbuf, 1, &queue_name(i));
        }
        conn.flush().await?;
        expect_n(conn, 1, method::QUEUE_DELETE_OK, batch as usize).await?;
        q += batch;
    }
    Ok(t.elapsed())
}

/// Several runs on the same charts: one line per (run, series), later runs dashed.
pub fn compare_charts(results: &[ScaleResult]) -> Vec<(&'static str, Chart)> {
    let mut merged: Vec<(&'static str, Chart)> = Vec::new();
    for (i, r) in results.iter().enumerate() {
        for (name, mut chart) in charts(r) {
            let series = std::mem::take(&mut chart.series)
                .into_iter()
                .enumerate()
                .map(|(k, mut s)| {
                    s.name = format!("{}: {}", r.label, s.name);
                    s.color = Some(k);
                    s.dashed = i % 2 == 1;
                    s
                });
            match merged.iter_mut().find(|(n, _)| *n == name) {
                Some((_, c)) => c.series.extend(series),
                None => {
                    let mut c = chart.clone();
                    c.title = c
                        .title
                        .split_once(": ")
                        .map(|(_, t)| t.to_string())
                        .unwrap_or(c.title);
                    c.series = series.collect();
                    merged.push((name, c));
                }
            }
        }
    }
    merged
}

/// Draws earlier runs together; writes the charts and a report into `out`.
pub fn run_compare(cli: &ScaleCli) -> Result<Vec<PathBuf>> {
    let mut results = Vec::new();
    for p in &cli.compare {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let r: ScaleResult = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a scale.json", p.display()))?;
        results.push(r);
    }
    std::fs::create_dir_all(&cli.out)?;
    let mut files = Vec::new();
    let mut svgs = Vec::new();
    for (name, chart) in compare_charts(&results) {
        let (png, svg) = chart.write(&cli.out.join(name))?;
        svgs.push((chart.title.clone(), svg.clone()));
        files.push(png);
        files.push(svg);
    }
    let labels: Vec<String> = results.iter().map(|r| report::escape(&r.label)).collect();
    let body = format!(
        "<p>Runs: {}.</p>{}",
        labels.join(", "),
        report::inline_svgs(&svgs)?
    );
    let html = cli.out.join("report.html");
    write_text(&html, &report::page("warren perf scale: comparison", &body))?;
    files.push(html);
    Ok(files)
}

pub async fn run(cli: &ScaleCli, stop: watch::Receiver<bool>) -> Result<ScaleResult> {
    if !cli.compare.is_empty() {
        for f in run_compare(cli)? {
            println!("wrote {}", f.display());
        }
        return Ok(ScaleResult::default());
    }
    let uri = Uri::parse(&cli.uri)?;
    std::fs::create_dir_all(&cli.out).with_context(|| format!("creating {}", cli.out.display()))?;
    let mut conn = Connection::open(&uri, 0, "warren-perf-scale").await?;
    conn.open_channel(1).await?;
    conn.open_channel(2).await?;
    conn.confirm_select(2).await?;
    conn.declare_exchange(1, EXCHANGE, "direct", false).await?;
    let points = grid(cli.base, cli.x, cli.y);
    let bar = progress::for_steps(points.len() as u64, "scale");
    let mut result = ScaleResult {
        label: cli.label.clone(),
        base: cli.base,
        x: cli.x,
        y: cli.y,
        points: Vec::new(),
        stop_reason: "Completed the grid".into(),
    };
    println!("queues,bindings_per_queue,create_us_per_queue,route_us_per_msg,route_us_per_msg_per_queue,delete_us_per_queue");
    for (queues, bpq) in points {
        if *stop.borrow() {
            result.stop_reason = "Interrupted".into();
            break;
        }
        bar.set_message(format!("{queues} queues x {bpq} bindings"));
        let created = create(&mut conn, queues, bpq).await?;
        let routed = route(&mut conn, bpq, cli.messages).await?;
        let deleted = delete(&mut conn, queues).await?;
        let p = ScalePoint {
            queues,
            bindings_per_queue: bpq,
            create_us_per_queue: created.as_secs_f64() * 1e6 / queues as f64,
            delete_us_per_queue: deleted.as_secs_f64() * 1e6 / queues as f64,
            route_us_per_msg: routed.as_secs_f64() * 1e6 / cli.messages.max(1) as f64,
            route_us_per_msg_per_queue: routed.as_secs_f64() * 1e6
                / cli.messages.max(1) as f64
                / queues as f64,
            messages: cli.messages,
        };
        bar.println(&format!(
            "{},{},{:.1},{:.2},{:.3},{:.1}",
            p.queues,
            p.bindings_per_queue,
            p.create_us_per_queue,
            p.route_us_per_msg,
            p.route_us_per_msg_per_queue,
            p.delete_us_per_queue
        ));
        result.points.push(p);
        bar.inc(1);
    }
    bar.finish();
    conn.delete_exchange(1, EXCHANGE).await?;
    conn.close().await;
    for f in write_outputs(&result, &cli.out)? {
        println!("wrote {}", f.display());
    }
    Ok(result)
}

pub const SCALE_CSV_HEADER: &str =
    "queues,bindings_per_queue,create_us_per_queue,delete_us_per_queue,route_us_per_msg,route_us_per_msg_per_queue,messages";

pub fn scale_csv(r: &ScaleResult) -> String {
    let mut out = String::from(SCALE_CSV_HEADER);
    out.push('\n');
    for p in &r.points {
        let _ = writeln!(
            out,
            "{},{},{:.3},{:.3},{:.3},{:.4},{}",
            p.queues,
            p.bindings_per_queue,
            p.create_us_per_queue,
            p.delete_us_per_queue,
            p.route_us_per_msg,
            p.route_us_per_msg_per_queue,
            p.messages
        );
    }
    out
}

fn series_by<F: Fn(&ScalePoint) -> (u64, f64, f64)>(
    points: &[ScalePoint],
    prefix: &str,
    f: F,
) -> Vec<Series> {
    let mut keys: Vec<u64> = points.iter().map(|p| f(p).0).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .map(|k| {
            let pts = points
                .iter()
                .filter(|p| f(p).0 == k)
                .map(|p| (f(p).1, f(p).2))
                .collect();
            Series::new(format!("{prefix}{k}"), pts).with_markers()
        })
        .collect()
}

pub fn charts(r: &ScaleResult) -> Vec<(&'static str, Chart)> {
    let p = &r.points;
    vec![
        (
            "create",
            Chart {
                title: format!("{}: queue creation with its bindings", r.label),
                x_label: "queues".into(),
                y_label: "µs per queue".into(),
                log_x: true,
                log_y: true,
                series: series_by(p, "bindings/queue ", |p| {
                    (p.bindings_per_queue, p.queues as f64, p.create_us_per_queue)
                }),
            },
        ),
        (
            "delete",
            Chart {
                title: format!("{}: queue deletion with its bindings", r.label),
                x_label: "queues".into(),
                y_label: "µs per queue".into(),
                log_x: true,
                log_y: true,
                series: series_by(p, "bindings/queue ", |p| {
                    (p.bindings_per_queue, p.queues as f64, p.delete_us_per_queue)
                }),
            },
        ),
        (
            "route",
            Chart {
                title: format!("{}: routing a message to every bound queue", r.label),
                x_label: "bindings per queue".into(),
                y_label: "µs per message".into(),
                log_x: true,
                log_y: true,
                series: series_by(p, "queues ", |p| {
                    (p.queues, p.bindings_per_queue as f64, p.route_us_per_msg)
                }),
            },
        ),
    ]
}

pub fn write_outputs(r: &ScaleResult, out: &std::path::Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out)?;
    let mut files = vec![out.join("scale.json"), out.join("scale.csv")];
    write_text(&files[0], &serde_json::to_string_pretty(r)?)?;
    write_text(&files[1], &scale_csv(r))?;
    let mut svgs = Vec::new();
    for (name, chart) in charts(r) {
        let (png, svg) = chart.write(&out.join(name))?;
        svgs.push((chart.title.clone(), svg.clone()));
        files.push(png);
        files.push(svg);
    }
    let mut body = format!(
        "<p>Base {} , queue exponent {}, bindings-per-queue exponent {}: {} grid points.</p><table><tr><th>queues</th><th>bindings/queue</th><th>create µs/queue</th><th>delete µs/queue</th><th>route µs/msg</th><th>route µs/msg/queue</th></tr>",
        r.base, r.x, r.y, r.points.len()
    );
    for p in &r.points {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:.2}</td><td>{:.3}</td></tr>",
            p.queues, p.bindings_per_queue, p.create_us_per_queue, p.delete_us_per_queue, p.route_us_per_msg, p.route_us_per_msg_per_queue
        );
    }
    body.push_str("</table>");
    body.push_str(&report::inline_svgs(&svgs)?);
    let html = out.join("report.html");
    write_text(
        &html,
        &report::page(&format!("warren perf scale: {}", r.label), &body),
    )?;
    files.push(html);
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_is_the_triangle_below_the_mean_exponent() {
        let g = grid(2, 2, 2);
        // i + j <= 2: (1,1) (2,1) (4,1) (1,2) (2,2) (1,4)
        assert_eq!(g, vec![(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4)]);
        assert_eq!(grid(10, 0, 0), vec![(1, 1)]);
    }
}
