//! The `porch-relay` process: its configuration (flags and environment),
//! leader election, the watches, the relay loop and the health server, and
//! a graceful stop that lets in-flight handler runs finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use porch_api::invocation::{Invocation, Outcome};
use porch_api::repository::Repository;
use porch_api::v1alpha2::PackageRevision;
use porch_api::variant::{PackageVariant, PackageVariantSet};
use porch_git::s3::AnyStore;

use crate::invoker::{AwsLambda, InProcess, InvokeError, Invoker, LambdaHttp};
use crate::kube::KubeCluster;
use crate::lease::LeaseLock;
use crate::relay::{Relay, RelayConfig};
use crate::server::{Health, router};

/// How often the relay looks for kinds the variants newly inject.
const INJECTABLE_KINDS_EVERY: Duration = Duration::from_secs(10);

/// How the relay reaches the handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InvokerKind {
    /// The handlers linked into the relay (configured by the same
    /// environment as the Lambda functions: `PORCH_CACHE_DIR`,
    /// `PORCH_S3_BUCKET`, `PORCH_SECRETS_DIR`, …).
    InProcess,
    /// The Lambda Invoke API over HTTP (`cargo lambda watch`).
    Http,
    /// AWS Lambda's Invoke API, signed with the environment's AWS
    /// credentials (IRSA in EKS); region and endpoint from `AWS_REGION`
    /// and `AWS_ENDPOINT_URL_LAMBDA`.
    Aws,
}

/// The relay's configuration.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "porch-relay",
    about = "Watches PackageRevisions and Repositories and runs the handlers they need"
)]
pub struct Config {
    #[arg(
        long,
        env = "PORCH_RELAY_INVOKER",
        value_enum,
        default_value = "in-process"
    )]
    pub invoker: InvokerKind,
    /// The Lambda Invoke API endpoint, for `--invoker http`.
    #[arg(
        long,
        env = "PORCH_LAMBDA_ENDPOINT",
        default_value = "http://127.0.0.1:9000"
    )]
    pub lambda_endpoint: String,
    /// Function names are this prefix and the operation (`porch-render`).
    #[arg(long, env = "PORCH_FUNCTION_PREFIX", default_value = "porch-")]
    pub function_prefix: String,
    /// How long one handler run may take over HTTP or AWS.
    #[arg(long, env = "PORCH_INVOKE_TIMEOUT_SECONDS", default_value_t = 900)]
    pub invoke_timeout_seconds: u64,
    /// Watch one namespace (default: all).
    #[arg(long, env = "PORCH_RELAY_NAMESPACE")]
    pub namespace: Option<String>,
    #[arg(long, env = "PORCH_RELAY_CONCURRENCY", default_value_t = 50)]
    pub concurrency: usize,
    #[arg(long, env = "PORCH_RELAY_RENDER_CONCURRENCY", default_value_t = 20)]
    pub render_concurrency: usize,
    #[arg(long, env = "PORCH_RELAY_SYNC_INTERVAL_SECONDS", default_value_t = 300)]
    pub sync_interval_seconds: u64,
    /// `/healthz`, `/readyz`, `/metrics`.
    #[arg(long, env = "PORCH_RELAY_LISTEN", default_value = "0.0.0.0:8081")]
    pub listen: SocketAddr,
    /// Act without a Lease (one replica only).
    #[arg(long, env = "PORCH_RELAY_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,
    #[arg(long, env = "PORCH_RELAY_LEASE_NAME", default_value = "porch-relay")]
    pub lease_name: String,
    /// The Lease's namespace (default: the pod's, else `porch-system`).
    #[arg(long, env = "POD_NAMESPACE", default_value = "porch-system")]
    pub lease_namespace: String,
    #[arg(long, env = "PORCH_RELAY_LEASE_SECONDS", default_value_t = 15)]
    pub lease_seconds: u64,
    /// This replica's name in the Lease (default: the pod's name, else a
    /// random one).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

/// One of the invokers, chosen at start.
#[derive(Debug)]
pub enum AnyInvoker {
    InProcess(InProcess<AnyStore>),
    Http(LambdaHttp),
    Aws(AwsLambda),
}

impl Invoker for AnyInvoker {
    async fn invoke(&self, invocation: &Invocation) -> Result<Outcome, InvokeError> {
        match self {
            AnyInvoker::InProcess(i) => i.invoke(invocation).await,
            AnyInvoker::Http(i) => i.invoke(invocation).await,
            AnyInvoker::Aws(i) => i.invoke(invocation).await,
        }
    }
}

async fn invoker(config: &Config) -> anyhow::Result<AnyInvoker> {
    Ok(match config.invoker {
        InvokerKind::InProcess => {
            let runner = porch_lambda::Config::from_env()
                .runner()
                .await
                .map_err(anyhow::Error::msg)?;
            AnyInvoker::InProcess(InProcess::new(Arc::new(runner)))
        }
        InvokerKind::Http => AnyInvoker::Http(
            LambdaHttp::new(
                &config.lambda_endpoint,
                &config.function_prefix,
                Duration::from_secs(config.invoke_timeout_seconds),
            )
            .map_err(|e| anyhow::anyhow!(e))?,
        ),
        InvokerKind::Aws => AnyInvoker::Aws(
            AwsLambda::from_env(
                &config.function_prefix,
                Duration::from_secs(config.invoke_timeout_seconds),
            )
            .await,
        ),
    })
}

/// Resolves on SIGTERM or Ctrl-C.
async fn terminated() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

