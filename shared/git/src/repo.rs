//! Repository access with gix: objects, package trees and compare-and-swap
//! ref updates, with no `git` binary and no user or system configuration.
//!
//! gix is blocking; async callers wrap these calls in `spawn_blocking`.

use crate::identity::Identity;
use crate::listing::is_branch_or_tag as mirrored;
use gix::ObjectId;
use gix::bstr::ByteSlice;
use gix::objs::tree::EntryKind;
use gix::refs::transaction::{Change, LogChange, PreviousValue, RefEdit, RefLog};
use gix::refs::{FullName, Target};
use porch_api::limits::{LimitError, MAX_FILE_BYTES, MAX_PACKAGE_FILES, PackageBudget};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A package's files: slash paths relative to the package root → contents.
pub type Files = BTreeMap<String, Vec<u8>>;

/// Why a repository operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("failed to open the repository at {path}")]
    Open {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("file path {path:?} is not allowed in a package: {reason}")]
    UnsafePath { path: String, reason: &'static str },
    #[error("failed to {step}")]
    Git {
        step: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A package over the size limits ([`porch_api::limits`]), read or
    /// written.
    #[error("package {dir:?}: {source}")]
    TooLarge {
        dir: String,
        #[source]
        source: LimitError,
    },
    #[error("ref {name} changed: expected {expected}, the repository has {actual}")]
    Conflict {
        name: String,
        expected: String,
        actual: String,
    },
}

fn git<E: std::error::Error + Send + Sync + 'static>(
    step: &'static str,
) -> impl FnOnce(E) -> RepoError {
    move |e| RepoError::Git {
        step,
        source: Box::new(e),
    }
}

/// A full hexadecimal object id (40 characters), or `None`.
pub fn parse_object_id(hex: &str) -> Option<ObjectId> {
    (hex.len() == 40)
        .then(|| ObjectId::from_hex(hex.as_bytes()).ok())
        .flatten()
}

