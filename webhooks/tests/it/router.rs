//! HTTP behaviour of the router: limits, hostile bodies, health, metrics,
//! the self-approval policy, and that mutation patches do what they say.

use crate::support::{call, json, state};
use base64::Engine as _;
use http::StatusCode;
use porch_webhooks::config::WebhookConfig;
use serde_json::Value;
use std::path::Path;

fn fixture(rel: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel);
    json(&std::fs::read(path).expect("fixture"))
}

#[tokio::test]
async fn bodies_over_the_limit_get_413() {
    let state = state(WebhookConfig {
        max_body_bytes: 4096,
        ..WebhookConfig::default()
    });
    let mut review = fixture("validate/pass/v1alpha2-create-init.json");
    review["request"]["object"]["metadata"]["annotations"] =
        serde_json::json!({"big": "x".repeat(8192)});
    let (status, _) = call(
        &state,
        "POST",
        "/validate",
        serde_json::to_vec(&review).expect("json"),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let (status, _) = call(&state, "POST", "/convert", vec![b' '; 10_000]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    // the default limit is 3 MiB
    assert_eq!(WebhookConfig::default().max_body_bytes, 3 * 1024 * 1024);
}

#[tokio::test]
async fn hostile_bodies_get_a_clear_invalid_answer() {
    let state = state(WebhookConfig::default());
    let nested = "[".repeat(100_000);
    let bodies: Vec<Vec<u8>> = vec![
        nested.into_bytes(),
        vec![0xff, 0xfe, 0x00, 0x01],
        b"null".to_vec(),
        b"{\"kind\":\"AdmissionReview\",\"apiVersion\":\"admission.k8s.io/v1\",\"request\":{\"uid\":7}}".to_vec(),
        Vec::new(),
    ];
    for body in bodies {
        for endpoint in ["/validate", "/mutate"] {
            let (status, bytes) = call(&state, "POST", endpoint, body.clone()).await;
            assert_eq!(status, StatusCode::OK);
            let answer = json(&bytes);
            assert_eq!(answer["response"]["allowed"], false);
            let message = answer["response"]["status"]["message"]
                .as_str()
                .unwrap_or_default();
            assert!(message.starts_with("invalid AdmissionReview"), "{message}");
        }
        let (status, bytes) = call(&state, "POST", "/convert", body).await;
        assert_eq!(status, StatusCode::OK);
        let answer = json(&bytes);
        assert_eq!(answer["response"]["result"]["status"], "Failure");
    }
}

#[tokio::test]
async fn health_routes_and_methods() {
    let state = state(WebhookConfig::default());
    let (status, body) = call(&state, "GET", "/healthz", Vec::new()).await;
    assert_eq!(
        (status, body.as_slice()),
        (StatusCode::OK, b"ok".as_slice())
    );
    assert_eq!(
        call(&state, "GET", "/validate", Vec::new()).await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        call(&state, "POST", "/nope", Vec::new()).await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn metrics_count_requests_by_endpoint_and_result() {
    let state = state(WebhookConfig::default());
    let allowed =
        serde_json::to_vec(&fixture("validate/pass/v1alpha2-create-init.json")).expect("json");
    let denied = serde_json::to_vec(&fixture("validate/fail/v1alpha2-create-as-published.json"))
        .expect("json");
    call(&state, "POST", "/validate", allowed.clone()).await;
    call(&state, "POST", "/validate", allowed).await;
    call(&state, "POST", "/validate", denied).await;
    call(&state, "POST", "/convert", b"{".to_vec()).await;
    let (status, body) = call(&state, "GET", "/metrics", Vec::new()).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body).expect("utf8");
    assert!(
        text.contains(r#"porch_webhooks_requests_total{endpoint="validate",result="allowed"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"porch_webhooks_requests_total{endpoint="validate",result="denied"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"porch_webhooks_requests_total{endpoint="convert",result="failed"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"porch_webhooks_request_duration_seconds_count{endpoint="validate",result="allowed"} 2"#), "{text}");
}

#[tokio::test]
async fn self_approval_can_be_forbidden() {
    let mut review = fixture("validate/pass/v1alpha2-update-approve-by-approver.json");
    // bob proposed (as recorded by /mutate) and now approves
    for object in ["object", "oldObject"] {
        review["request"][object]["metadata"]["annotations"]["porch.kpt.dev/proposed-by"] =
            "bob@example.com".into();
    }
    let body = serde_json::to_vec(&review).expect("json");
    let lenient = state(WebhookConfig::default());
    let answer = json(&call(&lenient, "POST", "/validate", body.clone()).await.1);
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let mut config = WebhookConfig::default();
    config.approval.deny_self_approval = true;
    let strict = state(config);
    let answer = json(&call(&strict, "POST", "/validate", body).await.1);
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("proposed this revision and may not also approve it"),
        "{message}"
    );
}

/// Applies the patch of a mutate answer to the request object.
async fn mutated(rel: &str) -> (Value, Value) {
    let review = fixture(rel);
    let state = state(WebhookConfig::default());
    let answer = json(
        &call(
            &state,
            "POST",
            "/mutate",
            serde_json::to_vec(&review).expect("json"),
        )
        .await
        .1,
    );
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let mut object = review["request"]["object"].clone();
    if let Some(patch) = answer["response"]["patch"].as_str() {
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .expect("base64");
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("patch");
        json_patch::patch(&mut object, &patch).expect("patch applies to the request object");
    }
    (review, object)
}

#[tokio::test]
async fn create_defaults_apply_cleanly() {
    let (_, obj) = mutated("mutate/pass/v1alpha2-create-defaults.json").await;
    assert_eq!(obj["spec"]["lifecycle"], "Draft");
    assert_eq!(
        obj["metadata"]["labels"]["porch.kpt.dev/repository"],
        "blueprints"
    );
    assert_eq!(
        obj["metadata"]["finalizers"],
        serde_json::json!(["porch.kpt.dev/packagerevisions"])
    );

    let (_, obj) = mutated("mutate/pass/v1alpha1-create-default-init-task.json").await;
    assert_eq!(obj["spec"]["tasks"][0]["type"], "init");
    assert_eq!(
        obj["spec"]["tasks"][0]["init"]["description"],
        "basens description"
    );
    assert_eq!(
        obj["metadata"]["labels"]["team"], "a",
        "existing labels are kept"
    );
    assert_eq!(
        obj["metadata"]["finalizers"],
        serde_json::json!(["example.com/keep", "porch.kpt.dev/packagerevisions"])
    );

    let (review, obj) = mutated("mutate/pass/v1alpha2-create-already-defaulted.json").await;
    assert_eq!(obj, review["request"]["object"], "nothing to change");
}

#[tokio::test]
async fn provenance_is_recorded_and_cannot_be_forged() {
    let (_, obj) = mutated("mutate/pass/v1alpha2-update-propose-records-proposer.json").await;
    assert_eq!(
        obj["metadata"]["annotations"]["porch.kpt.dev/proposed-by"],
        "alice@example.com"
    );
    let (_, obj) = mutated("mutate/pass/v1alpha2-update-approve-records-approver.json").await;
    assert_eq!(
        obj["metadata"]["annotations"]["porch.kpt.dev/approved-by"],
        "bob@example.com"
    );
    assert_eq!(
        obj["metadata"]["annotations"]["porch.kpt.dev/proposed-by"],
        "alice@example.com"
    );
    let (review, obj) = mutated("mutate/pass/v1alpha2-update-undoes-forged-provenance.json").await;
    assert_eq!(
        obj["metadata"]["annotations"],
        review["request"]["oldObject"]["metadata"]["annotations"]
    );
    let (_, obj) = mutated("mutate/pass/v1alpha2-update-approve-without-annotations.json").await;
    assert_eq!(
        obj["metadata"]["annotations"]["porch.kpt.dev/proposed-by"],
        "alice@example.com"
    );
    assert_eq!(
        obj["metadata"]["annotations"]["porch.kpt.dev/approved-by"],
        "bob@example.com"
    );
    let (_, obj) = mutated("mutate/pass/v1alpha2-create-strips-forged-provenance.json").await;
    assert!(
        obj["metadata"]["annotations"]
            .get("porch.kpt.dev/approved-by")
            .is_none(),
        "{obj}"
    );
}
