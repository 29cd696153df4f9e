//! The Lambda-HTTP invoker against a mock of the Invoke API as `cargo lambda
//! watch` and Lambda answer: an Outcome, function errors by `errorType`,
//! HTTP failures, an unreachable endpoint.

use std::time::Duration;

use porch_api::invocation::{Invocation, Operation};
use porch_relay::invoker::{InvokeError, Invoker, LambdaHttp};
use serde_json::json;
use wiremock::matchers::{body_partial_json, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn invocation(operation: &str) -> Invocation {
    serde_json::from_value(json!({
        "operation": operation,
        "requestId": "req-1",
        "repository": {
            "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository",
            "metadata": {"name": "blueprints", "namespace": "default"},
            "spec": {"type": "git", "git": {"repo": "https://git.example.com/b.git", "branch": "main"}}
        }
    }))
    .expect("an invocation")
}

#[tokio::test]
async fn outcomes_and_function_errors_come_back_typed() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/2015-03-31/functions/porch-sync/invocations"))
        .and(body_partial_json(
            json!({"operation": "sync", "requestId": "req-1"}),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "delete": [{"apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
                        "namespace": "default", "name": "blueprints.gone.v1", "uid": "u"}],
            "requeueAfterSeconds": 60
        })))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/2015-03-31/functions/porch-source/invocations"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("X-Amz-Function-Error", "Unhandled")
                .set_body_json(json!({"errorType": "InvalidInvocation", "errorMessage": "invalid invocation: workspaceName"})),
        )
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/2015-03-31/functions/porch-render/invocations"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("X-Amz-Function-Error", "Unhandled")
                .set_body_json(
                    json!({"errorType": "Retryable", "errorMessage": "git: connection reset"}),
                ),
        )
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/2015-03-31/functions/porch-lifecycle/invocations"))
        .respond_with(ResponseTemplate::new(502).set_body_string("<html>bad gateway</html>"))
        .mount(&server)
        .await;
    let invoker =
        LambdaHttp::new(&server.uri(), "porch-", Duration::from_secs(5)).expect("invoker");

    let outcome = invoker
        .invoke(&invocation("sync"))
        .await
        .expect("an outcome");
    assert_eq!(outcome.delete[0].name, "blueprints.gone.v1");
    assert_eq!(outcome.requeue_after_seconds, Some(60));
    let err = invoker
        .invoke(&invocation("source"))
        .await
        .expect_err("invalid");
    assert!(
        matches!(&err, InvokeError::Invalid(m) if m.contains("workspaceName")),
        "{err:?}"
    );
    let err = invoker
        .invoke(&invocation("render"))
        .await
        .expect_err("retryable");
    assert!(
        err.is_retryable() && err.to_string().contains("connection reset"),
        "{err:?}"
    );
    let err = invoker
        .invoke(&invocation("lifecycle"))
        .await
        .expect_err("bad gateway");
    assert!(
        err.is_retryable() && err.to_string().contains("502"),
        "{err:?}"
    );

    // nobody listening: retryable
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let closed = LambdaHttp::new(
        &format!("http://127.0.0.1:{port}"),
        "porch-",
        Duration::from_secs(2),
    )
    .expect("invoker");
    let mut sync = invocation("sync");
    sync.operation = Operation::Sync;
    assert!(
        closed
            .invoke(&sync)
            .await
            .expect_err("unreachable")
            .is_retryable()
    );
}
