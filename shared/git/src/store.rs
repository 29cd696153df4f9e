//! Object stores for the git cache snapshot: S3's semantics, including
//! conditional writes, so two handlers never lose each other's work.
//!
//! [`LocalDirStore`] (the embedded default) keeps objects as files under a
//! root directory; a conditional put takes a lock file, checks the
//! condition, writes a temporary file and renames it into place.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// An object's version tag: changes whenever its content does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ETag(pub String);

/// An object read from a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    pub body: Vec<u8>,
    pub etag: ETag,
}

/// The answer to a conditional get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    Missing,
    /// The object still has the tag the caller holds (`304 Not Modified`).
    NotModified,
    Found(StoredObject),
}

/// When a put may happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutCondition {
    /// Always.
    Always,
    /// Only if no object exists (`If-None-Match: *`).
    IfAbsent,
    /// Only if the object exists with this tag (`If-Match`).
    IfMatch(ETag),
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the condition on {key} does not hold: the object changed or already exists")]
    PreconditionFailed { key: String },
    #[error("{key} does not exist")]
    NotFound { key: String },
    #[error("object key {key:?} is not allowed: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error("failed to {step} {path}")]
    Io {
        step: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out waiting for the lock on {key}")]
    LockTimeout { key: String },
    #[error("the object store failed to {step} {key}: {message}")]
    Unavailable {
        step: &'static str,
        key: String,
        message: String,
        /// Server errors, throttling, timeouts, broken connections.
        transient: bool,
    },
}

impl StoreError {
    /// Worth retrying after a pause.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unavailable { transient, .. } => *transient,
            Self::LockTimeout { .. } => true,
            _ => false,
        }
    }
}

