//! The TLS host of the project's servers (the webhooks over HTTPS, the
//! function runner's gRPC): rustls on TLS 1.2 and 1.3 only, certificates
//! that reload from disk without a restart, a self-signed pair for local
//! runs, connection limits and graceful shutdown.

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

/// Why the server could not start or load its certificate.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("failed to read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no certificate found in {0}")]
    NoCertificate(PathBuf),
    #[error("no private key found in {0}")]
    NoKey(PathBuf),
    #[error("certificate {cert} and key {key} do not belong together")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("no rustls crypto provider is installed")]
    NoProvider,
    #[error("failed to generate a self-signed certificate")]
    SelfSigned(#[source] rcgen::Error),
    #[error("failed to write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to bind {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to build the TLS configuration")]
    Tls(#[source] rustls::Error),
}

/// A certificate and key on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Loads a PEM certificate chain and key and checks that they match.
///
/// # Errors
/// Unreadable files, no certificate or key, or a key of another certificate.
pub fn load_certified_key(files: &TlsFiles) -> Result<CertifiedKey, ServerError> {
    let (cert_pem, key_pem) = read_pair(files)?;
    parse_certified_key(files, &cert_pem, &key_pem)
}

fn read_pair(files: &TlsFiles) -> Result<(Vec<u8>, Vec<u8>), ServerError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| ServerError::Read {
            path: path.to_owned(),
            source,
        })
    };
    Ok((read(&files.cert)?, read(&files.key)?))
}

fn parse_certified_key(
    files: &TlsFiles,
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<CertifiedKey, ServerError> {
    let certs: Vec<_> = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<_, _>>()
        .map_err(|source| ServerError::Read {
            path: files.cert.clone(),
            source,
        })?;
    if certs.is_empty() {
        return Err(ServerError::NoCertificate(files.cert.clone()));
    }
    let key = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|source| ServerError::Read {
            path: files.key.clone(),
            source,
        })?
        .ok_or_else(|| ServerError::NoKey(files.key.clone()))?;
    let provider = rustls::crypto::CryptoProvider::get_default().ok_or(ServerError::NoProvider)?;
    CertifiedKey::from_der(certs, key, provider).map_err(|source| ServerError::Mismatch {
        cert: files.cert.clone(),
        key: files.key.clone(),
        source,
    })
}

/// Serves the current certificate; [`ReloadingCert::watch`] swaps it when
/// the files change (including Kubernetes Secret volume symlink swaps).
#[derive(Debug)]
pub struct ReloadingCert {
    files: TlsFiles,
    current: RwLock<(Arc<CertifiedKey>, Vec<u8>, Vec<u8>)>,
}

impl ReloadingCert {
    /// Loads the files once.
    ///
    /// # Errors
    /// See [`load_certified_key`].
    pub fn new(files: TlsFiles) -> Result<Arc<Self>, ServerError> {
        let (cert, key) = read_pair(&files)?;
        let certified = parse_certified_key(&files, &cert, &key)?;
        Ok(Arc::new(Self {
            files,
            current: RwLock::new((Arc::new(certified), cert, key)),
        }))
    }

    /// Re-reads the files; returns whether a new certificate is now served.
    /// A pair that does not load (half-written, mismatched) keeps the old one.
    pub fn reload(&self) -> bool {
        let Ok((cert, key)) = read_pair(&self.files) else {
            return false;
        };
        {
            let current = self.current.read().unwrap_or_else(|e| e.into_inner());
            if current.1 == cert && current.2 == key {
                return false;
            }
        }
        match parse_certified_key(&self.files, &cert, &key) {
            Ok(certified) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) =
                    (Arc::new(certified), cert, key);
                info!(cert = %self.files.cert.display(), "reloaded TLS certificate");
                true
            }
            Err(e) => {
                warn!(error = %e, "keeping the previous TLS certificate");
                false
            }
        }
    }

    /// Polls the files every `interval` until the process ends.
    pub fn watch(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let this = Arc::clone(&this);
                // file reads are blocking
                let _ = tokio::task::spawn_blocking(move || this.reload()).await;
            }
        })
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(|e| e.into_inner()).0,
        ))
    }
}

/// Writes a self-signed pair for `localhost`, `127.0.0.1` and `names` (a
/// service's in-cluster names) into `dir` and returns where.
///
/// # Errors
/// Key generation or writing fails.
pub fn write_self_signed(dir: &Path, names: &[&str]) -> Result<TlsFiles, ServerError> {
    let names: Vec<String> = ["localhost", "127.0.0.1"]
        .iter()
        .chain(names)
        .map(|n| (*n).to_owned())
        .collect();
    let generated = rcgen::generate_simple_self_signed(names).map_err(ServerError::SelfSigned)?;
    std::fs::create_dir_all(dir).map_err(|source| ServerError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let files = TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    let write = |path: &Path, body: String| {
        std::fs::write(path, body).map_err(|source| ServerError::Write {
            path: path.to_owned(),
            source,
        })
    };
    write(&files.cert, generated.cert.pem())?;
    write(&files.key, generated.signing_key.serialize_pem())?;
    Ok(files)
}

/// A rustls server configuration serving `cert` over TLS 1.2 and 1.3,
/// offering h2 and http/1.1.
///
/// # Errors
/// No crypto provider is installed.
pub fn tls_config(cert: Arc<ReloadingCert>) -> Result<Arc<ServerConfig>, ServerError> {
    let provider = rustls::crypto::CryptoProvider::get_default().ok_or(ServerError::NoProvider)?;
    let mut config = ServerConfig::builder_with_provider(Arc::clone(provider))
        // TLS 1.2 and 1.3 only, said here rather than left to a default
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(ServerError::Tls)?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Binds `addr`.
///
/// # Errors
/// The address is taken or not allowed.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// Limits of the HTTPS host against slow, idle and greedy clients.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections served at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// Time for a TLS handshake.
    pub handshake_timeout: Duration,
    /// Time to send the headers of a request (HTTP/1).
    pub header_read_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            max_concurrent_streams: 16,
        }
    }
}

/// Serves `router` over TLS on `listener` until `shutdown` completes, then
/// waits for in-flight connections to finish. HTTP/1.1 and HTTP/2 (gRPC
/// services are served as axum routers too).
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&connections).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // e.g. out of file descriptors: back off instead of spinning
                    warn!(error = %e, "failed to accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(router.clone());
        let watcher = graceful.watcher();
        let builder = builder.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let tls_stream =
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await
                {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls_stream), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    info!("shutting down: waiting for in-flight requests");
    graceful.shutdown().await;
}
