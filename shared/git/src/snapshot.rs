//! The git cache snapshot in an object store, so a cold handler starts
//! without cloning and a warm one reads almost nothing.
//!
//! Layout under a repository's key `K`:
//! * `K/manifest.json`: format version, remote URL, fetch time, refs, and
//!   the packs that hold every object the refs reach;
//! * `K/packs/pack-<checksum>.pack` and `.idx`: immutable, named by the
//!   pack checksum, verified on download.
//!
//! Load reads the manifest only if it changed since this process last saw
//! it (`If-None-Match`), downloads only the packs the local mirror lacks,
//! then sets the mirror's refs. Save uploads one pack of the objects new
//! since the manifest, then replaces the manifest with a conditional put;
//! when another writer got there first, it merges (union of packs, the
//! other writer's refs plus this writer's own changes) and tries again, so
//! no writer loses another's packs or refs. Packs are compacted into one
//! when they pile up; replaced packs are deleted only after a grace period,
//! since a reader may still be loading an older manifest. The remote stays
//! the source of truth: a missing or corrupt snapshot is rebuilt from it.

use crate::listing::RefMap;
use crate::pack::{Pack, StoredTree, StoredTrees};
use crate::remote::{Remote, RemoteError};
use crate::repo::{GitRepo, RepoError};
use crate::store::{ETag, Fetched, ObjectStore, PutCondition, StoreError, validate_key};
use gix::ObjectId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The manifest format this code reads and writes.
pub const FORMAT: u32 = 1;

/// The largest manifest accepted (about a million refs).
pub const MAX_MANIFEST_BYTES: usize = 128 << 20;

/// Packs beyond this many are compacted on the next save (see [`rollup`]).
pub const COMPACT_AT: usize = 16;

/// Compaction keeps packs in a geometric progression by object count: each
/// holds at least this many times the objects of the next smaller one, so
/// a repository of n objects keeps O(log n) packs, an object is rewritten
/// O(log n) times in its life, and a compaction rewrites (and every reader
/// downloads again) the recent small packs, not the whole repository.
const GEOMETRIC_FACTOR: u64 = 2;

/// The packs (name, object count) to roll into one so that the rest and
/// the new one are in progression, as `git repack --geometric` chooses
/// them: the smallest ones up to the largest pack that breaks the
/// progression with its neighbour below, then each next one smaller than
/// the factor times all they hold together. Empty when fewer than two.
fn rollup(packs: &[(String, u64)]) -> Vec<String> {
    let mut sorted: Vec<&(String, u64)> = packs.iter().collect();
    sorted.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    let mut split = (1..sorted.len())
        .rev()
        .find(|&i| sorted[i].1 < GEOMETRIC_FACTOR.saturating_mul(sorted[i - 1].1))
        .map_or(0, |i| i + 1);
    let mut total: u64 = sorted[..split].iter().map(|p| p.1).sum();
    while split < sorted.len() && sorted[split].1 < GEOMETRIC_FACTOR.saturating_mul(total) {
        total = total.saturating_add(sorted[split].1);
        split += 1;
    }
    if split < 2 {
        return Vec::new();
    }
    sorted[..split].iter().map(|p| p.0.clone()).collect()
}

/// A pack a save or a compaction uploaded.
#[derive(Debug)]
struct Uploaded {
    pack: String,
    bytes: u64,
    /// The large trees in it.
    trees: StoredTrees,
}

/// What a compaction wrote.
#[derive(Debug)]
struct Compaction {
    pack: String,
    bytes_written: u64,
    /// The packs the new one replaces.
    replaced: Vec<String>,
}

/// How long a replaced pack stays readable for loaders of older manifests.
pub const RETIRE_GRACE: Duration = Duration::from_secs(3600);

/// How often a save retries after losing the manifest race.
const SAVE_ATTEMPTS: usize = 64;

const STATE_FILE: &str = "porch-snapshot.json";

/// A pack replaced by compaction, deleted after [`RETIRE_GRACE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetiredPack {
    pub pack: String,
    /// Unix seconds.
    pub since: i64,
}

/// The manifest of one repository's snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    /// The remote the refs came from (no credentials).
    pub remote: String,
    /// When the refs were last fetched from or pushed to the remote, Unix seconds.
    pub fetched_at: i64,
    /// The full ref map at some earlier save, stored once as
    /// `K/refs/<id>.json` (`<id>`: the git blob id of its content), so a save
    /// writes and a changed manifest costs a reader only the refs changed
    /// since; `None` while the repository has few refs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Branch and tag names → object ids (hex): every ref without a base,
    /// else the refs added or changed since it.
    pub refs: BTreeMap<String, String>,
    /// Refs of the base that no longer exist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted: Vec<String>,
    /// Pack checksums (hex); together they hold every object the refs reach.
    pub packs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<RetiredPack>,
    /// Bases replaced by a newer one, deleted after [`RETIRE_GRACE`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired_bases: Vec<RetiredPack>,
}

/// More changed refs than this since the base, and the next save writes a
/// new base.
pub const MAX_DELTA: usize = 1024;

fn check_ref_name(name: &str) -> Result<(), String> {
    let usable =
        crate::listing::is_branch_or_tag(name) && gix::refs::FullName::try_from(name).is_ok();
    if usable {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not a branch or tag name",
            name.chars().take(200).collect::<String>()
        ))
    }
}

/// Decodes and checks a base ref map from untrusted bytes named `id`.
fn decode_base(id: &str, bytes: &[u8]) -> Result<RefMap, String> {
    let computed = gix::objs::compute_hash(gix::hash::Kind::Sha1, gix::objs::Kind::Blob, bytes)
        .map_err(|e| e.to_string())?;
    if hex_id(id) != Some(computed) {
        return Err(format!("ref base {id} does not match its content"));
    }
    let map: BTreeMap<String, String> = serde_json::from_slice(bytes)
        .map_err(|e| format!("ref base {id} is not a ref map: {e}"))?;
    let mut out = Vec::with_capacity(map.len());
    for (name, hex) in map {
        check_ref_name(&name)?;
        let oid = hex_id(&hex).ok_or_else(|| format!("ref {name} has a bad object id"))?;
        out.push((name, oid));
    }
    Ok(out.into_iter().collect())
}

/// Why a snapshot could not be used or written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("the snapshot at {key} is unusable: {reason}")]
    Corrupt { key: String, reason: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("failed to {step} {path}")]
    Io {
        step: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("gave up saving {key} after {attempts} lost races")]
    Contended { key: String, attempts: usize },
    #[error("a blocking git task failed: {0}")]
    Task(String),
}

fn hex_id(text: &str) -> Option<ObjectId> {
    (text.len() == 40)
        .then(|| ObjectId::from_hex(text.as_bytes()).ok())
        .flatten()
}

