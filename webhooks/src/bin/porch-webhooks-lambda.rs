//! AWS Lambda host of the webhook router (function URL or API Gateway).

use porch_webhooks::{AppState, router};

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .without_time()
        .init();
    let args = <porch_webhooks::config::WebhookArgs as clap::Parser>::parse();
    let (config, authorizer) = args.build().await;
    lambda_http::run(router(AppState::new(config, authorizer))).await
}
