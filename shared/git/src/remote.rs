//! Remotes: fetch into a local mirror and push compare-and-swap ref updates,
//! over smart HTTP(S), `git://`, or straight into a local bare repository.
//!
//! The smart protocol (v0/v1) is spoken natively: the ref advertisement,
//! `upload-pack` with `want`/`have`/`done`, `receive-pack` with one command
//! per ref (`<old> <new> <ref>`, the zero id to create or delete), the pack
//! of only the objects the remote lacks ([`crate::pack`]), and
//! `report-status` parsed into typed rejections. A push is never forced:
//! every command carries the old id the caller expects, and a push with
//! several refs is atomic when the server offers `atomic`.
//!
//! SSH remotes are not supported; `ssh://` and scp-like URLs are rejected
//! with a clear error.

use crate::egress::{Denied, EgressPolicy, GuardedResolver};
use crate::pktline::{
    self, Advertisement, FLUSH, ProtocolError, RefRejection, parse_advertisement,
    parse_report_status,
};
use crate::repo::{GitRepo, RefUpdate, RepoError};
use gix::ObjectId;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the client calls itself on the wire.
const AGENT: &str = concat!("agent=porch-rs/", env!("CARGO_PKG_VERSION"));

/// The refs of a remote: branch and tag names → the id each holds (shared:
/// a large repository's listing is not copied per caller).
pub type RemoteRefs = std::sync::Arc<crate::listing::RefMap>;

/// Credentials for a smart-HTTP remote. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    Basic {
        username: String,
        password: String,
    },
    /// Sent as `Authorization: Bearer <token>`.
    Bearer(String),
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
            Self::Bearer(_) => f.write_str("Bearer(<redacted>)"),
        }
    }
}

/// Finds the credentials for a remote URL (a Kubernetes Secret named by the
/// Repository, an environment variable, a fixed value in tests).
pub trait CredentialResolver: Send + Sync + fmt::Debug {
    fn resolve(&self, url: &str) -> Option<Credentials>;
}

/// The same credentials for every URL.
#[derive(Debug, Clone)]
pub struct StaticCredentials(pub Credentials);

impl CredentialResolver for StaticCredentials {
    fn resolve(&self, _url: &str) -> Option<Credentials> {
        Some(self.0.clone())
    }
}

/// How a smart remote is reached.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// PEM certificates trusted besides the system's roots.
    pub ca_bundle: Option<Vec<u8>>,
    pub credentials: Option<Arc<dyn CredentialResolver>>,
    pub connect_timeout: Duration,
    /// For one whole request, including its answer.
    pub request_timeout: Duration,
    /// The largest ref advertisement or report accepted.
    pub max_advertisement_bytes: usize,
    /// The largest pack accepted from a fetch.
    pub max_pack_bytes: usize,
    /// Where connections may go; `None` checks nothing (an administrator's
    /// Repository). URLs users choose carry a policy ([`crate::egress`]).
    pub egress: Option<Arc<EgressPolicy>>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            ca_bundle: None,
            credentials: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(300),
            max_advertisement_bytes: 256 << 20,
            max_pack_bytes: 1 << 30,
            egress: None,
        }
    }
}

/// Why a fetch or push failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("remote URL {url:?} is not usable: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("cannot reach {url}: {message}")]
    Unreachable {
        url: String,
        message: String,
        transient: bool,
    },
    #[error("{url} answered HTTP {status}: {body}")]
    Http {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url} answered HTTP {status}: credentials are missing or were not accepted")]
    Auth { url: String, status: u16 },
    #[error("{url} is not a smart git server: {reason}")]
    NotSmart { url: String, reason: String },
    #[error("malformed answer from {url}: {source}")]
    Protocol {
        url: String,
        #[source]
        source: ProtocolError,
    },
    #[error("the answer from {url} is larger than {limit} bytes")]
    TooLarge { url: String, limit: usize },
    #[error("{url} rejected the push: {}", describe(.refs))]
    Rejected {
        url: String,
        refs: Vec<(String, RefRejection)>,
    },
    #[error("{url} could not store the pushed objects: {reason}")]
    Unpack { url: String, reason: String },
    #[error("{url} reported an error: {message}")]
    Server { url: String, message: String },
    /// The egress policy refuses where the URL leads.
    #[error("{url}: {reason}")]
    Denied { url: String, reason: String },
    #[error("{url} does not support {what}")]
    Unsupported { url: String, what: &'static str },
    #[error("invalid ref update: {0}")]
    BadUpdate(String),
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error("a blocking git task failed: {0}")]
    Task(String),
}

