//! `warren ctl`'s super stream commands, with rabbitmq-streams' names, arguments and
//! results (RabbitMQ 3.11+): `add_super_stream` declares a direct exchange marked
//! `x-super-stream`, one stream per partition and a binding to each carrying the partition's
//! `x-stream-partition-order`; `delete_super_stream` deletes the partitions bound to it, then
//! the exchange. Spoken to the management API as the rest of ctl is.

use super::{encode_segment as seg, expect_ok, request, Endpoint};
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

/// Most partitions one command creates: each is a stream with its own files and writer.
const PARTITIONS_MAX: u32 = 1024;

#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
pub enum StreamsCommand {
    /// Adds a super stream: partitions NAME-0..NAME-(N-1) (--partitions, default 3) or
    /// NAME-KEY for each of --binding-keys, bound to the exchange NAME.
    AddSuperStream(Box<AddSuperStream>),
    /// Deletes a super stream: its partition streams, then its exchange.
    DeleteSuperStream {
        name: String,
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
    },
}

#[derive(Args, Debug)]
pub struct AddSuperStream {
    name: String,
    #[arg(short = 'p', long = "vhost", default_value = "/")]
    vhost: String,
    /// The number of partitions (default 3); not with --binding-keys.
    #[arg(long, conflicts_with_all = ["binding_keys", "routing_keys"])]
    partitions: Option<i64>,
    /// Comma-separated binding keys, one partition each.
    #[arg(long = "binding-keys", conflicts_with = "routing_keys")]
    binding_keys: Option<String>,
    /// The old name of --binding-keys.
    #[arg(long = "routing-keys", hide = true)]
    routing_keys: Option<String>,
    /// The partitions' maximum size: bytes, or with a unit (20gb, 500mb, 1GiB).
    #[arg(long = "max-length-bytes")]
    max_length_bytes: Option<String>,
    /// The partitions' maximum age, an ISO 8601 duration (PT10M30S, P5DT8H).
    #[arg(long = "max-age")]
    max_age: Option<String>,
    /// The partitions' segment size: bytes, or with a unit (500mb, 1gb).
    #[arg(long = "stream-max-segment-size-bytes")]
    stream_max_segment_size_bytes: Option<String>,
    /// client-local, balanced, random or least-leaders, passed on as RabbitMQ 3.10 does.
    #[arg(long = "leader-locator")]
    leader_locator: Option<String>,
    #[arg(long = "initial-cluster-size")]
    initial_cluster_size: Option<i64>,
}

pub fn run(ep: &Endpoint, command: StreamsCommand) -> Result<(), String> {
    match command {
        StreamsCommand::AddSuperStream(add) => {
            let AddSuperStream {
                name,
                vhost,
                partitions,
                binding_keys,
                routing_keys,
                max_length_bytes,
                max_age,
                stream_max_segment_size_bytes,
                leader_locator,
                initial_cluster_size,
            } = *add;
            let keys = match binding_keys.or(routing_keys) {
                Some(list) => {
                    let keys = binding_keys_of(&list);
                    if keys.is_empty() {
                        return Err("--binding-keys names no key".into());
                    }
                    keys
                }
                None => {
                    let n = partitions.unwrap_or(3);
                    if n < 1 {
                        return Err("The partition number must be greater than 0".into());
                    }
                    if n > i64::from(PARTITIONS_MAX) {
                        return Err(format!("at most {PARTITIONS_MAX} partitions"));
                    }
                    (0..n).map(|i| i.to_string()).collect()
                }
            };
            let arguments = stream_arguments(
                max_length_bytes.as_deref(),
                max_age.as_deref(),
                stream_max_segment_size_bytes.as_deref(),
                leader_locator.as_deref(),
                initial_cluster_size,
            )?;
            add_super_stream(ep, &vhost, &name, &keys, arguments)?;
            println!("Super stream {name} has been created");
        }
        StreamsCommand::DeleteSuperStream { name, vhost } => {
            delete_super_stream(ep, &vhost, &name)?;
            println!("Super stream {name} has been deleted");
        }
    }
    Ok(())
}

/// rabbit_stream_utils:binding_keys: split on commas, trimmed, empty ones dropped.
fn binding_keys_of(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(String::from)
        .collect()
}

