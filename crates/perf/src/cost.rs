//! Prices and leaderboards: what a configuration costs a month, and the three rankings of the
//! sizing study: top throughput, cost per 1000 msg/s per month at top throughput, and cost per
//! 1000 msg/s per month at a given target (only for configurations that met it).

use crate::charts::{Chart, Series};
use crate::cli::LeaderboardCli;
use crate::output::write_text;
use crate::report;
use crate::sweep::SweepResult;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// The table shipped with warren, used when --instances is not given.
pub const DEFAULT_INSTANCES_TOML: &str = include_str!("../instances.toml");

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    pub vcpu: u32,
    #[serde(default)]
    pub memory_gib: f64,
    pub monthly_usd: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Storage {
    pub per_gb_month_usd: f64,
    #[serde(default)]
    pub per_iops_month_usd: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PriceTable {
    pub instances: BTreeMap<String, Instance>,
    #[serde(default)]
    pub storage: BTreeMap<String, Storage>,
}

impl PriceTable {
    pub fn parse(text: &str) -> Result<PriceTable> {
        let t: PriceTable = toml::from_str(text).context("parsing the instances table")?;
        for (name, i) in &t.instances {
            if !(i.monthly_usd.is_finite() && i.monthly_usd > 0.0) {
                bail!("instance {name}: monthly_usd must be positive");
            }
        }
        Ok(t)
    }

    /// Monthly cost of `nodes` instances with their storage.
    pub fn monthly_usd(
        &self,
        instance: &str,
        nodes: u32,
        storage: Option<&str>,
        storage_gb: u32,
        storage_iops: u32,
    ) -> Result<f64> {
        let i = self.instances.get(instance).ok_or_else(|| {
            anyhow!(
                "unknown instance type {instance:?}; the table has: {}",
                self.instances
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        let per_node_storage = match storage {
            Some(s) => {
                let st = self.storage.get(s).ok_or_else(|| {
                    anyhow!(
                        "unknown storage {s:?}; the table has: {}",
                        self.storage.keys().cloned().collect::<Vec<_>>().join(", ")
                    )
                })?;
                storage_gb as f64 * st.per_gb_month_usd
                    + storage_iops as f64 * st.per_iops_month_usd
            }
            None => 0.0,
        };
        Ok(nodes as f64 * (i.monthly_usd + per_node_storage))
    }
}

pub fn load_table(path: Option<&Path>) -> Result<PriceTable> {
    match path {
        Some(p) => PriceTable::parse(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        ),
        None => PriceTable::parse(DEFAULT_INSTANCES_TOML),
    }
}

/// The configuration a sweep measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
/// Missing fields read as defaults, so files from older versions still load.
#[serde(default)]
pub struct ConfigInfo {
    pub name: String,
    pub instance_type: Option<String>,
    pub nodes: u32,
    pub storage: Option<String>,
    pub storage_gb: u32,
    pub storage_iops: u32,
    pub monthly_usd: Option<f64>,
}

/// Cost per 1000 msg/s per month at `rate`.
pub fn cost_per_1k(monthly_usd: f64, rate: f64) -> Option<f64> {
    (rate > 0.0).then(|| monthly_usd / (rate / 1000.0))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub value: f64,
    /// The rate the value refers to (for cost rankings).
    pub rate: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Leaderboard {
    pub top_throughput: Vec<Entry>,
    pub matched_target: Vec<Entry>,
    pub cost_at_top: Vec<Entry>,
    pub target_rate: Option<f64>,
    pub cost_at_target: Vec<Entry>,
}

/// Ranks sweeps. A configuration "met" a target when its step at that target passed.
pub fn leaderboard(
    runs: &[(String, SweepResult)],
    table: &PriceTable,
    target_rate: Option<f64>,
) -> Result<Leaderboard> {
    let mut lb = Leaderboard {
        target_rate,
        ..Default::default()
    };
    for (name, r) in runs {
        let top = r.top_rate();
        lb.top_throughput.push(Entry {
            name: name.clone(),
            value: top,
            rate: top,
        });
        if let Some(t) = r.top_passing_target() {
            lb.matched_target.push(Entry {
                name: name.clone(),
                value: t,
                rate: t,
            });
        }
        let monthly = match (&r.config.instance_type, r.config.monthly_usd) {
            (Some(t), _) => Some(table.monthly_usd(
                t,
                r.config.nodes,
                r.config.storage.as_deref(),
                r.config.storage_gb,
                r.config.storage_iops,
            )?),
            (None, m) => m,
        };
        let Some(monthly) = monthly else { continue };
        if let Some(c) = cost_per_1k(monthly, top) {
            lb.cost_at_top.push(Entry {
                name: name.clone(),
                value: c,
                rate: top,
            });
        }
        if let Some(target) = target_rate {
            let met = r
                .steps
                .iter()
                .any(|s| s.pass && (s.target_rate - target).abs() < 1e-6 * target.max(1.0));
            if met {
                if let Some(c) = cost_per_1k(monthly, target) {
                    lb.cost_at_target.push(Entry {
                        name: name.clone(),
                        value: c,
                        rate: target,
                    });
                }
            }
        }
    }
    let desc = |a: &Entry, b: &Entry| b.value.total_cmp(&a.value);
    let asc = |a: &Entry, b: &Entry| a.value.total_cmp(&b.value);
    lb.top_throughput.sort_by(desc);
    lb.matched_target.sort_by(desc);
    lb.cost_at_top.sort_by(asc);
    lb.cost_at_target.sort_by(asc);
    Ok(lb)
}

fn k(rate: f64) -> String {
    format!("{:.0}k", rate / 1000.0)
}

/// The leaderboards in the seed's words, as Markdown.
pub fn leaderboard_markdown(lb: &Leaderboard) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## Leaderboard in top throughput\n");
    for (i, e) in lb.top_throughput.iter().enumerate() {
        let _ = writeln!(s, "{}. {}. Rate: {:.0} msg/s", i + 1, e.name, e.value);
    }
    let _ = writeln!(s, "\n## Leaderboard in matched target throughput\n");
    for (i, e) in lb.matched_target.iter().enumerate() {
        let _ = writeln!(s, "{}. {}. Target met: {:.0} msg/s", i + 1, e.name, e.value);
    }
    let _ = writeln!(
        s,
        "\n## Leaderboard in cost per 1000 messages per month, at top throughput\n"
    );
    for (i, e) in lb.cost_at_top.iter().enumerate() {
        let _ = writeln!(
            s,
            "{}. {}. Cost: ${:.0} ({})",
            i + 1,
            e.name,
            e.value,
            k(e.rate)
        );
    }
    if let Some(t) = lb.target_rate {
        let _ = writeln!(
            s,
            "\n## Leaderboard in cost per 1000 messages per month at a target of {} msg/s\n",
            k(t)
        );
        for (i, e) in lb.cost_at_target.iter().enumerate() {
            let _ = writeln!(s, "{}. {}. Cost: ${:.0}", i + 1, e.name, e.value);
        }
    }
    s
}

/// The seed's overview figures: every configuration's achieved rate and p99 per target rate.
pub fn comparison_charts(runs: &[(String, SweepResult)]) -> Vec<(&'static str, Chart)> {
    let mut rates = vec![Series::new(
        "target",
        runs.iter()
            .flat_map(|(_, r)| r.steps.iter().map(|s| s.target_rate))
            .fold(Vec::<f64>::new(), |mut v, t| {
                if !v.contains(&t) {
                    v.push(t);
                }
                v
            })
            .into_iter()
            .map(|t| (t, t))
            .collect::<Vec<_>>(),
    )
    .dashed()];
    let mut p99 = Vec::new();
    for (name, r) in runs {
        rates.push(
            Series::new(
                name.clone(),
                r.steps
                    .iter()
                    .map(|s| (s.target_rate, s.achieved_rate))
                    .collect(),
            )
            .with_markers(),
        );
        p99.push(
            Series::new(
                name.clone(),
                r.steps
                    .iter()
                    .map(|s| (s.target_rate, s.latency_us.p99 as f64 / 1000.0))
                    .collect(),
            )
            .with_markers(),
        );
    }
    if let Some(first) = rates.first_mut() {
        first.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    vec![
        (
            "compare-rates",
            Chart {
                title: "Increasing intensity: rate reached per target".into(),
                x_label: "target rate (msg/s)".into(),
                y_label: "msg/s".into(),
                log_x: false,
                log_y: false,
                series: rates,
            },
        ),
        (
            "compare-p99",
            Chart {
                title: "Increasing intensity: p99 end-to-end latency per target".into(),
                x_label: "target rate (msg/s)".into(),
                y_label: "p99 latency (ms, log)".into(),
                log_x: false,
                log_y: true,
                series: p99,
            },
        ),
    ]
}

pub fn run_leaderboard(cli: &LeaderboardCli) -> Result<()> {
    let table = load_table(cli.instances.as_deref())?;
    let names: Option<Vec<String>> = cli
        .config_names
        .as_ref()
        .map(|n| n.split(',').map(|s| s.trim().to_string()).collect());
    if let Some(n) = &names {
        if n.len() != cli.runs.len() {
            bail!(
                "--config-names has {} names for {} runs",
                n.len(),
                cli.runs.len()
            );
        }
    }
    let mut runs = Vec::new();
    for (i, path) in cli.runs.iter().enumerate() {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let r: SweepResult = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a sweep.json", path.display()))?;
        let name = names
            .as_ref()
            .map(|n| n[i].clone())
            .unwrap_or_else(|| r.config.name.clone());
        runs.push((name, r));
    }
    let lb = leaderboard(&runs, &table, cli.target_rate)?;
    let md = leaderboard_markdown(&lb);
    print!("{md}");
    std::fs::create_dir_all(&cli.out)?;
    write_text(&cli.out.join("leaderboard.md"), &md)?;
    write_text(
        &cli.out.join("leaderboard.json"),
        &serde_json::to_string_pretty(&lb)?,
    )?;
    let mut svgs = Vec::new();
    for (name, chart) in comparison_charts(&runs) {
        let (_, svg) = chart.write(&cli.out.join(name))?;
        svgs.push((chart.title.clone(), svg));
    }
    write_text(
        &cli.out.join("leaderboard.html"),
        &report::leaderboard_html(&lb, &runs, &svgs)?,
    )?;
    println!("wrote {}", cli.out.join("leaderboard.html").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_table_prices_the_seed_configuration_as_the_article_does() {
        let t = load_table(None).unwrap();
        // Seed 000, gp2: 5 nodes of c5.2xlarge with 1 TB gp2 at 42k msg/s cost $41.
        let monthly = t
            .monthly_usd("c5.2xlarge", 5, Some("gp2"), 1000, 0)
            .unwrap();
        assert_eq!(cost_per_1k(monthly, 42_000.0).unwrap().round(), 41.0);
        assert_eq!(t.instances["c5.9xlarge"].vcpu, 36);
        assert!(t.monthly_usd("m5.large", 1, None, 0, 0).is_err());
        assert!(t
            .monthly_usd("c5.2xlarge", 1, Some("floppy"), 1, 0)
            .is_err());
    }
}
