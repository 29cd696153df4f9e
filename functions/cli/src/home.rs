//! Where the CLI keeps things: the registered repositories and the objects
//! in the config directory, mirrors and the snapshot store in the cache
//! directory. One CLI at a time per config directory (a file lock).

use std::path::{Path, PathBuf};

use porch_api::repository::Repository;
use serde::{Deserialize, Serialize};

/// The default config directory: `$XDG_CONFIG_HOME/porch`, else
/// `~/.config/porch`.
pub fn default_config_dir() -> PathBuf {
    xdg("XDG_CONFIG_HOME", ".config")
}

/// The default cache directory: `$XDG_CACHE_HOME/porch`, else
/// `~/.cache/porch`.
pub fn default_cache_dir() -> PathBuf {
    xdg("XDG_CACHE_HOME", ".cache")
}

fn xdg(variable: &str, fallback: &str) -> PathBuf {
    std::env::var_os(variable)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(fallback)))
        .unwrap_or_else(|| PathBuf::from(fallback))
        .join("porch")
}

/// A registered repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RepoEntry {
    pub name: String,
    /// A git URL or an absolute path to a bare repository.
    pub url: String,
    pub branch: String,
    #[serde(default)]
    pub directory: String,
    #[serde(default)]
    pub deployment: bool,
    /// The Secret (under the config directory's `secrets/`) holding the
    /// credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    pub uid: String,
}

impl RepoEntry {
    /// The Repository object a cluster would hold for this entry.
    ///
    /// # Errors
    /// Never for entries written by `repo add`.
    pub fn repository(&self, namespace: &str) -> anyhow::Result<Repository> {
        Ok(serde_json::from_value(serde_json::json!({
            "apiVersion": "config.porch.kpt.dev/v1alpha1",
            "kind": "Repository",
            "metadata": {"name": self.name, "namespace": namespace, "uid": self.uid},
            "spec": {
                "type": "git",
                "deployment": self.deployment,
                "git": {
                    "repo": self.url,
                    "branch": self.branch,
                    "directory": self.directory,
                    "secretRef": self.secret.as_ref().map(|name| serde_json::json!({"name": name})),
                }
            }
        }))?)
    }
}

/// Where the Secrets repositories and clones name live:
/// `<config-dir>/secrets/<namespace>/<name>/<key>`.
pub fn secrets_dir(config_dir: &Path) -> PathBuf {
    config_dir.join("secrets")
}

/// Writes Secret `name` of `namespace` with `keys`, readable by the owner
/// only, replacing what it held.
///
/// # Errors
/// A bad name; the file system.
pub fn write_secret(
    config_dir: &Path,
    namespace: &str,
    name: &str,
    keys: &[(&str, &str)],
) -> anyhow::Result<PathBuf> {
    porch_api::naming::validate_label("secret name", name)?;
    let dir = secrets_dir(config_dir).join(namespace).join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    restrict(&dir, 0o700)?;
    for (key, value) in keys {
        let path = dir.join(key);
        std::fs::write(&path, value)?;
        restrict(&path, 0o600)?;
    }
    Ok(dir)
}

#[cfg(unix)]
fn restrict(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn restrict(_path: &Path, _mode: u32) -> std::io::Result<()> {
    Ok(())
}

/// The CLI's configuration file.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub repositories: Vec<RepoEntry>,
}

impl Config {
    pub fn path(config_dir: &Path) -> PathBuf {
        config_dir.join("config.json")
    }

    /// Reads the config; none yet is an empty one.
    ///
    /// # Errors
    /// Unreadable or malformed.
    pub fn load(config_dir: &Path) -> anyhow::Result<Self> {
        let path = Self::path(config_dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("{} is not a valid config: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(e) => Err(anyhow::anyhow!("failed to read {}: {e}", path.display())),
        }
    }

    /// Writes the config atomically.
    ///
    /// # Errors
    /// The directory is not writable.
    pub fn save(&self, config_dir: &Path) -> anyhow::Result<()> {
        let path = Self::path(config_dir);
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    pub fn find(&self, name: &str) -> Option<&RepoEntry> {
        self.repositories.iter().find(|r| r.name == name)
    }
}

/// The exclusive lock of a config directory, held while a command runs.
#[derive(Debug)]
pub struct Lock(#[allow(dead_code)] std::fs::File);

/// Creates `config_dir` and takes its lock, waiting for another CLI.
///
/// # Errors
/// The directory cannot be created or locked.
pub fn lock(config_dir: &Path) -> anyhow::Result<Lock> {
    std::fs::create_dir_all(config_dir)
        .map_err(|e| anyhow::anyhow!("failed to create {}: {e}", config_dir.display()))?;
    let path = config_dir.join(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("failed to open {}: {e}", path.display()))?;
    file.lock()
        .map_err(|e| anyhow::anyhow!("failed to lock {}: {e}", path.display()))?;
    Ok(Lock(file))
}
