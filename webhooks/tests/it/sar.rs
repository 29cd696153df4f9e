//! Approval needs a SubjectAccessReview: allowed, denied, and an API error,
//! against a mock apiserver (wiremock) with real payloads.

use crate::support::{call, json};
use porch_webhooks::AppState;
use porch_webhooks::authz::SubjectAccessReviewAuthorizer;
use porch_webhooks::config::WebhookConfig;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use wiremock::matchers::{body_partial_json, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const SAR_PATH: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

fn approve_review() -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/validate/pass/v1alpha2-update-approve-by-approver.json"),
    )
    .expect("fixture")
}

async fn state_against(server: &MockServer) -> AppState {
    let config = kube::Config::new(server.uri().parse().expect("uri"));
    let client = kube::Client::try_from(config).expect("client");
    let webhook = WebhookConfig::default();
    let authorizer = SubjectAccessReviewAuthorizer::new(client, webhook.approval.clone());
    AppState::new(webhook, Arc::new(authorizer))
}

fn sar_answer(allowed: bool, reason: &str) -> serde_json::Value {
    json!({
        "kind": "SubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": {
            "resourceAttributes": {"namespace": "porch-demo", "verb": "approve", "group": "porch.kpt.dev", "resource": "packagerevisions", "name": "blueprints.basens.draft-1"},
            "user": "bob@example.com",
            "groups": ["porch-approvers", "system:authenticated"],
            "uid": "u-bob"
        },
        "status": {"allowed": allowed, "reason": reason}
    })
}

#[tokio::test]
async fn approval_allowed_by_subject_access_review() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(SAR_PATH))
        .and(body_partial_json(json!({
            "spec": {
                "user": "bob@example.com",
                "uid": "u-bob",
                "groups": ["porch-approvers", "system:authenticated"],
                "resourceAttributes": {"verb": "approve", "group": "porch.kpt.dev", "resource": "packagerevisions", "namespace": "porch-demo", "name": "blueprints.basens.draft-1"}
            }
        })))
        .respond_with(ResponseTemplate::new(201).set_body_json(sar_answer(true, "RBAC: allowed by RoleBinding \"approvers/porch-demo\"")))
        .expect(1)
        .mount(&server)
        .await;
    let state = state_against(&server).await;
    let (_, body) = call(&state, "POST", "/validate", approve_review()).await;
    let answer = json(&body);
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

#[tokio::test]
async fn approval_denied_by_subject_access_review() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(SAR_PATH))
        .respond_with(
            ResponseTemplate::new(201).set_body_json(sar_answer(false, "no RBAC policy matched")),
        )
        .expect(1)
        .mount(&server)
        .await;
    let state = state_against(&server).await;
    let (_, body) = call(&state, "POST", "/validate", approve_review()).await;
    let answer = json(&body);
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("separate right"), "{message}");
    assert!(message.contains("bob@example.com"), "{message}");
    assert!(message.contains("no RBAC policy matched"), "{message}");
}

#[tokio::test]
async fn approval_denied_when_the_api_fails() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(SAR_PATH))
        .respond_with(ResponseTemplate::new(500).set_body_json(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500
        })))
        .mount(&server)
        .await;
    let state = state_against(&server).await;
    let (_, body) = call(&state, "POST", "/validate", approve_review()).await;
    let answer = json(&body);
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.starts_with("cannot verify the right to approve"),
        "{message}"
    );
    assert!(
        message.contains("etcdserver: request timed out"),
        "{message}"
    );
}

#[tokio::test]
async fn other_updates_never_ask_the_api() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500))
        .expect(0)
        .mount(&server)
        .await;
    let state = state_against(&server).await;
    let propose = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/validate/pass/v1alpha2-update-propose.json"),
    )
    .expect("fixture");
    let (_, body) = call(&state, "POST", "/validate", propose).await;
    assert_eq!(json(&body)["response"]["allowed"], true);
}
