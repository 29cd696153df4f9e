//! Pack files: the objects a remote lacks, written as a pack to push or to
//! upload to a snapshot; and received packs indexed into a repository.
//!
//! Which objects a remote lacks is computed from the commit graph: the
//! commits reachable from the new tips but not from any tip the remote is
//! known to have, and in each of them the trees and blobs that differ from
//! the same path in every parent. Unchanged subtrees are skipped by id, so
//! the cost grows with the size of the change, not of the repository.

use crate::repo::{GitRepo, RepoError};
use gix::ObjectId;
use gix::objs::tree::EntryKind;
use gix::progress::Discard;
use gix_pack::data::output;
use std::collections::HashSet;
use std::sync::atomic::AtomicBool;

fn pack_error(step: &'static str) -> impl FnOnce(gix::Error) -> RepoError {
    move |e| RepoError::Git {
        step,
        source: e.into(),
    }
}

/// Git's order of tree entries: by name, a tree's name compared as if it
/// ended with `/`.
fn git_order(a: &[u8], a_tree: bool, b: &[u8], b_tree: bool) -> std::cmp::Ordering {
    let common = a.len().min(b.len());
    a[..common].cmp(&b[..common]).then_with(|| {
        let next = |name: &[u8], tree: bool| {
            name.get(common)
                .copied()
                .unwrap_or(if tree { b'/' } else { 0 })
        };
        next(a, a_tree)
            .cmp(&next(b, b_tree))
            .then_with(|| a.len().cmp(&b.len()))
    })
}

/// A pack in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pack {
    /// The pack file's bytes (header, entries, trailer).
    pub bytes: Vec<u8>,
    /// How many objects it holds.
    pub objects: u32,
}

/// Where a received pack was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedPack {
    /// The pack's checksum, which names its `.pack` and `.idx` files.
    pub checksum: ObjectId,
    pub objects: u32,
}

impl GitRepo {
    /// Whether the object database holds `id`.
    pub fn has_object(&self, id: ObjectId) -> bool {
        self.repo.has_object(id)
    }

    /// Writes `ids` into `to` as loose objects (ids `to` has are skipped):
    /// for a few objects, cheaper than a pack and its index. An object that
    /// is loose here is copied as its file, still compressed (a root tree
    /// of 10,000 packages is 350 KB to inflate, hash and deflate again
    /// otherwise). Blobs first, then trees, commits and tags last, so a
    /// reader that sees an object finds what it points to.
    ///
    /// # Errors
    /// An object missing here, or a failed write.
    pub fn copy_loose(&self, ids: &[ObjectId], to: &GitRepo) -> Result<(), RepoError> {
        use gix::objs::Write as _;
        enum Source {
            File(std::path::PathBuf),
            Data(Vec<u8>),
        }
        let here = self.repo.objects.store_ref().path().to_path_buf();
        let there = to.repo.objects.store_ref().path().to_path_buf();
        let mut objects = Vec::with_capacity(ids.len());
        for id in ids {
            if to.has_object(*id) {
                continue;
            }
            let header = self.repo.find_header(*id).map_err(|e| RepoError::Git {
                step: "read an object to copy",
                source: Box::new(e),
            })?;
            let kind = header.kind();
            let rank = match kind {
                gix::objs::Kind::Blob => 0,
                gix::objs::Kind::Tree => 1,
                gix::objs::Kind::Commit => 2,
                gix::objs::Kind::Tag => 3,
            };
            let source = match header {
                gix::odb::find::Header::Loose { .. } => Source::File(loose_path(&here, id)),
                gix::odb::find::Header::Packed(_) => Source::Data(self.object_data(*id)?),
            };
            objects.push((rank, *id, kind, source));
        }
        objects.sort_by_key(|(rank, _, _, _)| *rank);
        for (_, id, kind, source) in objects {
            let data = match source {
                Source::File(path) => match std::fs::read(&path) {
                    Ok(compressed) => {
                        write_loose_file(&loose_path(&there, &id), &compressed)?;
                        continue;
                    }
                    // packed meanwhile (a concurrent writer): read it there
                    Err(_) => self.object_data(id)?,
                },
                Source::Data(data) => data,
            };
            to.repo
                .objects
                .write_buf(kind, &data)
                .map_err(|e| RepoError::Git {
                    step: "write a copied object",
                    source: e.into(),
                })?;
        }
        Ok(())
    }

    fn object_data(&self, id: ObjectId) -> Result<Vec<u8>, RepoError> {
        let object = self.repo.find_object(id).map_err(|e| RepoError::Git {
            step: "read an object to copy",
            source: Box::new(e),
        })?;
        Ok(object.detach().data)
    }