/// Runs the relay until it is told to stop.
///
/// # Errors
/// No Kubernetes configuration, an unusable invoker or listen address, or
/// the Lease lost (the process then exits and restarts as a standby).
pub async fn run(config: Config) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("no Kubernetes configuration (in-cluster or KUBECONFIG)")?;
    let relay = Arc::new(Relay::new(
        Arc::new(KubeCluster::new(client.clone())),
        Arc::new(invoker(&config).await?),
        RelayConfig {
            concurrency: config.concurrency,
            render_concurrency: config.render_concurrency,
            sync_interval: Duration::from_secs(config.sync_interval_seconds.max(1)),
            ..RelayConfig::default()
        },
    ));
    let revisions_listed = Arc::new(AtomicBool::new(false));
    let repositories_listed = Arc::new(AtomicBool::new(false));
    let variants_listed = Arc::new(AtomicBool::new(false));
    let sets_listed = Arc::new(AtomicBool::new(false));
    let leading = Arc::new(AtomicBool::new(false));
    let health = Health {
        ready: vec![
            Arc::clone(&revisions_listed),
            Arc::clone(&repositories_listed),
            Arc::clone(&variants_listed),
            Arc::clone(&sets_listed),
        ],
        leading: Some(Arc::clone(&leading)),
        metrics: {
            let relay = Arc::clone(&relay);
            Arc::new(move || relay.encode_metrics())
        },
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(health)).await {
            tracing::error!(error = %e, "health server stopped");
        }
    });

    let stop = terminated();
    tokio::pin!(stop);
    let identity = config
        .identity
        .clone()
        .unwrap_or_else(|| format!("porch-relay-{}", uuid::Uuid::new_v4()));
    let lease = (!config.no_leader_election).then(|| {
        LeaseLock::new(
            kube::Api::namespaced(client.clone(), &config.lease_namespace),
            &config.lease_name,
            &identity,
            Duration::from_secs(config.lease_seconds.max(2)),
        )
    });
    let lease_period = Duration::from_secs(config.lease_seconds.max(2));
    if let Some(lease) = &lease {
        tracing::info!(identity = %identity, lease = %config.lease_name, "standing by for the Lease");
        loop {
            match lease.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "Lease not reachable"),
            }
            tokio::select! {
                () = &mut stop => return Ok(()),
                () = tokio::time::sleep(lease_period / 3) => {}
            }
        }
    }
    leading.store(true, Ordering::SeqCst);
    tracing::info!(identity = %identity, "leading");

    let (revisions, repositories, variants, sets) = match &config.namespace {
        Some(ns) => (
            kube::Api::<PackageRevision>::namespaced(client.clone(), ns),
            kube::Api::<Repository>::namespaced(client.clone(), ns),
            kube::Api::<PackageVariant>::namespaced(client.clone(), ns),
            kube::Api::<PackageVariantSet>::namespaced(client.clone(), ns),
        ),
        None => (
            kube::Api::all(client.clone()),
            kube::Api::all(client.clone()),
            kube::Api::all(client.clone()),
            kube::Api::all(client.clone()),
        ),
    };
    let watches = [
        tokio::spawn(crate::watch::revisions(
            Arc::clone(&relay),
            revisions,
            revisions_listed,
        )),
        tokio::spawn(crate::watch::repositories(
            Arc::clone(&relay),
            repositories,
            repositories_listed,
        )),
        tokio::spawn(crate::watch::variants(
            Arc::clone(&relay),
            variants,
            variants_listed,
        )),
        tokio::spawn(crate::watch::variant_sets(
            Arc::clone(&relay),
            sets,
            sets_listed,
        )),
    ];

    // the kinds the variants inject, each watched once it is named
    let injected = {
        let relay = Arc::clone(&relay);
        let client = client.clone();
        let namespace = config.namespace.clone();
        tokio::spawn(async move {
            let mut watched = std::collections::BTreeMap::new();
            loop {
                for (api_version, kind) in relay.injectable_kinds() {
                    watched
                        .entry((api_version.clone(), kind.clone()))
                        .or_insert_with(|| {
                            tracing::info!(api_version = %api_version, kind = %kind, "watching injected objects");
                            tokio::spawn(crate::watch::injectables(
                                Arc::clone(&relay),
                                client.clone(),
                                api_version,
                                kind,
                                namespace.clone(),
                            ))
                        });
                }
                tokio::time::sleep(INJECTABLE_KINDS_EVERY).await;
            }
        })
    };

    // renew the Lease; losing it (or failing to renew for a whole lease
    // period) stops the relay
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<()>();
    let renewing = lease.clone().map(|lease| {
        tokio::spawn(async move {
            let mut last = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(lease_period / 3).await;
                match lease.try_acquire_or_renew().await {
                    Ok(true) => last = tokio::time::Instant::now(),
                    Ok(false) => break,
                    Err(e) if last.elapsed() < lease_period => {
                        tracing::warn!(error = %e, "Lease not renewed; trying again");
                    }
                    Err(_) => break,
                }
            }
            let _ = lost_tx.send(());
        })
    });
    let lost = Arc::new(AtomicBool::new(false));
    let shutdown = {
        let lost = Arc::clone(&lost);
        async move {
            tokio::select! {
                () = &mut stop => {}
                _ = lost_rx => lost.store(true, Ordering::SeqCst),
            }
        }
    };
    // the relay finishes the runs in flight before returning
    Arc::clone(&relay).run(shutdown).await;
    for watch in watches {
        watch.abort();
    }
    injected.abort();
    if let Some(renewing) = renewing {
        renewing.abort();
    }
    if lost.load(Ordering::SeqCst) {
        anyhow::bail!("the Lease was lost; stopping so a standby takes over");
    }
    if let Some(lease) = &lease
        && let Err(e) = lease.release().await
    {
        tracing::warn!(error = %e, "Lease not released; a standby takes over when it expires");
    }
    tracing::info!("stopped");
    Ok(())
}