/// The partitions' queue arguments, checked as AddSuperStreamCommand validates its options,
/// with its refusals' texts.
fn stream_arguments(
    max_length_bytes: Option<&str>,
    max_age: Option<&str>,
    segment_bytes: Option<&str>,
    leader_locator: Option<&str>,
    initial_cluster_size: Option<i64>,
) -> Result<Map<String, Value>, String> {
    let mut args = Map::new();
    args.insert("x-queue-type".into(), json!("stream"));
    if let Some(v) = max_length_bytes {
        let n = information_unit(v)
            .ok_or("Invalid value for --max-length-bytes, valid example values: 100gb, 50mb")?;
        args.insert("x-max-length-bytes".into(), json!(n));
    }
    if let Some(v) = max_age {
        let s = iso8601_duration_s(v).ok_or(
            "Invalid value for --max-age, the value must a ISO 8601 duration, e.g. e.g. \
             PT10M30S for 10 minutes 30 seconds, P5DT8H for 5 days 8 hours.",
        )?;
        args.insert("x-max-age".into(), json!(format!("{s}s")));
    }
    if let Some(v) = segment_bytes {
        let n = information_unit(v).ok_or(
            "Invalid value for --stream-max-segment-size-bytes, valid example values: 100gb, \
             50mb",
        )?;
        args.insert("x-stream-max-segment-size-bytes".into(), json!(n));
    }
    if let Some(v) = leader_locator {
        // 3.10 stores the value given; 3.11+ store random and least-leaders as balanced.
        if !["client-local", "balanced", "random", "least-leaders"].contains(&v) {
            return Err(
                "Invalid value for --leader-locator, valid values are client-local, balanced."
                    .into(),
            );
        }
        args.insert("x-queue-leader-locator".into(), json!(v));
    }
    if let Some(n) = initial_cluster_size {
        if n < 1 {
            return Err(
                "Invalid value for --initial-cluster-size, the value must be positive.".into(),
            );
        }
        args.insert("x-initial-cluster-size".into(), json!(n));
    }
    Ok(args)
}

/// A size as rabbit_resource_monitor_misc:parse_information_unit reads one: digits, then
/// nothing (bytes) or a unit: k/kiB/m/MiB/g/GiB/t/TiB in powers of 1024, kb/KB/mb/MB/gb/GB/
/// tb/TB in powers of 1000.
fn information_unit(text: &str) -> Option<u64> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let n: u64 = digits.parse().ok()?;
    let factor: u64 = match unit {
        "" => 1,
        "k" | "kiB" => 1 << 10,
        "m" | "MiB" => 1 << 20,
        "g" | "GiB" => 1 << 30,
        "t" | "TiB" => 1 << 40,
        "kb" | "KB" => 1_000,
        "mb" | "MB" => 1_000_000,
        "gb" | "GB" => 1_000_000_000,
        "tb" | "TB" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(factor)
}

/// An ISO 8601 duration (`P1Y2M3DT4H5M6S`, any part left out) in seconds, a month counted
/// as 30 days and a year as 365, as the command's duration_to_seconds counts them.
fn iso8601_duration_s(text: &str) -> Option<u64> {
    let rest = text.strip_prefix('P')?;
    let (date, time) = match rest.split_once('T') {
        Some((d, t)) if !t.is_empty() => (d, Some(t)),
        Some(_) => return None,
        None => (rest, None),
    };
    let part = |s: &str, units: &[(char, u64)]| -> Option<(u64, bool)> {
        let (mut total, mut number, mut any, mut next_unit) = (0u64, String::new(), false, 0);
        for c in s.chars() {
            if c.is_ascii_digit() {
                number.push(c);
                continue;
            }
            let i = units[next_unit..].iter().position(|(u, _)| *u == c)? + next_unit;
            let n: u64 = number.parse().ok()?;
            total = total.checked_add(n.checked_mul(units[i].1)?)?;
            number.clear();
            any = true;
            next_unit = i + 1;
        }
        number.is_empty().then_some((total, any))
    };
    let (days, any_date) = part(
        date,
        &[('Y', 365 * 86_400), ('M', 30 * 86_400), ('D', 86_400)],
    )?;
    let (secs, any_time) = match time {
        Some(t) => part(t, &[('H', 3_600), ('M', 60), ('S', 1)])?,
        None => (0, false),
    };
    (any_date || any_time).then(|| days + secs)
}

