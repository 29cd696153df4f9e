//! Admission and conversion webhooks for PackageRevision, and admission for
//! Repository, PackageVariant and PackageVariantSet.
//!
//! [`router`] answers `POST /validate`, `POST /mutate`, `POST /convert`,
//! `GET /healthz` and `GET /metrics`. The same router is served over HTTPS by
//! `porch-webhooks` ([`server`]), by `porch-webhooks-lambda` on AWS Lambda,
//! and by tests with `oneshot`. Rules: spec `porch-v1alpha2.md` §2.3 (conversion),
//! §4.3 (transitions), §6.2 (names), §9 items 1–3, 12–15 (what the reference
//! leaves unchecked); `packagevariants.md` §1.4 and §3.3 (variants).

pub mod authz;
pub mod config;
pub mod conversion;
pub mod decode;
pub mod metrics;
pub mod mutate;
pub mod review;
/// The HTTPS host (shared with the function runner).
pub use porch_tls as server;
pub mod validate;

use authz::{ApprovalRequest, Authorizer, Decision};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use config::WebhookConfig;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionResponse, AdmissionReview};
use metrics::Metrics;
use review::{AdmissionInput, RequestHead};
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

/// The webhook router. Bodies over `config.max_body_bytes` get HTTP 413; at
/// most `config.max_in_flight` reviews are handled at once (health and
/// metrics are never queued behind them).
pub fn router(state: AppState) -> Router {
    let reviews = Router::new()
        .route("/validate", post(validate_handler))
        .route("/mutate", post(mutate_handler))
        .route("/convert", post(convert_handler))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
            state.config.max_in_flight.max(1),
        ));
    Router::new()
        .merge(reviews)
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics_handler))
        .with_state(state)
}

type Review = AdmissionReview<DynamicObject>;

/// What `/validate` handles, for the unsupported-kind answer.
const VALIDATED_KINDS: &str = "porch.kpt.dev PackageRevision (v1alpha1, v1alpha2), config.porch.kpt.dev/v1alpha1 Repository and PackageVariant, and config.porch.kpt.dev/v1alpha2 PackageVariantSet";
/// What `/mutate` handles.
const MUTATED_KINDS: &str = "porch.kpt.dev PackageRevision (v1alpha1, v1alpha2)";

fn unsupported_kind(input: &RequestHead, handled: &str) -> String {
    let k = &input.kind;
    format!(
        "unsupported kind {}/{} {}: this webhook handles {handled}",
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

async fn decide_validate(state: &AppState, input: &AdmissionInput<'_>) -> AdmissionResponse {
    let verdict = match (
        input.kind.group.as_str(),
        input.kind.kind.as_str(),
        input.kind.version.as_str(),
    ) {
        ("porch.kpt.dev", "PackageRevision", _) => validate::package_revision(input, &state.config),
        ("config.porch.kpt.dev", "Repository", "v1alpha1") => validate::repository(input),
        ("config.porch.kpt.dev", "PackageVariant", "v1alpha1") => validate::package_variant(input),
        ("config.porch.kpt.dev", "PackageVariantSet", "v1alpha2") => {
            validate::package_variant_set(input)
        }
        _ => Verdict::Deny(unsupported_kind(input, VALIDATED_KINDS)),
    };
    answer(state, input, verdict).await
}

/// Turns a verdict into the answer, asking the authorizer when needed.
async fn answer(state: &AppState, input: &RequestHead, verdict: Verdict) -> AdmissionResponse {
    let response = input.allow();
    match verdict {
        Verdict::Allow => response,
        Verdict::Deny(message) => response.deny(message),
        Verdict::NeedsApproval { namespace, name } => {
            let request = ApprovalRequest {
                user: &input.user_info,
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
pub fn encode_admission(mut review: Review) -> Vec<u8> {
    use base64::Engine as _;
    let patch = review.response.as_mut().and_then(|r| r.patch.take());
    let mut out = serde_json::to_vec(&review).unwrap_or_else(|e| {
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{{"uid":"","allowed":false,"status":{{"message":"failed to encode the response: {e}"}}}}}}"#
        )
        .into_bytes()
    });
    if let Some(patch) = patch
        && out.ends_with(b"}}")
    {
        // `response` is the last member: add `patch` before it closes
        let tail = out.split_off(out.len() - 2);
        out.extend_from_slice(br#","patch":""#);
        out.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode(patch)
                .as_bytes(),
        );
        out.push(b'"');
        out.extend_from_slice(&tail);
    }
    out
}

/// A JSON answer.
fn json_answer(body: Vec<u8>) -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], body)
}

async fn validate_handler(State(state): State<AppState>, body: Bytes) -> impl IntoResponse {
    let start = Instant::now();
    // the common case, a v1alpha2 PackageRevision, is read in one pass
    let (response, invalid) = match review::parse_revision_review(&body) {
        Some(review) => {
            let (head, verdict) = validate::package_revision_review(review, &state.config);
            (answer(&state, &head, verdict).await, false)
        }
        None => match review::parse(&body) {
            Err(invalid) => (*invalid, true),
            Ok(input) => (decide_validate(&state, &input).await, false),
        },
    };
    let result = match (invalid, response.allowed) {
        (true, _) => "invalid",
        (false, true) => "allowed",
        (false, false) => "denied",
    };
    state.metrics.observe("validate", result, start.elapsed());
    json_answer(encode_admission(response.into_review()))
}

fn decide_mutate(
    state: &AppState,
    input: &AdmissionInput<'_>,
) -> (AdmissionResponse, &'static str) {
    let response = input.allow();
    if input.kind.group != "porch.kpt.dev" || input.kind.kind != "PackageRevision" {
        return (
            response.deny(unsupported_kind(input, MUTATED_KINDS)),
            "denied",
        );
    }
    match mutate::package_revision(input, &state.config) {
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

async fn mutate_handler(State(state): State<AppState>, body: Bytes) -> impl IntoResponse {
    let start = Instant::now();
    let (response, result) = match review::parse(&body) {
        Err(invalid) => (*invalid, "invalid"),
        Ok(input) => decide_mutate(&state, &input),
    };
    state.metrics.observe("mutate", result, start.elapsed());
    json_answer(encode_admission(response.into_review()))
}

async fn convert_handler(State(state): State<AppState>, body: Bytes) -> impl IntoResponse {
    let start = Instant::now();
    // large reviews take milliseconds of CPU: keep them off the I/O threads
    let answer = if body.len() > 256 * 1024 {
        tokio::task::spawn_blocking(move || conversion::review(&body))
            .await
            .unwrap_or_else(|_| b"{}".to_vec())
    } else {
        conversion::review(&body)
    };
    let result = if conversion::succeeded(&answer) {
        "converted"
    } else {
        "failed"
    };
    state.metrics.observe("convert", result, start.elapsed());
    json_answer(answer)
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