impl Manifest {
    /// Decodes and checks a manifest from untrusted bytes.
    ///
    /// # Errors
    /// Too large, not JSON, unknown fields, another format version, or a
    /// bad ref name, object id or pack name.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(format!("it is larger than {MAX_MANIFEST_BYTES} bytes"));
        }
        let manifest: Self =
            serde_json::from_slice(bytes).map_err(|e| format!("it is not a manifest: {e}"))?;
        if manifest.format != FORMAT {
            return Err(format!(
                "format {} is not the supported format {FORMAT}",
                manifest.format
            ));
        }
        if manifest.remote.len() > 4096 {
            return Err("the remote URL is longer than 4096 bytes".into());
        }
        for (name, id) in &manifest.refs {
            check_ref_name(name)?;
            if hex_id(id).is_none() {
                return Err(format!("ref {name} has a bad object id"));
            }
        }
        for name in &manifest.deleted {
            check_ref_name(name)?;
        }
        for pack in manifest
            .packs
            .iter()
            .chain(manifest.retired.iter().map(|r| &r.pack))
            .chain(manifest.base.iter())
            .chain(manifest.retired_bases.iter().map(|r| &r.pack))
        {
            if hex_id(pack).is_none() {
                return Err(format!(
                    "pack name {:?} is not a checksum",
                    pack.chars().take(80).collect::<String>()
                ));
            }
        }
        Ok(manifest)
    }

    /// The refs listed in the manifest itself as ids (all of them when it
    /// has no base; checked by [`Manifest::decode`]).
    pub fn ref_ids(&self) -> BTreeMap<String, ObjectId> {
        self.refs
            .iter()
            .filter_map(|(n, id)| Some((n.clone(), hex_id(id)?)))
            .collect()
    }
}

/// What this process last knew of the snapshot, kept in the mirror.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LocalState {
    etag: String,
    /// The snapshot's refs are this manifest's, resolved against its base
    /// (kept beside the mirror and in memory): the state does not list
    /// them again, so writing it costs the same at 10 or 10,000 packages.
    manifest: Manifest,
    /// The refs the mirror had when it was last in step with the snapshot
    /// (changes since then are this process's to save); absent when they
    /// are the snapshot's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    synced_refs: Option<BTreeMap<String, String>>,
    /// Packs of the manifest whose objects the mirror holds although their
    /// files are not in it (packs this process wrote and uploaded, and
    /// downloaded ones it held every object of): a load does not download
    /// them.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    held_packs: BTreeSet<String>,
}

fn from_hex_map(map: &BTreeMap<String, String>) -> BTreeMap<String, ObjectId> {
    map.iter()
        .filter_map(|(n, id)| Some((n.clone(), hex_id(id)?)))
        .collect()
}

impl LocalState {
    /// `synced` are the mirror's refs when they differ from what
    /// `manifest` lists (`None` when they are the same).
    fn new(
        etag: &ETag,
        manifest: &Manifest,
        synced: Option<&RefMap>,
        mut held: BTreeSet<String>,
    ) -> Self {
        held.retain(|p| manifest.packs.contains(p));
        Self {
            etag: etag.0.clone(),
            synced_refs: synced.map(hex_map),
            manifest: manifest.clone(),
            held_packs: held,
        }
    }

    /// The mirror's refs when last in step: `refs` (the snapshot's) unless
    /// they differed.
    fn synced(&self, refs: &Arc<RefMap>) -> Arc<RefMap> {
        match &self.synced_refs {
            Some(synced) => Arc::new(from_hex_map(synced).into()),
            None => Arc::clone(refs),
        }
    }
}

/// What a load did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub manifest: Manifest,
    pub etag: ETag,
    /// Bytes read from the object store (0 when nothing changed).
    pub bytes_read: u64,
    pub packs_downloaded: usize,
}

/// The result of [`Snapshots::load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    Loaded(Box<Loaded>),
    /// No snapshot yet.
    Missing,
}

/// What a save did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub etag: ETag,
    /// The pack uploaded (`None` when no object was new).
    pub pack: Option<String>,
    pub bytes_written: u64,
    /// Times the manifest had to be merged with another writer's.
    pub merges: usize,
    pub compacted: bool,
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn hex_map(refs: &RefMap) -> BTreeMap<String, String> {
    refs.iter()
        .map(|(n, id)| (n.clone(), id.to_string()))
        .collect()
}

/// Checks that `bytes` is a whole pack (or index) whose trailing checksum
/// matches its content, and returns the pack checksum it names.
fn verify_trailer(bytes: &[u8], magic: &[u8]) -> Option<ObjectId> {
    if bytes.len() < 32 || !bytes.starts_with(magic) {
        return None;
    }
    let (content, trailer) = bytes.split_at(bytes.len() - 20);
    let mut hasher = gix::hash::hasher(gix::hash::Kind::Sha1);
    hasher.update(content);
    let computed = hasher.try_finalize().ok()?;
    (computed.as_bytes() == trailer).then_some(computed)
}

/// The snapshot of one repository in `store`, with the local mirror it
/// loads into and saves from.
#[derive(Debug)]
pub struct Snapshots<S> {
    store: S,
    key: String,
    mirror: PathBuf,
    /// The local state and the last base ref map, kept in memory as well as
    /// in the mirror, so a warm process does not re-read megabytes of JSON
    /// per operation. One `Snapshots` per mirror directory at a time.
    memory: std::sync::Mutex<Memory>,
}

#[derive(Debug, Default)]
struct Memory {
    state: Option<LocalState>,
    base: Option<(String, Arc<RefMap>)>,
    /// The refs a manifest last resolved to.
    resolved: Option<(RefsKey, Arc<RefMap>)>,
    /// Large trees this process saved in a listed pack, with how many
    /// deltas each is stored on at most (a compaction only lowers that):
    /// the bases a save may store a tree as a delta against.
    tree_depths: std::collections::HashMap<ObjectId, u8>,
    /// Those trees' bases (the tree at their path in their commit's first
    /// parent): what a compaction may store them against.
    tree_bases: std::collections::HashMap<ObjectId, ObjectId>,
    /// Retired packs already looked at for removal from the mirror.
    retired_seen: BTreeSet<String>,
}

/// How many large trees [`Memory::tree_depths`] keeps before it starts
/// again (then the next save of each tree stores it whole).
const MAX_TREE_DEPTHS: usize = 4096;

/// What a manifest's refs resolve from: its base and its changes to it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RefsKey {
    base: Option<String>,
    refs: BTreeMap<String, String>,
    deleted: Vec<String>,
}

impl RefsKey {
    fn of(manifest: &Manifest) -> Self {
        Self {
            base: manifest.base.clone(),
            refs: manifest.refs.clone(),
            deleted: manifest.deleted.clone(),
        }
    }

    /// What the manifest itself says of each name it mentions: an id, or
    /// `None` for deleted. A name also listed with an id has that id; one
    /// whose id does not parse is the base's (as [`Manifest::ref_ids`]
    /// leaves it out).
    fn says(&self) -> BTreeMap<&str, Option<ObjectId>> {
        let mut says: BTreeMap<&str, Option<ObjectId>> =
            self.deleted.iter().map(|n| (n.as_str(), None)).collect();
        for (name, id) in &self.refs {
            if let Some(id) = hex_id(id) {
                says.insert(name.as_str(), Some(id));
            }
        }
        says
    }

    /// The refs this key resolves to against `base`.
    fn resolve(&self, base: &Arc<RefMap>) -> Arc<RefMap> {
        if self.refs.is_empty() && self.deleted.is_empty() {
            return Arc::clone(base);
        }
        let mut refs = RefMap::clone(base);
        for (name, id) in self.says() {
            match id {
                Some(id) => refs.insert(name.to_owned(), id),
                None => refs.remove(name),
            };
        }
        Arc::new(refs)
    }

    /// The refs this key resolves to against `base`, from `resolved`, what
    /// `before` (a key on the same base) resolved to: only the names the
    /// two keys say differently of are looked up and changed. A manifest
    /// lists up to [`MAX_DELTA`] changes to its base, and the next one
    /// mostly the same again.
    fn resolve_from(&self, before: &Self, resolved: &RefMap, base: &Arc<RefMap>) -> Arc<RefMap> {
        if self.refs.is_empty() && self.deleted.is_empty() {
            return Arc::clone(base);
        }
        let (now, then) = (self.says(), before.says());
        let mut refs = resolved.clone();
        let mut set = |name: &str, id: Option<ObjectId>| {
            if refs.get(name) != id.as_ref() {
                match id {
                    Some(id) => refs.insert(name.to_owned(), id),
                    None => refs.remove(name),
                };
            }
        };
        for (name, id) in &now {
            if then.get(name) != Some(id) {
                set(name, *id);
            }
        }
        for name in then.keys().filter(|n| !now.contains_key(*n)) {
            set(name, base.get(name).copied());
        }
        Arc::new(refs)
    }
}

