//! Who is calling and what their tags let them do, as RabbitMQ's management plugin decides it:
//!
//! - any of `management`, `policymaker`, `monitoring`, `administrator` may use the API; a user
//!   with none gets 401 "Not management user", a bad login 401 "Login failed";
//! - `administrator` sees every vhost's objects, and alone manages users, vhosts, permissions
//!   and definitions ("Not administrator user");
//! - `monitoring` (and administrator) reads node-wide things: every vhost's name, every
//!   connection and channel, `/api/nodes` ("Not monitor user");
//! - everyone else sees and manages only the vhosts they have permissions on; another vhost is
//!   left out of every list and any request naming it gets 401 "User not authorised to access
//!   virtual host". What they may do inside a vhost is their AMQP permissions, checked by the
//!   channel code the API runs its methods through.

use super::{error, not_found};
use crate::Shared;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde_json::json;
use warren_broker::broker::SharedVHost;

const MANAGEMENT_TAGS: [&str; 4] = ["management", "policymaker", "monitoring", "administrator"];

/// An authenticated user of the API with a management tag.
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: String,
    pub tags: Vec<String>,
}

impl Caller {
    fn has(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t == tag)
    }

    pub fn is_admin(&self) -> bool {
        self.has("administrator")
    }

    /// Reads node-wide state: every vhost's name, every connection and channel.
    pub fn is_monitor(&self) -> bool {
        self.is_admin() || self.has("monitoring")
    }

    /// Whether the objects of `vhost` (queues, exchanges, bindings, consumers) are visible.
    pub fn sees_vhost(&self, s: &Shared, vhost: &str) -> bool {
        self.is_admin()
            || s.broker
                .users
                .read()
                .expect("users lock")
                .can_access_vhost(&self.user, vhost)
    }

    /// Whether `vhost` is in `/api/vhosts`: monitors list every one.
    pub fn lists_vhost(&self, s: &Shared, vhost: &str) -> bool {
        self.is_monitor() || self.sees_vhost(s, vhost)
    }

    /// Whether a connection (or its channels) of `user` is visible: one's own, or all for a
    /// monitor.
    pub fn sees_user(&self, user: &str) -> bool {
        self.is_monitor() || self.user == user
    }
}

fn login_failed() -> Response {
    // RabbitMQ spells it "not_authorized" here, and "not_authorised" everywhere else.
    (
        StatusCode::UNAUTHORIZED,
        [("www-authenticate", "Basic realm=\"RabbitMQ Management\"")],
        Json(json!({ "error": "not_authorized", "reason": "Login failed" })),
    )
        .into_response()
}

/// The caller, once their credentials and management tag are checked.
pub fn caller(s: &Shared, headers: &HeaderMap) -> Result<Caller, Response> {
    let value = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(login_failed)?;
    let encoded = value.strip_prefix("Basic ").ok_or_else(login_failed)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| login_failed())?;
    let text = String::from_utf8(decoded).map_err(|_| login_failed())?;
    let (user, pass) = text.split_once(':').ok_or_else(login_failed)?;
    let users = s.broker.users.read().expect("users lock");
    if !users.authenticate(user, pass) {
        return Err(login_failed());
    }
    let tags = users.tags(user);
    if !tags.iter().any(|t| MANAGEMENT_TAGS.contains(&t.as_str())) {
        return Err(error(StatusCode::UNAUTHORIZED, "Not management user"));
    }
    Ok(Caller {
        user: user.to_string(),
        tags,
    })
}

/// A caller with the administrator tag.
pub fn admin(s: &Shared, headers: &HeaderMap) -> Result<Caller, Response> {
    let c = caller(s, headers)?;
    if !c.is_admin() {
        return Err(error(StatusCode::UNAUTHORIZED, "Not administrator user"));
    }
    Ok(c)
}

/// A caller with the monitoring or administrator tag.
pub fn monitor(s: &Shared, headers: &HeaderMap) -> Result<Caller, Response> {
    let c = caller(s, headers)?;
    if !c.is_monitor() {
        return Err(error(StatusCode::UNAUTHORIZED, "Not monitor user"));
    }
    Ok(c)
}

/// Basic auth by an administrator, for the routes only administrators use.
pub(crate) fn authorize(s: &Shared, headers: &HeaderMap) -> Result<(), Response> {
    admin(s, headers).map(drop)
}

/// The vhost a request names: 404 when it does not exist, 401 when the caller may not see it.
pub fn vhost(s: &Shared, caller: &Caller, name: &str) -> Result<SharedVHost, Response> {
    let v = s.broker.vhost(name).ok_or_else(not_found)?;
    if !caller.sees_vhost(s, name) {
        return Err(not_authorised_vhost());
    }
    Ok(v)
}

/// The vhost a change names: RabbitMQ answers a missing one with `vhost_not_found`.
pub fn vhost_for_change(s: &Shared, caller: &Caller, name: &str) -> Result<SharedVHost, Response> {
    let v = s
        .broker
        .vhost(name)
        .ok_or_else(|| error(StatusCode::NOT_FOUND, "vhost_not_found"))?;
    if !caller.sees_vhost(s, name) {
        return Err(not_authorised_vhost());
    }
    Ok(v)
}

pub fn not_authorised_vhost() -> Response {
    error(
        StatusCode::UNAUTHORIZED,
        "User not authorised to access virtual host",
    )
}
