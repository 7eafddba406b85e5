//! `/api/users`, `/api/permissions` (administrators only) and `/api/whoami`.

use super::{auth, change, error, not_found, refuse_if_failed, Api, Body};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use warren_broker::definitions::MetaRecord;
use warren_broker::users::{Pattern, Permissions, Users};

/// RabbitMQ's name for the hash [`Users::password_hash`] gives.
const HASHING_ALGORITHM: &str = "rabbit_password_hashing_sha256";

fn user_json(users: &Users, name: &str) -> Value {
    json!({
        "name": name,
        "password_hash": users.password_hash(name).unwrap_or_default(),
        "hashing_algorithm": HASHING_ALGORITHM,
        "tags": users.tags(name),
        "limits": users.limits(name),
    })
}

fn permission_json(user: &str, vhost: &str, p: &Permissions) -> Value {
    json!({
        "user": user, "vhost": vhost,
        "configure": p.configure.as_str(), "write": p.write.as_str(), "read": p.read.as_str(),
    })
}

/// Who the caller is and their tags, as RabbitMQ's `/api/whoami`.
pub async fn whoami(State(s): Api, headers: HeaderMap) -> Response {
    match auth::caller(&s, &headers) {
        Ok(c) => Json(json!({ "name": c.user, "tags": c.tags })).into_response(),
        Err(r) => r,
    }
}

pub async fn list(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let users = s.broker.users.read().expect("users lock");
    let mut names = users.user_names();
    names.sort();
    Json(
        names
            .iter()
            .map(|n| user_json(&users, n))
            .collect::<Vec<_>>(),
    )
    .into_response()
}

pub async fn get_one(State(s): Api, headers: HeaderMap, Path(user): Path<String>) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let users = s.broker.users.read().expect("users lock");
    if !users.exists(&user) {
        return not_found();
    }
    Json(user_json(&users, &user)).into_response()
}

pub async fn list_permissions(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let mut all = s.broker.users.read().expect("users lock").all_permissions();
    all.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    Json(
        all.iter()
            .map(|(u, v, p)| permission_json(u, v, p))
            .collect::<Vec<_>>(),
    )
    .into_response()
}

pub async fn get_permissions(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, user)): Path<(String, String)>,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let users = s.broker.users.read().expect("users lock");
    match users.permissions(&user, &vhost) {
        Some(p) => Json(permission_json(&user, &vhost, p)).into_response(),
        None => not_found(),
    }
}

#[derive(Deserialize)]
pub struct UserBody {
    password: Option<String>,
    #[serde(default)]
    tags: Value,
}

pub async fn put(
    State(s): Api,
    headers: HeaderMap,
    Path(user): Path<String>,
    Body(body): Body<UserBody>,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let tags: Vec<String> = match &body.tags {
        Value::String(t) => t
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(String::from)
            .collect(),
        Value::Array(a) => a
            .iter()
            .filter_map(|t| t.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    };
    if let Err(r) = refuse_if_failed(&s) {
        return r;
    }
    // The hash is made here, once, so that every node (and the journal) has the same one.
    let (status, record) = {
        let users = s.broker.users.read().expect("users lock");
        let exists = users.exists(&user);
        let password_hash = match (&body.password, exists) {
            (None, true) => users.password_hash(&user).unwrap_or_default(),
            (password, _) => {
                let mut scratch = warren_broker::users::Users::default();
                scratch.add_user(&user, password.as_deref().unwrap_or_default(), vec![]);
                scratch.password_hash(&user).unwrap_or_default()
            }
        };
        let status = if exists {
            StatusCode::NO_CONTENT
        } else {
            StatusCode::CREATED
        };
        (
            status,
            MetaRecord::PutUser {
                name: user,
                password_hash,
                tags,
            },
        )
    };
    change(&s, record, status).await
}

pub async fn delete(State(s): Api, headers: HeaderMap, Path(user): Path<String>) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    if let Err(r) = refuse_if_failed(&s) {
        return r;
    }
    if !s.broker.users.read().expect("users lock").exists(&user) {
        return not_found();
    }
    change(
        &s,
        MetaRecord::DeleteUser { name: user },
        StatusCode::NO_CONTENT,
    )
    .await
}

#[derive(Deserialize)]
pub struct PermissionBody {
    configure: String,
    write: String,
    read: String,
}

pub async fn put_permissions(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, user)): Path<(String, String)>,
    Body(body): Body<PermissionBody>,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    if s.broker.vhost(&vhost).is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("vhost '{vhost}' does not exist"),
        );
    }
    let parse = |p: &str| {
        Pattern::new(p).map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                &format!("invalid pattern '{p}': {e}"),
            )
        })
    };
    for pattern in [&body.configure, &body.write, &body.read] {
        if let Err(r) = parse(pattern) {
            return r;
        }
    }
    if let Err(r) = refuse_if_failed(&s) {
        return r;
    }
    if !s.broker.users.read().expect("users lock").exists(&user) {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("user '{user}' does not exist"),
        );
    }
    let record = MetaRecord::SetPermissions {
        user,
        vhost,
        configure: body.configure,
        write: body.write,
        read: body.read,
    };
    change(&s, record, StatusCode::CREATED).await
}

pub async fn delete_permissions(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, user)): Path<(String, String)>,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    if let Err(r) = refuse_if_failed(&s) {
        return r;
    }
    let record = MetaRecord::ClearPermissions { user, vhost };
    change(&s, record, StatusCode::NO_CONTENT).await
}
