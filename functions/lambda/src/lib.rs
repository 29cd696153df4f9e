//! The handlers as AWS Lambda functions. Each operation's crate
//! (`functions/source`, `functions/render`, …) is one line calling [`main`];
//! `porch-handler` here serves any operation named by `PORCH_OPERATION`.
//!
//! The event is an Invocation (JSON); the answer is its Outcome. Errors are
//! Lambda `Diagnostic`s whose `errorType` says what the caller should do:
//! [`RETRYABLE`] (deliver again after a pause) or [`INVALID`] (the
//! Invocation itself is wrong; delivering it again cannot help).
//!
//! Configuration, from the environment:
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `PORCH_CACHE_DIR` | `/tmp/porch` | mirrors (Lambda's writable `/tmp`) |
//! | `PORCH_S3_BUCKET`, `PORCH_S3_PREFIX`, `PORCH_S3_ENDPOINT` | none | the snapshot store; without a bucket, `$PORCH_CACHE_DIR/snapshots` |
//! | `PORCH_FUNCTION_RUNNER` | none | a function runner's gRPC address for images the builtins do not cover |
//! | `PORCH_AWS_SECRETS_PREFIX`, `PORCH_AWS_SECRETS_ENDPOINT` | none | git credentials from AWS Secrets Manager: secret `<prefix><namespace>/<name>`, a JSON object (`username`/`password` or `bearerToken`) |
//! | `PORCH_SECRETS_DIR` | none | git credentials from files `<dir>/<namespace>/<name>/<key>` (a mounted Secret volume); without either, a Repository naming a Secret fails clearly |
//! | `PORCH_LOG` | `info` | a `tracing` filter; logs are JSON on stderr |

use std::path::PathBuf;
use std::sync::Arc;

use lambda_runtime::{Diagnostic, LambdaEvent};
use porch_api::invocation::{Invocation, Operation};
use porch_engine::runner::Runner;
use porch_engine::secrets::{AwsSecrets, NoSecrets, SecretDirectory, SecretResolver};
use porch_git::s3::{AnyStore, S3Options, S3Store};
use porch_git::store::LocalDirStore;
use porch_krm::builtins::BuiltinRuntime;
use porch_krm::grpc::{ClientOptions, GrpcRuntime};
use porch_krm::runtime::Runtimes;
use serde_json::Value;

/// `errorType` of failures worth delivering again.
pub const RETRYABLE: &str = "Retryable";
/// `errorType` of Invocations that can never succeed.
pub const INVALID: &str = "InvalidInvocation";

/// The largest Invocation accepted (Lambda's own limit for a synchronous
/// payload is 6 MB).
pub const MAX_INVOCATION_BYTES: usize = 6 << 20;

/// What a function needs from its environment.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub cache_dir: PathBuf,
    pub s3: Option<S3Options>,
    pub function_runner: Option<String>,
    pub secrets: SecretSource,
    /// `PORCH_CLONE_ALLOW`: what clones from git URLs may reach besides
    /// public addresses (networks, hosts, `file`, `*`; see
    /// [`porch_git::egress::EgressPolicy::with_allowlist`]).
    pub clone_allow: String,
    /// `PORCH_FUNCTION_IMAGES`: the images sent to the function runner
    /// (exact names or prefixes ending in `*`); the kpt catalog when unset.
    pub function_images: Option<String>,
}

/// Where the Secrets that Repositories and clones name are resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SecretSource {
    #[default]
    None,
    Directory(PathBuf),
    AwsSecretsManager {
        prefix: String,
        endpoint: Option<String>,
    },
}

