//! How the relay reaches a handler. Every invoker takes an Invocation and
//! gives its Outcome, or an error that says whether delivering the same
//! Invocation again may help.
//!
//! - [`InProcess`]: the handler libraries linked in (the embedded default);
//! - [`LambdaHttp`]: the Lambda Invoke API over HTTP as `cargo lambda watch`
//!   serves it (`POST /2015-03-31/functions/<function>/invocations`), one
//!   function per operation named `porch-<operation>`;
//! - [`AwsLambda`]: the same API on AWS, signed (SigV4) by the AWS SDK with
//!   the credentials of the environment (IRSA in a cluster).
//!
//! All read a function's answer the same way: an Outcome, or a Lambda error
//! payload whose `errorType` says whether a redelivery may help.

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

/// What a function answered: an Outcome, or its error payload typed by
/// `errorType` (`function_failed`: Lambda flagged a function error, with
/// `X-Amz-Function-Error` or the SDK's `function_error`).
fn read_answer(
    function: &str,
    succeeded: bool,
    function_failed: bool,
    bytes: &[u8],
) -> Result<Outcome, InvokeError> {
    if bytes.len() > MAX_ANSWER_BYTES {
        return Err(InvokeError::Retryable(format!(
            "{function}: answer larger than {MAX_ANSWER_BYTES} bytes"
        )));
    }
    let body: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| InvokeError::Retryable(format!("{function} answered with no JSON: {e}")))?;
    if let Some(error) = function_error(&body) {
        return Err(error);
    }
    if function_failed || !succeeded {
        return Err(InvokeError::Retryable(format!(
            "{function} failed with no error payload"
        )));
    }
    serde_json::from_value(body)
        .map_err(|e| InvokeError::Retryable(format!("{function}: not an Outcome: {e}")))
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
        read_answer(
            &format!("{url} (HTTP {status})"),
            status.is_success(),
            function_failed,
            &bytes,
        )
    }
}

/// The Lambda Invoke API on AWS through the AWS SDK: requests signed with
/// the environment's credentials (IRSA, instance profile, `AWS_*`), the
/// region and endpoint from the usual AWS settings (`AWS_REGION`,
/// `AWS_ENDPOINT_URL_LAMBDA` for an emulator). The SDK does not retry: a
/// failed delivery goes back to the relay's queue, which backs off with
/// jitter per revision.
#[derive(Debug, Clone)]
pub struct AwsLambda {
    client: aws_sdk_lambda::Client,
    prefix: String,
}

impl AwsLambda {
    /// Invokes `<prefix><operation>` with the SDK configuration `config`;
    /// each call may take `timeout`.
    pub fn new(config: &aws_config::SdkConfig, prefix: &str, timeout: Duration) -> Self {
        let lambda = aws_sdk_lambda::config::Builder::from(config)
            .retry_config(aws_sdk_lambda::config::retry::RetryConfig::disabled())
            .timeout_config(
                aws_sdk_lambda::config::timeout::TimeoutConfig::builder()
                    .operation_timeout(timeout)
                    .build(),
            )
            .build();
        AwsLambda {
            client: aws_sdk_lambda::Client::from_conf(lambda),
            prefix: prefix.to_owned(),
        }
    }

    /// The SDK configuration from the environment, then [`AwsLambda::new`].
    pub async fn from_env(prefix: &str, timeout: Duration) -> Self {
        let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .load()
            .await;
        Self::new(&config, prefix, timeout)
    }
}

/// Whether an Invoke API error is the Invocation's fault (delivering it
/// again cannot help) rather than the function's, the account's or the
/// network's.
fn invoke_refused(error: &aws_sdk_lambda::operation::invoke::InvokeError) -> bool {
    use aws_sdk_lambda::operation::invoke::InvokeError as E;
    matches!(
        error,
        E::RequestTooLargeException(_)
            | E::InvalidRequestContentException(_)
            | E::InvalidParameterValueException(_)
    )
}

impl Invoker for AwsLambda {
    async fn invoke(&self, invocation: &Invocation) -> Result<Outcome, InvokeError> {
        let function = format!("{}{}", self.prefix, invocation.operation.as_str());
        let payload = serde_json::to_vec(invocation)
            .map_err(|e| InvokeError::Invalid(format!("{function}: {e}")))?;
        let output = self
            .client
            .invoke()
            .function_name(&function)
            .payload(aws_sdk_lambda::primitives::Blob::new(payload))
            .send()
            .await
            .map_err(|e| {
                let text = aws_sdk_lambda::error::DisplayErrorContext(&e).to_string();
                match e.as_service_error() {
                    Some(service) if invoke_refused(service) => {
                        InvokeError::Invalid(format!("{function}: {text}"))
                    }
                    _ => InvokeError::Retryable(format!("{function}: {text}")),
                }
            })?;
        let bytes = output.payload().map(|b| b.as_ref()).unwrap_or_default();
        read_answer(
            &function,
            (200..300).contains(&output.status_code()),
            output.function_error().is_some(),
            bytes,
        )
    }
}
