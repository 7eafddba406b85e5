//! The AMQP handshake of one connection, up to connection.open-ok: protocol header, SASL
//! (PLAIN, AMQPLAIN, EXTERNAL over TLS), tuning, the vhost and its permissions, and the
//! deadline that bounds it all. What it negotiates starts the [`super::connection::Connection`].

use crate::amqp::connection::{control, ClientCaps};
use crate::Shared;
use amq_protocol_types::{AMQPValue, FieldTable, LongString};
use bytes::BytesMut;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncRead, AsyncReadExt};
use warren_broker::broker::SharedVHost;
use warren_broker::error::AmqpError;
use warren_broker::outbox::Outbox;
use warren_broker::users::Permissions;
use warren_protocol::amqp::{connection, AMQPClass};
use warren_protocol::constants::*;
use warren_protocol::frame::{self, Frame, FRAME_MIN_BYTES};
use warren_protocol::method::{Method, MethodError};

pub(crate) struct Negotiated {
    pub(crate) user: String,
    pub(crate) vhost_name: String,
    pub(crate) vhost: SharedVHost,
    pub(crate) permissions: Permissions,
    pub(crate) frame_max: u32,
    pub(crate) channel_max: u16,
    pub(crate) heartbeat_s: u16,
    pub(crate) caps: ClientCaps,
    /// What the client said of itself, for the management API.
    pub(crate) client_properties: FieldTable,
    pub(crate) mechanism: String,
    /// Counts the connection against its vhost's and user's `max-connections` while held.
    pub(crate) admission: crate::amqp::registry::Admission,
}

/// The RabbitMQ release warren answers as (the reference of the differential interop suite).
pub const RABBITMQ_VERSION_IMPLEMENTED: &str = "3.10.8";

fn server_properties() -> FieldTable {
    let mut caps = FieldTable::default();
    for c in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    ] {
        caps.insert(c.into(), AMQPValue::Boolean(true));
    }
    let mut p = FieldTable::default();
    let s = |v: &str| AMQPValue::LongString(LongString::from(v));
    p.insert("capabilities".into(), AMQPValue::FieldTable(caps));
    p.insert("product".into(), s("warren"));
    // Clients gate features on `version` (RabbitMQ's), so it names the RabbitMQ release whose
    // behaviour warren implements; warren's own version is beside it.
    p.insert("version".into(), s(RABBITMQ_VERSION_IMPLEMENTED));
    p.insert("warren_version".into(), s(env!("CARGO_PKG_VERSION")));
    p.insert("platform".into(), s("Rust"));
    p.insert("cluster_name".into(), s("warren@localhost"));
    p.insert("copyright".into(), s("The warren authors"));
    p.insert(
        "information".into(),
        s("Licensed under the Apache License 2.0"),
    );
    p
}

/// A connection that is not open within `handshake_timeout` of its accept is closed, logged and
/// counted, as RabbitMQ does.
pub(crate) fn handshake_timed_out(shared: &Shared, peer: SocketAddr, when: &str) {
    shared
        .counters
        .handshake_timeouts
        .fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        %peer,
        "handshake not finished within the handshake timeout ({} ms, {when}): closing",
        shared.config.handshake_timeout_ms
    );
}

/// Reads the next frame during the handshake; `None` when the peer went away or sent garbage.
async fn next_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    frame_max: u32,
) -> Result<Frame, Option<AmqpError>> {
    loop {
        match frame::decode(buf, frame_max) {
            Ok(Some(f)) => return Ok(f),
            Ok(None) => {}
            Err(e) => return Err(Some(AmqpError::new(FRAME_ERROR, e))),
        }
        match rd.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(None),
            Ok(_) => {}
        }
    }
}

async fn next_connection_method<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    frame_max: u32,
) -> Result<connection::AMQPMethod, Option<AmqpError>> {
    loop {
        let f = next_frame(rd, buf, frame_max).await?;
        match f.kind {
            frame::FRAME_HEARTBEAT => continue,
            frame::FRAME_METHOD => {}
            _ => {
                return Err(Some(AmqpError::new(
                    UNEXPECTED_FRAME,
                    "expected method frame, got non method frame instead",
                )))
            }
        }
        return match Method::decode(f.payload) {
            Ok(Method::Other(AMQPClass::Connection(m))) if f.channel == 0 => Ok(m),
            Ok(_) => Err(Some(AmqpError::command_invalid(
                "expected a connection method during the handshake",
            ))),
            Err(MethodError::Syntax { .. }) => {
                Err(Some(AmqpError::new(SYNTAX_ERROR, "malformed method frame")))
            }
            Err(MethodError::Unknown {
                class_id,
                method_id,
            }) => Err(Some(AmqpError::command_invalid(format!(
                "unknown method {class_id}/{method_id}"
            )))),
        };
    }
}

