//! The function runner over gRPC (spec §1): Porch's
//! `evaluator.FunctionEvaluator/EvaluateFunction`, as a client runtime for
//! render and as a service backed by the builtins and allow-listed
//! executables.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::{Request, Response, Status};

use crate::builtins::BuiltinRuntime;
use crate::resource::Resource;
use crate::resourcelist::{self, ResultItem};
use crate::runtime::{
    Call, ExecRuntime, FunctionError, FunctionOutput, FunctionRef, FunctionRuntime,
};

/// Generated from `proto/evaluator.proto`.
#[allow(
    missing_debug_implementations,
    unreachable_pub,
    clippy::all,
    clippy::pedantic
)]
pub mod proto {
    tonic::include_proto!("evaluator");
}

use proto::function_evaluator_client::FunctionEvaluatorClient;
use proto::function_evaluator_server::FunctionEvaluator;
pub use proto::function_evaluator_server::FunctionEvaluatorServer;
use proto::{EvaluateFunctionRequest, EvaluateFunctionResponse};

/// Porch's default message size limit (`--max-request-body-size`).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 6 * 1024 * 1024;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub max_message_bytes: usize,
    /// Deadline of one call.
    pub timeout: Duration,
    /// The images sent to the runner; others fail before any call.
    pub images: ImageAllowlist,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            timeout: Duration::from_secs(300),
            images: ImageAllowlist::default(),
        }
    }
}

/// Which function images may run: exact names, or prefixes ending in `*`.
/// The default is the kpt function catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageAllowlist(Vec<String>);

/// The kpt function catalog's registries.
pub const CATALOG_IMAGES: &str = "gcr.io/kpt-fn/*,ghcr.io/kptdev/krm-functions-catalog/*";

impl Default for ImageAllowlist {
    fn default() -> Self {
        Self::parse(CATALOG_IMAGES)
    }
}

impl ImageAllowlist {
    /// Comma-separated entries: `*` allows every image.
    pub fn parse(text: &str) -> Self {
        Self(
            text.split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }

    /// A name without a registry (`set-labels:v0.2`) is a catalog short
    /// name and is checked as the catalog image it stands for.
    pub fn allows(&self, image: &str) -> bool {
        let full;
        let image = if image.contains('/') {
            image
        } else {
            full = format!("ghcr.io/kptdev/krm-functions-catalog/{image}");
            &full
        };
        self.0.iter().any(|entry| match entry.strip_suffix('*') {
            Some(prefix) => image.starts_with(prefix),
            None => entry == image,
        })
    }
}

/// Runs image functions on a function runner. Render is synchronous: call it
/// from a blocking thread (`spawn_blocking`); each call runs as a task on the
/// given tokio runtime while the render thread waits.
#[derive(Debug, Clone)]
pub struct GrpcRuntime {
    client: FunctionEvaluatorClient<tonic::transport::Channel>,
    handle: tokio::runtime::Handle,
    options: ClientOptions,
}

impl GrpcRuntime {
    /// A runtime on a channel (connected lazily or eagerly by the caller).
    pub fn new(
        channel: tonic::transport::Channel,
        handle: tokio::runtime::Handle,
        options: ClientOptions,
    ) -> Self {
        let client = FunctionEvaluatorClient::new(channel)
            .max_decoding_message_size(options.max_message_bytes)
            .max_encoding_message_size(options.max_message_bytes);
        GrpcRuntime {
            client,
            handle,
            options,
        }
    }

    /// A runtime for `http://host:port`, connecting on first use.
    ///
    /// # Errors
    /// An address that is not a valid URI.
    pub fn connect_lazy(
        address: &str,
        handle: tokio::runtime::Handle,
        options: ClientOptions,
    ) -> Result<Self, FunctionError> {
        let endpoint = tonic::transport::Endpoint::from_shared(address.to_owned())
            .map_err(|e| {
                FunctionError::Runtime(format!("invalid function runner address {address:?}: {e}"))
            })?
            .connect_timeout(Duration::from_secs(10));
        Ok(GrpcRuntime::new(endpoint.connect_lazy(), handle, options))
    }