fn describe(refs: &[(String, RefRejection)]) -> String {
    refs.iter()
        .map(|(name, why)| format!("{name}: {why:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl RemoteError {
    /// A compare-and-swap lost to another writer: refetch, redo the
    /// operation on the new state, push again.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Rejected { refs, .. } if !refs.is_empty() && refs.iter().all(|(_, r)| matches!(
            r,
            RefRejection::Stale
                | RefRejection::NonFastForward
                | RefRejection::AlreadyExists
                | RefRejection::AtomicTransactionFailed
        )))
    }

    /// Worth retrying unchanged after a pause (the transient errors of the
    /// reference: server errors, broken connections, lock contention on the
    /// server, a declined hook, objects not yet migrated).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unreachable { transient, .. } => *transient,
            Self::Http { status, .. } => *status >= 500 || *status == 429 || *status == 408,
            Self::Unpack { reason, .. }
            | Self::Server {
                message: reason, ..
            } => {
                let reason = reason.to_ascii_lowercase();
                reason.contains("unable to migrate objects")
                    || reason.contains("stale file handle")
                    || reason.contains("broken pipe")
                    // over stateless HTTP a ref moved between the
                    // advertisement and the request: a new fetch reads a
                    // new advertisement
                    || reason.contains("not our ref")
            }
            Self::Rejected { refs, .. } => refs.iter().any(|(_, r)| match r {
                RefRejection::HookDeclined => true,
                RefRejection::Other(reason) => {
                    let reason = reason.to_ascii_lowercase();
                    reason.contains("failed to update ref") || reason.contains("failed to lock")
                }
                _ => false,
            }),
            _ => false,
        }
    }
}

/// A git remote the handlers fetch from and push to.
pub trait Remote: Send + Sync + fmt::Debug {
    /// The URL, without credentials.
    fn url(&self) -> &str;

    /// Brings every branch and tag of the remote into the bare repository at
    /// `mirror` (objects it lacks, then its refs made exactly the remote's).
    fn fetch(&self, mirror: &Path) -> impl Future<Output = Result<RemoteRefs, RemoteError>> + Send;

    /// Sends the objects `updates` need from `mirror` and applies the
    /// updates on the remote, each a compare-and-swap, all or none.
    fn push(
        &self,
        mirror: &Path,
        updates: &[RefUpdate],
    ) -> impl Future<Output = Result<(), RemoteError>> + Send;
}

/// Runs blocking git work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, RemoteError> + Send + 'static,
) -> Result<T, RemoteError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| RemoteError::Task(e.to_string()))?
}