/// The configured mechanisms this connection may use: EXTERNAL on TLS connections only, as
/// RabbitMQ offers it.
/// Whether `user` is held to loopback (RabbitMQ's `loopback_users`) and `ip` is not one: an
/// IPv4-mapped IPv6 peer (a dual-stack listener) counts by its IPv4 address.
pub(crate) fn loopback_refused(
    loopback_users: &[String],
    user: &str,
    ip: std::net::IpAddr,
) -> bool {
    let loopback = match ip {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
    };
    !loopback && loopback_users.iter().any(|u| u == user)
}

fn offered_mechanisms(cfg: &crate::node::config::ServerConfig, tls: bool) -> Vec<&str> {
    cfg.auth_mechanisms
        .iter()
        .map(String::as_str)
        .filter(|m| tls || *m != "EXTERNAL")
        .collect()
}

/// A refused login: logged with the peer's address and why, and counted for `/metrics`.
fn auth_failed(shared: &Shared, peer: SocketAddr, mechanism: &str, user: &str, why: &str) {
    shared
        .counters
        .auth_failures
        .fetch_add(1, Ordering::Relaxed);
    tracing::warn!(%peer, %user, %mechanism, "login refused: {why}");
}

pub(crate) fn credentials(mechanism: &str, response: &[u8]) -> Result<(String, String), AmqpError> {
    match mechanism {
        "PLAIN" => {
            let mut parts = response.split(|b| *b == 0);
            let _authzid = parts.next();
            let user = parts.next().unwrap_or_default();
            let pass = parts.next().unwrap_or_default();
            Ok((
                String::from_utf8_lossy(user).into_owned(),
                String::from_utf8_lossy(pass).into_owned(),
            ))
        }
        "AMQPLAIN" => {
            let table = warren_protocol::content::decode_table(response).map_err(|_| {
                AmqpError::new(SYNTAX_ERROR, "AMQPLAIN response is not a field table")
            })?;
            let get = |k: &str| {
                table
                    .inner()
                    .get(k)
                    .and_then(warren_broker::args::string)
                    .unwrap_or_default()
            };
            Ok((get("LOGIN"), get("PASSWORD")))
        }
        other => Err(AmqpError::command_invalid(format!(
            "unknown authentication mechanism '{other}'"
        ))),
    }
}

