//! How the relay reaches a handler. Every invoker takes an Invocation and
//! gives its Outcome, or an error that says whether delivering the same
//! Invocation again may help.
//!
//! - [`InProcess`]: the handler libraries linked in (the embedded default);
//! - [`LambdaHttp`]: the Lambda Invoke API over HTTP as `cargo lambda watch`
//!   serves it (`POST /2015-03-31/functions/<function>/invocations`), one
//!   function per operation named `porch-<operation>`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use porch_api::invocation::{Invocation, Outcome};
use porch_engine::runner::Runner;
use porch_git::store::ObjectStore;

/// Why an invocation gave no Outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvokeError {
    /// Worth delivering again after a pause.
    #[error("{0}")]
    Retryable(String),
    /// The Invocation itself is wrong; delivering it again cannot help.
    #[error("{0}")]
    Invalid(String),
}

impl InvokeError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, InvokeError::Retryable(_))
    }
}

/// Reaches the handler of an Invocation's operation.
pub trait Invoker: Send + Sync {
    fn invoke(
        &self,
        invocation: &Invocation,
    ) -> impl Future<Output = Result<Outcome, InvokeError>> + Send;
}

/// The handlers in this process.
#[derive(Debug)]
pub struct InProcess<S> {
    runner: Arc<Runner<S>>,
}

impl<S> InProcess<S> {
    pub fn new(runner: Arc<Runner<S>>) -> Self {
        InProcess { runner }
    }
}

impl<S: ObjectStore + Clone + Send + Sync + 'static> Invoker for InProcess<S> {
    async fn invoke(&self, invocation: &Invocation) -> Result<Outcome, InvokeError> {
        self.runner.handle(invocation).await.map_err(|e| {
            if e.is_retryable() {
                InvokeError::Retryable(e.to_string())
            } else {
                InvokeError::Invalid(e.to_string())
            }
        })
    }
}

/// The `errorType` a handler gives an Invocation that can never succeed.
pub const INVALID_ERROR_TYPE: &str = "InvalidInvocation";

/// The largest answer read from a handler.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// The Lambda Invoke API over plain HTTP: `cargo lambda watch`, or any
/// endpoint that speaks it without request signing.
#[derive(Debug, Clone)]
pub struct LambdaHttp {
    client: reqwest::Client,
    endpoint: String,
    prefix: String,
}

impl LambdaHttp {
    /// Invokes `<prefix><operation>` at `endpoint` (for `cargo lambda
    /// watch`, `http://127.0.0.1:9000` and prefix `porch-`).
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(endpoint: &str, prefix: &str, timeout: Duration) -> Result<Self, InvokeError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| InvokeError::Invalid(format!("HTTP client: {e}")))?;
        Ok(LambdaHttp {
            client,
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            prefix: prefix.to_owned(),
        })
    }

    fn url(&self, invocation: &Invocation) -> String {
        format!(
            "{}/2015-03-31/functions/{}{}/invocations",
            self.endpoint,
            self.prefix,
            invocation.operation.as_str()
        )
    }
}

/// A Lambda error payload: `{"errorType": …, "errorMessage": …}`.
fn function_error(body: &serde_json::Value) -> Option<InvokeError> {
    let kind = body.get("errorType")?.as_str()?;
    let message = body
        .get("errorMessage")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    let text = format!("{kind}: {message}");
    Some(if kind == INVALID_ERROR_TYPE {
        InvokeError::Invalid(text)
    } else {
        InvokeError::Retryable(text)
    })
}

impl Invoker for LambdaHttp {
    async fn invoke(&self, invocation: &Invocation) -> Result<Outcome, InvokeError> {
        let url = self.url(invocation);
        let response = self
            .client
            .post(&url)
            .json(invocation)
            .send()
            .await
            .map_err(|e| InvokeError::Retryable(format!("{url}: {e}")))?;
        let status = response.status();
        let function_failed = response.headers().contains_key("x-amz-function-error");
        if response
            .content_length()
            .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
        {
            return Err(InvokeError::Retryable(format!(
                "{url}: answer larger than {MAX_ANSWER_BYTES} bytes"
            )));
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|e| InvokeError::Retryable(format!("{url}: {e}")))?;
        if bytes.len() > MAX_ANSWER_BYTES {
            return Err(InvokeError::Retryable(format!(
                "{url}: answer larger than {MAX_ANSWER_BYTES} bytes"
            )));
        }
        let body: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            InvokeError::Retryable(format!("{url} answered HTTP {status} with no JSON: {e}"))
        })?;
        if let Some(error) = function_error(&body) {
            return Err(error);
        }
        if function_failed || !status.is_success() {
            return Err(InvokeError::Retryable(format!(
                "{url} answered HTTP {status}"
            )));
        }
        serde_json::from_value(body)
            .map_err(|e| InvokeError::Retryable(format!("{url}: not an Outcome: {e}")))
    }
}