/// Checks a file path inside a package: relative, no `.`/`..`/`.git`
/// segments, no empty segments, no backslashes or control characters.
///
/// # Errors
/// The first rule the path breaks.
pub fn validate_file_path(path: &str) -> Result<(), RepoError> {
    let bad = |reason| RepoError::UnsafePath {
        path: path.chars().take(120).collect(),
        reason,
    };
    if path.is_empty() {
        return Err(bad("it is empty"));
    }
    if path.len() > 4096 {
        return Err(bad("it is longer than 4096 bytes"));
    }
    if path.starts_with('/') {
        return Err(bad("absolute paths are not allowed"));
    }
    if path.chars().any(|c| c.is_control() || c == '\\') {
        return Err(bad("control characters and backslashes are not allowed"));
    }
    for segment in path.split('/') {
        match segment {
            "" => return Err(bad("empty path segments are not allowed")),
            "." | ".." => return Err(bad("'.' and '..' segments are not allowed")),
            s if s.eq_ignore_ascii_case(".git") => {
                return Err(bad("'.git' segments are not allowed"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// What a commit says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    pub author_name: String,
    pub author_email: String,
    /// Seconds since the Unix epoch.
    pub author_time: i64,
    pub message: String,
}

/// The last few large trees read, decoded, shared by every repository
/// handle in the process. A repository that keeps thousands of packages at
/// its root has a root tree of hundreds of kilobytes, which one operation
/// would otherwise inflate again for each step: the edit, the push, the
/// snapshot's pack and its diff against the parent. Objects are named by
/// their content, so one read from any repository serves them all (a read
/// may so find a tree this repository lacks; [`GitRepo::has_object`] still
/// answers for this repository alone).
struct LargeTrees;

impl LargeTrees {
    /// Smaller trees inflate about as fast as they copy.
    const AT_LEAST: usize = crate::pack::LARGE_TREE;
    const KEPT: usize = 8;
    const KEPT_BYTES: usize = 32 * 1024 * 1024;

    fn kept() -> std::sync::MutexGuard<'static, std::collections::VecDeque<(ObjectId, Arc<[u8]>)>> {
        static KEPT: Mutex<std::collections::VecDeque<(ObjectId, Arc<[u8]>)>> =
            Mutex::new(std::collections::VecDeque::new());
        KEPT.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A large tree kept decoded ([`LargeTrees`]), shared rather than copied
/// as gix's object cache hands it out; `None` when it is not kept.
pub(crate) fn kept_large_tree(id: &ObjectId) -> Option<Arc<[u8]>> {
    let mut kept = LargeTrees::kept();
    let at = kept.iter().position(|(kept_id, _)| kept_id == id)?;
    let entry = kept.remove(at)?;
    let data = Arc::clone(&entry.1);
    kept.push_front(entry);
    Some(data)
}

/// The id of a large tree kept decoded whose bytes are exactly `data`: a
/// tree made again (a publish's, whose branch held the package's base, is
/// the proposal's) is named without hashing it once more.
fn kept_large_tree_id(data: &[u8]) -> Option<ObjectId> {
    LargeTrees::kept()
        .iter()
        .find(|(_, kept)| kept.len() == data.len() && **kept == *data)
        .map(|(id, _)| *id)
}

impl gix_pack::cache::Object for LargeTrees {
    fn put(&mut self, id: ObjectId, kind: gix::object::Kind, data: &[u8]) {
        if kind != gix::object::Kind::Tree || data.len() < Self::AT_LEAST {
            return;
        }
        let mut kept = Self::kept();
        if kept.iter().any(|(kept_id, _)| *kept_id == id) {
            return;
        }
        kept.push_front((id, Arc::from(data)));
        let mut bytes = 0;
        let within = kept
            .iter()
            .take(Self::KEPT)
            .take_while(|(_, data)| {
                bytes += data.len();
                bytes <= Self::KEPT_BYTES
            })
            .count();
        kept.truncate(within.max(1));
    }

    fn get(&mut self, id: &ObjectId, out: &mut Vec<u8>) -> Option<gix::object::Kind> {
        let mut kept = Self::kept();
        let at = kept.iter().position(|(kept_id, _)| kept_id == id)?;
        let entry = kept.remove(at)?;
        out.clear();
        out.extend_from_slice(&entry.1);
        kept.push_front(entry);
        Some(gix::object::Kind::Tree)
    }
}

/// A handle's last few large trees resolved from deltas in its packs,
/// by pack and offset (gix's delta-base cache, which it consults at every
/// step of a chain). Snapshots store a root tree of hundreds of kilobytes
/// as a chain of up to [`crate::pack::MAX_DELTA_DEPTH`] deltas: without
/// it, reading each tree of a history (a compaction reads them all)
/// applies its whole chain again, a copy of the tree per delta; with it,
/// a tree whose base was read just before costs one delta.
///
/// One per handle, as gix keys it by the handle's own pack ids.
#[derive(Default)]
struct LargeBases {
    /// Newest first: pack id, offset, kind, packed size and the bytes.
    kept: std::collections::VecDeque<(u32, u64, gix::object::Kind, usize, Vec<u8>)>,
}

impl LargeBases {
    const KEPT: usize = 4;
}

impl gix_pack::cache::DecodeEntry for LargeBases {
    fn put(
        &mut self,
        pack_id: u32,
        offset: u64,
        data: &[u8],
        kind: gix::object::Kind,
        compressed_size: usize,
    ) {
        if kind != gix::object::Kind::Tree || data.len() < crate::pack::LARGE_TREE {
            return;
        }
        if let Some(at) = self
            .kept
            .iter()
            .position(|(p, o, ..)| (*p, *o) == (pack_id, offset))
        {
            if let Some(entry) = self.kept.remove(at) {
                self.kept.push_front(entry);
            }
            return;
        }
        // the oldest entry's buffer is reused
        let mut bytes = if self.kept.len() >= Self::KEPT {
            self.kept
                .pop_back()
                .map(|entry| entry.4)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        bytes.clear();
        bytes.extend_from_slice(data);
        self.kept
            .push_front((pack_id, offset, kind, compressed_size, bytes));
    }

    fn get(
        &mut self,
        pack_id: u32,
        offset: u64,
        out: &mut Vec<u8>,
    ) -> Option<(gix::object::Kind, usize)> {
        let at = self
            .kept
            .iter()
            .position(|(p, o, ..)| (*p, *o) == (pack_id, offset))?;
        let (_, _, kind, packed, bytes) = &self.kept[at];
        out.clear();
        out.extend_from_slice(bytes);
        let found = (*kind, *packed);
        if let Some(entry) = self.kept.remove(at) {
            self.kept.push_front(entry);
        }
        Some(found)
    }
}

/// A git repository on local disk.
pub struct GitRepo {
    pub(crate) repo: gix::Repository,
    /// Every compare-and-swap ref update made through this handle, in
    /// order: what an operation changed, without listing every ref before
    /// and after it.
    journal: std::cell::RefCell<Vec<RefUpdate>>,
}

impl std::fmt::Debug for GitRepo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitRepo")
            .field("path", &self.repo.path())
            .finish()
    }
}

impl GitRepo {
    /// Creates a bare repository (or opens the one already there).
    ///
    /// # Errors
    /// The directory cannot be created or holds something else.
    pub fn init_bare(path: &Path) -> Result<Self, RepoError> {
        if path.join("HEAD").exists() {
            return Self::open(path);
        }
        gix::init_bare(path).map_err(|e| RepoError::Open {
            path: path.display().to_string(),
            source: Box::new(e),
        })?;
        Self::open(path)
    }

    /// Opens a repository isolated from user and system configuration,
    /// sharing what an earlier open of it in this process loaded
    /// ([`crate::opened`]).
    ///
    /// # Errors
    /// No repository at `path`.
    pub fn open(path: &Path) -> Result<Self, RepoError> {
        let mut repo = crate::opened::open(path).map_err(|source| RepoError::Open {
            path: path.display().to_string(),
            source,
        })?;
        repo.objects.set_object_cache(|| Box::new(LargeTrees));
        repo.objects
            .set_pack_cache(|| Box::new(LargeBases::default()));
        Ok(Self {
            repo,
            journal: std::cell::RefCell::new(Vec::new()),
        })
    }

    /// Writes a tree holding exactly `files`.
    ///
    /// # Errors
    /// An unsafe file path, or a failed object write.
    pub fn write_files(&self, files: &Files) -> Result<ObjectId, RepoError> {
        for path in files.keys() {
            validate_file_path(path)?;
        }
        PackageBudget::check(files).map_err(|source| RepoError::TooLarge {
            dir: String::new(),
            source,
        })?;
        let empty = ObjectId::empty_tree(self.repo.object_hash());
        let mut editor = self.repo.edit_tree(empty).map_err(git("start a tree"))?;
        for (path, content) in files {
            let blob = self.repo.write_blob(content).map_err(git("write a blob"))?;
            editor
                .upsert(path.as_str(), EntryKind::Blob, blob.detach())
                .map_err(git("add a file to a tree"))?;
        }
        Ok(editor.write().map_err(git("write a tree"))?.detach())
    }

    /// `base` with the directory at `path` replaced by `subtree` (or removed
    /// when `subtree` is `None`); `base = None` starts from an empty tree.
    ///
    /// # Errors
    /// An unsafe path or a failed object write.
    pub fn replace_subtree(
        &self,
        base: Option<ObjectId>,
        path: &str,
        subtree: Option<ObjectId>,
    ) -> Result<ObjectId, RepoError> {
        validate_file_path(path)?;
        self.replace_subtrees(base, &[(path.to_owned(), subtree)])
    }

    /// `base` with several directories replaced or removed in one pass
    /// (`None` removes); `base = None` starts from an empty tree.
    ///
    /// # Errors
    /// An unsafe path or a failed object write.
    pub fn replace_subtrees(
        &self,
        base: Option<ObjectId>,
        subtrees: &[(String, Option<ObjectId>)],
    ) -> Result<ObjectId, RepoError> {
        for (path, _) in subtrees {
            validate_file_path(path)?;
        }
        if let Some(base) = base
            && let Some(id) = self.splice_subtrees(base, subtrees)?
        {
            return Ok(id);
        }
        let base = base.unwrap_or_else(|| ObjectId::empty_tree(self.repo.object_hash()));
        // the paths are checked above, so gix's own editor is used without
        // its checks, writing trees through `write_tree`
        let mut editor = self
            .repo
            .edit_tree(base)
            .map_err(git("start a tree"))?
            .detach();
        for (path, subtree) in subtrees {
            editor
                .remove(path.split('/'))
                .map_err(git("remove a directory from a tree"))?;
            if let Some(subtree) = subtree {
                editor
                    .upsert(path.split('/'), EntryKind::Tree, *subtree)
                    .map_err(git("add a directory to a tree"))?;
            }
        }
        editor.write(|tree| self.write_tree(tree))
    }

    /// Writes a tree object. A large one (a root tree listing thousands of
    /// packages, mostly object ids that do not compress) is written loose
    /// at compression level 0, a valid zlib stream of stored blocks: level
    /// 1 took ten times as long to save 30%. It is kept decoded for the
    /// reads that follow (the push, the snapshot's pack).
    ///
    /// # Errors
    /// A failed write.
    fn write_tree(&self, tree: &gix::objs::Tree) -> Result<ObjectId, RepoError> {
        use gix::objs::WriteTo;
        let mut data = Vec::with_capacity(tree.entries.len() * 40);
        tree.write_to(&mut data).map_err(git("encode a tree"))?;
        self.write_tree_data(&data)
    }

    /// [`GitRepo::replace_subtrees`] on a large tree, for directories at
    /// its top: the tree's bytes with the entries spliced in and out,
    /// without decoding every entry into an editor and encoding it again.
    /// `None` when the edit is not that (deeper paths, a small tree, an
    /// empty subtree, which the editor drops): the editor does it.
    fn splice_subtrees(
        &self,
        base: ObjectId,
        subtrees: &[(String, Option<ObjectId>)],
    ) -> Result<Option<ObjectId>, RepoError> {
        let empty = ObjectId::empty_tree(self.repo.object_hash());
        if subtrees
            .iter()
            .any(|(path, id)| path.contains('/') || *id == Some(empty))
        {
            return Ok(None);
        }
        let data = self.tree_data(base)?;
        if data.len() < crate::pack::LARGE_TREE {
            return Ok(None);
        }
        // edits of one path: the last one counts
        let edits: std::collections::BTreeMap<&[u8], Option<ObjectId>> = subtrees
            .iter()
            .map(|(path, id)| (path.as_bytes(), *id))
            .collect();
        let spliced = crate::pack::splice_directories(&data, &edits)?;
        self.write_tree_data(&spliced).map(Some)
    }

    fn write_tree_data(&self, data: &[u8]) -> Result<ObjectId, RepoError> {
        if data.len() < crate::pack::LARGE_TREE {
            return gix::objs::Write::write_buf(&self.repo.objects, gix::object::Kind::Tree, data)
                .map_err(git("write a tree"));
        }
        let id = match kept_large_tree_id(data) {
            Some(id) => id,
            None => gix::objs::compute_hash(self.repo.object_hash(), gix::object::Kind::Tree, data)
                .map_err(git("hash a tree"))?,
        };
        // a new tree is usually missing: looked up without listing the
        // pack directory again (a copy in a pack written meanwhile costs a
        // loose duplicate)
        if !self.has_object_without_rescan(id) {
            let mut object = format!("tree {}\0", data.len()).into_bytes();
            object.extend_from_slice(data);
            let mut compressed = Vec::with_capacity(object.len() + object.len() / 64 + 64);
            crate::pack::deflate_into(
                &mut gix::zlib::stream::deflate::Compress::new(gix::zlib::Compression::NONE),
                &object,
                &mut compressed,
            )?;
            let objects = self.repo.objects.store_ref().path();
            crate::pack::write_object_file(&crate::pack::loose_path(objects, &id), &compressed)?;
        }
        gix_pack::cache::Object::put(&mut LargeTrees, id, gix::object::Kind::Tree, data);
        Ok(id)
    }

    /// The git directory.
    pub fn git_dir(&self) -> &Path {
        self.repo.path()
    }

    /// One ref, peeled to the object it points at; `None` if absent.
    ///
    /// # Errors
    /// An unreadable ref.
    pub fn ref_id(&self, name: &str) -> Result<Option<ObjectId>, RepoError> {
        // a branch or tag from its file or the kept parse of `packed-refs`,
        // rather than through a gix handle that maps `packed-refs` (1 MB at
        // 10,000 packages) for each repository opened; an annotated tag's
        // own id is peeled below, as gix would
        if let Some(found) = crate::listing::lookup(self.repo.path(), name) {
            return match found {
                Some(id) => self.peeled(id).map(Some),
                None => Ok(None),
            };
        }
        match self
            .repo
            .try_find_reference(name)
            .map_err(git("read a ref"))?
        {
            Some(mut reference) => Ok(Some(
                reference.peel_to_id().map_err(git("peel a ref"))?.detach(),
            )),
            None => Ok(None),
        }
    }

    /// The object an id names, through any annotated tags to what they
    /// point at.
    fn peeled(&self, id: ObjectId) -> Result<ObjectId, RepoError> {
        let header = self
            .repo
            .find_header(id)
            .map_err(git("read a ref's object"))?;
        if header.kind() != gix::object::Kind::Tag {
            return Ok(id);
        }
        Ok(self
            .repo
            .find_object(id)
            .map_err(git("read a ref's object"))?
            .peel_tags_to_end()
            .map_err(git("peel a ref"))?
            .id)
    }

    /// The refs whose names start with `prefix` (e.g. `refs/tags/a/`),
    /// peeled, without reading the others.
    ///
    /// # Errors
    /// Unreadable refs.
    pub fn refs_with_prefix(&self, prefix: &str) -> Result<BTreeMap<String, ObjectId>, RepoError> {
        // branches and tags from the shared listing (no gix handle mapping
        // `packed-refs`), annotated tags peeled as below
        if (prefix.starts_with("refs/heads/") || prefix.starts_with("refs/tags/"))
            && let Some(listing) = crate::listing::branches_and_tags(self.repo.path())
        {
            return listing
                .prefixed(prefix)
                .map(|(name, id)| Ok((name.clone(), self.peeled(*id)?)))
                .collect();
        }
        let platform = self.repo.references().map_err(git("list refs"))?;
        let mut out = BTreeMap::new();
        let prefix_ref: &gix::bstr::BStr = prefix.as_bytes().as_bstr();
        for reference in platform.prefixed(prefix_ref).map_err(git("list refs"))? {
            let mut reference = reference.map_err(git("read a ref"))?;
            let name = reference.name().as_bstr().to_str_lossy().into_owned();
            let id = reference.peel_to_id().map_err(git("peel a ref"))?;
            out.insert(name, id.detach());
        }
        Ok(out)
    }

    /// Writes a commit object (no ref moves).
    ///
    /// # Errors
    /// A failed object write.
    pub fn commit(
        &self,
        tree: ObjectId,
        parents: &[ObjectId],
        message: &str,
        author: &Identity,
        committer: &Identity,
        seconds_since_epoch: i64,
    ) -> Result<ObjectId, RepoError> {
        let signature = |who: &Identity| gix::actor::Signature {
            name: who.name.as_str().into(),
            email: who.email.as_str().into(),
            time: gix::date::Time::new(seconds_since_epoch, 0),
        };
        let commit = gix::objs::Commit {
            tree,
            parents: parents.iter().copied().collect(),
            author: signature(author),
            committer: signature(committer),
            encoding: None,
            message: message.into(),
            extra_headers: Vec::new(),
        };
        Ok(self
            .repo
            .write_object(&commit)
            .map_err(git("write a commit"))?
            .detach())
    }

    /// The tree of a commit.
    ///
    /// # Errors
    /// No such commit.
    pub fn tree_of(&self, commit: ObjectId) -> Result<ObjectId, RepoError> {
        let commit = self
            .repo
            .find_commit(commit)
            .map_err(git("find a commit"))?;
        commit
            .tree_id()
            .map(|id| id.detach())
            .map_err(git("read a commit's tree"))
    }

    /// Every file entry (path, blob id) in the tree of `commit`.
    fn blobs(&self, commit: ObjectId) -> Result<Vec<(String, ObjectId)>, RepoError> {
        self.blobs_under(self.tree_of(commit)?)
    }

    /// Every file under `tree`, with paths relative to it.
    fn blobs_under(&self, tree: ObjectId) -> Result<Vec<(String, ObjectId)>, RepoError> {
        let tree = self.repo.find_tree(tree).map_err(git("find a tree"))?;
        let mut recorder = gix::traverse::tree::Recorder::default();
        tree.traverse()
            .breadthfirst(&mut recorder)
            .map_err(git("walk a tree"))?;
        Ok(recorder
            .records
            .into_iter()
            .filter(|e| e.mode.is_blob())
            .map(|e| (e.filepath.to_str_lossy().into_owned(), e.oid))
            .collect())
    }

    /// The files under `dir` (slashes trimmed; empty for the whole tree) in
    /// the tree of `commit`, keyed relative to `dir`. Only `dir`'s subtree
    /// is walked, not the rest of the repository.
    ///
    /// # Errors
    /// No such commit, or an unreadable object.
    pub fn read_files(&self, commit: ObjectId, dir: &str) -> Result<Files, RepoError> {
        let dir = dir.trim_matches('/');
        let root = self.tree_of(commit)?;
        let subtree = if dir.is_empty() {
            root
        } else {
            let tree = self.repo.find_tree(root).map_err(git("find a tree"))?;
            match tree
                .lookup_entry_by_path(dir)
                .map_err(git("look up a path"))?
            {
                Some(entry) if entry.mode().is_tree() => entry.object_id(),
                _ => return Ok(Files::new()),
            }
        };
        let too_large = |source| RepoError::TooLarge {
            dir: dir.to_owned(),
            source,
        };
        let blobs = self.blobs_under(subtree)?;
        if blobs.len() > MAX_PACKAGE_FILES {
            return Err(too_large(LimitError::TooManyFiles));
        }
        // sizes from the object headers first: nothing over the limits is
        // inflated
        let mut budget = PackageBudget::default();
        for (path, id) in &blobs {
            let size = self
                .repo
                .find_header(*id)
                .map_err(git("read a blob header"))?
                .size();
            budget
                .add(path, usize::try_from(size).unwrap_or(usize::MAX))
                .map_err(too_large)?;
        }
        let mut files = Files::new();
        for (path, id) in blobs {
            let blob = self.repo.find_blob(id).map_err(git("read a blob"))?;
            files.insert(path, blob.data.clone());
        }
        Ok(files)
    }

    /// Paths of every file in the tree of `commit`.
    ///
    /// # Errors
    /// No such commit, or an unreadable tree.
    pub fn list_files(&self, commit: ObjectId) -> Result<Vec<String>, RepoError> {
        Ok(self
            .blobs(commit)?
            .into_iter()
            .map(|(path, _)| path)
            .collect())
    }

    /// One file of the tree of `commit`, if it is there.
    ///
    /// # Errors
    /// No such commit, or an unreadable object.
    pub fn file(&self, commit: ObjectId, path: &str) -> Result<Option<Vec<u8>>, RepoError> {
        let tree = self
            .repo
            .find_tree(self.tree_of(commit)?)
            .map_err(git("find a tree"))?;
        let Some(entry) = tree
            .lookup_entry_by_path(path)
            .map_err(git("look up a path"))?
        else {
            return Ok(None);
        };
        if !entry.mode().is_blob() {
            return Ok(None);
        }
        let size = self
            .repo
            .find_header(entry.object_id())
            .map_err(git("read a blob header"))?
            .size();
        if size > MAX_FILE_BYTES as u64 {
            return Err(RepoError::TooLarge {
                dir: path.rsplit_once('/').map_or("", |(d, _)| d).to_owned(),
                source: LimitError::FileTooLarge {
                    path: path.to_owned(),
                    size: usize::try_from(size).unwrap_or(usize::MAX),
                },
            });
        }
        let blob = self
            .repo
            .find_blob(entry.object_id())
            .map_err(git("read a blob"))?;
        Ok(Some(blob.data.clone()))
    }

    /// Author, time and message of a commit.
    ///
    /// # Errors
    /// No such commit, or one that does not decode.
    pub fn commit_info(&self, id: ObjectId) -> Result<CommitInfo, RepoError> {
        let commit = self.repo.find_commit(id).map_err(git("find a commit"))?;
        let author = commit.author().map_err(git("read a commit's author"))?;
        let seconds = author.time().map(|t| t.seconds).unwrap_or_default();
        Ok(CommitInfo {
            author_name: author.name.to_str_lossy().into_owned(),
            author_email: author.email.to_str_lossy().into_owned(),
            author_time: seconds,
            message: commit.message_raw_sloppy().to_str_lossy().into_owned(),
        })
    }

    /// Every ref, peeled to the object it points at.
    ///
    /// # Errors
    /// The refs cannot be read.
    pub fn refs(&self) -> Result<BTreeMap<String, ObjectId>, RepoError> {
        // another process may delete a loose ref between listing and reading
        // it; list again rather than fail
        const ATTEMPTS: usize = 8;
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            match self.try_refs() {
                Ok(refs) => return Ok(refs),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(1 << attempt.min(5)));
        }
        Err(last.unwrap_or_else(|| RepoError::Git {
            step: "list refs",
            source: "no attempt was made".into(),
        }))
    }

    fn try_refs(&self) -> Result<BTreeMap<String, ObjectId>, RepoError> {
        let platform = self.repo.references().map_err(git("list refs"))?;
        let mut out = BTreeMap::new();
        for reference in platform.all().map_err(git("list refs"))? {
            let mut reference = reference.map_err(git("read a ref"))?;
            let name = reference.name().as_bstr().to_str_lossy().into_owned();
            let id = reference.peel_to_id().map_err(git("peel a ref"))?;
            out.insert(name, id.detach());
        }
        Ok(out)
    }

    /// Compare-and-swap of one ref: `expected` is its current value (`None`:
    /// it must not exist), `new` the value to set (`None`: delete it).
    ///
    /// # Errors
    /// [`RepoError::Conflict`] when the ref is not at `expected`.
    pub fn update_ref(
        &self,
        name: &str,
        expected: Option<ObjectId>,
        new: Option<ObjectId>,
    ) -> Result<(), RepoError> {
        self.update_refs(&[RefUpdate {
            name: name.to_owned(),
            expected,
            new,
        }])
    }

    /// Several compare-and-swap ref updates in one transaction: all refs are
    /// locked, every expected value is checked, then all change or none.
    ///
    /// # Errors
    /// [`RepoError::Conflict`] naming the first ref not at its expected value.
    pub fn update_refs(&self, updates: &[RefUpdate]) -> Result<(), RepoError> {
        let mut edits = Vec::with_capacity(updates.len());
        for update in updates {
            let name: FullName = update
                .name
                .as_str()
                .try_into()
                .map_err(git("parse a ref name"))?;
            let expected = match update.expected {
                Some(id) => PreviousValue::MustExistAndMatch(Target::Object(id)),
                None => PreviousValue::MustNotExist,
            };
            let change = match update.new {
                Some(id) => Change::Update {
                    log: LogChange::default(),
                    expected,
                    new: Target::Object(id),
                },
                None => Change::Delete {
                    expected,
                    log: RefLog::AndReference,
                },
            };
            edits.push(RefEdit {
                change,
                name,
                deref: false,
            });
        }
        let current = || -> Result<BTreeMap<String, ObjectId>, RepoError> {
            let mut refs = BTreeMap::new();
            for update in updates {
                if let Some(id) = self.ref_id(&update.name)? {
                    refs.insert(update.name.clone(), id);
                }
            }
            Ok(refs)
        };
        let conflict = |refs: &BTreeMap<String, ObjectId>| {
            updates.iter().find_map(|u| {
                let actual = refs.get(&u.name).copied();
                (actual != u.expected).then(|| RepoError::Conflict {
                    name: u.name.clone(),
                    expected: u
                        .expected
                        .map_or_else(|| "no ref".to_owned(), |id| id.to_string()),
                    actual: actual.map_or_else(|| "no ref".to_owned(), |id| id.to_string()),
                })
            })
        };
        if let Some(err) = conflict(&current()?) {
            return Err(err);
        }
        self.repo.edit_references(edits).map_err(|e| {
            // lost a race after the check: say which ref moved
            match current().ok().as_ref().and_then(conflict) {
                Some(err) => err,
                None => RepoError::Git {
                    step: "update refs",
                    source: Box::new(e),
                },
            }
        })?;
        self.journal.borrow_mut().extend_from_slice(updates);
        Ok(())
    }

    /// The net effect of the ref updates made through this handle since it
    /// was opened (or last asked), as compare-and-swap updates from the
    /// values before the first to the values after the last; refs that
    /// ended where they started are left out. Clears the journal.
    pub fn take_ref_changes(&self) -> Vec<RefUpdate> {
        let mut net: BTreeMap<String, RefUpdate> = BTreeMap::new();
        for update in self.journal.borrow_mut().drain(..) {
            net.entry(update.name.clone())
                .and_modify(|u| u.new = update.new)
                .or_insert(update);
        }
        net.into_values().filter(|u| u.expected != u.new).collect()
    }

    /// Makes the branches and tags exactly `refs` (a mirror of a remote):
    /// others are deleted, the rest set whatever their value. Only for a
    /// repository that is a cache of a remote; every other change goes
    /// through [`GitRepo::update_refs`].
    ///
    /// # Errors
    /// A bad ref name, or a failed ref write.
    pub fn mirror_refs(&self, refs: &crate::listing::RefMap) -> Result<(), RepoError> {
        let current = self.branches_and_tags()?;
        self.mirror_refs_from(&current, refs)
    }

    /// [`GitRepo::mirror_refs`] for a caller that has just listed the
    /// branches and tags (`current`): a few changes are written as loose
    /// refs, many as one packed-refs file.
    ///
    /// # Errors
    /// A bad ref name, or a failed ref write.
    pub fn mirror_refs_from(
        &self,
        current: &crate::listing::RefMap,
        refs: &crate::listing::RefMap,
    ) -> Result<(), RepoError> {
        /// Changes written one loose ref each; more rewrite packed-refs.
        const FEW: usize = 64;
        let checked = |name: &str| -> Result<FullName, RepoError> {
            let full = FullName::try_from(name).map_err(git("parse a ref name"))?;
            if !mirrored(name) {
                return Err(RepoError::Git {
                    step: "mirror the remote's refs",
                    source: format!("{name} is not a branch or tag").into(),
                });
            }
            Ok(full)
        };
        // only the names that change are looked at while they are few
        let differences = crate::listing::differences(current, refs);
        if differences.is_empty() {
            return Ok(());
        }
        let mut edits = Vec::new();
        for (name, _, id) in differences.iter().take(FEW + 1) {
            let name = checked(name)?;
            edits.push(RefEdit {
                change: match id {
                    Some(id) => Change::Update {
                        log: LogChange::default(),
                        expected: PreviousValue::Any,
                        new: Target::Object(*id),
                    },
                    None => Change::Delete {
                        expected: PreviousValue::Any,
                        log: RefLog::AndReference,
                    },
                },
                name,
                deref: false,
            });
        }
        // a loose ref that cannot be written (a file where a directory
        // must go) is settled by the whole rewrite below, and so are loose
        // refs grown past what a listing should read each time
        let loose = crate::listing::loose_count(self.repo.path()).unwrap_or(0);
        if edits.len() <= FEW
            && loose + edits.len() <= crate::packed_refs::PACK_LOOSE_AT
            && self.repo.edit_references(edits).is_ok()
        {
            return Ok(());
        }
        // One packed-refs file written whole, then the loose branch and tag
        // files removed: a mirror of a large remote would otherwise create
        // (and later read) one file per ref. gix locks packed-refs for any
        // change, so a lock left by a writer that died fails the loose
        // write above for good; this rewrite breaks it once it is stale.
        crate::packed_refs::write_mirror_refs(self.repo.path(), current, refs).map_err(|e| {
            RepoError::Git {
                step: "mirror the remote's refs",
                source: e.into(),
            }
        })
    }

    /// Every branch and tag with the id it holds (an annotated tag's own
    /// id), shared: read through [`crate::listing`], which keeps the parse
    /// of `packed-refs` while it does not change.
    ///
    /// # Errors
    /// The refs cannot be read.
    pub fn branches_and_tags(&self) -> Result<std::sync::Arc<crate::listing::RefMap>, RepoError> {
        if let Some(refs) = crate::listing::branches_and_tags(self.repo.path()) {
            return Ok(refs);
        }
        let mut refs = self.try_refs_unpeeled()?;
        refs.retain(|name, _| mirrored(name));
        Ok(std::sync::Arc::new(refs.into()))
    }

    /// Every direct ref with the id it holds (an annotated tag's own id).
    ///
    /// # Errors
    /// The refs cannot be read.
    pub fn try_refs_unpeeled(&self) -> Result<BTreeMap<String, ObjectId>, RepoError> {
        let platform = self.repo.references().map_err(git("list refs"))?;
        let mut out = BTreeMap::new();
        for reference in platform.all().map_err(git("list refs"))? {
            let reference = reference.map_err(git("read a ref"))?;
            if let Some(id) = reference.target().try_id() {
                out.insert(
                    reference.name().as_bstr().to_str_lossy().into_owned(),
                    id.to_owned(),
                );
            }
        }
        Ok(out)
    }

    /// The first-parent history of `commit`, newest first, at most `limit`.
    ///
    /// # Errors
    /// An unreadable commit.
    pub fn first_parents(
        &self,
        commit: ObjectId,
        limit: usize,
    ) -> Result<Vec<ObjectId>, RepoError> {
        let mut out = Vec::new();
        let mut at = Some(commit);
        while let Some(id) = at {
            if out.len() >= limit {
                break;
            }
            out.push(id);
            let c = self.repo.find_commit(id).map_err(git("find a commit"))?;
            at = c.parent_ids().next().map(|p| p.detach());
        }
        Ok(out)
    }
}

/// One compare-and-swap ref update: `expected` `None` means the ref must not
/// exist, `new` `None` deletes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefUpdate {
    pub name: String,
    pub expected: Option<ObjectId>,
    pub new: Option<ObjectId>,
}

/// Path lookups in many commits that share trees: every tree is decoded
/// once into a map, so a thousand tags of one root cost one decode.
pub(crate) struct PathLookup<'r> {
    repo: &'r GitRepo,
    trees: std::collections::HashMap<
        ObjectId,
        std::collections::HashMap<Vec<u8>, (EntryKind, ObjectId)>,
    >,
    roots: std::collections::HashMap<ObjectId, ObjectId>,
}

impl<'r> PathLookup<'r> {
    pub(crate) fn new(repo: &'r GitRepo) -> Self {
        Self {
            repo,
            trees: std::collections::HashMap::new(),
            roots: std::collections::HashMap::new(),
        }
    }

    fn entries(
        &mut self,
        tree: ObjectId,
    ) -> Result<&std::collections::HashMap<Vec<u8>, (EntryKind, ObjectId)>, RepoError> {
        if !self.trees.contains_key(&tree) {
            let object = self.repo.repo.find_tree(tree).map_err(git("read a tree"))?;
            let decoded = object.decode().map_err(git("decode a tree"))?;
            let map = decoded
                .entries
                .iter()
                .map(|e| (e.filename.to_vec(), (e.mode.kind(), e.oid.to_owned())))
                .collect();
            self.trees.insert(tree, map);
        }
        self.trees.get(&tree).ok_or_else(|| RepoError::Git {
            step: "read a tree",
            source: "tree cache lost an entry".into(),
        })
    }

    /// The id and kind of the entry at `path` in `commit`'s tree.
    pub(crate) fn entry(
        &mut self,
        commit: ObjectId,
        path: &str,
    ) -> Result<Option<(EntryKind, ObjectId)>, RepoError> {
        let mut tree = match self.roots.get(&commit) {
            Some(tree) => *tree,
            None => {
                let tree = self.repo.tree_of(commit)?;
                self.roots.insert(commit, tree);
                tree
            }
        };
        let mut segments = path.split('/').peekable();
        while let Some(segment) = segments.next() {
            let Some((kind, id)) = self.entries(tree)?.get(segment.as_bytes()).copied() else {
                return Ok(None);
            };
            if segments.peek().is_none() {
                return Ok(Some((kind, id)));
            }
            if kind != EntryKind::Tree {
                return Ok(None);
            }
            tree = id;
        }
        Ok(None)
    }

    /// A blob's content, unless it is larger than a file may be.
    pub(crate) fn blob(&self, id: ObjectId) -> Result<Vec<u8>, RepoError> {
        let size = self
            .repo
            .repo
            .find_header(id)
            .map_err(git("read a blob header"))?
            .size();
        if size > MAX_FILE_BYTES as u64 {
            return Err(RepoError::TooLarge {
                dir: String::new(),
                source: LimitError::FileTooLarge {
                    path: id.to_string(),
                    size: usize::try_from(size).unwrap_or(usize::MAX),
                },
            });
        }
        Ok(self
            .repo
            .repo
            .find_blob(id)
            .map_err(git("read a blob"))?
            .data
            .clone())
    }
}

#[cfg(test)]
mod tests {
    use super::LargeBases;
    use gix::object::Kind;
    use gix_pack::cache::DecodeEntry as _;

    fn tree(fill: u8) -> Vec<u8> {
        vec![fill; crate::pack::LARGE_TREE]
    }

    #[test]
    fn large_bases_keep_the_last_large_trees_by_pack_and_offset() {
        let mut cache = LargeBases::default();
        let mut out = b"stale".to_vec();
        // small objects and large non-trees are left to be resolved again
        cache.put(1, 10, b"small tree", Kind::Tree, 9);
        cache.put(1, 20, &tree(b'b'), Kind::Blob, 9);
        assert_eq!(cache.get(1, 10, &mut out), None);
        assert_eq!(cache.get(1, 20, &mut out), None);
        for offset in 0..LargeBases::KEPT as u8 {
            cache.put(1, u64::from(offset), &tree(offset), Kind::Tree, 7);
        }
        // the same offset in another pack is another object
        assert_eq!(cache.get(2, 0, &mut out), None);
        assert_eq!(cache.get(1, 0, &mut out), Some((Kind::Tree, 7)));
        assert_eq!(out, tree(0));
        // one more: the least recently used (offset 1, as 0 was just read)
        // goes
        cache.put(1, 99, &tree(99), Kind::Tree, 5);
        assert_eq!(cache.get(1, 1, &mut out), None);
        assert_eq!(cache.get(1, 0, &mut out), Some((Kind::Tree, 7)));
        assert_eq!(cache.get(1, 99, &mut out), Some((Kind::Tree, 5)));
        assert_eq!(out, tree(99));
        assert_eq!(cache.kept.len(), LargeBases::KEPT);
    }
}