fn add_super_stream(
    ep: &Endpoint,
    vhost: &str,
    name: &str,
    keys: &[String],
    arguments: Map<String, Value>,
) -> Result<(), String> {
    let exchange = format!("/api/exchanges/{}/{}", seg(vhost), seg(name));
    let (code, _) = request(ep, "GET", &exchange, None)?;
    if code == 200 {
        // rabbit_stream_manager's reference_already_exists text.
        return Err(format!("there is already an exchange named {name}"));
    }
    // Every partition must be new too: a super stream adopts no queue it did not create.
    for key in keys {
        let stream = format!("{name}-{key}");
        let path = format!("/api/queues/{}/{}", seg(vhost), seg(&stream));
        if request(ep, "GET", &path, None)?.0 == 200 {
            return Err(format!("there is already a queue named {stream}"));
        }
    }
    expect_ok(request(
        ep,
        "PUT",
        &exchange,
        Some(&json!({
            "type": "direct",
            "durable": true,
            "auto_delete": false,
            "internal": false,
            "arguments": { "x-super-stream": true },
        })),
    )?)?;
    for (order, key) in keys.iter().enumerate() {
        let stream = format!("{name}-{key}");
        let path = format!("/api/queues/{}/{}", seg(vhost), seg(&stream));
        expect_ok(request(
            ep,
            "PUT",
            &path,
            Some(&json!({ "durable": true, "auto_delete": false, "arguments": arguments })),
        )?)?;
        let binding = format!(
            "/api/bindings/{}/e/{}/q/{}",
            seg(vhost),
            seg(name),
            seg(&stream)
        );
        expect_ok(request(
            ep,
            "POST",
            &binding,
            Some(&json!({
                "routing_key": key,
                "arguments": { "x-stream-partition-order": order },
            })),
        )?)?;
    }
    Ok(())
}

/// The partitions of super stream `name`: the streams its exchange is bound to.
fn partitions(ep: &Endpoint, vhost: &str, name: &str) -> Result<Vec<String>, String> {
    let path = format!(
        "/api/exchanges/{}/{}/bindings/source",
        seg(vhost),
        seg(name)
    );
    let bindings: Value = serde_json::from_str(&expect_ok(request(ep, "GET", &path, None)?)?)
        .map_err(|e| format!("unreadable answer from {path}: {e}"))?;
    let mut out: Vec<String> = bindings
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["destination_type"] == "queue")
        .filter_map(|b| b["destination"].as_str().map(String::from))
        .collect();
    out.dedup();
    Ok(out)
}

fn delete_super_stream(ep: &Endpoint, vhost: &str, name: &str) -> Result<(), String> {
    let exchange = format!("/api/exchanges/{}/{}", seg(vhost), seg(name));
    let (code, body) = request(ep, "GET", &exchange, None)?;
    if code == 404 {
        return Err(format!(
            "super stream '{name}' in vhost '{vhost}' does not exist"
        ));
    }
    let x: Value = serde_json::from_str(&expect_ok((code, body))?)
        .map_err(|e| format!("unreadable answer from {exchange}: {e}"))?;
    if x["arguments"]["x-super-stream"] != true {
        return Err(format!(
            "exchange '{name}' in vhost '{vhost}' is not a super stream (no x-super-stream argument)"
        ));
    }
    for stream in partitions(ep, vhost, name)? {
        let path = format!("/api/queues/{}/{}", seg(vhost), seg(&stream));
        let (code, body) = request(ep, "DELETE", &path, None)?;
        if code != 404 {
            expect_ok((code, body))?;
        }
    }
    expect_ok(request(ep, "DELETE", &exchange, None)?).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_rabbitmqs_units() {
        assert_eq!(information_unit("100"), Some(100));
        assert_eq!(information_unit("20gb"), Some(20_000_000_000));
        assert_eq!(information_unit("500mb"), Some(500_000_000));
        assert_eq!(information_unit("1GiB"), Some(1 << 30));
        assert_eq!(information_unit("2k"), Some(2048));
        assert_eq!(information_unit("1.5gb"), None);
        assert_eq!(information_unit("gb"), None);
        assert_eq!(information_unit("10 gb"), None);
        assert_eq!(information_unit("99999999999999999999"), None);
    }

    #[test]
    fn durations_are_iso8601_in_seconds() {
        assert_eq!(iso8601_duration_s("PT10M30S"), Some(630));
        assert_eq!(iso8601_duration_s("P5DT8H"), Some(5 * 86_400 + 8 * 3_600));
        assert_eq!(iso8601_duration_s("P1Y"), Some(365 * 86_400));
        assert_eq!(iso8601_duration_s("P1M"), Some(30 * 86_400));
        assert_eq!(iso8601_duration_s("PT1M"), Some(60));
        for bad in [
            "", "P", "PT", "7D", "P1H", "PT1D", "P1DT", "PT1S1M", "P-1D", "PT1.5S",
        ] {
            assert_eq!(iso8601_duration_s(bad), None, "{bad}");
        }
    }

    #[test]
    fn binding_keys_are_trimmed_and_empty_ones_dropped() {
        assert_eq!(binding_keys_of("amer, emea,apac"), ["amer", "emea", "apac"]);
        assert!(binding_keys_of(" , ").is_empty());
    }
}
