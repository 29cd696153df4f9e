//! The function runner.
//!
//! - `fn-runner serve`: Porch's `evaluator.FunctionEvaluator` gRPC API (and
//!   `grpc.health.v1.Health`) backed by the builtin functions and, for
//!   images mapped with `--exec-image`, local executables; metrics on HTTP.
//!   With `--tls-cert`/`--tls-key` the API is served over TLS 1.2+ and the
//!   certificate reloads from disk without a restart.
//! - `fn-runner exec <function>`: one builtin as an executable (ResourceList
//!   on stdin and stdout) for kpt and exec evaluators. Invoked through a link
//!   named after a function, it runs that function.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use porch_krm::builtins::{BuiltinRuntime, process_resource_list};
use porch_krm::grpc::{DEFAULT_MAX_MESSAGE_BYTES, Evaluator, routes, serve};
use porch_krm::runtime::{ExecLimits, ExecRuntime};

#[derive(Parser, Debug)]
#[command(name = "fn-runner", about = "KRM function runner")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the gRPC API.
    Serve {
        #[arg(long, env = "FN_RUNNER_ADDRESS", default_value = "0.0.0.0:9445")]
        address: SocketAddr,
        #[arg(
            long,
            env = "FN_RUNNER_METRICS_ADDRESS",
            default_value = "0.0.0.0:9446"
        )]
        metrics_address: SocketAddr,
        #[arg(long, env = "FN_RUNNER_MAX_MESSAGE_BYTES", default_value_t = DEFAULT_MAX_MESSAGE_BYTES)]
        max_message_bytes: usize,
        /// `image=/path/to/executable`: run this image with a local binary.
        #[arg(
            long = "exec-image",
            env = "FN_RUNNER_EXEC_IMAGES",
            value_delimiter = ','
        )]
        exec_images: Vec<String>,
        #[arg(long, env = "FN_RUNNER_EXEC_TIMEOUT_SECONDS", default_value_t = 60)]
        exec_timeout_seconds: u64,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Run one builtin function on stdin.
    Exec { function: String },
}

/// Serving the API over TLS.
#[derive(clap::Args, Debug, Clone)]
struct TlsArgs {
    /// PEM certificate chain; with `--tls-key`, the API is served over TLS.
    #[arg(long, env = "FN_RUNNER_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    #[arg(long, env = "FN_RUNNER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How often the certificate files are checked for a new pair.
    #[arg(long, env = "FN_RUNNER_TLS_RELOAD_SECONDS", default_value_t = 10.0)]
    tls_reload_seconds: f64,
}

fn exec(runtime: &BuiltinRuntime, name: &str) -> ExitCode {
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("failed to read the ResourceList from stdin: {e}");
        return ExitCode::FAILURE;
    }
    match process_resource_list(runtime, name, &input) {
        Ok((output, ok)) => {
            if let Err(e) = std::io::stdout().write_all(output.as_bytes()) {
                eprintln!("failed to write the ResourceList: {e}");
                return ExitCode::FAILURE;
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let runtime = BuiltinRuntime::catalog();
    let invoked = std::env::args()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_owned)
        })
        .unwrap_or_default();
    if runtime.names().contains(&invoked.as_str()) {
        return exec(&runtime, &invoked);
    }
    match Cli::parse().command {
        Command::Exec { function } => exec(&runtime, &function),
        Command::Serve {
            address,
            metrics_address,
            max_message_bytes,
            exec_images,
            exec_timeout_seconds,
            tls,
        } => match run_server(
            address,
            metrics_address,
            max_message_bytes,
            &exec_images,
            exec_timeout_seconds,
            &tls,
        ) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fn-runner: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

fn run_server(
    address: SocketAddr,
    metrics_address: SocketAddr,
    max_message_bytes: usize,
    exec_images: &[String],
    exec_timeout_seconds: u64,
    tls: &TlsArgs,
) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let mut exec = ExecRuntime::new(ExecLimits {
        timeout: std::time::Duration::from_secs(exec_timeout_seconds),
        ..ExecLimits::default()
    });
    for mapping in exec_images {
        let Some((image, path)) = mapping.split_once('=') else {
            anyhow::bail!("--exec-image must be image=path, got {mapping:?}");
        };
        exec = exec.image(image, PathBuf::from(path), &[]);
    }
    let evaluator = Evaluator::new(BuiltinRuntime::catalog(), Some(exec));
    let stats = evaluator.stats.clone();
    tokio::runtime::Runtime::new()?.block_on(async move {
        let listener = tokio::net::TcpListener::bind(address).await?;
        let metrics_listener = tokio::net::TcpListener::bind(metrics_address).await?;
        let metrics = axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || async move { stats.render() }),
            )
            .route("/healthz", axum::routing::get(|| async { "ok" }));
        tokio::spawn(async move {
            if let Err(e) = axum::serve(metrics_listener, metrics).await {
                tracing::error!(error = %e, "metrics server stopped");
            }
        });
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        if let (Some(cert), Some(key)) = (&tls.tls_cert, &tls.tls_key) {
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
            let cert = porch_tls::ReloadingCert::new(porch_tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            })?;
            cert.watch(std::time::Duration::from_secs_f64(tls.tls_reload_seconds));
            let config = porch_tls::tls_config(cert)?;
            let router = routes(evaluator, max_message_bytes)
                .await
                .into_axum_router();
            // listening, on stderr, as the tests and local runs read it
            eprintln!("listening on https://{}", listener.local_addr()?);
            tracing::info!(%address, %metrics_address, "function runner serving over TLS");
            let limits = porch_tls::ConnectionLimits {
                // evaluations stream on few long-lived HTTP/2 connections
                max_concurrent_streams: 256,
                ..porch_tls::ConnectionLimits::default()
            };
            porch_tls::serve_tls(listener, config, router, limits, shutdown).await;
        } else {
            eprintln!("listening on http://{}", listener.local_addr()?);
            tracing::info!(%address, %metrics_address, "function runner serving");
            serve(listener, evaluator, max_message_bytes, shutdown).await?;
        }
        Ok(())
    })
}
