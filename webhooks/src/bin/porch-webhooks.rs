//! HTTPS host of the webhook router.

use anyhow::Context;
use clap::Parser;
use porch_webhooks::server::{self, ReloadingCert, TlsFiles};
use porch_webhooks::{AppState, router};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Admission and conversion webhooks for porch.kpt.dev PackageRevisions"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "PORCH_WEBHOOKS_ADDR", default_value = "0.0.0.0:8443")]
    addr: SocketAddr,
    /// PEM certificate chain; reloaded when the file changes.
    #[arg(long, env = "PORCH_WEBHOOKS_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key; reloaded when the file changes.
    #[arg(long, env = "PORCH_WEBHOOKS_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How often to look for new certificate files, in seconds.
    #[arg(long, env = "PORCH_WEBHOOKS_TLS_RELOAD_SECONDS", default_value_t = 5.0, value_parser = reload_seconds)]
    tls_reload_seconds: f64,
    /// Connections served at once.
    #[arg(long, env = "PORCH_WEBHOOKS_MAX_CONNECTIONS", default_value_t = 1024)]
    max_connections: usize,
    /// Where to write a self-signed pair when no certificate is given.
    #[arg(long, env = "PORCH_WEBHOOKS_SELF_SIGNED_DIR")]
    self_signed_dir: Option<PathBuf>,
    /// Serve plain HTTP (no TLS): for local experiments only.
    #[arg(long, env = "PORCH_WEBHOOKS_INSECURE_HTTP", conflicts_with_all = ["tls_cert", "tls_key"])]
    insecure_http: bool,
    #[command(flatten)]
    webhook: porch_webhooks::config::WebhookArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let (config, authorizer) = args.webhook.build().await;
    let app = router(AppState::new(config, authorizer));
    let listener = server::bind(args.addr).await?;
    let addr = listener
        .local_addr()
        .context("failed to read the bound address")?;
    if args.insecure_http {
        tracing::warn!(%addr, "serving plain HTTP: never do this where an apiserver connects");
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("server failed")?;
        return Ok(());
    }
    let files = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => TlsFiles { cert, key },
        _ => {
            let dir = args.self_signed_dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("porch-webhooks-{}", std::process::id()))
            });
            let files = server::write_self_signed(
                &dir,
                &["porch-webhooks", "porch-webhooks.porch-system.svc"],
            )?;
            eprintln!(
                "no --tls-cert given: serving a self-signed certificate for localhost from {} (key {})",
                files.cert.display(),
                files.key.display()
            );
            files
        }
    };
    let cert = ReloadingCert::new(files)?;
    cert.watch(Duration::from_secs_f64(args.tls_reload_seconds));
    let tls = server::tls_config(cert)?;
    tracing::info!(%addr, "serving HTTPS");
    eprintln!("listening on https://{addr}");
    let limits = server::ConnectionLimits {
        max_connections: args.max_connections,
        ..server::ConnectionLimits::default()
    };
    server::serve_tls(listener, tls, app, limits, shutdown_signal()).await;
    Ok(())
}

fn reload_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if (0.05..=3600.0).contains(&s) => Ok(s),
        _ => Err(format!(
            "{text:?} is not a number of seconds from 0.05 to 3600"
        )),
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