    /// Evaluates one function by image (async).
    ///
    /// # Errors
    /// Typed errors for not found, failure, deadline and transport problems.
    pub async fn evaluate(
        &self,
        image: &str,
        items: &[Resource],
        config: Option<&crate::yaml::Node>,
    ) -> Result<(String, String), FunctionError> {
        let input = resourcelist::encode(items, config);
        if input.len() > self.options.max_message_bytes {
            return Err(FunctionError::Runtime(format!(
                "resource list of {} bytes is larger than the message limit of {} bytes",
                input.len(),
                self.options.max_message_bytes
            )));
        }
        let mut request = Request::new(EvaluateFunctionRequest {
            resource_list: input.into_bytes(),
            image: image.to_owned(),
        });
        request.set_timeout(self.options.timeout);
        let mut client = self.client.clone();
        let response = client
            .evaluate_function(request)
            .await
            .map_err(|status| status_error(image, &status))?
            .into_inner();
        let output = String::from_utf8(response.resource_list).map_err(|_| {
            FunctionError::Runtime(format!("func eval {image:?}: output is not UTF-8"))
        })?;
        Ok((output, String::from_utf8_lossy(&response.log).into_owned()))
    }
}

fn status_error(image: &str, status: &Status) -> FunctionError {
    use tonic::Code;
    let message = status.message();
    match status.code() {
        Code::NotFound => FunctionError::NotFound(image.to_owned()),
        Code::Cancelled if message.contains("Timeout") => {
            FunctionError::Runtime(format!("func eval {image:?} failed: deadline exceeded"))
        }
        Code::DeadlineExceeded => {
            FunctionError::Runtime(format!("func eval {image:?} failed: deadline exceeded"))
        }
        Code::Unavailable => FunctionError::Runtime(format!(
            "func eval {image:?} failed: function runner unavailable: {message}"
        )),
        Code::ResourceExhausted | Code::OutOfRange => FunctionError::Runtime(format!(
            "func eval {image:?} failed: message too large: {message}"
        )),
        Code::Internal | Code::Unknown | Code::Aborted | Code::FailedPrecondition => {
            FunctionError::Failed {
                message: format!("func eval {image:?} failed: {message}"),
                results: Vec::new(),
                stderr: String::new(),
                exit_code: 1,
            }
        }
        code => FunctionError::Runtime(format!("func eval {image:?} failed: {code:?}: {message}")),
    }
}

impl FunctionRuntime for GrpcRuntime {
    fn handles(&self, function: &FunctionRef) -> bool {
        matches!(function, FunctionRef::Image(_))
    }

    fn run(&self, call: Call<'_>) -> Result<FunctionOutput, FunctionError> {
        let FunctionRef::Image(image) = call.function else {
            return Err(FunctionError::NotFound(call.function.display().to_owned()));
        };
        if !self.options.images.allows(image) {
            return Err(FunctionError::Runtime(format!(
                "image {image:?} is not in the function image allowlist"
            )));
        }
        // The call runs as a task on the runtime; this (blocking) thread waits.
        let (tx, rx) = std::sync::mpsc::channel();
        let this = self.clone();
        let image_owned = image.clone();
        let items = call.items.clone();
        let config = call.config.cloned();
        self.handle.spawn(async move {
            let outcome = this.evaluate(&image_owned, &items, config.as_ref()).await;
            let _ = tx.send(outcome);
        });
        let (output, log) = rx
            .recv()
            .map_err(|_| FunctionError::Runtime("the gRPC call was dropped".into()))??;
        let decoded =
            resourcelist::decode(&output).map_err(|e| FunctionError::Runtime(e.to_string()))?;
        crate::render::from_wire_output(&call.items, decoded, call.package, log)
    }
}

/// Counters of the service, read by the metrics endpoint.
#[derive(Debug, Default)]
pub struct EvaluatorStats {
    pub evaluations: std::sync::atomic::AtomicU64,
    pub failures: std::sync::atomic::AtomicU64,
    pub not_found: std::sync::atomic::AtomicU64,
    /// Total evaluation time in microseconds.
    pub micros: std::sync::atomic::AtomicU64,
}

impl EvaluatorStats {
    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        format!(
            "# TYPE fn_runner_evaluations_total counter\nfn_runner_evaluations_total {}\n# TYPE fn_runner_failures_total counter\nfn_runner_failures_total {}\n# TYPE fn_runner_not_found_total counter\nfn_runner_not_found_total {}\n# TYPE fn_runner_evaluation_seconds_total counter\nfn_runner_evaluation_seconds_total {}\n",
            self.evaluations.load(Relaxed),
            self.failures.load(Relaxed),
            self.not_found.load(Relaxed),
            self.micros.load(Relaxed) as f64 / 1e6
        )
    }
}

/// The service: builtins first, then allow-listed executables by image.
#[derive(Debug, Clone)]
pub struct Evaluator {
    builtins: Arc<BuiltinRuntime>,
    exec: Option<Arc<ExecRuntime>>,
    prefix: String,
    pub stats: Arc<EvaluatorStats>,
}

impl Evaluator {
    pub fn new(builtins: BuiltinRuntime, exec: Option<ExecRuntime>) -> Self {
        Evaluator {
            builtins: Arc::new(builtins),
            exec: exec.map(Arc::new),
            prefix: crate::runtime::DEFAULT_IMAGE_PREFIX.to_owned(),
            stats: Arc::default(),
        }
    }