impl<S: ObjectStore> Snapshots<S> {
    /// The snapshot under `key` (e.g. `repos/<namespace>/<repository>`),
    /// mirrored at `mirror` (created when missing).
    ///
    /// # Errors
    /// An unsafe key, or a mirror directory that cannot hold a repository.
    pub fn new(store: S, key: &str, mirror: impl Into<PathBuf>) -> Result<Self, SnapshotError> {
        validate_key(key)?;
        let mirror = mirror.into();
        GitRepo::init_bare(&mirror)?;
        Ok(Self {
            store,
            key: key.trim_end_matches('/').to_owned(),
            mirror,
            memory: std::sync::Mutex::new(Memory::default()),
        })
    }

    pub fn mirror(&self) -> &Path {
        &self.mirror
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    fn manifest_key(&self) -> String {
        format!("{}/manifest.json", self.key)
    }

    fn pack_key(&self, pack: &str, ext: &str) -> String {
        format!("{}/packs/pack-{pack}.{ext}", self.key)
    }

    fn corrupt(&self, reason: impl Into<String>) -> SnapshotError {
        SnapshotError::Corrupt {
            key: self.key.clone(),
            reason: reason.into(),
        }
    }

    fn io(step: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotError {
        let path = path.display().to_string();
        move |source| SnapshotError::Io { step, path, source }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        // a panic while holding the lock leaves plain data: use it
        self.memory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn read_state(&self) -> Option<LocalState> {
        if let Some(state) = &self.memory().state {
            return Some(state.clone());
        }
        let bytes = std::fs::read(self.mirror.join(STATE_FILE)).ok()?;
        let state: LocalState = serde_json::from_slice(&bytes).ok()?;
        self.memory().state = Some(state.clone());
        Some(state)
    }

    fn write_state(&self, state: &LocalState) -> Result<(), SnapshotError> {
        self.memory().state = Some(state.clone());
        let path = self.mirror.join(STATE_FILE);
        let tmp = self.mirror.join(format!(".{STATE_FILE}.tmp"));
        let body = serde_json::to_vec(state).map_err(|e| self.corrupt(e.to_string()))?;
        std::fs::write(&tmp, body).map_err(Self::io("write", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(Self::io("rename", &path))
    }

    fn local_pack(&self, pack: &str, ext: &str) -> PathBuf {
        self.mirror
            .join("objects/pack")
            .join(format!("pack-{pack}.{ext}"))
    }

    /// Downloads and verifies one pack with its index, and installs it in
    /// the mirror unless the mirror holds every object in it already (a
    /// roll-up of packs it has, or another process's save into the same
    /// mirror): a mirror that took a copy of each would search one more
    /// index at every lookup and list one more pack at every rescan.
    /// Returns the bytes read, and whether the pack was installed.
    async fn download_pack(&self, pack: &str) -> Result<(u64, bool), SnapshotError> {
        let expected = hex_id(pack).ok_or_else(|| self.corrupt("bad pack name"))?;
        let mut read = 0u64;
        let mut bodies = Vec::new();
        for ext in ["pack", "idx"] {
            let key = self.pack_key(pack, ext);
            let object = self
                .store
                .get(&key)
                .await?
                .ok_or_else(|| self.corrupt(format!("{key} is missing")))?;
            read += u64::try_from(object.body.len()).unwrap_or(u64::MAX);
            bodies.push(object.body);
        }
        let (pack_bytes, idx_bytes) = (&bodies[0], &bodies[1]);
        if verify_trailer(pack_bytes, b"PACK") != Some(expected) {
            return Err(self.corrupt(format!("pack {pack} does not match its checksum")));
        }
        let idx_names_pack = idx_bytes.len() >= 40
            && &idx_bytes[idx_bytes.len() - 40..idx_bytes.len() - 20] == expected.as_bytes();
        if verify_trailer(idx_bytes, b"\xfftOc").is_none() || !idx_names_pack {
            return Err(self.corrupt(format!("index of pack {pack} is damaged")));
        }
        // how deep its large trees stand: a save of ours may store the next
        // ones as deltas against them
        let trees = {
            let memory = self.memory();
            crate::pack::large_tree_depths(pack_bytes, idx_bytes, &|id| {
                memory.tree_depths.get(id).copied()
            })
        };
        self.remember_trees(&trees);
        let ids = crate::pack::index_object_ids(idx_bytes)
            .ok_or_else(|| self.corrupt(format!("index of pack {pack} is damaged")))?;
        let mirror = self.mirror.clone();
        let held = tokio::task::spawn_blocking(move || {
            let repo = GitRepo::open(&mirror)?;
            // a miss is not looked for in packs written meanwhile: the pack
            // is then installed, which is never wrong
            Ok::<_, RepoError>(ids.iter().all(|id| repo.has_object_without_rescan(*id)))
        })
        .await
        .map_err(|e| SnapshotError::Task(e.to_string()))??;
        if held {
            // its index is what a compaction reads to list its objects
            self.keep_index(pack, idx_bytes)?;
            return Ok((read, false));
        }
        let dir = self.mirror.join("objects/pack");
        std::fs::create_dir_all(&dir).map_err(Self::io("create", &dir))?;
        // the pack first, the index last: a pack without its index is not read
        for (ext, body) in [("pack", pack_bytes), ("idx", idx_bytes)] {
            let path = self.local_pack(pack, ext);
            let tmp = dir.join(format!(".tmp-pack-{pack}.{ext}"));
            std::fs::write(&tmp, body).map_err(Self::io("write", &tmp))?;
            std::fs::rename(&tmp, &path).map_err(Self::io("rename", &path))?;
        }
        Ok((read, true))
    }

    /// Brings the mirror to the snapshot: the manifest if it changed, the
    /// packs the mirror lacks, then the refs.
    ///
    /// # Errors
    /// [`SnapshotError::Corrupt`] for a bad manifest or pack (rebuild it
    /// from the remote), store errors.
    pub async fn load(&self) -> Result<LoadOutcome, SnapshotError> {
        let state = self.read_state();
        let held = state
            .as_ref()
            .map(|s| s.held_packs.clone())
            .unwrap_or_default();
        let known = state.as_ref().map(|s| ETag(s.etag.clone()));
        let (manifest, etag, mut bytes_read, refs) = match self
            .store
            .get_if_changed(&self.manifest_key(), known.as_ref())
            .await?
        {
            Fetched::Missing => return Ok(LoadOutcome::Missing),
            Fetched::NotModified => match state {
                Some(state) => {
                    let (refs, read) = self.resolve(&state.manifest).await?;
                    (state.manifest, ETag(state.etag), read, refs)
                }
                None => return Err(self.corrupt("not modified, but never loaded")),
            },
            Fetched::Found(object) => {
                let manifest = Manifest::decode(&object.body).map_err(|r| self.corrupt(r))?;
                let (refs, base_read) = self.resolve(&manifest).await?;
                let read = u64::try_from(object.body.len()).unwrap_or(u64::MAX) + base_read;
                (manifest, object.etag, read, refs)
            }
        };
        if bytes_read == 0 {
            // nothing changed in the store: if the mirror still has the
            // manifest's refs, it is ready as it is
            let mirror = self.mirror.clone();
            let refs = refs.clone();
            let same = tokio::task::spawn_blocking(move || {
                GitRepo::open(&mirror)?
                    .branches_and_tags()
                    .map(|r| Arc::ptr_eq(&r, &refs) || *r == *refs)
            })
            .await
            .map_err(|e| SnapshotError::Task(e.to_string()))??;
            if same {
                return Ok(LoadOutcome::Loaded(Box::new(Loaded {
                    manifest,
                    etag,
                    bytes_read,
                    packs_downloaded: 0,
                })));
            }
        }
        bytes_read += self.load_discovery_cache().await?;
        let mut packs_downloaded = 0;
        let mut held = held;
        for pack in &manifest.packs {
            if !held.contains(pack) && !self.local_pack(pack, "idx").exists() {
                let (read, installed) = self.download_pack(pack).await?;
                bytes_read += read;
                packs_downloaded += 1;
                if !installed {
                    held.insert(pack.clone());
                }
            }
        }
        if packs_downloaded > 0 {
            self.drop_retired_packs(&manifest).await?;
        }
        let mirror = self.mirror.clone();
        let synced = refs.clone();
        let complete = tokio::task::spawn_blocking(move || {
            let repo = GitRepo::open(&mirror)?;
            let current = repo.branches_and_tags()?;
            // what the mirror lists already points to objects it has (refs
            // are written after their objects): only the changes are looked up
            let changes = crate::listing::differences(&current, &synced);
            if let Some((name, ..)) = changes
                .iter()
                .find(|(_, _, id)| id.is_some_and(|id| !repo.has_object(id)))
            {
                return Ok::<_, RepoError>(Some((*name).to_owned()));
            }
            repo.mirror_refs_from(&current, &synced)?;
            Ok(None)
        })
        .await
        .map_err(|e| SnapshotError::Task(e.to_string()))??;
        if let Some(name) = complete {
            return Err(self.corrupt(format!("no pack holds the commit of {name}")));
        }
        self.write_state(&LocalState::new(&etag, &manifest, None, held))?;
        Ok(LoadOutcome::Loaded(Box::new(Loaded {
            manifest,
            etag,
            bytes_read,
            packs_downloaded,
        })))
    }

    /// Removes from the mirror the packs it downloaded that the manifest
    /// has retired, once the listed packs installed in it hold every
    /// object of theirs: a roll-up replaced them.
    /// A mirror would otherwise keep each pack it ever downloaded, one
    /// per save of another process, and search each index at every
    /// lookup. Lookups in flight on a removed pack find the object again
    /// in the roll-up (gix lists the pack directory again when a pack it
    /// knew is gone). A retired pack whose objects are not all listed (a
    /// roll-up of every pack drops what nothing reaches) is kept.
    async fn drop_retired_packs(&self, manifest: &Manifest) -> Result<(), SnapshotError> {
        let retired: Vec<&str> = {
            let mut memory = self.memory();
            // what the manifest no longer retires will not come back
            memory
                .retired_seen
                .retain(|p| manifest.retired.iter().any(|r| r.pack == *p));
            manifest
                .retired
                .iter()
                .map(|r| r.pack.as_str())
                .filter(|p| {
                    !memory.retired_seen.contains(*p) && !manifest.packs.iter().any(|l| l == p)
                })
                .collect()
        };
        if retired.is_empty() {
            return Ok(());
        }
        // The ids of the listed packs installed here, read as needed, newest
        // first (a roll-up is listed last, the repository's large pack
        // first). A held pack does not count: its objects may be in the
        // very packs retired (a roll-up of packs this mirror has is held,
        // not installed).
        let mut listed: Vec<Vec<ObjectId>> = Vec::new();
        let mut unread = manifest.packs.iter().rev();
        for pack in retired {
            self.memory().retired_seen.insert(pack.to_owned());
            // a held one's index, kept for a compaction that is done
            self.forget_index(pack);
            let idx = self.local_pack(pack, "idx");
            let Some(ids) = std::fs::read(&idx)
                .ok()
                .and_then(|bytes| crate::pack::index_object_ids(&bytes))
            else {
                continue;
            };
            let mut covered = true;
            for id in &ids {
                while !listed.iter().any(|l| l.binary_search(id).is_ok()) {
                    let Some(next) = unread.next() else {
                        covered = false;
                        break;
                    };
                    if let Some(ids) = std::fs::read(self.local_pack(next, "idx"))
                        .ok()
                        .and_then(|bytes| crate::pack::index_object_ids(&bytes))
                    {
                        listed.push(ids);
                    }
                }
                if !covered {
                    break;
                }
            }
            if covered {
                // the index first: a pack without its index is not read
                std::fs::remove_file(&idx).map_err(Self::io("remove", &idx))?;
                let data = self.local_pack(pack, "pack");
                std::fs::remove_file(&data).map_err(Self::io("remove", &data))?;
            }
        }
        Ok(())
    }

    fn base_key(&self, id: &str) -> String {
        format!("{}/refs/{id}.json", self.key)
    }

    fn local_base(&self, id: &str) -> PathBuf {
        self.mirror.join(format!("porch-refs-{id}.json"))
    }

    /// A base ref map: from memory, the mirror's copy, else the store.
    /// Returns it with the bytes read from the store.
    async fn base_refs(&self, id: &str) -> Result<(Arc<RefMap>, u64), SnapshotError> {
        if let Some((cached, map)) = &self.memory().base
            && cached == id
        {
            return Ok((Arc::clone(map), 0));
        }
        let local = self.local_base(id);
        if let Ok(bytes) = std::fs::read(&local)
            && let Ok(map) = decode_base(id, &bytes)
        {
            let map = Arc::new(map);
            self.memory().base = Some((id.to_owned(), Arc::clone(&map)));
            return Ok((map, 0));
        }
        let object = self
            .store
            .get(&self.base_key(id))
            .await?
            .ok_or_else(|| self.corrupt(format!("ref base {id} is missing")))?;
        let map = Arc::new(decode_base(id, &object.body).map_err(|r| self.corrupt(r))?);
        self.memory().base = Some((id.to_owned(), Arc::clone(&map)));
        let tmp = self.mirror.join(format!(".porch-refs-{id}.tmp"));
        std::fs::write(&tmp, &object.body).map_err(Self::io("write", &tmp))?;
        std::fs::rename(&tmp, &local).map_err(Self::io("rename", &local))?;
        Ok((map, u64::try_from(object.body.len()).unwrap_or(u64::MAX)))
    }

    /// The manifest's refs resolved against its base, and the bytes read.
    /// The last resolution is kept: a warm process resolves the same
    /// manifest on every load and save.
    async fn resolve(&self, manifest: &Manifest) -> Result<(Arc<RefMap>, u64), SnapshotError> {
        let Some(base) = &manifest.base else {
            return Ok((Arc::new(manifest.ref_ids().into()), 0));
        };
        let key = RefsKey::of(manifest);
        // taken out: it is replaced below
        let last = {
            let mut memory = self.memory();
            if let Some((cached, refs)) = &memory.resolved
                && *cached == key
            {
                return Ok((Arc::clone(refs), 0));
            }
            memory.resolved.take()
        };
        let (base_refs, read) = self.base_refs(base).await?;
        let refs = match &last {
            // another writer's manifest on the same base: from the last one
            Some((before, resolved)) if before.base == key.base => {
                key.resolve_from(before, resolved, &base_refs)
            }
            _ => key.resolve(&base_refs),
        };
        self.memory().resolved = Some((key, Arc::clone(&refs)));
        Ok((refs, read))
    }

    /// `manifest`, listing `refs` (what it lists now, resolved), changed by
    /// `changes`: as changes to its base while they are few, else on a new
    /// base written to the store (the old one retired). Only the changed
    /// names are looked at while the manifest stays a delta. Returns the
    /// bytes written.
    async fn set_refs(
        &self,
        manifest: &mut Manifest,
        refs: &RefMap,
        changes: &BTreeMap<String, Option<ObjectId>>,
    ) -> Result<u64, SnapshotError> {
        if let Some(base) = manifest.base.clone() {
            let (base_refs, _) = self.base_refs(&base).await?;
            let mut delta: BTreeMap<String, Option<ObjectId>> = manifest
                .ref_ids()
                .into_iter()
                .map(|(n, id)| (n, Some(id)))
                .chain(manifest.deleted.iter().map(|n| (n.clone(), None)))
                .collect();
            for (name, id) in changes {
                if base_refs.get(name) == id.as_ref() {
                    delta.remove(name);
                } else {
                    delta.insert(name.clone(), *id);
                }
            }
            if delta.len() <= MAX_DELTA {
                manifest.refs = delta
                    .iter()
                    .filter_map(|(n, id)| Some((n.clone(), (*id)?.to_string())))
                    .collect();
                manifest.deleted = delta
                    .into_iter()
                    .filter_map(|(n, id)| id.is_none().then_some(n))
                    .collect();
                return Ok(0);
            }
        }
        let mut full = refs.clone();
        for (name, id) in changes {
            match id {
                Some(id) => full.insert(name.clone(), *id),
                None => full.remove(name),
            };
        }
        if manifest.base.is_none() && full.len() <= MAX_DELTA {
            manifest.refs = hex_map(&full);
            manifest.deleted.clear();
            return Ok(0);
        }
        let body = serde_json::to_vec(&hex_map(&full)).map_err(|e| self.corrupt(e.to_string()))?;
        let id = gix::objs::compute_hash(gix::hash::Kind::Sha1, gix::objs::Kind::Blob, &body)
            .map_err(|e| self.corrupt(e.to_string()))?
            .to_string();
        let size = u64::try_from(body.len()).unwrap_or(u64::MAX);
        let local = self.local_base(&id);
        std::fs::write(&local, &body).map_err(Self::io("write", &local))?;
        self.memory().base = Some((id.clone(), Arc::new(full)));
        match self
            .store
            .put(&self.base_key(&id), body, PutCondition::IfAbsent)
            .await
        {
            Ok(_) | Err(StoreError::PreconditionFailed { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(old) = manifest.base.replace(id.clone())
            && old != id
        {
            manifest.retired_bases.push(RetiredPack {
                pack: old,
                since: now(),
            });
        }
        manifest.refs.clear();
        manifest.deleted.clear();
        Ok(size)
    }

    fn discovery_key(&self) -> String {
        format!("{}/discovery.json", self.key)
    }

    /// Uploads discovery's tag cache (what each tag's commit holds, which
    /// never changes), so a cold handler discovers without reading every
    /// tag's tree. Call it after discovery; a lost race only costs another
    /// handler a recomputation.
    ///
    /// # Errors
    /// Store errors.
    pub async fn save_discovery_cache(&self) -> Result<u64, SnapshotError> {
        let path = self.mirror.join(crate::discovery::TAG_CACHE_FILE);
        let Ok(body) = std::fs::read(&path) else {
            return Ok(0);
        };
        let size = u64::try_from(body.len()).unwrap_or(u64::MAX);
        self.store
            .put(&self.discovery_key(), body, PutCondition::Always)
            .await?;
        Ok(size)
    }

    /// Downloads discovery's tag cache when the mirror has none.
    async fn load_discovery_cache(&self) -> Result<u64, SnapshotError> {
        let path = self.mirror.join(crate::discovery::TAG_CACHE_FILE);
        if path.exists() {
            return Ok(0);
        }
        let Some(object) = self.store.get(&self.discovery_key()).await? else {
            return Ok(0);
        };
        let size = u64::try_from(object.body.len()).unwrap_or(u64::MAX);
        // an unreadable cache is ignored by discovery, so no check here
        let tmp = self
            .mirror
            .join(format!(".{}.tmp", crate::discovery::TAG_CACHE_FILE));
        std::fs::write(&tmp, object.body).map_err(Self::io("write", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(Self::io("rename", &path))?;
        Ok(size)
    }

    /// Uploads a pack of the objects the mirror's refs reach beyond
    /// `known`, installing it locally too. Returns its checksum and size.
    /// With `overwrite`, a pack already stored under the same name is
    /// replaced (a rebuild after damage); else it is taken as written.
    /// Large trees may be stored as deltas against trees the snapshot
    /// holds ([`GitRepo::write_thin_pack`]), when this process knows how
    /// deep they are stored (from its saves and the packs it loaded).
    async fn upload_pack(
        &self,
        tips: Vec<ObjectId>,
        known: Vec<Arc<RefMap>>,
        overwrite: bool,
    ) -> Result<Option<Uploaded>, SnapshotError> {
        let depths = self.memory().tree_depths.clone();
        self.upload_objects(
            move |repo| {
                let (ids, bases) = repo.missing_objects_and_bases_beyond(&tips, &known)?;
                if ids.is_empty() {
                    return Ok(None);
                }
                let depth_of = |id: &ObjectId| depths.get(id).copied();
                Ok(Some(repo.write_thin_pack(&ids, &bases, &depth_of)?))
            },
            overwrite,
        )
        .await
    }

    /// Writes the pack `write` makes from the mirror and uploads it with
    /// its index; `None` when it writes none.
    async fn upload_objects(
        &self,
        write: impl FnOnce(&GitRepo) -> Result<Option<(Pack, StoredTrees)>, RepoError> + Send + 'static,
        overwrite: bool,
    ) -> Result<Option<Uploaded>, SnapshotError> {
        let mirror = self.mirror.clone();
        let pack = tokio::task::spawn_blocking(move || {
            let repo = GitRepo::open(&mirror)?;
            // not installed into the mirror, which has these objects
            // already: one more pack per save would make every object
            // lookup search one more index
            let Some((pack, depths)) = write(&repo)? else {
                return Ok::<_, RepoError>(None);
            };
            let index = pack.index()?;
            Ok(Some((pack, index, depths)))
        })
        .await
        .map_err(|e| SnapshotError::Task(e.to_string()))??;
        let Some((pack, index, trees)) = pack else {
            return Ok(None);
        };
        let name = pack.checksum.to_string();
        // its index kept beside the mirror: a compaction counts and lists
        // the pack's objects without downloading it
        self.keep_index(&name, &index)?;
        let mut written = 0u64;
        for (ext, body) in [("pack", pack.bytes), ("idx", index)] {
            written += u64::try_from(body.len()).unwrap_or(u64::MAX);
            let key = self.pack_key(&name, ext);
            if overwrite {
                self.store.put(&key, body, PutCondition::Always).await?;
            } else {
                // content-addressed: already there is as good as written
                self.store.create(&key, body).await?;
            }
        }
        Ok(Some(Uploaded {
            pack: name,
            bytes: written,
            trees,
        }))
    }

    /// Saves the mirror's branches and tags: a pack of what is new since
    /// the snapshot, then the manifest by conditional put, merged with any
    /// concurrent writer's. When no ref moved since the snapshot was loaded
    /// or saved, nothing is written.
    ///
    /// # Errors
    /// Store or git errors, or [`SnapshotError::Contended`].
    pub async fn save(&self, remote_url: &str) -> Result<Saved, SnapshotError> {
        self.save_inner(remote_url, false).await
    }

    async fn save_inner(&self, remote_url: &str, overwrite: bool) -> Result<Saved, SnapshotError> {
        let state = self.read_state();
        let mirror = self.mirror.clone();
        let ours = tokio::task::spawn_blocking(move || GitRepo::open(&mirror)?.branches_and_tags())
            .await
            .map_err(|e| SnapshotError::Task(e.to_string()))??;
        let base = match &state {
            Some(state) => self.resolve(&state.manifest).await?.0,
            None => Arc::new(RefMap::new()),
        };
        let synced = match &state {
            Some(state) => state.synced(&base),
            None => Arc::new(RefMap::new()),
        };
        // our changes since the mirror was last in step with the snapshot
        let changes: BTreeMap<String, Option<ObjectId>> =
            crate::listing::differences(&synced, &ours)
                .into_iter()
                .map(|(name, _, id)| (name.to_owned(), id))
                .collect();
        // nothing moved since the snapshot: no objects are new either
        if changes.is_empty()
            && !overwrite
            && let Some(state) = &state
        {
            return Ok(Saved {
                etag: ETag(state.etag.clone()),
                pack: None,
                bytes_written: 0,
                merges: 0,
                compacted: false,
            });
        }
        // refs that did not change reach only what the snapshot holds
        let tips: Vec<ObjectId> = if overwrite {
            ours.values().copied().collect()
        } else {
            changes.values().flatten().copied().collect()
        };
        let known: Vec<Arc<RefMap>> = if Arc::ptr_eq(&base, &synced) {
            vec![Arc::clone(&base)]
        } else {
            vec![Arc::clone(&base), Arc::clone(&synced)]
        };
        let mut uploaded = self.upload_pack(tips, known, overwrite).await?;
        let mut bytes_written = uploaded.as_ref().map_or(0, |u| u.bytes);

        // the snapshot's refs are ours after the save when they were the
        // mirror's before it (the common case: nobody else saved meanwhile)
        let mut current = state.map(|s| (s.manifest, ETag(s.etag), Arc::clone(&base)));
        let mut in_step = Arc::ptr_eq(&base, &synced);
        // the packs our pack's "already in the snapshot" relied on, and
        // packs of ours a later one replaced
        let mut based_on: Vec<String> = current
            .as_ref()
            .map(|(m, _, _)| m.packs.clone())
            .unwrap_or_default();
        let mut superseded: Vec<String> = Vec::new();
        let mut merges = 0;
        for _ in 0..SAVE_ATTEMPTS {
            let (mut manifest, condition, refs) = match &current {
                Some((manifest, etag, refs)) => (
                    manifest.clone(),
                    PutCondition::IfMatch(etag.clone()),
                    Arc::clone(refs),
                ),
                None => (
                    Manifest {
                        format: FORMAT,
                        remote: remote_url.to_owned(),
                        fetched_at: 0,
                        base: None,
                        refs: BTreeMap::new(),
                        deleted: Vec::new(),
                        packs: Vec::new(),
                        retired: Vec::new(),
                        retired_bases: Vec::new(),
                    },
                    PutCondition::IfAbsent,
                    Arc::new(RefMap::new()),
                ),
            };
            if changes.is_empty() && uploaded.is_none() && current.is_some() {
                let etag = match condition {
                    PutCondition::IfMatch(etag) => etag,
                    _ => ETag(String::new()),
                };
                let synced = (*refs != *ours).then_some(&*ours);
                self.remember(&manifest, &etag, synced, &[])?;
                return Ok(Saved {
                    etag,
                    pack: None,
                    bytes_written,
                    merges,
                    compacted: false,
                });
            }
            bytes_written += self.set_refs(&mut manifest, &refs, &changes).await?;
            let base = manifest.base.clone();
            manifest
                .retired_bases
                .retain(|r| Some(&r.pack) != base.as_ref());
            if let Some(Uploaded { pack, .. }) = &uploaded
                && !manifest.packs.contains(pack)
            {
                manifest.packs.push(pack.clone());
            }
            for pack in &superseded {
                if !manifest.retired.iter().any(|r| &r.pack == pack) {
                    manifest.retired.push(RetiredPack {
                        pack: pack.clone(),
                        since: now(),
                    });
                }
            }
            let listed = manifest.packs.clone();
            manifest.retired.retain(|r| !listed.contains(&r.pack));
            manifest.remote = remote_url.to_owned();
            manifest.fetched_at = now();
            let mut compacted = None;
            if manifest.packs.len() > COMPACT_AT
                && let Some(compaction) = self.compact(&manifest).await?
            {
                let since = now();
                manifest.packs.retain(|p| !compaction.replaced.contains(p));
                for old in compaction.replaced {
                    if old != compaction.pack {
                        manifest.retired.push(RetiredPack { pack: old, since });
                    }
                }
                if !manifest.packs.contains(&compaction.pack) {
                    manifest.packs.push(compaction.pack.clone());
                }
                bytes_written += compaction.bytes_written;
                compacted = Some(compaction.pack);
            }
            let expired: Vec<String> = manifest
                .retired
                .iter()
                .filter(|r| {
                    now() - r.since > i64::try_from(RETIRE_GRACE.as_secs()).unwrap_or(i64::MAX)
                })
                .map(|r| r.pack.clone())
                .collect();
            manifest.retired.retain(|r| !expired.contains(&r.pack));
            let expired_bases: Vec<String> = manifest
                .retired_bases
                .iter()
                .filter(|r| {
                    now() - r.since > i64::try_from(RETIRE_GRACE.as_secs()).unwrap_or(i64::MAX)
                })
                .map(|r| r.pack.clone())
                .collect();
            manifest
                .retired_bases
                .retain(|r| !expired_bases.contains(&r.pack));
            let body = serde_json::to_vec(&manifest).map_err(|e| self.corrupt(e.to_string()))?;
            let size = u64::try_from(body.len()).unwrap_or(u64::MAX);
            match self.store.put(&self.manifest_key(), body, condition).await {
                Ok(etag) => {
                    bytes_written += size;
                    // packs written here: their objects are in the mirror
                    let held: Vec<&str> = uploaded
                        .iter()
                        .map(|u| u.pack.as_str())
                        .chain(compacted.as_deref())
                        .collect();
                    if let Some(uploaded) = &uploaded {
                        self.remember_trees(&uploaded.trees);
                    }
                    // the kept indexes of packs our compaction replaced
                    // (only once that is listed: a lost race keeps them)
                    if compacted.is_some() {
                        for retired in &manifest.retired {
                            self.forget_index(&retired.pack);
                        }
                    }
                    if in_step {
                        self.memory().resolved = Some((RefsKey::of(&manifest), Arc::clone(&ours)));
                        self.remember(&manifest, &etag, None, &held)?;
                    } else {
                        let (refs, _) = self.resolve(&manifest).await?;
                        let synced = (*refs != *ours).then_some(&*ours);
                        self.remember(&manifest, &etag, synced, &held)?;
                    }
                    for base in expired_bases {
                        if manifest.base.as_ref() != Some(&base) {
                            let _ = self.store.delete(&self.base_key(&base)).await;
                        }
                    }
                    for pack in expired {
                        if !manifest.packs.contains(&pack) {
                            for ext in ["pack", "idx"] {
                                let _ = self.store.delete(&self.pack_key(&pack, ext)).await;
                            }
                        }
                    }
                    return Ok(Saved {
                        etag,
                        pack: uploaded.map(|u| u.pack),
                        bytes_written,
                        merges,
                        compacted: compacted.is_some(),
                    });
                }
                Err(StoreError::PreconditionFailed { .. } | StoreError::NotFound { .. }) => {
                    merges += 1;
                    current = match self.store.get(&self.manifest_key()).await? {
                        Some(object) => {
                            let theirs =
                                Manifest::decode(&object.body).map_err(|r| self.corrupt(r))?;
                            let (refs, _) = self.resolve(&theirs).await?;
                            Some((theirs, object.etag, refs))
                        }
                        None => None,
                    };
                    if let Some((theirs, _, _)) = &mut current {
                        // their packs stay; ours is added above
                        theirs.retired.retain(|r| !theirs.packs.contains(&r.pack));
                    }
                    in_step = false;
                    // Compacted meanwhile (or gone): what our pack left out
                    // as already in the snapshot may now be only in packs
                    // the manifest no longer lists. Packed again against
                    // what it does list.
                    let relisted = match &current {
                        Some((theirs, _, their_refs)) => based_on
                            .iter()
                            .any(|p| !theirs.packs.contains(p))
                            .then(|| (theirs.packs.clone(), vec![Arc::clone(their_refs)])),
                        None => Some((Vec::new(), Vec::new())),
                    };
                    if let Some((packs, known)) = relisted {
                        let tips: Vec<ObjectId> = changes.values().flatten().copied().collect();
                        let redone = self.upload_pack(tips, known, overwrite).await?;
                        bytes_written += redone.as_ref().map_or(0, |u| u.bytes);
                        if let Some(Uploaded { pack: old, .. }) =
                            std::mem::replace(&mut uploaded, redone)
                            && uploaded.as_ref().is_none_or(|new| new.pack != old)
                        {
                            superseded.push(old);
                        }
                        based_on = packs;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(SnapshotError::Contended {
            key: self.key.clone(),
            attempts: SAVE_ATTEMPTS,
        })
    }

    /// Records how deep the large trees of a pack now listed are stored,
    /// and their bases.
    fn remember_trees(&self, trees: &[StoredTree]) {
        let mut memory = self.memory();
        if memory.tree_depths.len() + trees.len() > MAX_TREE_DEPTHS {
            memory.tree_depths.clear();
            memory.tree_bases.clear();
        }
        for tree in trees {
            // another copy may be shallower; the deepest is what counts
            let known = memory.tree_depths.entry(tree.id).or_insert(tree.depth);
            *known = (*known).max(tree.depth);
            if let Some(base) = tree.base {
                memory.tree_bases.insert(tree.id, base);
            }
        }
    }

    /// Records what was saved: the manifest, its tag, the mirror refs it
    /// now includes, and the packs written from the mirror.
    fn remember(
        &self,
        manifest: &Manifest,
        etag: &ETag,
        synced: Option<&RefMap>,
        written: &[&str],
    ) -> Result<(), SnapshotError> {
        let mut held = self
            .memory()
            .state
            .as_ref()
            .map(|s| s.held_packs.clone())
            .unwrap_or_default();
        held.extend(written.iter().map(|p| (*p).to_owned()));
        self.write_state(&LocalState::new(etag, manifest, synced, held))
    }

    /// Rolls the manifest's smallest packs into one (see [`rollup`]). When
    /// that is every pack, the new one holds just what the refs reach, so
    /// objects nothing reaches any more are dropped; otherwise it holds the
    /// objects of the packs it replaces. `None` when the packs are in
    /// progression already, or when the mirror lacks an object the new
    /// pack must hold (a concurrent writer's, not downloaded here): the
    /// compaction waits for a writer that has them all.
    async fn compact(&self, manifest: &Manifest) -> Result<Option<Compaction>, SnapshotError> {
        let mut counted = Vec::with_capacity(manifest.packs.len());
        let mut objects = BTreeMap::new();
        for pack in &manifest.packs {
            let ids = self.pack_object_ids(pack).await?;
            counted.push((pack.clone(), u64::try_from(ids.len()).unwrap_or(u64::MAX)));
            objects.insert(pack.clone(), ids);
        }
        let replaced = rollup(&counted);
        if replaced.is_empty() {
            return Ok(None);
        }
        let ids: Vec<ObjectId> = if replaced.len() == manifest.packs.len() {
            let refs = self.resolve(manifest).await?.0;
            refs.values().copied().collect()
        } else {
            let mut ids: Vec<ObjectId> = replaced
                .iter()
                .filter_map(|p| objects.remove(p))
                .flatten()
                .collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        let whole = replaced.len() == manifest.packs.len();
        let mirror = self.mirror.clone();
        let has_all = {
            let ids = ids.clone();
            tokio::task::spawn_blocking(move || {
                let repo = GitRepo::open(&mirror)?;
                Ok::<_, RepoError>(ids.iter().all(|id| repo.has_object(*id)))
            })
            .await
            .map_err(|e| SnapshotError::Task(e.to_string()))??
        };
        if !has_all {
            return Ok(None);
        }
        // a complete pack: a compaction ends the chains of deltas across
        // packs of those it replaces; large trees may be deltas against
        // others in it
        let bases: Vec<(ObjectId, ObjectId)> = self
            .memory()
            .tree_bases
            .iter()
            .map(|(tree, base)| (*tree, *base))
            .collect();
        let uploaded = self
            .upload_objects(
                move |repo| {
                    let ids = if whole {
                        repo.missing_objects(&ids, &[])?
                    } else {
                        ids
                    };
                    if ids.is_empty() {
                        return Ok(None);
                    }
                    Ok(Some((repo.write_complete_pack(&ids, &bases)?, Vec::new())))
                },
                false,
            )
            .await?;
        Ok(uploaded.map(|Uploaded { pack, bytes, .. }| Compaction {
            pack,
            bytes_written: bytes,
            replaced,
        }))
    }

    fn kept_index(&self, pack: &str) -> PathBuf {
        self.mirror
            .join("porch-pack-index")
            .join(format!("pack-{pack}.idx"))
    }

    /// Drops the kept index of a pack compacted away (the mirror still has
    /// its objects; nothing lists it again).
    fn forget_index(&self, pack: &str) {
        let _ = std::fs::remove_file(self.kept_index(pack));
    }

    /// Keeps the index of a pack this process wrote beside the mirror.
    fn keep_index(&self, pack: &str, index: &[u8]) -> Result<(), SnapshotError> {
        let path = self.kept_index(pack);
        let dir = self.mirror.join("porch-pack-index");
        std::fs::create_dir_all(&dir).map_err(Self::io("create", &dir))?;
        let tmp = dir.join(format!(".tmp-pack-{pack}.idx"));
        std::fs::write(&tmp, index).map_err(Self::io("write", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(Self::io("rename", &path))
    }

    /// The ids of the objects in a pack of the snapshot, from its index:
    /// the mirror's copy (a downloaded pack), the one kept beside it (a
    /// pack this process wrote), else the store's (then kept).
    async fn pack_object_ids(&self, pack: &str) -> Result<Vec<ObjectId>, SnapshotError> {
        for local in [self.local_pack(pack, "idx"), self.kept_index(pack)] {
            if let Ok(bytes) = std::fs::read(&local)
                && let Some(ids) = crate::pack::index_object_ids(&bytes)
            {
                return Ok(ids);
            }
        }
        let expected = hex_id(pack).ok_or_else(|| self.corrupt("bad pack name"))?;
        let key = self.pack_key(pack, "idx");
        let body = self
            .store
            .get(&key)
            .await?
            .ok_or_else(|| self.corrupt(format!("{key} is missing")))?
            .body;
        let names_pack =
            body.len() >= 40 && &body[body.len() - 40..body.len() - 20] == expected.as_bytes();
        let ids = (names_pack && verify_trailer(&body, b"\xfftOc").is_some())
            .then(|| crate::pack::index_object_ids(&body))
            .flatten()
            .ok_or_else(|| self.corrupt(format!("index of pack {pack} is damaged")))?;
        self.keep_index(pack, &body)?;
        Ok(ids)
    }

    /// Rebuilds the snapshot from the remote: a full fetch into the mirror,
    /// then a save that replaces whatever manifest is there.
    ///
    /// # Errors
    /// The remote or the store fails.
    pub async fn rebuild<R: Remote>(&self, remote: &R) -> Result<Saved, SnapshotError> {
        let state_file = self.mirror.join(STATE_FILE);
        let _ = std::fs::remove_file(&state_file);
        self.memory().state = None;
        remote.fetch(&self.mirror).await?;
        // start from whatever manifest exists (even a corrupt one) so the
        // conditional put replaces it instead of failing forever
        if let Some(object) = self.store.get(&self.manifest_key()).await? {
            let old = Manifest::decode(&object.body).ok();
            let since = now();
            let retire = |names: Vec<String>, earlier: Vec<RetiredPack>| -> Vec<RetiredPack> {
                names
                    .into_iter()
                    .map(|pack| RetiredPack { pack, since })
                    .chain(earlier)
                    .collect()
            };
            let manifest = Manifest {
                format: FORMAT,
                remote: remote.url().to_owned(),
                fetched_at: 0,
                base: None,
                refs: BTreeMap::new(),
                deleted: Vec::new(),
                packs: Vec::new(),
                // everything the old manifest used goes after the grace period
                retired: old
                    .as_ref()
                    .map(|m| retire(m.packs.clone(), m.retired.clone()))
                    .unwrap_or_default(),
                retired_bases: old
                    .map(|m| retire(m.base.into_iter().collect(), m.retired_bases))
                    .unwrap_or_default(),
            };
            self.write_state(&LocalState {
                etag: object.etag.0,
                manifest,
                synced_refs: None,
                held_packs: BTreeSet::new(),
            })?;
        }
        self.save_inner(remote.url(), true).await
    }

    /// A mirror ready to use: the snapshot loaded, or rebuilt from the
    /// remote when it is missing or corrupt.
    ///
    /// # Errors
    /// The store or the remote fails.
    pub async fn prepare<R: Remote>(&self, remote: &R) -> Result<Prepared, SnapshotError> {
        match self.load().await {
            Ok(LoadOutcome::Loaded(loaded)) => Ok(Prepared::Loaded(*loaded)),
            Ok(LoadOutcome::Missing) => Ok(Prepared::Rebuilt(self.rebuild(remote).await?)),
            Err(SnapshotError::Corrupt { key, reason }) => {
                tracing::warn!(%key, %reason, "snapshot unusable, rebuilding it from the remote");
                Ok(Prepared::Rebuilt(self.rebuild(remote).await?))
            }
            Err(e) => Err(e),
        }
    }

    /// The packs listed in the store under this snapshot (for tests and
    /// housekeeping).
    ///
    /// # Errors
    /// The store fails.
    pub async fn stored_packs(&self) -> Result<BTreeSet<String>, SnapshotError> {
        let prefix = format!("{}/packs/pack-", self.key);
        Ok(self
            .store
            .list(&prefix)
            .await?
            .into_iter()
            .filter_map(|k| {
                k.strip_prefix(&prefix)
                    .and_then(|n| n.strip_suffix(".pack"))
                    .map(str::to_owned)
            })
            .collect())
    }
}

/// How [`Snapshots::prepare`] got the mirror ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    Loaded(Loaded),
    Rebuilt(Saved),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packs(counts: &[u64]) -> Vec<(String, u64)> {
        counts
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("p{i:02}"), *n))
            .collect()
    }

    fn rolled(counts: &[u64]) -> Vec<u64> {
        let packs = packs(counts);
        let mut out: Vec<u64> = rollup(&packs)
            .iter()
            .map(|name| packs.iter().find(|(n, _)| n == name).expect("listed").1)
            .collect();
        out.sort_unstable();
        out
    }

    #[test]
    fn the_small_packs_are_rolled_up_and_a_large_one_is_left() {
        // sixteen saves' packs beside the repository's pack
        let mut counts = vec![5; 16];
        counts.push(60_000);
        assert_eq!(rolled(&counts), vec![5; 16]);
        // next time the earlier roll-up joins them while it is small
        let mut counts = vec![5; 15];
        counts.extend([80, 60_000]);
        let mut expected = vec![5; 15];
        expected.push(80);
        assert_eq!(rolled(&counts), expected);
        // packs of equal size: all of them (the whole repository)
        assert_eq!(rolled(&[7, 7, 7]), vec![7, 7, 7]);
        // a whole repository smaller than twice the new packs: all of it
        let mut counts = vec![4; 16];
        counts.push(15);
        assert_eq!(rolled(&counts).len(), 17);
    }

    #[test]
    fn a_manifest_resolved_from_the_last_one_matches_one_resolved_from_its_base() {
        let id = |n: u64| {
            ObjectId::from_bytes_or_panic(&{
                let mut bytes = [0u8; 20];
                bytes[..8].copy_from_slice(&n.to_be_bytes());
                bytes
            })
        };
        let name = |n: u64| format!("refs/tags/pkg-{n}/v1");
        let base: Arc<RefMap> = Arc::new((0..2_000).map(|n| (name(n), id(n))).collect());
        let mut seed = 7u64;
        let mut next = |below: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % below
        };
        let mut key = RefsKey {
            base: Some("b".repeat(40)),
            refs: BTreeMap::new(),
            deleted: Vec::new(),
        };
        let mut resolved = key.resolve(&base);
        for round in 0..200 {
            let before = key.clone();
            // names new and old (some of the base's) set, deleted, dropped
            // from the delta again (back to the base's id), or given an id
            // that does not parse
            for _ in 0..next(12) {
                let n = next(2_200);
                match next(5) {
                    0 | 1 => {
                        key.refs.insert(name(n), id(n + 10_000 + round).to_string());
                    }
                    2 => {
                        key.refs.remove(&name(n));
                        key.deleted.push(name(n));
                    }
                    3 => {
                        key.refs.remove(&name(n));
                        key.deleted.retain(|d| *d != name(n));
                    }
                    _ => {
                        key.refs.insert(name(n), "not an id".into());
                    }
                }
            }
            if round % 50 == 49 {
                key.refs.clear();
                key.deleted.clear();
            }
            resolved = key.resolve_from(&before, &resolved, &base);
            assert_eq!(*resolved, *key.resolve(&base), "round {round}");
        }
    }

    #[test]
    fn packs_in_progression_are_left_alone() {
        assert!(rolled(&[1, 2, 4, 8, 16, 32]).is_empty());
        assert!(rolled(&[3, 100, 1_000]).is_empty());
        assert!(rolled(&[10]).is_empty());
        assert!(rolled(&[]).is_empty());
        // one break low down: only what is below it, and what it then
        // outweighs
        assert_eq!(rolled(&[1, 1, 3, 20, 1_000]), vec![1, 1, 3]);
        assert_eq!(rolled(&[1, 1, 2, 3, 1_000]), vec![1, 1, 2, 3]);
        // the largest counts an index can hold, and sizes at the edge of
        // u64, do not overflow
        let most = u64::from(u32::MAX);
        assert_eq!(rolled(&[most, most, most]).len(), 3);
        let _ = rolled(&[u64::MAX, u64::MAX, 1]);
    }
}
