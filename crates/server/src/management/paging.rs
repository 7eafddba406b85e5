//! Server-side paging, filtering and sorting of listings, as RabbitMQ's management API does
//! it (`?page=2&page_size=100&name=orders&use_regex=false&sort=messages&sort_reverse=true`),
//! so a UI (or a script) over 10,000 queues fetches one page, not all of them.
//!
//! Without `page` a listing is the whole array, as before; with it, RabbitMQ's envelope:
//! `{"items", "page", "page_size", "page_count", "item_count", "filtered_count",
//! "total_count"}`.

use super::error;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::HashMap;

/// RabbitMQ's bound on `page_size`.
pub const PAGE_SIZE_MAX: usize = 500;
const PAGE_SIZE_DEFAULT: usize = 100;

/// RabbitMQ's answer to a page, size or regex that is not one.
fn invalid() -> Response {
    error(StatusCode::BAD_REQUEST, "Pagination parameters are invalid")
}

fn with_word(word: &str, reason: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({ "error": word, "reason": reason })),
    )
        .into_response()
}

/// A listing's answer: paged when the query asks, else the whole array.
pub fn paged(items: Vec<Value>, params: &HashMap<String, String>) -> Response {
    respond(page(items, params))
}

/// A listing's answer built lazily: `json` runs only for the items of the page when the sort
/// is by name (the UI's) or absent, so a page of 10,000 queues builds 50 queues' JSON.
pub fn paged_by<T>(
    items: Vec<T>,
    name: impl Fn(&T) -> &str,
    json: impl Fn(&T) -> Value,
    params: &HashMap<String, String>,
) -> Response {
    respond(page_of(items, name, json, params))
}

fn respond(v: Result<Value, Response>) -> Response {
    match v {
        Ok(v) => axum::Json(v).into_response(),
        Err(r) => r,
    }
}

/// The listing `items` as the query asks for it; errors in RabbitMQ's words.
pub fn page(items: Vec<Value>, params: &HashMap<String, String>) -> Result<Value, Response> {
    if !params.contains_key("page") {
        return Ok(Value::Array(items));
    }
    page_of(
        items,
        |i| i["name"].as_str().unwrap_or_default(),
        Value::clone,
        params,
    )
}

/// What `?page=..` asks for.
struct Ask {
    page: usize,
    page_size: usize,
    sort: Option<String>,
    reverse: bool,
}

fn ask(params: &HashMap<String, String>) -> Result<Option<Ask>, Response> {
    let Some(page) = params.get("page") else {
        return Ok(None);
    };
    let page: i64 = page.parse().map_err(|_| invalid())?;
    let page_size: Option<i64> = match params.get("page_size") {
        None => None,
        Some(s) => Some(s.parse().map_err(|_| invalid())?),
    };
    let size_ok = page_size.is_none_or(|n| (1..=PAGE_SIZE_MAX as i64).contains(&n));
    if page < 1 || !size_ok {
        let size = page_size.map_or("undefined".to_string(), |n| n.to_string());
        return Err(with_word(
            "invalid_pagination_parameters",
            format!("Invalid pagination parameters: page number {page}, page size {size}"),
        ));
    }
    Ok(Some(Ask {
        page: page as usize,
        page_size: page_size.map_or(PAGE_SIZE_DEFAULT, |n| n as usize),
        sort: params.get("sort").filter(|k| !k.is_empty()).cloned(),
        reverse: params.get("sort_reverse").is_some_and(|v| v == "true"),
    }))
}

/// Whether a name passes the query's `name`.
type NameFilter = Box<dyn Fn(&str) -> bool>;

/// `name` (a case-insensitive substring, or a regex with `use_regex=true`) as a predicate.
fn name_filter(params: &HashMap<String, String>) -> Result<NameFilter, Response> {
    let Some(name) = params.get("name").filter(|n| !n.is_empty()) else {
        return Ok(Box::new(|_| true));
    };
    if params.get("use_regex").is_some_and(|v| v == "true") {
        let re = regex::Regex::new(name).map_err(|_| invalid())?;
        Ok(Box::new(move |n| re.is_match(n)))
    } else {
        let needle = name.to_lowercase();
        Ok(Box::new(move |n| n.to_lowercase().contains(&needle)))
    }
}

