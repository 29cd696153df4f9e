//! `porch`: see the crate documentation of `porch_cli`.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PORCH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = porch_cli::Cli::parse();
    // boxed: the command futures are too deep for the layout of main's own
    match Box::pin(porch_cli::run(cli)).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", porch_cli::message(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
