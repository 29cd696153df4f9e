//! The webhook router end to end: any body sent to `/validate`, `/mutate` or
//! `/convert` gets a well-formed review back (or a 4xx), never a 5xx or a
//! panic; the uid is echoed; a mutation's patch applies to the object.

use axum::Router;
use axum::body::Body;
use base64::Engine as _;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use porch_webhooks::authz::{ApprovalRequest, Authorizer, AuthzFuture, Decision};
use porch_webhooks::config::WebhookConfig;
use porch_webhooks::{AppState, router};
use serde_json::Value;
use std::sync::{Arc, OnceLock};
use tower::ServiceExt;

/// Approves for members of `porch-approvers`, so both answers are reachable.
#[derive(Debug)]
struct GroupAuthorizer;

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
                    reason: "not in porch-approvers".to_owned(),
                }
            })
        })
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime builds")
    })
}

fn app() -> Router {
    static APP: OnceLock<Router> = OnceLock::new();
    APP.get_or_init(|| {
        router(AppState::new(
            WebhookConfig::default(),
            Arc::new(GroupAuthorizer),
        ))
    })
    .clone()
}

/// One POST through the router: status and body.
fn post(path: &str, body: &[u8]) -> (StatusCode, Vec<u8>) {
    let request = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a request with a fixed method, path and header builds");
    runtime().block_on(async {
        let response = app()
            .oneshot(request)
            .await
            .expect("the router is infallible");
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("a buffered body reads")
            .to_bytes();
        (status, bytes.to_vec())
    })
}

/// A 200 with a JSON body, or a 4xx; anything else breaks the contract.
fn answer(path: &str, body: &[u8]) -> Option<Value> {
    let (status, bytes) = post(path, body);
    assert!(
        status == StatusCode::OK || status.is_client_error(),
        "{path} answered {status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    if status != StatusCode::OK {
        return None;
    }
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{path} answered 200 with a body that is not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    Some(value)
}

/// `request.uid` of a body, when the body is JSON and has one.
fn request_uid(input: Option<&Value>) -> Option<&str> {
    input?.get("request")?.get("uid")?.as_str()
}

/// `POST /validate` and `POST /mutate` with the same body.
pub fn admission(data: &[u8]) {
    let input: Option<Value> = serde_json::from_slice(data).ok();
    for path in ["/validate", "/mutate"] {
        let Some(review) = answer(path, data) else {
            continue;
        };
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1", "{review}");
        assert_eq!(review["kind"], "AdmissionReview", "{review}");
        let response = &review["response"];
        let uid = response["uid"]
            .as_str()
            .unwrap_or_else(|| panic!("{path}: response.uid is not a string: {review}"));
        let allowed = response["allowed"]
            .as_bool()
            .unwrap_or_else(|| panic!("{path}: response.allowed is not a bool: {review}"));
        if let Some(sent) = request_uid(input.as_ref()) {
            assert_eq!(uid, sent, "{path} did not echo the uid: {review}");
        }
        if !allowed {
            let message = response["status"]["message"].as_str().unwrap_or_default();
            assert!(
                !message.is_empty(),
                "{path} denied without a message: {review}"
            );
        }
        if let Some(patch) = response.get("patch") {
            assert!(allowed, "{path} patched a denied request: {review}");
            assert_eq!(response["patchType"], "JSONPatch", "{review}");
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(patch.as_str().expect("patch is a base64 string"))
                .unwrap_or_else(|e| panic!("{path}: patch is not base64 ({e}): {review}"));
            let patch: json_patch::Patch = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{path}: patch is not a JSON patch ({e}): {review}"));
            let mut object = input
                .as_ref()
                .and_then(|i| i["request"].get("object"))
                .cloned()
                .unwrap_or_else(|| panic!("{path} patched a request without an object"));
            if let Err(e) = json_patch::patch(&mut object, &patch) {
                panic!("{path}: the patch does not apply to the object ({e}): {review}");
            }
        }
    }
}

/// Drops what the apiserver drops too: empty `metadata.annotations`,
/// `metadata.labels` and `status`.
fn normalise(mut object: Value) -> Value {
    let is_empty = |v: &Value| v.as_object().is_some_and(serde_json::Map::is_empty);
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in ["annotations", "labels"] {
            if metadata.get(key).is_some_and(is_empty) {
                metadata.remove(key);
            }
        }
    }
    if let Some(map) = object.as_object_mut()
        && map.get("status").is_some_and(is_empty)
    {
        map.remove("status");
    }
    object
}

const VERSIONS: [&str; 2] = ["porch.kpt.dev/v1alpha1", "porch.kpt.dev/v1alpha2"];

/// `POST /convert`: a success converts every object to the desired version,
/// and converting a converted object back and forth gives it again.
pub fn conversion(data: &[u8]) {
    let Some(review) = answer("/convert", data) else {
        return;
    };
    assert_eq!(review["apiVersion"], "apiextensions.k8s.io/v1", "{review}");
    assert_eq!(review["kind"], "ConversionReview", "{review}");
    let response = &review["response"];
    let input: Option<Value> = serde_json::from_slice(data).ok();
    if let Some(sent) = request_uid(input.as_ref()) {
        assert_eq!(
            response["uid"], sent,
            "/convert did not echo the uid: {review}"
        );
    }
    let status = response["result"]["status"].as_str();
    assert!(
        matches!(status, Some("Success" | "Failure")),
        "result.status is neither Success nor Failure: {review}"
    );
    if status == Some("Failure") {
        let message = response["result"]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "a failure without a message: {review}");
        return;
    }
    let request = &input.as_ref().expect("a converted review is JSON")["request"];
    let desired = request["desiredAPIVersion"]
        .as_str()
        .expect("a converted review names its desired version");
    let sent = request["objects"].as_array().expect("objects is a list");
    let converted = response["convertedObjects"]
        .as_array()
        .unwrap_or_else(|| panic!("a success without convertedObjects: {review}"));
    assert_eq!(sent.len(), converted.len(), "objects lost: {review}");
    let other = VERSIONS
        .into_iter()
        .find(|v| *v != desired)
        .expect("two versions");
    for (original, object) in sent.iter().zip(converted) {
        assert_eq!(object["apiVersion"], desired, "{object}");
        assert_eq!(object["kind"], "PackageRevision", "{object}");
        if original["apiVersion"] == desired {
            // passed through as sent, not written by conversion
            continue;
        }
        // desired → other → desired is an identity for what conversion wrote
        let back = convert_one(object, other);
        let again = convert_one(&back, desired);
        assert_eq!(
            normalise(again),
            normalise(object.clone()),
            "round trip through {other} changed the object"
        );
    }
}

/// Converts one object through the router, which must succeed.
fn convert_one(object: &Value, desired: &str) -> Value {
    let body = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "round-trip", "desiredAPIVersion": desired, "objects": [object]},
    });
    let bytes = serde_json::to_vec(&body).expect("a Value encodes");
    let review = answer("/convert", &bytes).expect("a small review is answered");
    assert_eq!(
        review["response"]["result"]["status"], "Success",
        "a converted object does not convert to {desired}: {review}"
    );
    review["response"]["convertedObjects"][0].clone()
}
