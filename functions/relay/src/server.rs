//! The relay's HTTP endpoints: `/healthz` (the process answers), `/readyz`
//! (a standby, or a leader whose first lists of PackageRevisions and
//! Repositories are in), and
//! `/metrics` (Prometheus text).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

/// What the endpoints read.
#[derive(Clone)]
pub struct Health {
    /// Set once every watch has listed its objects.
    pub ready: Vec<Arc<AtomicBool>>,
    /// With leader election: whether this replica leads. A standby is
    /// ready (it has nothing to list), so rollouts do not wait on it.
    pub leading: Option<Arc<AtomicBool>>,
    /// The Prometheus text, produced on each scrape.
    pub metrics: Arc<dyn Fn() -> String + Send + Sync>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

/// The router of the three endpoints.
pub fn router(health: Health) -> Router {
    let ready = health.ready.clone();
    let leading = health.leading.clone();
    let metrics = Arc::clone(&health.metrics);
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                let leading = leading.clone();
                async move {
                    if leading.is_some_and(|l| !l.load(Ordering::SeqCst)) {
                        (StatusCode::OK, "standby")
                    } else if ready.iter().all(|r| r.load(Ordering::SeqCst)) {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "watches not listed yet")
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let metrics = Arc::clone(&metrics);
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        metrics(),
                    )
                        .into_response()
                }
            }),
        )
}