    /// The ids of the objects reachable from `tips` and not from `known`
    /// (tips the other side has; ids missing here are ignored).
    ///
    /// # Errors
    /// A missing or unreadable object under `tips`.
    pub fn missing_objects(
        &self,
        tips: &[ObjectId],
        known: &[ObjectId],
    ) -> Result<Vec<ObjectId>, RepoError> {
        let known_set: HashSet<ObjectId> = known.iter().copied().collect();
        self.objects_to_send(tips, &|id| known_set.contains(id), &|| {
            Ok(known_set.iter().copied().collect())
        })
    }

    /// The ids of the objects reachable from `tips` that `target` lacks:
    /// the walk stops at the first commits `target` holds (a repository
    /// holding a commit holds what it reaches), so no ref of `target` is
    /// listed unless the new history is long.
    ///
    /// # Errors
    /// A missing or unreadable object under `tips`; unreadable refs of
    /// `target` when the walk needs them.
    pub fn objects_missing_from(
        &self,
        tips: &[ObjectId],
        target: &GitRepo,
    ) -> Result<Vec<ObjectId>, RepoError> {
        self.objects_to_send(tips, &|id| target.has_object(*id), &|| {
            Ok(target.try_refs_unpeeled()?.into_values().collect())
        })
    }

    /// The objects reachable from `tips` and not from commits for which
    /// `known` holds; `hidden` lists the tips to hide from an exact walk
    /// when the quick one grows large.
    fn objects_to_send(
        &self,
        tips: &[ObjectId],
        known: &dyn Fn(&ObjectId) -> bool,
        hidden: &dyn Fn() -> Result<Vec<ObjectId>, RepoError>,
    ) -> Result<Vec<ObjectId>, RepoError> {
        let mut tips: Vec<ObjectId> = tips.iter().copied().filter(|t| !known(t)).collect();
        tips.sort();
        tips.dedup();
        if tips.is_empty() {
            return Ok(Vec::new());
        }
        // annotated tags are sent themselves, their commits walked
        let mut tag_objects = Vec::new();
        let mut tree_tips = Vec::new();
        let mut commit_tips = Vec::new();
        for tip in tips {
            let mut id = tip;
            loop {
                let object = self.repo.find_object(id).map_err(|e| RepoError::Git {
                    step: "read an object to send",
                    source: Box::new(e),
                })?;
                match object.kind {
                    gix::objs::Kind::Tag => {
                        tag_objects.push(id);
                        id = object
                            .into_tag()
                            .target_id()
                            .map_err(|e| RepoError::Git {
                                step: "read a tag to send",
                                source: Box::new(e),
                            })?
                            .detach();
                        if known(&id) {
                            break;
                        }
                    }
                    gix::objs::Kind::Commit => {
                        commit_tips.push(id);
                        break;
                    }
                    gix::objs::Kind::Tree => {
                        tree_tips.push(id);
                        break;
                    }
                    gix::objs::Kind::Blob => {
                        tag_objects.push(id);
                        break;
                    }
                }
            }
        }
        let tips = commit_tips;
        let commits = match self.commits_until_known(&tips, known)? {
            Some(commits) => commits,
            None => {
                let known: Vec<ObjectId> = hidden()?
                    .into_iter()
                    .filter(|id| self.repo.has_object(*id))
                    .collect();
                let walk = self
                    .repo
                    .rev_walk(tips)
                    .with_hidden(known)
                    .all()
                    .map_err(|e| RepoError::Git {
                        step: "walk the commits to send",
                        source: Box::new(e),
                    })?;
                let mut commits = Vec::new();
                for info in walk {
                    let info = info.map_err(|e| RepoError::Git {
                        step: "walk the commits to send",
                        source: Box::new(e),
                    })?;
                    commits.push(info.id);
                }
                commits
            }
        };
        let mut seen: HashSet<ObjectId> = tag_objects.iter().copied().collect();
        let mut out = tag_objects;
        for tree in tree_tips {
            self.new_tree_objects(tree, &[], &mut seen, &mut out)?;
        }
        for commit in commits {
            let (tree, parents) = self.commit_tree_and_parents(commit)?;
            out.push(commit);
            let parent_trees = parents
                .into_iter()
                .map(|p| self.commit_tree_and_parents(p).map(|(t, _)| Some(t)))
                .collect::<Result<Vec<_>, _>>()?;
            self.new_tree_objects(tree, &parent_trees, &mut seen, &mut out)?;
        }
        Ok(out)
    }

