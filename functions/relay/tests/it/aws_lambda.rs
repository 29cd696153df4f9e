//! The AWS invoker against a mock of the Lambda Invoke API answering as
//! AWS does: requests signed with SigV4 for the configured region, the
//! Invocation as the payload, an Outcome or a function error in the
//! answer, and the API's own errors (missing function, throttling, a
//! payload over the limit) typed by `x-amzn-ErrorType`.

use std::time::Duration;

use aws_sdk_lambda::config::Credentials;
use porch_api::invocation::{Invocation, Operation};
use porch_relay::invoker::{AwsLambda, InvokeError, Invoker};
use serde_json::json;
use wiremock::matchers::{body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

fn invocation(operation: Operation) -> Invocation {
    let mut invocation: Invocation = serde_json::from_value(json!({
        "operation": "sync",
        "requestId": "req-7",
        "attempt": 2,
        "repository": {
            "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository",
            "metadata": {"name": "blueprints", "namespace": "default"},
            "spec": {"type": "git", "git": {"repo": "https://git.example.com/b.git", "branch": "main"}}
        }
    }))
    .expect("an invocation");
    invocation.operation = operation;
    invocation
}

async fn invoker(server: &MockServer) -> AwsLambda {
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(server.uri())
        .region(aws_config::Region::new("eu-west-1"))
        .credentials_provider(Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCY-c4n4ry",
            None,
            None,
            "test",
        ))
        .load()
        .await;
    AwsLambda::new(&config, "porch-", Duration::from_secs(5))
}

/// A SigV4 signature for Lambda in the configured region, by the test key.
fn signed(request: &Request) -> bool {
    request
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
                && v.contains("/eu-west-1/lambda/aws4_request")
        })
}

fn api_error(status: u16, kind: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .insert_header("x-amzn-ErrorType", kind)
        .insert_header("content-type", "application/json")
        .set_body_json(json!({"Type": "User", "message": message}))
}

#[tokio::test]
async fn signed_invocations_give_outcomes_and_typed_errors() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/2015-03-31/functions/porch-sync/invocations"))
        .and(signed)
        .and(body_partial_json(
            json!({"operation": "sync", "requestId": "req-7", "attempt": 2}),
        ))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("X-Amz-Executed-Version", "$LATEST")
                .set_body_json(json!({"requeueAfterSeconds": 30})),
        )
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/2015-03-31/functions/porch-source/invocations"))
        .and(signed)
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("X-Amz-Function-Error", "Unhandled")
                .set_body_json(json!({"errorType": "InvalidInvocation",
                                      "errorMessage": "invalid invocation: package path \"../x\""})),
        )
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/2015-03-31/functions/porch-render/invocations"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("X-Amz-Function-Error", "Unhandled")
                .set_body_json(json!({"errorType": "Runtime.ExitError",
                                      "errorMessage": "RequestId: 1 Error: Runtime exited with error: signal: killed"})),
        )
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/2015-03-31/functions/porch-lifecycle/invocations"))
        .respond_with(api_error(429, "TooManyRequestsException", "Rate Exceeded."))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/2015-03-31/functions/porch-delete/invocations"))
        .respond_with(api_error(
            404,
            "ResourceNotFoundException",
            "Function not found: arn:aws:lambda:eu-west-1:000000000000:function:porch-delete",
        ))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/2015-03-31/functions/porch-adopt/invocations"))
        .and(header("content-type", "application/octet-stream"))
        .respond_with(api_error(
            413,
            "RequestTooLargeException",
            "Request must be smaller than 6291456 bytes for the InvokeFunction operation",
        ))
        .mount(&server)
        .await;
    let invoker = invoker(&server).await;

    let outcome = invoker
        .invoke(&invocation(Operation::Sync))
        .await
        .expect("an outcome");
    assert_eq!(outcome.requeue_after_seconds, Some(30));

    let err = invoker
        .invoke(&invocation(Operation::Source))
        .await
        .expect_err("refused");
    assert!(
        matches!(&err, InvokeError::Invalid(m) if m.contains("../x")),
        "{err:?}"
    );
    let err = invoker
        .invoke(&invocation(Operation::Render))
        .await
        .expect_err("killed");
    assert!(
        err.is_retryable() && err.to_string().contains("Runtime.ExitError"),
        "{err:?}"
    );
    let err = invoker
        .invoke(&invocation(Operation::Lifecycle))
        .await
        .expect_err("throttled");
    assert!(
        err.is_retryable() && err.to_string().contains("TooManyRequests"),
        "{err:?}"
    );
    let err = invoker
        .invoke(&invocation(Operation::Delete))
        .await
        .expect_err("no function");
    assert!(
        err.is_retryable() && err.to_string().contains("porch-delete"),
        "{err:?}"
    );
    let err = invoker
        .invoke(&invocation(Operation::Adopt))
        .await
        .expect_err("too large");
    assert!(
        matches!(&err, InvokeError::Invalid(m) if m.contains("RequestTooLarge")),
        "{err:?}"
    );
    // the SDK does not retry on its own: one request per delivery
    let throttled = server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| r.url.path().contains("porch-lifecycle"))
        .count();
    assert_eq!(throttled, 1);
}

#[tokio::test]
async fn nothing_listening_is_retryable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(format!("http://127.0.0.1:{port}"))
        .region(aws_config::Region::new("eu-west-1"))
        .credentials_provider(Credentials::new(
            "AKID",
            "secret-c4n4ry",
            None,
            None,
            "test",
        ))
        .load()
        .await;
    let invoker = AwsLambda::new(&config, "porch-", Duration::from_secs(2));
    let err = invoker
        .invoke(&invocation(Operation::Sync))
        .await
        .expect_err("unreachable");
    assert!(err.is_retryable(), "{err:?}");
}
