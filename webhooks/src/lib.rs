//! Admission and conversion webhooks for PackageRevision.
//!
//! [`router`] answers `POST /validate`, `POST /mutate`, `POST /convert`,
//! `GET /healthz` and `GET /metrics`. The same router is served over HTTPS by
//! `porch-webhooks` ([`server`]), by `porch-webhooks-lambda` on AWS Lambda,
//! and by tests with `oneshot`. Rules: spec `porch-v1alpha2.md` §2.3 (conversion),
//! §4.3 (transitions), §6.2 (names), §9 items 1–3, 12–15 (what the reference
//! leaves unchecked).

pub mod authz;
pub mod config;
pub mod conversion;
pub mod decode;
pub mod metrics;
pub mod mutate;
pub mod server;
pub mod validate;

use authz::{ApprovalRequest, Authorizer, Decision};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use config::WebhookConfig;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::response::StatusSummary;
use metrics::Metrics;
use std::sync::Arc;
use std::time::Instant;
use validate::Verdict;

/// Everything a request handler needs; cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState {
    pub config: Arc<WebhookConfig>,
    pub authorizer: Arc<dyn Authorizer>,
    pub metrics: Metrics,
}

impl AppState {
    pub fn new(config: WebhookConfig, authorizer: Arc<dyn Authorizer>) -> Self {
        Self {
            config: Arc::new(config),
            authorizer,
            metrics: Metrics::default(),
        }
    }
}

/// The webhook router. Bodies over `config.max_body_bytes` get HTTP 413.
pub fn router(state: AppState) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .route("/validate", post(validate_handler))
        .route("/mutate", post(mutate_handler))
        .route("/convert", post(convert_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics_handler))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

type Review = AdmissionReview<DynamicObject>;

/// Parses an AdmissionReview `v1` with a request, or says why not.
fn parse_admission(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, Box<AdmissionResponse>> {
    let review: Review = serde_json::from_slice(body)
        .map_err(|e| Box::new(AdmissionResponse::invalid(format!("invalid AdmissionReview: {e}"))))?;
    let uid = review
        .request
        .as_ref()
        .map(|r| r.uid.clone())
        .unwrap_or_default();
    if review.types.api_version != "admission.k8s.io/v1" || review.types.kind != "AdmissionReview" {
        let mut response = AdmissionResponse::invalid(format!(
            "unsupported review {}/{}: expected admission.k8s.io/v1 AdmissionReview",
            review.types.api_version, review.types.kind
        ));
        response.uid = uid;
        return Err(Box::new(response));
    }
    review
        .try_into()
        .map_err(|_| Box::new(AdmissionResponse::invalid("AdmissionReview has no request")))
}

fn unsupported_kind(req: &AdmissionRequest<DynamicObject>) -> String {
    let k = &req.kind;
    format!(
        "unsupported kind {}/{} {}: this webhook handles porch.kpt.dev PackageRevision (v1alpha1, v1alpha2) and config.porch.kpt.dev/v1alpha1 Repository",
        k.group, k.version, k.kind
    )
}

/// Full error text with every source, for denial messages.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

async fn decide_validate(
    state: &AppState,
    req: &AdmissionRequest<DynamicObject>,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(req);
    let verdict = match (
        req.kind.group.as_str(),
        req.kind.kind.as_str(),
        req.kind.version.as_str(),
    ) {
        ("porch.kpt.dev", "PackageRevision", _) => validate::package_revision(req, &state.config),
        ("config.porch.kpt.dev", "Repository", "v1alpha1") => validate::repository(req),
        _ => Verdict::Deny(unsupported_kind(req)),
    };
    match verdict {
        Verdict::Allow => response,
        Verdict::Deny(message) => response.deny(message),
        Verdict::NeedsApproval { namespace, name } => {
            let request = ApprovalRequest {
                user: &req.user_info,
                namespace: &namespace,
                name: &name,
            };
            match state.authorizer.can_approve(request).await {
                Ok(Decision::Allowed) => response,
                Ok(Decision::Denied { reason }) => response.deny(format!(
                    "approving (Proposed → Published) is a separate right: {reason}; ask a user with that right to approve"
                )),
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "approval check failed");
                    response.deny(format!("cannot verify the right to approve: {}", error_chain(&e)))
                }
            }
        }
    }
}

/// Encodes an admission review for the apiserver: `response.patch` as base64
/// (kube serialises the bytes as a number array, kube-rs/kube#1781).
pub fn encode_admission(review: Review) -> serde_json::Value {
    use base64::Engine as _;
    let patch = review.response.as_ref().and_then(|r| r.patch.clone());
    let mut value = serde_json::to_value(&review).unwrap_or_else(|e| {
        serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": "", "allowed": false, "status": {"message": format!("failed to encode the response: {e}")}}
        })
    });
    if let Some(patch) = patch {
        value["response"]["patch"] =
            serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(patch));
    }
    value
}

async fn validate_handler(State(state): State<AppState>, body: Bytes) -> Json<serde_json::Value> {
    let start = Instant::now();
    let (response, result) = match parse_admission(&body) {
        Err(invalid) => (*invalid, "invalid"),
        Ok(req) => {
            let response = decide_validate(&state, &req).await;
            let result = if response.allowed {
                "allowed"
            } else {
                "denied"
            };
            (response, result)
        }
    };
    state.metrics.observe("validate", result, start.elapsed());
    Json(encode_admission(response.into_review()))
}

fn decide_mutate(
    state: &AppState,
    req: &AdmissionRequest<DynamicObject>,
) -> (AdmissionResponse, &'static str) {
    let response = AdmissionResponse::from(req);
    if req.kind.group != "porch.kpt.dev" || req.kind.kind != "PackageRevision" {
        return (response.deny(unsupported_kind(req)), "denied");
    }
    match mutate::package_revision(req, &state.config) {
        Ok(ops) if ops.is_empty() => (response, "allowed"),
        Ok(ops) => match response.clone().with_patch(json_patch::Patch(ops)) {
            Ok(patched) => (patched, "patched"),
            Err(e) => (
                response.deny(format!("failed to encode the patch: {e}")),
                "denied",
            ),
        },
        Err(message) => (response.deny(message), "denied"),
    }
}

async fn mutate_handler(State(state): State<AppState>, body: Bytes) -> Json<serde_json::Value> {
    let start = Instant::now();
    let (response, result) = match parse_admission(&body) {
        Err(invalid) => (*invalid, "invalid"),
        Ok(req) => decide_mutate(&state, &req),
    };
    state.metrics.observe("mutate", result, start.elapsed());
    Json(encode_admission(response.into_review()))
}

async fn convert_handler(State(state): State<AppState>, body: Bytes) -> impl IntoResponse {
    let start = Instant::now();
    let review = conversion::review(&body);
    let ok = review
        .response
        .as_ref()
        .is_some_and(|r| r.result.status == Some(StatusSummary::Success));
    state.metrics.observe(
        "convert",
        if ok { "converted" } else { "failed" },
        start.elapsed(),
    );
    Json(review)
}

async fn metrics_handler(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}