    /// The commits from `tips` back to the first known ones, when that
    /// takes few steps (the usual case: new commits on top of known
    /// heads); `None` when the walk grows large, and the exact walk with
    /// every known tip hidden is used instead. A commit reachable from a
    /// known one without being known itself may be included: that only
    /// sends objects twice.
    fn commits_until_known(
        &self,
        tips: &[ObjectId],
        known: &dyn Fn(&ObjectId) -> bool,
    ) -> Result<Option<Vec<ObjectId>>, RepoError> {
        const BUDGET: usize = 1024;
        let mut queue: std::collections::VecDeque<ObjectId> = tips.iter().copied().collect();
        let mut seen: HashSet<ObjectId> = tips.iter().copied().collect();
        let mut out = Vec::new();
        while let Some(commit) = queue.pop_front() {
            if out.len() >= BUDGET {
                return Ok(None);
            }
            out.push(commit);
            for parent in self.commit_tree_and_parents(commit)?.1 {
                if !known(&parent) && seen.insert(parent) {
                    queue.push_back(parent);
                }
            }
        }
        Ok(Some(out))
    }

    fn commit_tree_and_parents(
        &self,
        id: ObjectId,
    ) -> Result<(ObjectId, Vec<ObjectId>), RepoError> {
        let commit = self.repo.find_commit(id).map_err(|e| RepoError::Git {
            step: "read a commit to send",
            source: Box::new(e),
        })?;
        let tree = commit.tree_id().map_err(|e| RepoError::Git {
            step: "read a commit's tree",
            source: Box::new(e),
        })?;
        Ok((
            tree.detach(),
            commit.parent_ids().map(|p| p.detach()).collect(),
        ))
    }