/// What the snapshot needs from an object store.
pub trait ObjectStore: Send + Sync {
    /// The object and its tag, `None` if absent.
    fn get(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<StoredObject>, StoreError>> + Send;
    /// The object unless it still has tag `known` (`If-None-Match`), so a
    /// caller with a warm copy reads nothing when nothing changed.
    fn get_if_changed(
        &self,
        key: &str,
        known: Option<&ETag>,
    ) -> impl Future<Output = Result<Fetched, StoreError>> + Send;
    /// Writes the object if `condition` holds; returns its new tag.
    fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        condition: PutCondition,
    ) -> impl Future<Output = Result<ETag, StoreError>> + Send;
    /// Writes an immutable, content-addressed object unless the key holds
    /// one already (`If-None-Match: *`): `false` when it did, which for
    /// such an object is as good as written. No tag is computed, since
    /// nothing is ever conditioned on one.
    fn create(
        &self,
        key: &str,
        body: Vec<u8>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async move {
            match self.put(key, body, PutCondition::IfAbsent).await {
                Ok(_) => Ok(true),
                Err(StoreError::PreconditionFailed { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
    /// Keys starting with `prefix`, sorted.
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;
    /// Removes an object; absent is fine.
    fn delete(&self, key: &str) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Checks an object key: relative slash path, no `.`/`..`, no empty
/// segments, no backslashes or control characters, at most 1024 bytes.
///
/// # Errors
/// The first rule the key breaks.
pub fn validate_key(key: &str) -> Result<(), StoreError> {
    let bad = |reason| StoreError::InvalidKey {
        key: key.chars().take(120).collect(),
        reason,
    };
    if key.is_empty() || key.len() > 1024 {
        return Err(bad("it must have 1 to 1024 bytes"));
    }
    if key.starts_with('/') || key.chars().any(|c| c.is_control() || c == '\\') {
        return Err(bad(
            "absolute keys, backslashes and control characters are not allowed",
        ));
    }
    if key.split('/').any(|s| {
        s.is_empty() || s == "." || s == ".." || s.ends_with(".lock") || s.starts_with(".tmp-")
    }) {
        return Err(bad(
            "empty, '.', '..', '*.lock' and '.tmp-*' segments are not allowed",
        ));
    }
    Ok(())
}

fn etag_of(body: &[u8]) -> ETag {
    // the git blob id of the content: stable across processes and versions.
    // Hashed without collision detection: a tag only tells this store's
    // own writes apart, and a pack is hashed on every put.
    let header = format!("blob {}\0", body.len());
    ETag(format!(
        "\"{}\"",
        crate::pack::fast_sha1(&[header.as_bytes(), body])
    ))
}

/// Objects as files under a root directory.
#[derive(Debug, Clone)]
pub struct LocalDirStore {
    root: PathBuf,
    /// Locks older than this are taken to belong to a dead writer.
    stale_lock: Duration,
}

impl LocalDirStore {
    /// A store rooted at `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            stale_lock: Duration::from_secs(30),
        }
    }

    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        validate_key(key)?;
        Ok(self.root.join(key))
    }

    fn io(step: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.display().to_string();
        move |source| StoreError::Io { step, path, source }
    }

    fn read(path: &Path) -> Result<Option<StoredObject>, StoreError> {
        match std::fs::read(path) {
            Ok(body) => Ok(Some(StoredObject {
                etag: etag_of(&body),
                body,
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Self::io("read", path)(e)),
        }
    }

    /// Takes the lock of `path`, waiting for another writer to finish.
    fn lock(&self, key: &str, path: &Path) -> Result<Lock, StoreError> {
        let lock = path.with_file_name(format!(
            "{}.lock",
            path.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("object")
        ));
        if let Some(parent) = lock.parent() {
            std::fs::create_dir_all(parent).map_err(Self::io("create directory", parent))?;
        }
        let deadline = SystemTime::now() + Duration::from_secs(60);
        let mut wait = Duration::from_micros(200);
        loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lock)
            {
                Ok(_) => return Ok(Lock { path: lock }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let stale = std::fs::metadata(&lock)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > self.stale_lock);
                    if stale {
                        let _ = std::fs::remove_file(&lock);
                        continue;
                    }
                    if SystemTime::now() > deadline {
                        return Err(StoreError::LockTimeout {
                            key: key.to_owned(),
                        });
                    }
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_millis(20));
                }
                Err(e) => return Err(Self::io("lock", &lock)(e)),
            }
        }
    }

    /// The blocking get.
    ///
    /// # Errors
    /// An invalid key or an unreadable file.
    pub fn get_blocking(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        Self::read(&self.path(key)?)
    }

    /// The blocking conditional put.
    ///
    /// # Errors
    /// The condition fails, an invalid key, or a failed write.
    pub fn put_blocking(
        &self,
        key: &str,
        body: &[u8],
        condition: &PutCondition,
    ) -> Result<ETag, StoreError> {
        self.write_blocking(key, body, condition)?;
        Ok(etag_of(body))
    }

    /// The blocking create ([`ObjectStore::create`]): no tag is hashed.
    ///
    /// # Errors
    /// An invalid key, or a failed write.
    pub fn create_blocking(&self, key: &str, body: &[u8]) -> Result<bool, StoreError> {
        match self.write_blocking(key, body, &PutCondition::IfAbsent) {
            Ok(()) => Ok(true),
            Err(StoreError::PreconditionFailed { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn write_blocking(
        &self,
        key: &str,
        body: &[u8],
        condition: &PutCondition,
    ) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let _lock = self.lock(key, &path)?;
        match condition {
            PutCondition::Always => {}
            // whether it is there, without reading and hashing it
            PutCondition::IfAbsent => match std::fs::symlink_metadata(&path) {
                Ok(_) => {
                    return Err(StoreError::PreconditionFailed {
                        key: key.to_owned(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Self::io("read", &path)(e)),
            },
            PutCondition::IfMatch(tag) => match Self::read(&path)? {
                None => {
                    return Err(StoreError::NotFound {
                        key: key.to_owned(),
                    });
                }
                Some(obj) if obj.etag != *tag => {
                    return Err(StoreError::PreconditionFailed {
                        key: key.to_owned(),
                    });
                }
                Some(_) => {}
            },
        }
        let tmp = path.with_file_name(format!(
            ".tmp-{}-{}",
            std::process::id(),
            path.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("object")
        ));
        {
            use std::io::Write;
            let mut file = std::fs::File::create(&tmp).map_err(Self::io("create", &tmp))?;
            file.write_all(body).map_err(Self::io("write", &tmp))?;
            file.sync_all().map_err(Self::io("sync", &tmp))?;
        }
        std::fs::rename(&tmp, &path).map_err(Self::io("rename", &path))
    }

    /// The blocking list.
    ///
    /// # Errors
    /// An unreadable directory.
    pub fn list_blocking(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Self::io("list", &dir)(e)),
            };
            for entry in entries {
                let entry = entry.map_err(Self::io("list", &dir))?;
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let Ok(relative) = path.strip_prefix(&self.root) else {
                    continue;
                };
                let key = relative.to_string_lossy().replace('\\', "/");
                if validate_key(&key).is_ok() && key.starts_with(prefix) {
                    out.push(key);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// The blocking delete.
    ///
    /// # Errors
    /// An invalid key or a failed removal.
    pub fn delete_blocking(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let _lock = self.lock(key, &path)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Self::io("delete", &path)(e)),
        }
    }
}

/// A held lock file, removed when dropped.
struct Lock {
    path: PathBuf,
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Io {
            step: "run",
            path: String::new(),
            source: std::io::Error::other(e.to_string()),
        })?
}

impl ObjectStore for LocalDirStore {
    async fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        let (this, key) = (self.clone(), key.to_owned());
        blocking(move || this.get_blocking(&key)).await
    }

    async fn get_if_changed(&self, key: &str, known: Option<&ETag>) -> Result<Fetched, StoreError> {
        let (this, key, known) = (self.clone(), key.to_owned(), known.cloned());
        blocking(move || {
            Ok(match this.get_blocking(&key)? {
                None => Fetched::Missing,
                Some(object) if Some(&object.etag) == known.as_ref() => Fetched::NotModified,
                Some(object) => Fetched::Found(object),
            })
        })
        .await
    }

    async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        condition: PutCondition,
    ) -> Result<ETag, StoreError> {
        let (this, key) = (self.clone(), key.to_owned());
        blocking(move || this.put_blocking(&key, &body, &condition)).await
    }

    async fn create(&self, key: &str, body: Vec<u8>) -> Result<bool, StoreError> {
        let (this, key) = (self.clone(), key.to_owned());
        blocking(move || this.create_blocking(&key, &body)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let (this, prefix) = (self.clone(), prefix.to_owned());
        blocking(move || this.list_blocking(&prefix)).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let (this, key) = (self.clone(), key.to_owned());
        blocking(move || this.delete_blocking(&key)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entity_tag_is_the_git_blob_id_of_the_content() {
        for body in [&b""[..], b"x", &vec![7u8; 70_000]] {
            let id = gix::objs::compute_hash(gix::hash::Kind::Sha1, gix::objs::Kind::Blob, body)
                .expect("hashes");
            assert_eq!(etag_of(body), ETag(format!("\"{id}\"")));
        }
    }
}
