//! The admin listener: `/healthz`, `/readyz`, `/metrics`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::blocks::BlockStore;
use crate::metrics::Metrics;

/// What the admin endpoints report on.
pub struct AdminState {
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Blocks, for tier gauges.
    pub blocks: Arc<BlockStore>,
    /// Set once the S3 listener accepts connections.
    pub ready: AtomicBool,
}

/// The admin router.
pub fn router(state: Arc<AdminState>) -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}

async fn metrics(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    let stats = s.blocks.memory().stats();
    s.metrics.memory_capacity.set(stats.capacity_bytes);
    s.metrics.memory_used.set(stats.used_bytes);
    s.metrics.memory_entries.set(stats.entries);
    s.metrics.memory_evictions.set(stats.evictions);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
}
