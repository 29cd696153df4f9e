//! Repositories opened in this process, kept by path so that an operation
//! opening the same repository again reuses what the last one loaded: the
//! parsed configuration, the object database's loaded pack indices and
//! mapped packs, and the `packed-refs` map.
//!
//! A flow opens its mirror a dozen times. Opened afresh each time, the
//! repository parses its configuration, lists its pack directory, maps each
//! pack and index it reads, and maps `packed-refs` (1 MB at 10,000
//! packages), then unmaps them all when the handle drops; the unmapping of
//! pages touched grows with the repository.
//!
//! What is kept is checked at every open against the disk, since other
//! handles and processes (git, the CLI run twice) change the repository
//! between two opens. Each check compares a [`FileStamp`], and a stamp too
//! recent to stand for what it stamps counts as changed:
//! * the objects directory and the configuration file: a repository
//!   deleted and created again at the same path, or its configuration
//!   changed, is opened afresh;
//! * the pack directory: when it changed, the object database lists it
//!   again, so that an open sees the packs written before it as a fresh
//!   open would ([`crate::repo::GitRepo::has_object_without_rescan`] relies
//!   on it). The database has a fixed number of index slots, sized at open
//!   with room to spare; a repository that outgrew half of them is opened
//!   afresh;
//! * `packed-refs`: gix reloads it on a later modification time only, which
//!   a rewrite within one tick of the coarse clock does not give, so it is
//!   reloaded here when its stamp changed.

use crate::listing::FileStamp;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Repositories kept; opening one more drops the least recently opened.
const KEPT: usize = 8;

/// Index slots given to the object database beyond twice the indices the
/// repository had when opened.
const SPARE_SLOTS: usize = 64;

struct Kept {
    path: PathBuf,
    objects: FileStamp,
    config: Option<FileStamp>,
    slots: usize,
    /// The pack directory when the object database last listed it, once
    /// settled; `None` while only a listing can tell.
    packs: Option<FileStamp>,
    /// `packed-refs` when gix's copy was last loaded here, once settled.
    packed_refs: Option<FileStamp>,
    repo: gix::ThreadSafeRepository,
}

thread_local! {
    /// Per thread: gix is built without its `parallel` feature, so its
    /// shared parts are `Rc`s. Blocking work runs on a few long-lived
    /// threads (tokio's blocking pool, a Lambda's one), each keeping its own.
    static KEPT_REPOSITORIES: RefCell<VecDeque<Kept>> =
        const { RefCell::new(VecDeque::new()) };
}

/// How many pack indices the pack directory holds.
fn pack_indices(pack_dir: &Path) -> usize {
    std::fs::read_dir(pack_dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| e.file_name().as_encoded_bytes().ends_with(b".idx"))
            .count()
    })
}

/// The repository at `path`, isolated from user and system configuration,
/// sharing what an earlier open of the same repository loaded.
///
/// # Errors
/// No repository at `path`.
pub(crate) fn open(
    path: &Path,
) -> Result<gix::Repository, Box<dyn std::error::Error + Send + Sync>> {
    let now = SystemTime::now();
    let settled = |stamp: Option<FileStamp>| stamp.filter(|s| s.settled_before(now));
    let objects_dir = path.join("objects");
    let objects = FileStamp::at(&objects_dir)?
        .ok_or_else(|| format!("{} is missing", objects_dir.display()))?;
    let config = FileStamp::at(&path.join("config"))?;
    let pack_dir = objects_dir.join("pack");
    let packs = FileStamp::at(&pack_dir)?;
    let packs_settled = settled(packs);
    let packed_refs = FileStamp::at(&path.join("packed-refs"))?;
    let packed_refs_settled = settled(packed_refs);
    // counted once, when the pack directory changed or for a fresh open
    let mut indices = None;

    let reused = KEPT_REPOSITORIES.with_borrow_mut(|kept| {
        let at = kept.iter().position(|k| k.path == path)?;
        let mut entry = kept.remove(at)?;
        // the objects directory keeps its inode while the repository
        // lives; only its times move as objects are added
        if !entry.objects.same_file(&objects) || entry.config != config {
            return None;
        }
        let packs_changed = packs_settled.is_none() || entry.packs != packs_settled;
        if packs_changed && *indices.insert(pack_indices(&pack_dir)) * 2 > entry.slots {
            return None;
        }
        let refs_changed = packed_refs.is_some()
            && (packed_refs_settled.is_none() || entry.packed_refs != packed_refs_settled);
        // a `packed-refs` that cannot be loaded again (gone meanwhile, or
        // unreadable) is left to a fresh open to report
        if refs_changed && entry.repo.refs.force_refresh_packed_buffer().is_err() {
            return None;
        }
        let repo = entry.repo.to_thread_local();
        if packs_changed {
            // a lookup that misses lists the pack directory again
            let _ =
                gix::objs::Exists::exists(&repo.objects, &gix::ObjectId::null(repo.object_hash()));
        }
        entry.packs = packs_settled;
        entry.packed_refs = packed_refs_settled;
        kept.push_front(entry);
        Some(repo)
    });
    if let Some(repo) = reused {
        return Ok(repo);
    }

    // Objects are what their ids name: no `refs/replace/` substitutes
    // (which `git` itself ignores when it serves a pack), and no scan of a
    // 1 MB `packed-refs` for them at every open of a large repository.
    let slots = indices.unwrap_or_else(|| pack_indices(&pack_dir)) * 2 + SPARE_SLOTS;
    let options = gix::open::Options::isolated()
        .config_overrides(["core.useReplaceRefs=false"])
        .object_store_slots(gix::odb::store::init::Slots::Given(
            u16::try_from(slots).unwrap_or(u16::MAX >> 1),
        ));
    let repo = gix::ThreadSafeRepository::open_opts(path, options)?;
    let local = repo.to_thread_local();
    KEPT_REPOSITORIES.with_borrow_mut(|kept| {
        if kept.len() >= KEPT {
            kept.pop_back();
        }
        kept.push_front(Kept {
            path: path.to_path_buf(),
            objects,
            config,
            slots,
            // gix lists the pack directory and loads `packed-refs` on first
            // use, after these stamps
            packs: packs_settled,
            packed_refs: packed_refs_settled,
            repo,
        });
    });
    Ok(local)
}