fn check_updates(updates: &[RefUpdate]) -> Result<(), RemoteError> {
    let mut names = std::collections::BTreeSet::new();
    for update in updates {
        let name = &update.name;
        if !crate::listing::is_branch_or_tag(name) {
            return Err(RemoteError::BadUpdate(format!(
                "{name:?} is not a branch or tag"
            )));
        }
        gix::refs::FullName::try_from(name.as_str())
            .map_err(|e| RemoteError::BadUpdate(format!("{name:?}: {e}")))?;
        if !names.insert(name) {
            return Err(RemoteError::BadUpdate(format!("{name:?} is updated twice")));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- local

/// A bare repository on local disk as the remote (the embedded default):
/// objects are copied as a pack, refs change in one locked transaction with
/// the expected previous values.
#[derive(Debug, Clone)]
pub struct LocalRemote {
    path: PathBuf,
    display: String,
}

impl LocalRemote {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let display = path.display().to_string();
        Self { path, display }
    }

    /// Copies the objects `from` has and `to` lacks for `tips`.
    fn copy_objects(from: &GitRepo, to: &GitRepo, tips: &[ObjectId]) -> Result<(), RepoError> {
        /// More objects than this travel as a pack; fewer are written
        /// loose, so a repository that takes one small change at a time
        /// does not collect a pack (and an index to search) per change.
        const LOOSE_AT_MOST: usize = 256;
        let ids = from.objects_missing_from(tips, to)?;
        if ids.is_empty() {
            return Ok(());
        }
        if ids.len() <= LOOSE_AT_MOST {
            return from.copy_loose(&ids, to);
        }
        to.install_pack(&from.write_pack(&ids)?)
    }
}

impl Remote for LocalRemote {
    fn url(&self) -> &str {
        &self.display
    }

    async fn fetch(&self, mirror: &Path) -> Result<RemoteRefs, RemoteError> {
        let (source, mirror) = (self.path.clone(), mirror.to_owned());
        blocking(move || {
            // A writer may be between writing objects and moving refs while
            // we read: a ref we cannot resolve is read again from a freshly
            // opened repository, as a git server would serve a consistent
            // view.
            let mut attempt = 0;
            loop {
                attempt += 1;
                let read = || -> Result<RemoteRefs, RemoteError> {
                    let from = GitRepo::open(&source)?;
                    let to = GitRepo::open(&mirror)?;
                    // as a git server's advertisement: every ref is listed,
                    // but only the objects of refs that moved are looked at
                    let refs = from.branches_and_tags()?;
                    let current = to.branches_and_tags()?;
                    if refs == current {
                        return Ok(refs);
                    }
                    let tips: Vec<ObjectId> = crate::listing::differences(&current, &refs)
                        .into_iter()
                        .filter_map(|(_, _, id)| id)
                        .collect();
                    Self::copy_objects(&from, &to, &tips)?;
                    to.mirror_refs_from(&current, &refs)?;
                    Ok(refs)
                };
                match read() {
                    Err(RemoteError::Repo(_)) if attempt < 5 => {
                        std::thread::sleep(std::time::Duration::from_millis(10 * attempt));
                    }
                    // Still moving under us: a transient failure the
                    // mirror's backoff retries.
                    Err(RemoteError::Repo(e)) => {
                        return Err(RemoteError::Unreachable {
                            url: source.display().to_string(),
                            message: format!("the repository kept changing while read: {e}"),
                            transient: true,
                        });
                    }
                    other => return other,
                }
            }
        })
        .await
    }

    async fn push(&self, mirror: &Path, updates: &[RefUpdate]) -> Result<(), RemoteError> {
        check_updates(updates)?;
        let (target, mirror) = (self.path.clone(), mirror.to_owned());
        let updates = updates.to_vec();
        let url = self.display.clone();
        blocking(move || {
            let from = GitRepo::open(&mirror)?;
            let tips: Vec<ObjectId> = updates.iter().filter_map(|u| u.new).collect();
            // A concurrent writer's objects may be newer than the view a
            // handle opened earlier: a ref that cannot be resolved is tried
            // again through a fresh handle.
            let mut attempt = 0;
            loop {
                attempt += 1;
                let to = GitRepo::open(&target)?;
                Self::copy_objects(&from, &to, &tips)?;
                match to.update_refs(&updates) {
                    Ok(()) => return Ok(()),
                    Err(RepoError::Conflict { name, .. }) => {
                        return Err(RemoteError::Rejected {
                            url,
                            refs: vec![(name, RefRejection::Stale)],
                        });
                    }
                    Err(_) if attempt < 5 => {
                        std::thread::sleep(std::time::Duration::from_millis(10 * attempt));
                    }
                    Err(other) => {
                        return Err(RemoteError::Unreachable {
                            url,
                            message: format!("the repository kept changing while updated: {other}"),
                            transient: true,
                        });
                    }
                }
            }
        })
        .await
    }
}

// ---------------------------------------------------------------- smart

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    UploadPack,
    ReceivePack,
}

impl Service {
    fn name(self) -> &'static str {
        match self {
            Self::UploadPack => "git-upload-pack",
            Self::ReceivePack => "git-receive-pack",
        }
    }
}

#[derive(Debug, Clone)]
enum Endpoint {
    Http {
        base: reqwest::Url,
        client: reqwest::Client,
    },
    Daemon {
        host: String,
        port: u16,
        path: String,
    },
}

/// A remote over smart HTTP(S) or `git://`.
#[derive(Debug, Clone)]
pub struct SmartRemote {
    endpoint: Endpoint,
    /// The URL without user information, for messages.
    display: String,
    options: RemoteOptions,
    url_credentials: Option<Credentials>,
}