pub(crate) async fn handshake<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    outbox: &Outbox,
    shared: &Shared,
    peer: SocketAddr,
    tls: Option<&crate::tls::TlsPeer>,
) -> Result<Negotiated, Option<(AmqpError, u16, u16)>> {
    let cfg = &shared.config;
    control(
        outbox,
        0,
        AMQPClass::Connection(connection::AMQPMethod::Start(connection::Start {
            version_major: 0,
            version_minor: 9,
            server_properties: server_properties(),
            mechanisms: LongString::from(offered_mechanisms(cfg, tls.is_some()).join(" ")),
            locales: LongString::from("en_US"),
        })),
    );
    let connection::AMQPMethod::StartOk(start_ok) =
        next_connection_method(rd, buf, FRAME_MIN_BYTES)
            .await
            .map_err(|e| e.map(|e| (e, 0, 0)))?
    else {
        return Err(Some((
            AmqpError::command_invalid("expected connection.start-ok"),
            0,
            0,
        )));
    };
    let mut caps = ClientCaps::default();
    if let Some(AMQPValue::FieldTable(t)) = start_ok.client_properties.inner().get("capabilities") {
        let on = |k: &str| matches!(t.inner().get(k), Some(AMQPValue::Boolean(true)));
        caps = ClientCaps {
            consumer_cancel_notify: on("consumer_cancel_notify"),
            connection_blocked: on("connection.blocked"),
            authentication_failure_close: on("authentication_failure_close"),
        };
    }
    let mechanism = start_ok.mechanism.as_str().to_string();
    let refused = || {
        AmqpError::access_refused(format!(
            "Login was refused using authentication mechanism {mechanism}. For details see the broker logfile."
        ))
    };
    let offered = offered_mechanisms(cfg, tls.is_some());
    let login = if !offered.contains(&mechanism.as_str()) {
        Err(AmqpError::command_invalid(format!(
            "unknown authentication mechanism '{mechanism}'"
        )))
    } else if mechanism == "EXTERNAL" {
        // The user is the one the client certificate names; it must exist, no password.
        let name = shared
            .tls
            .as_ref()
            .ok_or_else(|| "not SSL connection".to_string())
            .and_then(|t| t.external_user(tls));
        match name {
            Ok(user) => Ok((user, None)),
            Err(why) => {
                auth_failed(shared, peer, &mechanism, "", &why);
                return Err(caps.authentication_failure_close.then(|| (refused(), 0, 0)));
            }
        }
    } else {
        credentials(&mechanism, start_ok.response.as_bytes()).map(|(u, p)| (u, Some(p)))
    };
    let (user, password) = match login {
        Ok(l) => l,
        Err(e) => {
            auth_failed(shared, peer, &mechanism, "", &e.text);
            return Err(Some((e, 0, 0)));
        }
    };
    let authenticated = {
        let users = shared.broker.users.read().expect("users lock");
        match &password {
            Some(password) => users.authenticate(&user, password),
            None => users.exists(&user),
        }
    };
    let loopback_refused = loopback_refused(&cfg.loopback_users, &user, peer.ip());
    if !authenticated || loopback_refused {
        let why = if loopback_refused {
            format!("user '{user}' may only connect via localhost")
        } else if password.is_some() {
            "invalid credentials".into()
        } else {
            "no such user".into()
        };
        auth_failed(shared, peer, &mechanism, &user, &why);
        return Err(if caps.authentication_failure_close {
            Some((refused(), 0, 0))
        } else {
            None
        });
    }
    control(
        outbox,
        0,
        AMQPClass::Connection(connection::AMQPMethod::Tune(connection::Tune {
            channel_max: cfg.channel_max,
            frame_max: cfg.frame_max_bytes,
            heartbeat: cfg.heartbeat_s,
        })),
    );
    let connection::AMQPMethod::TuneOk(tune) = next_connection_method(rd, buf, FRAME_MIN_BYTES)
        .await
        .map_err(|e| e.map(|e| (e, 0, 0)))?
    else {
        return Err(Some((
            AmqpError::command_invalid("expected connection.tune-ok"),
            0,
            0,
        )));
    };
    if tune.frame_max != 0 && tune.frame_max < FRAME_MIN_BYTES {
        return Err(Some((
            AmqpError::not_allowed(format!(
                "frame_max={} < {} min size",
                tune.frame_max, FRAME_MIN_BYTES
            )),
            0,
            0,
        )));
    }
    if tune.frame_max > cfg.frame_max_bytes || (tune.frame_max == 0 && cfg.frame_max_bytes != 0) {
        return Err(Some((
            AmqpError::not_allowed(format!(
                "frame_max={} > {} max size",
                tune.frame_max, cfg.frame_max_bytes
            )),
            0,
            0,
        )));
    }
    if tune.channel_max > cfg.channel_max || (tune.channel_max == 0 && cfg.channel_max != 0) {
        return Err(Some((
            AmqpError::not_allowed(format!(
                "channel_max={} > {} max",
                tune.channel_max, cfg.channel_max
            )),
            0,
            0,
        )));
    }
    let channel_max = if tune.channel_max == 0 {
        cfg.channel_max
    } else {
        tune.channel_max
    };
    let frame_max = tune.frame_max;
    let connection::AMQPMethod::Open(open) = next_connection_method(rd, buf, frame_max)
        .await
        .map_err(|e| e.map(|e| (e, 0, 0)))?
    else {
        return Err(Some((
            AmqpError::command_invalid("expected connection.open"),
            0,
            0,
        )));
    };
    let vhost_name = open.virtual_host.as_str().to_string();
    let Some(vhost) = shared.broker.vhost(&vhost_name) else {
        return Err(Some((
            AmqpError::not_allowed(format!("vhost {vhost_name} not found")),
            10,
            40,
        )));
    };
    // As RabbitMQ: the connection limits are checked before the user's access to the vhost.
    let admission = crate::amqp::access::admit_connection(shared, &vhost, &vhost_name, &user)
        .await
        .map_err(|e| Some((e, 10, 40)))?;
    let permissions = shared
        .broker
        .users
        .read()
        .expect("users lock")
        .permissions(&user, &vhost_name)
        .cloned();
    let Some(permissions) = permissions else {
        return Err(Some((
            AmqpError::not_allowed(format!(
                "access to vhost '{vhost_name}' refused for user '{user}'"
            )),
            10,
            40,
        )));
    };
    control(
        outbox,
        0,
        AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {})),
    );
    Ok(Negotiated {
        user,
        vhost_name,
        vhost,
        permissions,
        frame_max,
        channel_max,
        heartbeat_s: tune.heartbeat,
        caps,
        client_properties: start_ok.client_properties,
        mechanism,
        admission,
    })
}

#[cfg(test)]
mod loopback_tests {
    use super::loopback_refused;

    #[test]
    fn only_the_loopback_users_are_refused_and_only_from_elsewhere() {
        let guest = ["guest".to_string()];
        let outside = "10.88.0.1".parse().unwrap();
        assert!(loopback_refused(&guest, "guest", outside));
        assert!(!loopback_refused(
            &guest,
            "guest",
            "127.0.0.2".parse().unwrap()
        ));
        assert!(!loopback_refused(&guest, "guest", "::1".parse().unwrap()));
        assert!(!loopback_refused(
            &guest,
            "guest",
            "::ffff:127.0.0.1".parse().unwrap()
        ));
        assert!(loopback_refused(
            &guest,
            "guest",
            "::ffff:10.88.0.1".parse().unwrap()
        ));
        assert!(!loopback_refused(&guest, "admin", outside));
        assert!(!loopback_refused(&[], "guest", outside));
    }
}
