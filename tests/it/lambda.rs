//! The Lambda host serves the same router: real function URL events (the
//! files `cargo lambda invoke --data-file` takes) go through it.

use http_body_util::BodyExt;
use std::path::Path;
use tower::ServiceExt;

async fn invoke(event_file: &str) -> (http::StatusCode, Vec<u8>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("events")
        .join(event_file);
    let text = std::fs::read_to_string(path).expect("event");
    let request = lambda_http::request::from_str(&text).expect("a function URL event");
    let state = porch_webhooks::AppState::new(
        porch_webhooks::config::WebhookConfig::default(),
        std::sync::Arc::new(porch_webhooks::authz::StaticAuthorizer::DenyAll),
    );
    let response = porch_webhooks::router(state)
        .oneshot(request)
        .await
        .expect("response");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    (status, body)
}

#[tokio::test]
async fn function_url_events_reach_the_router() {
    for file in [
        "function-url-validate.json",
        "function-url-validate-base64.json",
    ] {
        let (status, body) = invoke(file).await;
        assert_eq!(status, http::StatusCode::OK, "{file}");
        let answer: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(
            answer["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002",
            "{file}"
        );
        assert_eq!(answer["response"]["allowed"], false, "{file}");
        let message = answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            message.contains("must be created as Draft"),
            "{file}: {message}"
        );
    }
    let (status, body) = invoke("function-url-convert.json").await;
    assert_eq!(status, http::StatusCode::OK);
    let answer: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(answer["response"]["result"]["status"], "Success");
    assert_eq!(
        answer["response"]["convertedObjects"][0]["apiVersion"],
        "porch.kpt.dev/v1alpha1"
    );
    let (status, body) = invoke("function-url-healthz.json").await;
    assert_eq!(
        (status, body.as_slice()),
        (http::StatusCode::OK, b"ok".as_slice())
    );
}