    fn find_tree(&self, id: ObjectId) -> Result<gix::Tree<'_>, RepoError> {
        self.repo.find_tree(id).map_err(|e| RepoError::Git {
            step: "read a tree to send",
            source: Box::new(e),
        })
    }

    /// Adds `tree` and everything under it that differs from the entry at
    /// the same path in every one of `parents` (`None`: absent there).
    ///
    /// Trees list their entries in git's order, so each parent is walked
    /// once alongside the tree, with no lookup table: a root tree of
    /// thousands of packages costs one pass over its bytes. A tree that is
    /// not in git's order only makes entries look new (sent twice, never
    /// missed).
    fn new_tree_objects(
        &self,
        tree: ObjectId,
        parents: &[Option<ObjectId>],
        seen: &mut HashSet<ObjectId>,
        out: &mut Vec<ObjectId>,
    ) -> Result<(), RepoError> {
        if parents.contains(&Some(tree)) || !seen.insert(tree) {
            return Ok(());
        }
        out.push(tree);
        fn decode_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> RepoError {
            RepoError::Git {
                step: "decode a tree to send",
                source: Box::new(e),
            }
        }
        let own = self.find_tree(tree)?;
        let own = own.decode().map_err(decode_error)?;
        let parent_trees = parents
            .iter()
            .map(|p| p.map(|p| self.find_tree(p)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let parent_entries = parent_trees
            .iter()
            .map(|t| {
                t.as_ref()
                    .map(|t| t.decode().map(|d| d.entries))
                    .transpose()
                    .map_err(decode_error)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut cursors = vec![0usize; parent_entries.len()];
        let mut at_parents: Vec<Option<ObjectId>> = Vec::with_capacity(parents.len());
        for entry in &own.entries {
            let is_tree = entry.mode.is_tree();
            at_parents.clear();
            for (entries, cursor) in parent_entries.iter().zip(cursors.iter_mut()) {
                let found = entries.as_ref().and_then(|entries| {
                    while let Some(other) = entries.get(*cursor) {
                        match git_order(
                            other.filename,
                            other.mode.is_tree(),
                            entry.filename,
                            is_tree,
                        ) {
                            std::cmp::Ordering::Less => *cursor += 1,
                            std::cmp::Ordering::Equal => return Some(other.oid.to_owned()),
                            std::cmp::Ordering::Greater => return None,
                        }
                    }
                    None
                });
                at_parents.push(found);
            }
            let id = entry.oid.to_owned();
            match entry.mode.kind() {
                EntryKind::Tree => self.new_tree_objects(id, &at_parents, seen, out)?,
                EntryKind::Commit => {} // a submodule's commit lives elsewhere
                EntryKind::Blob | EntryKind::BlobExecutable | EntryKind::Link => {
                    if !at_parents.contains(&Some(id)) && seen.insert(id) {
                        out.push(id);
                    }
                }
            }
        }
        Ok(())
    }

    /// A pack (version 2, every object whole: no deltas, so it never
    /// depends on objects outside it) of `ids`, compressed at zlib's
    /// fastest level: a root tree listing thousands of packages is mostly
    /// object ids, which do not compress, and level 6 took three times as
    /// long for a few percent.
    ///
    /// # Errors
    /// A missing object, or a failed pack write.
    pub fn write_pack(&self, ids: &[ObjectId]) -> Result<Pack, RepoError> {
        let objects = u32::try_from(ids.len()).map_err(|_| RepoError::Git {
            step: "write a pack",
            source: "more than 4 billion objects".into(),
        })?;
        let mut entries = Vec::with_capacity(ids.len());
        for id in ids {
            let object = self.repo.find_object(*id).map_err(|e| RepoError::Git {
                step: "read an object to pack",
                source: Box::new(e),
            })?;
            let data = gix::objs::Data::new(&object.data, object.kind, gix::hash::Kind::Sha1);
            let count = output::Count::from_data(*id, None);
            entries.push(
                output::Entry::from_data(&count, &data, gix::zlib::Compression::BEST_SPEED)
                    .map_err(pack_error("compress an object"))?,
            );
        }
        let mut bytes = Vec::new();
        let writer = output::bytes::FromEntriesIter::new(
            std::iter::once(Ok(entries)),
            &mut bytes,
            objects,
            gix_pack::data::Version::V2,
            gix::hash::Kind::Sha1,
        );
        for written in writer {
            written.map_err(pack_error("write a pack"))?;
        }
        Ok(Pack { bytes, objects })
    }

    /// Stores a pack (as received from a remote or a snapshot) with its
    /// index in `objects/pack`. An empty pack stores nothing.
    ///
    /// # Errors
    /// A malformed or truncated pack, or a failed write.
    pub fn index_pack(&self, pack: &[u8]) -> Result<Option<IndexedPack>, RepoError> {
        let directory = self.repo.objects.store_ref().path().join("pack");
        std::fs::create_dir_all(&directory).map_err(|e| RepoError::Git {
            step: "create objects/pack",
            source: Box::new(e),
        })?;
        Self::index_pack_into(pack, &directory)
    }

    /// Writes `pack` with its index into `directory` (which must exist) as
    /// `pack-<checksum>.pack` and `.idx`; `None` for an empty pack.
    ///
    /// # Errors
    /// A malformed pack, or a failed write.
    pub fn index_pack_into(
        pack: &[u8],
        directory: &std::path::Path,
    ) -> Result<Option<IndexedPack>, RepoError> {
        if pack.len() >= 12 && pack[8..12] == [0, 0, 0, 0] {
            return Ok(None);
        }
        let interrupt = AtomicBool::new(false);
        let mut reader = std::io::BufReader::new(pack);
        let outcome = gix_pack::Bundle::write_to_directory(
            &mut reader,
            Some(directory),
            &mut Discard,
            &interrupt,
            None::<gix::objs::find::Never>,
            gix::hash::Kind::Sha1,
            gix_pack::bundle::write::Options::default(),
        )
        .map_err(pack_error("index a received pack"))?;
        if let Some(keep) = &outcome.keep_path {
            // the refs that make these objects reachable are written next;
            // nothing here collects garbage in between
            let _ = std::fs::remove_file(keep);
        }
        Ok(Some(IndexedPack {
            checksum: outcome.index.data_hash,
            objects: outcome.index.num_objects,
        }))
    }
}

/// Where the loose object `id` lives under the objects directory `objects`.
fn loose_path(objects: &std::path::Path, id: &ObjectId) -> std::path::PathBuf {
    let hex = id.to_hex().to_string();
    let (fan, rest) = hex.split_at(2);
    objects.join(fan).join(rest)
}

/// Writes a loose object's compressed file: to a temporary name beside it,
/// then renamed, so a reader never sees half of it.
fn write_loose_file(path: &std::path::Path, compressed: &[u8]) -> Result<(), RepoError> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let io = |e: std::io::Error| RepoError::Git {
        step: "write a copied object",
        source: Box::new(e),
    };
    let dir = path.parent().ok_or_else(|| RepoError::Git {
        step: "write a copied object",
        source: "an object path without a directory".into(),
    })?;
    std::fs::create_dir_all(dir).map_err(io)?;
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("tmp_obj_{}_{n}", std::process::id()));
    std::fs::write(&tmp, compressed).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}
