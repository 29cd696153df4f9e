//! Shared helpers: a deterministic authorizer and a router driven with `oneshot`.

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use porch_webhooks::authz::{ApprovalRequest, Authorizer, AuthzFuture, Decision};
use porch_webhooks::config::WebhookConfig;
use porch_webhooks::{AppState, router};
use std::sync::Arc;
use tower::ServiceExt;

/// Allows approval to members of `porch-approvers`, as an RBAC binding would.
#[derive(Debug)]
pub(crate) struct GroupAuthorizer;

impl Authorizer for GroupAuthorizer {
    fn can_approve<'a>(&'a self, request: ApprovalRequest<'a>) -> AuthzFuture<'a> {
        Box::pin(async move {
            let approver = request
                .user
                .groups
                .iter()
                .flatten()
                .any(|g| g == "porch-approvers");
            Ok(if approver {
                Decision::Allowed
            } else {
                Decision::Denied {
                    reason: format!(
                        "user {:?} may not approve packagerevisions.porch.kpt.dev in namespace {:?}",
                        request.user.username.as_deref().unwrap_or(""),
                        request.namespace
                    ),
                }
            })
        })
    }
}

pub(crate) fn state(config: WebhookConfig) -> AppState {
    AppState::new(config, Arc::new(GroupAuthorizer))
}

/// Sends one request through a fresh router.
pub(crate) async fn call(
    state: &AppState,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("request");
    let response = router(state.clone())
        .oneshot(request)
        .await
        .expect("infallible");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, bytes.to_vec())
}

pub(crate) fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}