fn tls_config(ca_bundle: Option<&[u8]>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        // a system certificate rustls cannot use is skipped, as browsers do
        let _ = roots.add(cert);
    }
    if let Some(pem) = ca_bundle {
        let mut reader = pem;
        let mut added = 0;
        for cert in rustls_pemfile::certs(&mut reader) {
            let cert = cert.map_err(|e| format!("the CA bundle is not PEM: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("the CA bundle holds an unusable certificate: {e}"))?;
            added += 1;
        }
        if added == 0 {
            return Err("the CA bundle holds no certificate".into());
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

struct Session {
    advertisement: Advertisement,
    /// The advertised refs including peeled `^{}` entries and `HEAD`.
    raw_refs: Vec<(String, ObjectId)>,
    conn: Conn,
}

enum Conn {
    /// `base`: the repository URL the advertisement finally came from (after
    /// a same-host redirect), where the request goes too.
    Http {
        service: Service,
        base: reqwest::Url,
    },
    Daemon(tokio::net::TcpStream),
}

impl SmartRemote {
    /// A remote for an `http://`, `https://` or `git://` URL. User
    /// information in the URL is used as basic-auth credentials when no
    /// resolver is given, and never shown.
    ///
    /// # Errors
    /// Another scheme (SSH is not supported), a malformed URL, a bad CA bundle.
    pub fn new(url: &str, options: RemoteOptions) -> Result<Self, RemoteError> {
        let bad = |reason: &str| RemoteError::BadUrl {
            url: redact(url),
            reason: reason.to_owned(),
        };
        if url.starts_with("ssh://") || (!url.contains("://") && url.contains(':')) {
            return Err(bad("SSH remotes are not supported; use HTTPS"));
        }
        let mut parsed = reqwest::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        let url_credentials = (!parsed.username().is_empty()).then(|| Credentials::Basic {
            username: percent_decode(parsed.username()),
            password: percent_decode(parsed.password().unwrap_or_default()),
        });
        let _ = parsed.set_username("");
        let _ = parsed.set_password(None);
        let display = parsed.as_str().trim_end_matches('/').to_owned();
        let guard = options.egress.clone().filter(|p| !p.is_unrestricted());
        if let Some(policy) = &guard {
            let host = parsed.host_str().unwrap_or_default();
            if !policy.allows_host(host) {
                policy.check_url(&parsed).map_err(|e| RemoteError::Denied {
                    url: display.clone(),
                    reason: e.to_string(),
                })?;
            }
        }
        let endpoint = match parsed.scheme() {
            "http" | "https" => {
                let tls = tls_config(options.ca_bundle.as_deref()).map_err(|e| bad(&e))?;
                let mut builder = reqwest::Client::builder()
                    .use_preconfigured_tls(tls)
                    .connect_timeout(options.connect_timeout)
                    .timeout(options.request_timeout)
                    .redirect(redirect_policy(guard.clone()))
                    .user_agent(AGENT.trim_start_matches("agent="));
                if let Some(policy) = &guard {
                    // Every name is resolved through the policy, so the
                    // connection goes only to an address that passed.
                    builder = builder
                        .no_proxy()
                        .dns_resolver(Arc::new(GuardedResolver(Arc::clone(policy))));
                }
                let client = builder.build().map_err(|e| bad(&e.to_string()))?;
                let mut base = parsed.clone();
                if !base.path().ends_with('/') {
                    base.set_path(&format!("{}/", base.path()));
                }
                Endpoint::Http { base, client }
            }
            "git" => Endpoint::Daemon {
                host: parsed.host_str().ok_or_else(|| bad("no host"))?.to_owned(),
                port: parsed.port().unwrap_or(9418),
                path: parsed.path().to_owned(),
            },
            other => return Err(bad(&format!("scheme {other:?} is not supported"))),
        };
        Ok(Self {
            endpoint,
            display,
            options,
            url_credentials,
        })
    }

    fn credentials(&self) -> Option<Credentials> {
        match &self.options.credentials {
            Some(resolver) => resolver.resolve(&self.display),
            None => self.url_credentials.clone(),
        }
    }

    fn unreachable(&self, e: &reqwest::Error) -> RemoteError {
        if let Some(reason) = egress_refusal(e) {
            return RemoteError::Denied {
                url: self.display.clone(),
                reason,
            };
        }
        // connection refused/reset, timeouts: all worth another try
        RemoteError::Unreachable {
            url: self.display.clone(),
            message: error_chain(e),
            transient: e.is_timeout() || e.is_connect() || e.is_request() || e.is_body(),
        }
    }

    fn protocol(&self, source: ProtocolError) -> RemoteError {
        match source {
            ProtocolError::Remote(message) => RemoteError::Server {
                url: self.display.clone(),
                message,
            },
            source => RemoteError::Protocol {
                url: self.display.clone(),
                source,
            },
        }
    }

    fn authorize(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self.credentials() {
            Some(Credentials::Basic { username, password }) => {
                request.basic_auth(username, Some(password))
            }
            Some(Credentials::Bearer(token)) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Reads an HTTP answer whole, with a size limit, mapping statuses.
    async fn http_body(
        &self,
        response: Result<reqwest::Response, reqwest::Error>,
        expected_type: &str,
        limit: usize,
    ) -> Result<Vec<u8>, RemoteError> {
        let mut response = response.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(RemoteError::Auth {
                url: self.display.clone(),
                status: status.as_u16(),
            });
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(RemoteError::Http {
                url: self.display.clone(),
                status: status.as_u16(),
                body: body.chars().take(300).collect::<String>().trim().to_owned(),
            });
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if content_type != expected_type {
            return Err(RemoteError::NotSmart {
                url: self.display.clone(),
                reason: format!("content type {content_type:?}, expected {expected_type:?}"),
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| self.unreachable(&e))? {
            if body.len() + chunk.len() > limit {
                return Err(RemoteError::TooLarge {
                    url: self.display.clone(),
                    limit,
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    async fn connect(&self, service: Service) -> Result<Session, RemoteError> {
        let limit = self.options.max_advertisement_bytes;
        let (raw, conn) = match &self.endpoint {
            Endpoint::Http { base, client } => {
                let mut url = base
                    .join("info/refs")
                    .map_err(|e| self.protocol(ProtocolError::Remote(e.to_string())))?;
                url.set_query(Some(&format!("service={}", service.name())));
                let response = self.authorize(client.get(url)).send().await;
                let final_base = response
                    .as_ref()
                    .ok()
                    .and_then(|r| redirected_base(base, r.url()))
                    .unwrap_or_else(|| base.clone());
                let expected = format!("application/x-{}-advertisement", service.name());
                let body = self.http_body(response, &expected, limit).await?;
                (
                    body,
                    Conn::Http {
                        service,
                        base: final_base,
                    },
                )
            }
            Endpoint::Daemon { host, port, path } => {
                let addresses = match self.options.egress.as_deref() {
                    Some(policy) if !policy.allows_host(host) => {
                        match policy.resolve(host, *port).await {
                            Ok(addresses) => addresses,
                            Err(crate::egress::ResolveError::Refused(refused)) => {
                                return Err(RemoteError::Denied {
                                    url: self.display.clone(),
                                    reason: refused.to_string(),
                                });
                            }
                            Err(crate::egress::ResolveError::Lookup(message)) => {
                                return Err(self.daemon_error(&message, true));
                            }
                        }
                    }
                    _ => tokio::net::lookup_host((host.as_str(), *port))
                        .await
                        .map_err(|e| self.daemon_error(&e.to_string(), true))?
                        .collect(),
                };
                let mut stream = tokio::time::timeout(
                    self.options.connect_timeout,
                    tokio::net::TcpStream::connect(&addresses[..]),
                )
                .await
                .map_err(|_| self.daemon_error("connect timed out", true))?
                .map_err(|e| self.daemon_error(&e.to_string(), true))?;
                let request = format!("{} {path}\0host={host}:{port}\0", service.name());
                let line = pktline::encode(request.as_bytes()).map_err(|e| self.protocol(e))?;
                stream
                    .write_all(&line)
                    .await
                    .map_err(|e| self.daemon_error(&e.to_string(), true))?;
                let raw = self.read_until_flush(&mut stream, limit).await?;
                (raw, Conn::Daemon(stream))
            }
        };
        let raw_refs = parse_advertisement(&raw)
            .map_err(|e| self.protocol(e))?
            .refs;
        let mut advertisement = parse_advertisement(&raw).map_err(|e| self.protocol(e))?;
        advertisement
            .refs
            .retain(|(name, _)| name.starts_with("refs/") && !name.ends_with("^{}"));
        Ok(Session {
            advertisement,
            raw_refs,
            conn,
        })
    }

    fn daemon_error(&self, message: &str, transient: bool) -> RemoteError {
        RemoteError::Unreachable {
            url: self.display.clone(),
            message: message.to_owned(),
            transient,
        }
    }

    /// Reads pkt-lines from a `git://` connection up to the first flush.
    async fn read_until_flush(
        &self,
        stream: &mut tokio::net::TcpStream,
        limit: usize,
    ) -> Result<Vec<u8>, RemoteError> {
        let mut raw = Vec::new();
        loop {
            let mut head = [0u8; 4];
            stream
                .read_exact(&mut head)
                .await
                .map_err(|e| self.daemon_error(&format!("reading the advertisement: {e}"), true))?;
            raw.extend_from_slice(&head);
            let text = std::str::from_utf8(&head).unwrap_or("zzzz");
            let len = usize::from_str_radix(text, 16)
                .map_err(|_| self.protocol(ProtocolError::BadLength(text.to_owned())))?;
            if len == 0 {
                return Ok(raw);
            }
            if !(4..=pktline::MAX_PKT_DATA + 4).contains(&len) {
                return Err(self.protocol(ProtocolError::BadLength(text.to_owned())));
            }
            if raw.len() + len > limit {
                return Err(RemoteError::TooLarge {
                    url: self.display.clone(),
                    limit,
                });
            }
            let start = raw.len();
            raw.resize(start + len - 4, 0);
            stream
                .read_exact(&mut raw[start..])
                .await
                .map_err(|e| self.daemon_error(&format!("reading the advertisement: {e}"), true))?;
        }
    }

    /// Sends the request of a session and reads the whole answer.
    async fn request(
        &self,
        session: Session,
        body: Vec<u8>,
        limit: usize,
    ) -> Result<Vec<u8>, RemoteError> {
        match (session.conn, &self.endpoint) {
            (Conn::Http { service, base }, Endpoint::Http { client, .. }) => {
                let url = base
                    .join(service.name())
                    .map_err(|e| self.protocol(ProtocolError::Remote(e.to_string())))?;
                let request = client
                    .post(url)
                    .header(
                        reqwest::header::CONTENT_TYPE,
                        format!("application/x-{}-request", service.name()),
                    )
                    .header(
                        reqwest::header::ACCEPT,
                        format!("application/x-{}-result", service.name()),
                    )
                    .body(body);
                let response = self.authorize(request).send().await;
                let expected = format!("application/x-{}-result", service.name());
                self.http_body(response, &expected, limit).await
            }
            (Conn::Daemon(mut stream), _) => {
                stream
                    .write_all(&body)
                    .await
                    .map_err(|e| self.daemon_error(&format!("sending the request: {e}"), true))?;
                let mut answer = Vec::new();
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = stream.read(&mut buf).await.map_err(|e| {
                        self.daemon_error(&format!("reading the answer: {e}"), true)
                    })?;
                    if n == 0 {
                        return Ok(answer);
                    }
                    if answer.len() + n > limit {
                        return Err(RemoteError::TooLarge {
                            url: self.display.clone(),
                            limit,
                        });
                    }
                    answer.extend_from_slice(&buf[..n]);
                }
            }
            (Conn::Http { .. }, Endpoint::Daemon { .. }) => Err(RemoteError::Task(
                "an HTTP session on a git:// remote".into(),
            )),
        }
    }

    /// Ends a session without a request (nothing to fetch or push).
    async fn finish(&self, session: Session) {
        if let Conn::Daemon(mut stream) = session.conn {
            let _ = stream.write_all(FLUSH).await;
            let _ = stream.shutdown().await;
        }
    }

    /// The remote's branches and tags.
    ///
    /// # Errors
    /// The remote cannot be reached or answers badly.
    pub async fn list_refs(&self) -> Result<RemoteRefs, RemoteError> {
        let session = self.connect(Service::UploadPack).await?;
        let refs = session.advertisement.refs.iter().cloned().collect();
        self.finish(session).await;
        Ok(std::sync::Arc::new(refs))
    }
}

/// Most `have` lines sent in one fetch: branch heads cover nearly all
/// history, and the server stops at the first common commit anyway.
const MAX_HAVES: usize = 4096;

impl Remote for SmartRemote {
    fn url(&self) -> &str {
        &self.display
    }

    async fn fetch(&self, mirror: &Path) -> Result<RemoteRefs, RemoteError> {
        let session = self.connect(Service::UploadPack).await?;
        let refs: RemoteRefs = std::sync::Arc::new(
            session
                .advertisement
                .refs
                .iter()
                .filter(|(n, _)| crate::listing::is_branch_or_tag(n))
                .cloned()
                .collect(),
        );
        let (wanted, local) = {
            let (mirror, refs) = (mirror.to_owned(), refs.clone());
            blocking(move || {
                let repo = GitRepo::open(&mirror)?;
                let mut wants: Vec<ObjectId> = refs
                    .values()
                    .copied()
                    .filter(|id| !repo.has_object(*id))
                    .collect();
                wants.sort();
                wants.dedup();
                let local = repo.try_refs_unpeeled()?;
                let mut haves: Vec<ObjectId> = local
                    .iter()
                    .filter(|(n, _)| n.starts_with("refs/heads/"))
                    .map(|(_, id)| *id)
                    .collect();
                haves.sort();
                haves.dedup();
                haves.truncate(MAX_HAVES);
                Ok((wants, haves))
            })
            .await?
        };
        if wanted.is_empty() {
            self.finish(session).await;
        } else {
            let offered = &session.advertisement.capabilities;
            let mut caps = vec!["ofs-delta", AGENT];
            if offered.contains("side-band-64k") {
                caps.push("side-band-64k");
            } else if offered.contains("side-band") {
                caps.push("side-band");
            }
            if offered.contains("no-progress") {
                caps.push("no-progress");
            }
            let mut body = Vec::new();
            for (i, id) in wanted.iter().enumerate() {
                let line = if i == 0 {
                    format!("want {id} {}\n", caps.join(" "))
                } else {
                    format!("want {id}\n")
                };
                body.extend(pktline::encode(line.as_bytes()).map_err(|e| self.protocol(e))?);
            }
            body.extend_from_slice(FLUSH);
            for id in &local {
                body.extend(
                    pktline::encode(format!("have {id}\n").as_bytes())
                        .map_err(|e| self.protocol(e))?,
                );
            }
            body.extend(pktline::encode(b"done\n").map_err(|e| self.protocol(e))?);
            let answer = self
                .request(session, body, self.options.max_pack_bytes)
                .await?;
            let pack = pktline::pack_from_answer(&answer).map_err(|e| self.protocol(e))?;
            let mirror = mirror.to_owned();
            blocking(move || {
                GitRepo::open(&mirror)?.index_pack(&pack)?;
                Ok(())
            })
            .await?;
        }
        let (mirror, mirrored) = (mirror.to_owned(), refs.clone());
        blocking(move || Ok(GitRepo::open(&mirror)?.mirror_refs(&mirrored)?)).await?;
        Ok(refs)
    }

    async fn push(&self, mirror: &Path, updates: &[RefUpdate]) -> Result<(), RemoteError> {
        check_updates(updates)?;
        let session = self.connect(Service::ReceivePack).await?;
        let advertised: BTreeMap<&str, ObjectId> = session
            .advertisement
            .refs
            .iter()
            .map(|(n, id)| (n.as_str(), *id))
            .collect();
        let peeled: BTreeMap<&str, ObjectId> = session
            .raw_refs
            .iter()
            .filter_map(|(n, id)| n.strip_suffix("^{}").map(|n| (n, *id)))
            .collect();
        // compare-and-swap, checked here first so a lost race costs no pack
        let mut commands = Vec::new();
        let mut stale = Vec::new();
        for update in updates {
            let name = update.name.as_str();
            let actual = advertised.get(name).copied();
            let matches = actual == update.expected
                || (update.expected.is_some() && peeled.get(name).copied() == update.expected);
            if !matches {
                let why = if update.expected.is_none() {
                    RefRejection::AlreadyExists
                } else {
                    RefRejection::Stale
                };
                stale.push((update.name.clone(), why));
                continue;
            }
            if actual == update.new {
                continue; // already there (an earlier attempt got through)
            }
            commands.push((actual, update.new, update.name.clone()));
        }
        if !stale.is_empty() {
            self.finish(session).await;
            return Err(RemoteError::Rejected {
                url: self.display.clone(),
                refs: stale,
            });
        }
        if commands.is_empty() {
            self.finish(session).await;
            return Ok(());
        }
        let offered = &session.advertisement.capabilities;
        if commands.iter().any(|(_, new, _)| new.is_none()) && !offered.contains("delete-refs") {
            self.finish(session).await;
            return Err(RemoteError::Unsupported {
                url: self.display.clone(),
                what: "deleting refs",
            });
        }
        let mut caps = vec!["report-status", AGENT];
        let sideband = offered.contains("side-band-64k");
        if sideband {
            caps.push("side-band-64k");
        }
        if offered.contains("atomic") {
            caps.push("atomic");
        }
        if offered.contains("quiet") {
            caps.push("quiet");
        }
        let tips: Vec<ObjectId> = commands.iter().filter_map(|(_, new, _)| *new).collect();
        let known: Vec<ObjectId> = session.raw_refs.iter().map(|(_, id)| *id).collect();
        let pack = if tips.is_empty() {
            None
        } else {
            let mirror = mirror.to_owned();
            Some(
                blocking(move || {
                    let repo = GitRepo::open(&mirror)?;
                    let ids = repo.missing_objects(&tips, &known)?;
                    Ok(repo.write_pack(&ids)?)
                })
                .await?,
            )
        };
        let zero = ObjectId::null(gix::hash::Kind::Sha1);
        let mut body = Vec::new();
        for (i, (old, new, name)) in commands.iter().enumerate() {
            let mut line = format!("{} {} {name}", old.unwrap_or(zero), new.unwrap_or(zero));
            if i == 0 {
                line.push('\0');
                line.push_str(&caps.join(" "));
            }
            line.push('\n');
            body.extend(pktline::encode(line.as_bytes()).map_err(|e| self.protocol(e))?);
        }
        body.extend_from_slice(FLUSH);
        if let Some(pack) = pack {
            body.extend_from_slice(&pack.bytes);
        }
        let answer = self
            .request(session, body, self.options.max_advertisement_bytes)
            .await?;
        let report = if sideband {
            pktline::demux_sideband(&answer).map_err(|e| self.protocol(e))?
        } else {
            answer
        };
        let report = parse_report_status(&report).map_err(|e| self.protocol(e))?;
        if let Some(reason) = report.unpack_error {
            return Err(RemoteError::Unpack {
                url: self.display.clone(),
                reason,
            });
        }
        let mut rejected = Vec::new();
        for (_, _, name) in &commands {
            match report.refs.iter().find(|(n, _)| n == name) {
                Some((_, Ok(()))) => {}
                Some((_, Err(why))) => rejected.push((name.clone(), why.clone())),
                None => {
                    return Err(
                        self.protocol(ProtocolError::BadStatus(format!("no status for {name}")))
                    );
                }
            }
        }
        if rejected.is_empty() {
            Ok(())
        } else {
            Err(RemoteError::Rejected {
                url: self.display.clone(),
                refs: rejected,
            })
        }
    }
}

/// The repository base a redirected advertisement request ended at, when
/// it stayed on the same host and port (or only moved from http to https):
/// the request follows it, as git does, and credentials never go elsewhere.
fn redirected_base(base: &reqwest::Url, landed: &reqwest::Url) -> Option<reqwest::Url> {
    if landed.host_str() != base.host_str() {
        return None;
    }
    let same_scheme = landed.scheme() == base.scheme()
        && landed.port_or_known_default() == base.port_or_known_default();
    let upgraded = base.scheme() == "http" && landed.scheme() == "https";
    if !(same_scheme || upgraded) {
        return None;
    }
    let path = landed.path().strip_suffix("info/refs")?;
    let mut out = landed.clone();
    out.set_query(None);
    out.set_path(path);
    (out != *base).then_some(out)
}

/// Redirects: at most five, to HTTP(S) only, each target re-checked
/// against the egress policy (names are checked when resolved).
fn redirect_policy(guard: Option<Arc<EgressPolicy>>) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 5 {
            return attempt.error("more than 5 redirects");
        }
        if !matches!(attempt.url().scheme(), "http" | "https") {
            let scheme = attempt.url().scheme().to_owned();
            return attempt.error(format!("a redirect to scheme {scheme:?}"));
        }
        let checked = match &guard {
            Some(policy) if !policy.allows_host(attempt.url().host_str().unwrap_or_default()) => {
                policy.check_url(attempt.url())
            }
            _ => Ok(()),
        };
        match checked {
            Ok(()) => attempt.follow(),
            Err(denied) => attempt.error(denied),
        }
    })
}

/// The egress refusal behind a client error, from a redirect or a name
/// that resolved to refused addresses only.
fn egress_refusal(e: &reqwest::Error) -> Option<String> {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(inner) = source {
        if let Some(denied) = inner.downcast_ref::<Denied>() {
            return Some(denied.to_string());
        }
        if let Some(refused) = inner.downcast_ref::<crate::egress::Refused>() {
            return Some(refused.to_string());
        }
        source = inner.source();
    }
    None
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        message.push_str(": ");
        message.push_str(&inner.to_string());
        source = inner.source();
    }
    message
}

fn percent_decode(text: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = (bytes[i] == b'%')
            .then(|| Some(hex(*bytes.get(i + 1)?)? * 16 + hex(*bytes.get(i + 2)?)?))
            .flatten();
        match decoded {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A URL with any user information removed, for messages.
pub fn redact(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Err(_) => match url.split_once('@') {
            Some((_, rest)) => format!("<redacted>@{rest}"),
            None => url.to_owned(),
        },
    }
}
