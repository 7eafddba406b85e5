//! The web UI at `/`: three files built from `ui/` by `scripts/ui-build.sh` and committed under
//! `crates/server/assets/ui`, embedded in the binary so a node needs no internet and no build
//! step at run time. The page talks to this same API with the user's basic-auth login.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::sync::Arc;

const INDEX_HTML: &[u8] = include_bytes!("../../assets/ui/index.html");
const APP_JS: &[u8] = include_bytes!("../../assets/ui/app.js");
const APP_CSS: &[u8] = include_bytes!("../../assets/ui/app.css");

/// Scripts and styles from this origin only (uPlot sizes its elements with inline styles).
const CSP: &str = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:";

fn asset(content_type: &'static str, body: &'static [u8]) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, CSP),
        ],
        body,
    )
        .into_response()
}

pub fn routes() -> Router<Arc<crate::Shared>> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/index.html",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        // No icon: answered so that browsers do not log a 404 for it on every page.
        .route(
            "/favicon.ico",
            get(|| async { axum::http::StatusCode::NO_CONTENT }),
        )
        .route(
            "/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
}