fn page_of<T>(
    mut items: Vec<T>,
    name: impl Fn(&T) -> &str,
    json: impl Fn(&T) -> Value,
    params: &HashMap<String, String>,
) -> Result<Value, Response> {
    let Some(ask) = ask(params)? else {
        return Ok(Value::Array(items.iter().map(json).collect()));
    };
    let total_count = items.len();
    let keep = name_filter(params)?;
    items.retain(|i| keep(name(i)));
    let filtered_count = items.len();
    // As RabbitMQ: a page past the last is empty, one that starts past the end is refused.
    let (page, page_size) = (ask.page, ask.page_size);
    if (page - 1).saturating_mul(page_size) > filtered_count {
        return Err(with_word(
            "page_out_of_range",
            format!(
                "Page out of range, page: {page} page size: {page_size}, len: {filtered_count}"
            ),
        ));
    }
    let skip = (page - 1) * page_size;
    let items: Vec<Value> = match ask.sort.as_deref() {
        None | Some("name") => {
            if ask.sort.is_some() {
                items.sort_by(|a, b| name(a).cmp(name(b)));
            }
            if ask.reverse {
                items.reverse();
            }
            items.iter().skip(skip).take(page_size).map(json).collect()
        }
        Some(key) => {
            let mut all: Vec<Value> = items.iter().map(json).collect();
            all.sort_by(|a, b| compare(field(a, key), field(b, key)));
            if ask.reverse {
                all.reverse();
            }
            all.into_iter().skip(skip).take(page_size).collect()
        }
    };
    Ok(json!({
        "item_count": items.len(),
        "items": items,
        "page": page,
        "page_size": page_size,
        "page_count": filtered_count.div_ceil(page_size),
        "filtered_count": filtered_count,
        "total_count": total_count,
    }))
}

/// A sort key: `messages`, or a dotted path such as `message_stats.publish_details.rate`.
fn field<'a>(item: &'a Value, key: &str) -> &'a Value {
    key.split('.')
        .fold(item, |v, k| v.get(k).unwrap_or(&Value::Null))
}

fn compare(a: &Value, b: &Value) -> std::cmp::Ordering {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x
            .as_f64()
            .unwrap_or(0.0)
            .total_cmp(&y.as_f64().unwrap_or(0.0)),
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Null, Value::Null) => std::cmp::Ordering::Equal,
        (Value::Null, _) => std::cmp::Ordering::Less,
        (_, Value::Null) => std::cmp::Ordering::Greater,
        _ => a.to_string().cmp(&b.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| json!({"name": format!("q{i:05}"), "messages": i % 7}))
            .collect()
    }

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn without_page_the_listing_is_the_whole_array() {
        let got = page(queues(3), &params(&[])).unwrap();
        assert_eq!(got.as_array().unwrap().len(), 3);
    }

    #[test]
    fn a_page_of_ten_thousand_queues_holds_page_size_items_and_the_counts() {
        let got = page(
            queues(10_000),
            &params(&[("page", "3"), ("page_size", "500")]),
        )
        .unwrap();
        assert_eq!(got["items"].as_array().unwrap().len(), 500);
        assert_eq!(got["items"][0]["name"], "q01000");
        assert_eq!(got["page_count"], 20);
        assert_eq!(got["total_count"], 10_000);
    }

    #[test]
    fn name_filters_by_substring_or_regex_before_paging() {
        let p = params(&[("page", "1"), ("name", "Q0999")]);
        let got = page(queues(10_000), &p).unwrap();
        assert_eq!(got["filtered_count"], 10);
        let p = params(&[
            ("page", "1"),
            ("name", "^q0000[12]$"),
            ("use_regex", "true"),
        ]);
        let got = page(queues(10_000), &p).unwrap();
        assert_eq!(got["filtered_count"], 2);
    }

    #[test]
    fn a_page_just_past_the_last_is_empty_as_in_rabbitmq() {
        let got = page(queues(2), &params(&[("page", "3"), ("page_size", "1")])).unwrap();
        assert_eq!(got["item_count"], 0);
        assert_eq!(got["page_count"], 2);
    }

    #[test]
    fn sort_orders_by_a_field_and_reverses() {
        let p = params(&[
            ("page", "1"),
            ("sort", "messages"),
            ("sort_reverse", "true"),
        ]);
        let got = page(queues(20), &p).unwrap();
        assert_eq!(got["items"][0]["messages"], 6);
    }

    #[test]
    fn bad_paging_is_a_400_not_a_panic() {
        for p in [
            params(&[("page", "0")]),
            params(&[("page", "x")]),
            params(&[("page", "1"), ("page_size", "100000")]),
            params(&[("page", "-1")]),
            params(&[("page", "3"), ("page_size", "1"), ("name", "q00001")]),
            params(&[("page", "1"), ("name", "("), ("use_regex", "true")]),
        ] {
            let r = page(queues(10), &p).unwrap_err();
            assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        }
    }
}