impl Config {
    /// Reads the configuration from the environment.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Config {
            cache_dir: var("PORCH_CACHE_DIR")
                .map_or_else(|| PathBuf::from("/tmp/porch"), PathBuf::from),
            s3: var("PORCH_S3_BUCKET").map(|bucket| {
                let endpoint = var("PORCH_S3_ENDPOINT");
                S3Options {
                    bucket,
                    prefix: var("PORCH_S3_PREFIX").unwrap_or_default(),
                    force_path_style: endpoint.is_some(),
                    endpoint,
                    ..S3Options::default()
                }
            }),
            function_runner: var("PORCH_FUNCTION_RUNNER"),
            clone_allow: var("PORCH_CLONE_ALLOW").unwrap_or_default(),
            function_images: var("PORCH_FUNCTION_IMAGES"),
            secrets: match (var("PORCH_AWS_SECRETS_PREFIX"), var("PORCH_SECRETS_DIR")) {
                (Some(prefix), _) => SecretSource::AwsSecretsManager {
                    prefix,
                    endpoint: var("PORCH_AWS_SECRETS_ENDPOINT"),
                },
                (None, Some(dir)) => SecretSource::Directory(PathBuf::from(dir)),
                (None, None) => SecretSource::None,
            },
        }
    }

    /// The runner this configuration describes: builtins first, then the
    /// function runner when one is named.
    ///
    /// # Errors
    /// A bad S3 prefix, function runner address or clone allowlist.
    pub async fn runner(&self) -> Result<Runner<AnyStore>, String> {
        let clone_egress = porch_git::egress::EgressPolicy::with_allowlist(&self.clone_allow)
            .map_err(|e| format!("PORCH_CLONE_ALLOW: {e}"))?;
        let store = match &self.s3 {
            Some(options) => AnyStore::S3(
                S3Store::connect(options.clone())
                    .await
                    .map_err(|e| e.to_string())?,
            ),
            None => AnyStore::Local(LocalDirStore::new(self.cache_dir.join("snapshots"))),
        };
        let mut functions = Runtimes::new().with(Arc::new(BuiltinRuntime::catalog()));
        if let Some(address) = &self.function_runner {
            let channel = tonic::transport::Endpoint::from_shared(address.clone())
                .map_err(|e| format!("PORCH_FUNCTION_RUNNER {address:?}: {e}"))?
                .connect_lazy();
            functions = functions.with(Arc::new(GrpcRuntime::new(
                channel,
                tokio::runtime::Handle::current(),
                ClientOptions {
                    images: self
                        .function_images
                        .as_deref()
                        .map(porch_krm::grpc::ImageAllowlist::parse)
                        .unwrap_or_default(),
                    ..ClientOptions::default()
                },
            )));
        }
        let secrets: Arc<dyn SecretResolver> = match &self.secrets {
            SecretSource::None => Arc::new(NoSecrets),
            SecretSource::Directory(dir) => Arc::new(SecretDirectory::new(dir)),
            SecretSource::AwsSecretsManager { prefix, endpoint } => {
                Arc::new(AwsSecrets::from_env(prefix.clone(), endpoint.as_deref()).await)
            }
        };
        Ok(
            Runner::new(self.cache_dir.join("mirrors"), Arc::new(functions))
                .with_store(store)
                .with_secrets(secrets)
                .with_clone_egress(clone_egress),
        )
    }
}

fn diagnostic(error_type: &str, message: impl Into<String>) -> Diagnostic {
    Diagnostic {
        error_type: error_type.to_owned(),
        error_message: message.into(),
    }
}

/// Runs one event: decodes and checks the Invocation, runs its handler,
/// answers its Outcome as JSON.
///
/// # Errors
/// A [`Diagnostic`] of type [`INVALID`] or [`RETRYABLE`].
pub async fn invoke<S>(
    runner: &Runner<S>,
    operation: Operation,
    event: &Value,
) -> Result<Value, Diagnostic>
where
    S: porch_git::store::ObjectStore + Clone + 'static,
{
    let bytes = serde_json::to_vec(event).map_err(|e| diagnostic(INVALID, e.to_string()))?;
    if bytes.len() > MAX_INVOCATION_BYTES {
        return Err(diagnostic(
            INVALID,
            format!(
                "the invocation is {} bytes; at most {MAX_INVOCATION_BYTES} are accepted",
                bytes.len()
            ),
        ));
    }
    let invocation =
        Invocation::from_json(&bytes).map_err(|e| diagnostic(INVALID, e.to_string()))?;
    if invocation.operation != operation {
        return Err(diagnostic(
            INVALID,
            format!(
                "this function runs {} invocations, not {}",
                operation.as_str(),
                invocation.operation.as_str()
            ),
        ));
    }
    let started = std::time::Instant::now();
    let result = runner.handle(&invocation).await;
    let millis = started.elapsed().as_millis();
    match result {
        Ok(outcome) => {
            tracing::info!(operation = operation.as_str(), request = %invocation.request_id, attempt = invocation.attempt, millis, patches = outcome.patches.len(), "handled");
            serde_json::to_value(&outcome).map_err(|e| diagnostic(RETRYABLE, e.to_string()))
        }
        Err(e) => {
            let retryable = e.is_retryable();
            tracing::warn!(operation = operation.as_str(), request = %invocation.request_id, attempt = invocation.attempt, millis, retryable, error = %e, "failed");
            Err(diagnostic(
                if retryable { RETRYABLE } else { INVALID },
                e.to_string(),
            ))
        }
    }
}

/// The body of every function's `main`: logging, the runner, then the
/// Lambda runtime loop.
///
/// # Errors
/// The runner cannot be built, or the runtime API fails.
pub async fn main(operation: Operation) -> Result<(), lambda_runtime::Error> {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PORCH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_current_span(false)
        .init();
    let runner = Arc::new(Config::from_env().runner().await?);
    lambda_runtime::run(lambda_runtime::service_fn(
        move |event: LambdaEvent<Value>| {
            let runner = Arc::clone(&runner);
            // boxed: the handler futures are deep enough to overflow the
            // compiler's layout recursion inside the runtime's types
            Box::pin(async move { invoke(&runner, operation, &event.payload).await })
        },
    ))
    .await
}

/// The operation named by `name` (`source`, `render`, …).
///
/// # Errors
/// An unknown name.
pub fn operation(name: &str) -> Result<Operation, String> {
    serde_json::from_value(Value::String(name.to_owned())).map_err(|_| {
        format!(
            "unknown operation {name:?}: adopt, source, render, lifecycle, delete, sync, variant or variant-set"
        )
    })
}
