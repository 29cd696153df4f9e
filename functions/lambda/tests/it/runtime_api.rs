//! A Lambda Runtime API on loopback (what AWS Lambda and `cargo lambda
//! watch` serve to a function): `call` hands an event to the function's
//! long poll and waits for its response or error. Shared by the tests and
//! the handler benchmark.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use serde_json::Value;
use tokio::sync::{Mutex, mpsc, oneshot};

type Answer = (String, Value);

struct Inner {
    sender: mpsc::UnboundedSender<(String, Value)>,
    events: Mutex<mpsc::UnboundedReceiver<(String, Value)>>,
    waiting: std::sync::Mutex<HashMap<String, oneshot::Sender<Answer>>>,
    /// Events handed to the function and not yet answered.
    handed: std::sync::Mutex<std::collections::HashSet<String>>,
    counter: AtomicU64,
}

/// The emulated Runtime API.
#[derive(Clone)]
pub(crate) struct RuntimeApi(Arc<Inner>);

impl RuntimeApi {
    /// Serves the API on a loopback port.
    pub(crate) async fn start() -> (Self, SocketAddr) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let api = RuntimeApi(Arc::new(Inner {
            sender,
            events: Mutex::new(receiver),
            waiting: std::sync::Mutex::new(HashMap::new()),
            handed: std::sync::Mutex::new(std::collections::HashSet::new()),
            counter: AtomicU64::new(0),
        }));
        let app = axum::Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route("/2018-06-01/runtime/invocation/{id}/{kind}", post(answer))
            .with_state(api.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        (api, address)
    }

    /// Invokes the function with `event`: `("response", outcome)` or
    /// `("error", diagnostic)`.
    pub(crate) async fn call(&self, event: Value) -> Answer {
        let id = format!("req-{}", self.0.counter.fetch_add(1, Ordering::SeqCst));
        let (tx, rx) = oneshot::channel();
        self.0.waiting.lock().expect("lock").insert(id.clone(), tx);
        self.0.sender.send((id, event)).expect("queue");
        rx.await.expect("an answer")
    }

    /// Events the function took and has not answered.
    #[allow(dead_code, reason = "only the fault tests kill functions")]
    pub(crate) fn in_flight(&self) -> usize {
        self.0.handed.lock().expect("lock").len()
    }

    /// What Lambda does when a function's process dies mid-invocation: the
    /// caller gets a `Runtime.ExitError` function error.
    #[allow(dead_code, reason = "only the fault tests kill functions")]
    pub(crate) fn fail_in_flight(&self) {
        let handed: Vec<String> = self.0.handed.lock().expect("lock").drain().collect();
        let mut waiting = self.0.waiting.lock().expect("lock");
        for id in handed {
            if let Some(tx) = waiting.remove(&id) {
                let _ = tx.send((
                    "error".to_owned(),
                    serde_json::json!({"errorType": "Runtime.ExitError",
                        "errorMessage": "RequestId: the process exited (signal: killed)"}),
                ));
            }
        }
    }

    /// The environment a function process needs to reach this API.
    pub(crate) fn env(address: SocketAddr, function: &str) -> Vec<(String, String)> {
        [
            ("AWS_LAMBDA_RUNTIME_API", address.to_string()),
            ("AWS_LAMBDA_FUNCTION_NAME", function.to_owned()),
            ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512".to_owned()),
            ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

async fn next(State(api): State<RuntimeApi>) -> (HeaderMap, axum::Json<Value>) {
    let (id, event) = api
        .0
        .events
        .lock()
        .await
        .recv()
        .await
        .expect("the API lives as long as its callers");
    api.0.handed.lock().expect("lock").insert(id.clone());
    let deadline = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() + 300_000)
        .unwrap_or_default();
    let mut headers = HeaderMap::new();
    headers.insert("lambda-runtime-aws-request-id", id.parse().expect("header"));
    headers.insert(
        "lambda-runtime-deadline-ms",
        deadline.to_string().parse().expect("header"),
    );
    headers.insert(
        "lambda-runtime-invoked-function-arn",
        "arn:aws:lambda:us-east-1:000000000000:function:porch"
            .parse()
            .expect("header"),
    );
    (headers, axum::Json(event))
}

async fn answer(
    State(api): State<RuntimeApi>,
    UrlPath((id, kind)): UrlPath<(String, String)>,
    body: axum::body::Bytes,
) -> StatusCode {
    let value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    api.0.handed.lock().expect("lock").remove(&id);
    if let Some(tx) = api.0.waiting.lock().expect("lock").remove(&id) {
        let _ = tx.send((kind, value));
    }
    StatusCode::ACCEPTED
}

/// The Lambda Invoke API (`POST /2015-03-31/functions/<name>/invocations`,
/// what `cargo lambda watch` and AWS serve to callers) in front of one
/// Runtime API per function: an answer comes back as the body, an error
/// with `X-Amz-Function-Error: Unhandled`, an unknown function as Lambda's
/// 404 `ResourceNotFoundException`.
#[allow(
    dead_code,
    reason = "the handler benchmark calls the Runtime API directly"
)]
pub(crate) async fn invoke_api(functions: HashMap<String, RuntimeApi>) -> SocketAddr {
    let app = axum::Router::new()
        .route("/2015-03-31/functions/{name}/invocations", post(invoke))
        .with_state(Arc::new(functions));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

async fn invoke(
    State(functions): State<Arc<HashMap<String, RuntimeApi>>>,
    UrlPath(name): UrlPath<String>,
    body: axum::body::Bytes,
) -> (StatusCode, HeaderMap, axum::Json<Value>) {
    let mut headers = HeaderMap::new();
    let Some(function) = functions.get(&name) else {
        headers.insert(
            "x-amzn-errortype",
            "ResourceNotFoundException".parse().expect("header"),
        );
        return (
            StatusCode::NOT_FOUND,
            headers,
            axum::Json(
                serde_json::json!({"Type": "User", "message": format!("Function not found: {name}")}),
            ),
        );
    };
    let event = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (kind, answer) = function.call(event).await;
    if kind == "error" {
        headers.insert("x-amz-function-error", "Unhandled".parse().expect("header"));
    }
    (StatusCode::OK, headers, axum::Json(answer))
}
