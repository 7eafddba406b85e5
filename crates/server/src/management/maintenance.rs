//! `POST /api/warren/drain` and `POST /api/warren/revive`: `warren ctl drain` / `revive`, for
//! an administrator; the node's maintenance mode itself is [`crate::node::maintenance`].

use super::{authorize, error};
use crate::node::maintenance::{drain, revive};
use crate::Shared;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use std::sync::Arc;

pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/api/warren/drain", post(drain_route))
        .route("/api/warren/revive", post(revive_route))
}

async fn drain_route(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    match drain(&s).await {
        Ok(d) => Json(d).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e),
    }
}

async fn revive_route(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    match revive(&s).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e),
    }
}