    /// Evaluates a ResourceList text synchronously.
    ///
    /// # Errors
    /// Not found, bad input, or the function's failure.
    pub fn evaluate_text(
        &self,
        image: &str,
        input: &str,
        deadline: Option<Duration>,
    ) -> Result<(String, String), FunctionError> {
        let image = crate::runtime::normalize_image(image, &self.prefix);
        if self.builtins.lookup(&image).is_some() {
            return evaluate_builtin(&self.builtins, &image, input);
        }
        if let Some(exec) = &self.exec
            && exec.handles(&FunctionRef::Image(image.clone()))
        {
            return exec.run_raw(&FunctionRef::Image(image), input.as_bytes(), deadline);
        }
        Err(FunctionError::NotFound(image))
    }
}

/// A builtin over a ResourceList text; objects keep the caller's annotations.
fn evaluate_builtin(
    builtins: &BuiltinRuntime,
    image: &str,
    input: &str,
) -> Result<(String, String), FunctionError> {
    let name = builtins
        .lookup(image)
        .map(|b| b.name())
        .ok_or_else(|| FunctionError::NotFound(image.to_owned()))?;
    let (output, ok) = crate::builtins::process_resource_list(builtins, name, input)?;
    if ok {
        return Ok((output, String::new()));
    }
    let results = resourcelist::decode(&output)
        .map(|d| d.results)
        .unwrap_or_default();
    Err(FunctionError::Failed {
        message: String::new(),
        results,
        stderr: String::new(),
        exit_code: 1,
    })
}

/// The `grpc-timeout` header: digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn summarize(results: &[ResultItem]) -> String {
    results
        .iter()
        .map(|r| {
            format!(
                "[{}] {}",
                if r.severity.is_empty() {
                    "error"
                } else {
                    &r.severity
                },
                r.message
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[tonic::async_trait]
impl FunctionEvaluator for Evaluator {
    async fn evaluate_function(
        &self,
        request: Request<EvaluateFunctionRequest>,
    ) -> Result<Response<EvaluateFunctionResponse>, Status> {
        let deadline = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout);
        let request = request.into_inner();
        let input = String::from_utf8(request.resource_list)
            .map_err(|_| Status::invalid_argument("resource_list is not UTF-8"))?;
        let this = self.clone();
        let image = request.image;
        let started = Instant::now();
        let outcome = tokio::task::spawn_blocking(move || {
            this.evaluate_text(&image, &input, deadline)
                .map_err(|e| (image, e))
        })
        .await
        .map_err(|e| Status::internal(format!("evaluation task failed: {e}")))?;
        use std::sync::atomic::Ordering::Relaxed;
        self.stats.evaluations.fetch_add(1, Relaxed);
        self.stats
            .micros
            .fetch_add(started.elapsed().as_micros() as u64, Relaxed);
        match outcome {
            Ok((output, log)) => Ok(Response::new(EvaluateFunctionResponse {
                resource_list: output.into_bytes(),
                log: log.into_bytes(),
            })),
            Err((image, FunctionError::NotFound(_))) => {
                self.stats.not_found.fetch_add(1, Relaxed);
                Err(Status::not_found(format!(
                    "function {image:?} is not available here"
                )))
            }
            Err((
                image,
                FunctionError::Failed {
                    results, stderr, ..
                },
            )) => {
                self.stats.failures.fetch_add(1, Relaxed);
                Err(Status::internal(format!(
                    "failed to evaluate function {image:?} with structured results: {} and stderr: {stderr}",
                    summarize(&results)
                )))
            }
            Err((image, FunctionError::Runtime(message))) => {
                self.stats.failures.fetch_add(1, Relaxed);
                if message.contains("not a ResourceList") || message.contains("parse") {
                    Err(Status::invalid_argument(format!(
                        "function {image:?}: {message}"
                    )))
                } else {
                    Err(Status::internal(format!("function {image:?}: {message}")))
                }
            }
        }
    }
}

/// Serves the evaluator and the standard health service on a listener until
/// `shutdown` resolves.
///
/// # Errors
/// Transport errors of the server.
pub async fn serve(
    listener: tokio::net::TcpListener,
    evaluator: Evaluator,
    max_message_bytes: usize,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_routes(routes(evaluator, max_message_bytes).await)
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown,
        )
        .await
}

/// The evaluator and the health service as routes, for a host of the
/// caller's choosing (plain HTTP/2 in [`serve`], TLS in the function
/// runner).
pub async fn routes(evaluator: Evaluator, max_message_bytes: usize) -> tonic::service::Routes {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<FunctionEvaluatorServer<Evaluator>>()
        .await;
    let service = FunctionEvaluatorServer::new(evaluator)
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes);
    tonic::service::Routes::new(health).add_service(service)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("300m"), Some(Duration::from_millis(300)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
        assert_eq!(parse_grpc_timeout("5q"), None);
    }
}
