//! Git credentials by reference. A Repository's `spec.git.secretRef` and a
//! clone's `cloneFrom.git.secretRef` name a Secret in their namespace; an
//! Invocation never carries its value. The handler resolves the name through
//! a [`SecretResolver`]:
//!
//! - [`SecretDirectory`]: files `<root>/<namespace>/<name>/<key>`, the layout
//!   of a mounted Kubernetes Secret volume (local runs, the CLI);
//! - [`AwsSecrets`]: AWS Secrets Manager, secret `<prefix><namespace>/<name>`
//!   holding a JSON object of the same keys (Lambda);
//! - [`NoSecrets`]: the default; every reference is an error.
//!
//! The keys are the reference's: `username` and `password` (a
//! `kubernetes.io/basic-auth` Secret) or `bearerToken`. A CA bundle is taken
//! from Secret `<namespace>-ca-bundle`, key `ca.crt`, when it exists.
//! Values are never logged: [`SecretData`]'s `Debug` shows key names only.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use porch_git::remote::{CredentialResolver, Credentials, RemoteOptions, StaticCredentials};

/// The largest value read for one key.
const MAX_VALUE_BYTES: u64 = 1 << 20;

/// A Secret's keys and values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretData(pub BTreeMap<String, Vec<u8>>);

impl fmt::Debug for SecretData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl SecretData {
    fn text(&self, key: &str) -> Option<String> {
        self.0.get(key).map(|v| {
            String::from_utf8_lossy(v)
                .trim_end_matches(['\n', '\r'])
                .to_owned()
        })
    }

    /// The git credentials the Secret holds.
    ///
    /// # Errors
    /// Neither `username`/`password` nor `bearerToken`.
    pub fn credentials(&self) -> Result<Credentials, String> {
        if let Some(token) = self.text("bearerToken").filter(|t| !t.is_empty()) {
            return Ok(Credentials::Bearer(token));
        }
        match (self.text("username"), self.text("password")) {
            (Some(username), Some(password)) if !username.is_empty() => {
                Ok(Credentials::Basic { username, password })
            }
            _ => Err(format!(
                "has neither username and password nor bearerToken (keys: {:?})",
                self.0.keys().collect::<Vec<_>>()
            )),
        }
    }
}

/// What resolving a Secret gives: its data, `None` when it does not exist,
/// or why it could not be read.
pub type Resolved<'a> =
    Pin<Box<dyn Future<Output = Result<Option<SecretData>, String>> + Send + 'a>>;

/// Finds a Secret by namespace and name.
pub trait SecretResolver: Send + Sync + fmt::Debug {
    fn resolve<'a>(&'a self, namespace: &'a str, name: &'a str) -> Resolved<'a>;
}

/// Knows no Secrets: every reference is an error.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSecrets;

impl SecretResolver for NoSecrets {
    fn resolve<'a>(&'a self, _namespace: &'a str, _name: &'a str) -> Resolved<'a> {
        Box::pin(async { Err("no secret store is configured".to_owned()) })
    }
}

/// Secrets as files: `<root>/<namespace>/<name>/<key>`.
#[derive(Debug, Clone)]
pub struct SecretDirectory {
    root: PathBuf,
}

impl SecretDirectory {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        SecretDirectory { root: root.into() }
    }

    fn read(dir: &Path) -> Result<Option<SecretData>, String> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let mut data = BTreeMap::new();
        for entry in entries {
            let entry = entry.map_err(|e| e.to_string())?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // a mounted volume's bookkeeping (`..data`, `..2024_…`) and
            // anything that is not a plain key
            if name.starts_with('.') || !valid_key(&name) {
                continue;
            }
            let path = entry.path();
            let meta = std::fs::metadata(&path).map_err(|e| e.to_string())?;
            if !meta.is_file() {
                continue;
            }
            if meta.len() > MAX_VALUE_BYTES {
                return Err(format!(
                    "key {name:?} is larger than {MAX_VALUE_BYTES} bytes"
                ));
            }
            data.insert(name, std::fs::read(&path).map_err(|e| e.to_string())?);
        }
        Ok(Some(SecretData(data)))
    }
}

impl SecretResolver for SecretDirectory {
    fn resolve<'a>(&'a self, namespace: &'a str, name: &'a str) -> Resolved<'a> {
        Box::pin(async move {
            let dir = self.root.join(namespace).join(name);
            tokio::task::spawn_blocking(move || Self::read(&dir))
                .await
                .map_err(|e| e.to_string())?
        })
    }
}

/// Secrets in AWS Secrets Manager: `<prefix><namespace>/<name>`, a JSON
/// object of string values.
#[derive(Debug, Clone)]
pub struct AwsSecrets {
    client: aws_sdk_secretsmanager::Client,
    prefix: String,
}

impl AwsSecrets {
    pub fn new(client: aws_sdk_secretsmanager::Client, prefix: impl Into<String>) -> Self {
        AwsSecrets {
            client,
            prefix: prefix.into(),
        }
    }

    /// A client from the environment's AWS configuration, optionally at
    /// another endpoint (an S3-compatible test server serves this API too).
    pub async fn from_env(prefix: impl Into<String>, endpoint: Option<&str>) -> Self {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(endpoint) = endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let config = loader.load().await;
        AwsSecrets::new(aws_sdk_secretsmanager::Client::new(&config), prefix)
    }
}

impl SecretResolver for AwsSecrets {
    fn resolve<'a>(&'a self, namespace: &'a str, name: &'a str) -> Resolved<'a> {
        Box::pin(async move {
            let id = format!("{}{namespace}/{name}", self.prefix);
            let answer = match self.client.get_secret_value().secret_id(&id).send().await {
                Ok(answer) => answer,
                Err(e) => {
                    let service = e.as_service_error();
                    if service.is_some_and(|s| s.is_resource_not_found_exception()) {
                        return Ok(None);
                    }
                    return Err(format!(
                        "AWS Secrets Manager: {}",
                        aws_sdk_secretsmanager::error::DisplayErrorContext(&e)
                    ));
                }
            };
            let text = answer
                .secret_string()
                .ok_or("is not a JSON object of strings (no SecretString)")?;
            if text.len() as u64 > MAX_VALUE_BYTES {
                return Err(format!("is larger than {MAX_VALUE_BYTES} bytes"));
            }
            let object: BTreeMap<String, serde_json::Value> = serde_json::from_str(text)
                .map_err(|_| "is not a JSON object of strings".to_owned())?;
            let mut data = BTreeMap::new();
            for (key, value) in object {
                if let serde_json::Value::String(value) = value
                    && valid_key(&key)
                {
                    data.insert(key, value.into_bytes());
                }
            }
            Ok(Some(SecretData(data)))
        })
    }
}

/// A Secret key: what Kubernetes allows (`[-._a-zA-Z0-9]+`), no dot-only
/// names.
fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
        && key.chars().any(|c| c != '.')
}

/// Checks a Secret reference's name: a DNS subdomain, so it can never leave
/// its namespace's directory or prefix.
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not a valid Secret name"))
    }
}

/// The remote options for a git URL whose credentials are in Secret `name`
/// (when one is named) of `namespace`, with the namespace's CA bundle when
/// it has one.
///
/// # Errors
/// A bad name, a Secret that does not exist or holds no credentials, a
/// resolver failure; the message names the Secret, never its values.
pub async fn remote_options(
    resolver: &dyn SecretResolver,
    base: &RemoteOptions,
    namespace: &str,
    name: Option<&str>,
) -> Result<RemoteOptions, String> {
    let mut options = base.clone();
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Ok(options);
    };
    check_name(namespace).map_err(|e| format!("namespace {e}"))?;
    let described = |e: String| format!("Secret {namespace}/{name}: {e}");
    check_name(name).map_err(described)?;
    let data = resolver
        .resolve(namespace, name)
        .await
        .map_err(described)?
        .ok_or_else(|| described("not found".to_owned()))?;
    let credentials = data.credentials().map_err(described)?;
    options.credentials =
        Some(Arc::new(StaticCredentials(credentials)) as Arc<dyn CredentialResolver>);
    let bundle = format!("{namespace}-ca-bundle");
    if check_name(&bundle).is_ok()
        && let Ok(Some(ca)) = resolver.resolve(namespace, &bundle).await
        && let Some(pem) = ca.0.get("ca.crt")
    {
        options.ca_bundle = Some(pem.clone());
    }
    Ok(options)
}
