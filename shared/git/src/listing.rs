//! A repository's branches and tags read straight from its ref files, for
//! the callers that want all of them on every operation (the snapshot's
//! save and load, the local remote's fetch).
//!
//! A large repository keeps most refs in `packed-refs`: at 10,000 packages
//! that is 20,000 lines (1 MB) to read, parse, check and copy into a map
//! each time. The parse is kept per repository for as long as the file
//! stays the same. Same means the same bytes, or, once the file is older
//! than many ticks of the clock file times come from (a tenth of a second;
//! two seconds where times are whole seconds), the same inode, size and
//! times: git's rule for racily clean index entries, since a rewrite within
//! the tick in which the file was read can leave its size and times
//! unchanged. Loose ref files are read every time, and they are few, since
//! a mirror rewrites `packed-refs` when many refs move. Anything unexpected
//! in the files (a line that is not an id and a name, an id that is not
//! SHA-1, a name git would refuse) makes the caller fall back to listing
//! through gix.

use gix::ObjectId;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, SystemTime};

pub use crate::refmap::{RefMap, differences};

/// Repositories whose `packed-refs` parse is kept; more drop them all.
const MAX_REPOSITORIES: usize = 64;

/// How much older than the moment it was looked at a file must be for its
/// stamp to stand for its bytes, on a filesystem that keeps sub-second
/// times: many ticks of the kernel's coarse clock that file times are taken
/// from (a tick is 10 ms at the slowest, `HZ=100`).
const SETTLED: Duration = Duration::from_millis(100);

/// The same on a filesystem that keeps whole seconds (a stamp whose times
/// have no nanoseconds): more than the coarsest it may keep (two seconds).
const SETTLED_WHOLE_SECONDS: Duration = Duration::from_secs(2);

/// What tells one version of a file from another without reading it. A
/// rewrite by rename (git's, gix's and ours) makes a new inode; a write in
/// place moves the times.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    /// The stamp of the file at `path`; `None` when there is none.
    pub(crate) fn at(path: &Path) -> std::io::Result<Option<Self>> {
        match std::fs::metadata(path) {
            Ok(meta) => Ok(Some(Self::of(&meta))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether both stamps are of the same file (device and inode), in
    /// whatever version.
    pub(crate) fn same_file(&self, other: &Self) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }

    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether any change made after `looked_at` must change this stamp:
    /// the file's last change is settled well before it, so a later one
    /// carries a later time (or, by rename, another inode).
    pub(crate) fn settled_before(&self, looked_at: SystemTime) -> bool {
        let latest = self.mtime.max(self.ctime);
        let Ok(secs) = u64::try_from(latest.0) else {
            return false;
        };
        let Ok(nanos) = u32::try_from(latest.1) else {
            return false;
        };
        let changed = SystemTime::UNIX_EPOCH + Duration::new(secs, nanos);
        let margin = if self.mtime.1 == 0 && self.ctime.1 == 0 {
            SETTLED_WHOLE_SECONDS
        } else {
            SETTLED
        };
        changed + margin < looked_at
    }
}

struct Parsed {
    packed_bytes: Vec<u8>,
    /// The stamp `packed-refs` had when `packed_bytes` were read, once it
    /// was settled; `None` while only the bytes can tell.
    settled_stamp: Option<FileStamp>,
    /// How many times the file was read for this entry.
    reads: u64,
    packed: Arc<RefMap>,
    /// The loose refs last read, and the listing they made with `packed`.
    loose: Vec<(String, ObjectId)>,
    merged: Arc<RefMap>,
}

static PARSED: LazyLock<Mutex<HashMap<PathBuf, Parsed>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Whether a ref is a branch or a tag: what a mirror keeps in step with its
/// remote, and what a listing holds.
pub fn is_branch_or_tag(name: &str) -> bool {
    name.starts_with("refs/heads/") || name.starts_with("refs/tags/")
}

fn valid_name(name: &str) -> bool {
    gix::refs::FullName::try_from(name).is_ok()
}

fn parse_id(hex: &[u8]) -> Option<ObjectId> {
    if hex.len() != 40 {
        return None;
    }
    ObjectId::from_hex(hex).ok()
}

/// The branches and tags of `packed-refs`; `None` for anything unexpected.
fn parse_packed(bytes: &[u8]) -> Option<RefMap> {
    let mut refs = Vec::new();
    for line in bytes.split(|b| *b == b'\n') {
        if line.is_empty() || line[0] == b'#' || line[0] == b'^' {
            continue;
        }
        let space = line.iter().position(|b| *b == b' ')?;
        let id = parse_id(&line[..space])?;
        let name = std::str::from_utf8(&line[space + 1..]).ok()?;
        if !is_branch_or_tag(name) {
            continue;
        }
        if !valid_name(name) {
            return None;
        }
        refs.push((name.to_owned(), id));
    }
    Some(refs.into_iter().collect())
}

/// The loose ref files under `refs/heads` and `refs/tags` (ref name and
/// path, lock files left out), and the directories below those two,
/// parents before their children.
pub(crate) struct LooseFiles {
    pub files: Vec<(String, PathBuf)>,
    pub dirs: Vec<PathBuf>,
}

/// Walks the loose branch and tag files of the repository at `git_dir`. A
/// directory gone meanwhile is skipped; a name that is not UTF-8 is an
/// error ([`std::io::ErrorKind::InvalidData`]).
pub(crate) fn loose_files(git_dir: &Path) -> std::io::Result<LooseFiles> {
    let mut out = LooseFiles {
        files: Vec::new(),
        dirs: Vec::new(),
    };
    let mut stack: Vec<(PathBuf, String)> = ["refs/heads", "refs/tags"]
        .iter()
        .map(|top| (git_dir.join(top), (*top).to_owned()))
        .collect();
    while let Some((dir, prefix)) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let file_name = entry.file_name();
            let file_name = file_name.to_str().ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "a ref name is not UTF-8")
            })?;
            let name = format!("{prefix}/{file_name}");
            if entry.file_type()?.is_dir() {
                out.dirs.push(entry.path());
                stack.push((entry.path(), name));
            } else if !file_name.ends_with(".lock") {
                out.files.push((name, entry.path()));
            }
        }
    }
    Ok(out)
}

/// Every loose branch and tag, sorted by name; `None` for anything
/// unexpected. Symbolic refs are skipped, as a listing of direct refs does.
fn read_loose(git_dir: &Path) -> Option<Vec<(String, ObjectId)>> {
    let mut out = Vec::new();
    for (name, path) in loose_files(git_dir).ok()?.files {
        let contents = match std::fs::read(path) {
            Ok(contents) => contents,
            // removed between the listing and the read: gone
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => return None,
        };
        let text = contents.trim_ascii();
        if text.starts_with(b"ref:") {
            continue;
        }
        if !valid_name(&name) {
            return None;
        }
        out.push((name, parse_id(text)?));
    }
    out.sort();
    Some(out)
}

/// The branches and tags of the repository at `git_dir`, loose refs over
/// packed ones; `None` when the files hold something this reader does not
/// expect (list through gix instead).
pub fn branches_and_tags(git_dir: &Path) -> Option<Arc<RefMap>> {
    // the clock read before the stat, and the stat made before the read:
    // bytes newer than their stamp only cost a read next time
    branches_and_tags_at(git_dir, SystemTime::now())
}

/// [`branches_and_tags`] with the clock read at `looked_at`.
fn branches_and_tags_at(git_dir: &Path, looked_at: SystemTime) -> Option<Arc<RefMap>> {
    // loose refs first: a ref packed meanwhile is in the `packed-refs`
    // looked at next (git packs, then removes the loose file)
    let loose = read_loose(git_dir)?;
    with_packed(git_dir, looked_at, |entry| entry.listing(loose))
}

/// How many loose branches and tags the last listing of the repository at
/// `git_dir` in this process found; `None` if it was not listed here.
pub fn loose_count(git_dir: &Path) -> Option<usize> {
    PARSED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(git_dir)
        .map(|entry| entry.loose.len())
}

/// One branch or tag, as a single lookup: its loose file, else
/// `packed-refs` (parsed once while it stays the same, as for
/// [`branches_and_tags`]). `Some(None)`: no such ref. `None` when the files
/// hold something this reader does not expect, a symbolic ref among them,
/// or `name` is not a branch or tag: look it up through gix instead.
pub fn lookup(git_dir: &Path, name: &str) -> Option<Option<ObjectId>> {
    let looked_at = SystemTime::now();
    if !is_branch_or_tag(name) || !valid_name(name) {
        return None;
    }
    match std::fs::read(git_dir.join(name)) {
        Ok(contents) => {
            let text = contents.trim_ascii();
            if text.starts_with(b"ref:") {
                return None;
            }
            return parse_id(text).map(Some);
        }
        // no loose file (or a directory, or a file where a directory of the
        // name would be): the packed one, if any
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound
                    | std::io::ErrorKind::IsADirectory
                    | std::io::ErrorKind::NotADirectory
            ) => {}
        Err(_) => return None,
    }
    with_packed(git_dir, looked_at, |entry| entry.packed.get(name).copied())
}

/// `read` on the kept parse of the repository's `packed-refs`, read and
/// parsed again first if the file changed.
fn with_packed<T>(
    git_dir: &Path,
    looked_at: SystemTime,
    read: impl FnOnce(&mut Parsed) -> T,
) -> Option<T> {
    let path = git_dir.join("packed-refs");
    let stamp = FileStamp::at(&path).ok()?;
    let settled = stamp.filter(|s| s.settled_before(looked_at));
    let unchanged = |entry: &Parsed| settled.is_some() && entry.settled_stamp == settled;
    {
        let mut parsed = PARSED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = parsed.get_mut(git_dir)
            && unchanged(entry)
        {
            return Some(read(entry));
        }
    }
    let packed_bytes = match stamp {
        None => Vec::new(),
        Some(_) => match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(_) => return None,
        },
    };
    let mut parsed = PARSED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(entry) = parsed.get_mut(git_dir)
        && entry.packed_bytes == packed_bytes
    {
        entry.settled_stamp = settled;
        entry.reads += 1;
        return Some(read(entry));
    }
    // parsed outside the lock would let two threads parse the same file;
    // a parse is rare (the file changed) and short next to its use
    let packed = Arc::new(parse_packed(&packed_bytes)?);
    if parsed.len() >= MAX_REPOSITORIES && !parsed.contains_key(git_dir) {
        parsed.clear();
    }
    let entry = parsed.entry(git_dir.to_path_buf()).insert_entry(Parsed {
        packed_bytes,
        settled_stamp: settled,
        reads: 1,
        merged: Arc::clone(&packed),
        packed,
        loose: Vec::new(),
    });
    Some(read(entry.into_mut()))
}

impl Parsed {
    /// The listing of the kept `packed-refs` parse with `loose` over it,
    /// made from the last listing by the few names loose then or now. When
    /// no caller holds the last listing any more, it is changed in place;
    /// a listing still held is never changed: the new one shares all but
    /// the chunks those names fall in ([`RefMap`]).
    fn listing(&mut self, loose: Vec<(String, ObjectId)>) -> Arc<RefMap> {
        if self.loose != loose {
            let merged = Arc::make_mut(&mut self.merged);
            for (name, _) in &self.loose {
                if loose.binary_search_by(|(n, _)| n.cmp(name)).is_err() {
                    match self.packed.get(name) {
                        Some(id) => merged.insert(name.clone(), *id),
                        None => merged.remove(name),
                    };
                }
            }
            for (name, id) in &loose {
                if merged.get(name) != Some(id) {
                    merged.insert(name.clone(), *id);
                }
            }
            self.loose = loose;
        }
        Arc::clone(&self.merged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111";
    const B: &str = "2222222222222222222222222222222222222222";

    fn id(hex: &str) -> ObjectId {
        ObjectId::from_hex(hex.as_bytes()).expect("hex")
    }

    #[test]
    fn packed_refs_are_read_with_their_peeled_lines_and_other_refs_skipped() {
        let text = format!(
            "# pack-refs with: peeled fully-peeled sorted \n{A} refs/heads/main\n{B} refs/tags/v1\n^{A}\n{A} refs/notes/x\n"
        );
        let refs = parse_packed(text.as_bytes()).expect("parses");
        assert_eq!(
            refs,
            RefMap::from([
                ("refs/heads/main".to_owned(), id(A)),
                ("refs/tags/v1".to_owned(), id(B)),
            ])
        );
    }

    #[test]
    fn anything_unexpected_in_packed_refs_falls_back() {
        for text in [
            format!("{A}refs/heads/main\n"),
            format!("{} refs/heads/main\n", &A[..39]),
            format!("{A}{A}{A} refs/heads/main\n"),
            format!("{A} refs/heads/a..b\n"),
            format!("{A} refs/heads/x.lock\n"),
            "zzzz refs/heads/main\n".to_owned(),
        ] {
            assert_eq!(parse_packed(text.as_bytes()), None, "{text:?}");
        }
    }

    #[test]
    fn loose_refs_win_and_a_changed_packed_refs_is_read_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let git = dir.path();
        std::fs::create_dir_all(git.join("refs/heads/drafts/p")).expect("mkdir");
        std::fs::create_dir_all(git.join("refs/tags")).expect("mkdir");
        std::fs::write(
            git.join("packed-refs"),
            format!("{A} refs/heads/main\n{A} refs/tags/p/v1\n"),
        )
        .expect("write");
        std::fs::write(git.join("refs/heads/main"), format!("{B}\n")).expect("write");
        std::fs::write(git.join("refs/heads/drafts/p/ws"), format!("{A}\n")).expect("write");
        std::fs::write(git.join("refs/heads/HEADLIKE"), "ref: refs/heads/main\n").expect("write");
        std::fs::write(git.join("refs/heads/main.lock"), "junk").expect("write");
        let first = branches_and_tags(git).expect("lists");
        assert_eq!(
            *first,
            RefMap::from([
                ("refs/heads/drafts/p/ws".to_owned(), id(A)),
                ("refs/heads/main".to_owned(), id(B)),
                ("refs/tags/p/v1".to_owned(), id(A)),
            ])
        );
        // nothing changed: the same listing, not a new one
        assert!(Arc::ptr_eq(&first, &branches_and_tags(git).expect("lists")));
        // a loose ref removed shows the packed one again
        std::fs::remove_file(git.join("refs/heads/main")).expect("remove");
        assert_eq!(
            branches_and_tags(git).expect("lists")["refs/heads/main"],
            id(A)
        );
        // packed-refs rewritten with the same size: read again
        std::fs::write(
            git.join("packed-refs"),
            format!("{B} refs/heads/main\n{A} refs/tags/p/v1\n"),
        )
        .expect("write");
        assert_eq!(
            branches_and_tags(git).expect("lists")["refs/heads/main"],
            id(B)
        );
        // a loose file that is not an id: the caller lists through gix
        std::fs::write(git.join("refs/tags/bad"), "not an id\n").expect("write");
        assert!(branches_and_tags(git).is_none());
    }

    #[test]
    fn one_ref_is_looked_up_loose_then_packed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let git = dir.path();
        std::fs::create_dir_all(git.join("refs/heads/drafts/p")).expect("mkdir");
        std::fs::write(
            git.join("packed-refs"),
            format!("{A} refs/heads/main\n{A} refs/tags/p/v1\n{A} refs/heads/drafts/p\n"),
        )
        .expect("write");
        std::fs::write(git.join("refs/heads/main"), format!("{B}\n")).expect("write");
        std::fs::write(git.join("refs/heads/drafts/p/ws"), format!("{A}\n")).expect("write");
        std::fs::write(git.join("refs/heads/sym"), "ref: refs/heads/main\n").expect("write");
        assert_eq!(
            lookup(git, "refs/heads/main"),
            Some(Some(id(B))),
            "loose wins"
        );
        assert_eq!(lookup(git, "refs/tags/p/v1"), Some(Some(id(A))), "packed");
        assert_eq!(lookup(git, "refs/heads/drafts/p/ws"), Some(Some(id(A))));
        // a directory of loose refs, and a path under a loose file
        assert_eq!(lookup(git, "refs/heads/drafts/p"), Some(Some(id(A))));
        assert_eq!(lookup(git, "refs/heads/main/x"), Some(None));
        assert_eq!(lookup(git, "refs/tags/none"), Some(None));
        // not for this reader: gix decides
        assert_eq!(lookup(git, "refs/heads/sym"), None);
        assert_eq!(lookup(git, "HEAD"), None);
        assert_eq!(lookup(git, "refs/notes/x"), None);
        assert_eq!(lookup(git, "refs/heads/../../config"), None);
        // packed-refs rewritten: read again
        std::fs::write(git.join("packed-refs"), format!("{B} refs/tags/p/v1\n")).expect("write");
        assert_eq!(lookup(git, "refs/tags/p/v1"), Some(Some(id(B))));
        assert_eq!(lookup(git, "refs/heads/drafts/p"), Some(None));
        // and the listing made after lookups is whole
        assert_eq!(
            *branches_and_tags(git).expect("lists"),
            RefMap::from([
                ("refs/heads/drafts/p/ws".to_owned(), id(A)),
                ("refs/heads/main".to_owned(), id(B)),
                ("refs/tags/p/v1".to_owned(), id(B)),
            ])
        );
        std::fs::remove_file(git.join("packed-refs")).expect("remove");
        assert_eq!(lookup(git, "refs/tags/p/v1"), Some(None));
    }

    fn stamp_changed_at(mtime: (i64, i64), ctime: (i64, i64)) -> FileStamp {
        FileStamp {
            dev: 1,
            ino: 2,
            len: 3,
            mtime,
            ctime,
        }
    }

    #[test]
    fn a_stamp_stands_for_its_bytes_only_once_its_last_change_is_settled() {
        let at = |secs: u64, nanos: u32| SystemTime::UNIX_EPOCH + Duration::new(secs, nanos);
        let stamp = stamp_changed_at((1_000, 0), (1_000, 500_000_000));
        // the later of the two times counts, and a tenth of a second after
        // it on a filesystem with sub-second times
        assert!(!stamp.settled_before(at(1_000, 550_000_000)));
        assert!(!stamp.settled_before(at(1_000, 600_000_000)));
        assert!(stamp.settled_before(at(1_000, 600_000_001)));
        assert!(!stamp_changed_at((1_005, 0), (1_000, 7)).settled_before(at(1_005, 50_000_000)));
        // two seconds where times are whole seconds
        let whole = stamp_changed_at((1_000, 0), (1_000, 0));
        assert!(!whole.settled_before(at(1_001, 900_000_000)));
        assert!(!whole.settled_before(at(1_002, 0)));
        assert!(whole.settled_before(at(1_002, 1)));
        assert!(!stamp_changed_at((1_005, 0), (1_000, 0)).settled_before(at(1_006, 0)));
        // times before the epoch, or nonsense nanoseconds, never are
        assert!(!stamp_changed_at((-5, 0), (-5, 0)).settled_before(at(1_000, 0)));
        assert!(!stamp_changed_at((1, -1), (1, -1)).settled_before(at(1_000, 0)));
    }

    #[test]
    fn a_settled_packed_refs_is_not_read_again_until_its_stamp_moves() {
        let dir = tempfile::tempdir().expect("tempdir");
        let git = dir.path();
        std::fs::create_dir_all(git.join("refs/heads")).expect("mkdir");
        let packed = git.join("packed-refs");
        std::fs::write(&packed, format!("{A} refs/heads/main\n")).expect("write");
        let later = SystemTime::now() + Duration::from_secs(10);
        let first = branches_and_tags_at(git, later).expect("lists");
        assert_eq!(first["refs/heads/main"], id(A));
        let kept = |git: &Path| {
            let parsed = PARSED.lock().expect("lock");
            let entry = parsed.get(git).expect("kept");
            (entry.settled_stamp, entry.reads)
        };
        let (stamp, reads) = kept(git);
        assert!(stamp.is_some(), "old enough to stand for its bytes");
        assert_eq!(reads, 1);
        let again = branches_and_tags_at(git, later).expect("lists");
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(kept(git).1, 1, "not read again");
        // a chmod moves the ctime: read again, the same bytes, parse kept
        let perms = std::fs::metadata(&packed).expect("stat").permissions();
        std::fs::set_permissions(&packed, perms).expect("chmod");
        let same = branches_and_tags_at(git, later).expect("lists");
        assert!(Arc::ptr_eq(&first, &same));
        assert_eq!(kept(git).1, 2);

        // rewritten by rename with the same size: another inode
        let tmp = git.join("packed-refs.new");
        std::fs::write(&tmp, format!("{B} refs/heads/main\n")).expect("write");
        std::fs::rename(&tmp, &packed).expect("rename");
        assert_eq!(
            branches_and_tags_at(git, later).expect("lists")["refs/heads/main"],
            id(B)
        );
        // written in place with the same size and a later time
        std::fs::write(&packed, format!("{A} refs/heads/main\n")).expect("write");
        std::fs::File::options()
            .write(true)
            .open(&packed)
            .and_then(|f| f.set_modified(later - Duration::from_secs(3)))
            .expect("touch");
        assert_eq!(
            branches_and_tags_at(git, later).expect("lists")["refs/heads/main"],
            id(A)
        );
        // and a fresh file, not yet settled, is compared by its bytes
        let now = SystemTime::now();
        std::fs::write(&packed, format!("{B} refs/heads/main\n")).expect("write");
        assert_eq!(
            branches_and_tags_at(git, now).expect("lists")["refs/heads/main"],
            id(B)
        );
        assert_eq!(kept(git).0, None);
    }

    #[test]
    fn a_listing_held_by_a_caller_never_changes_under_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let git = dir.path();
        std::fs::create_dir_all(git.join("refs/heads/drafts")).expect("mkdir");
        std::fs::write(
            git.join("packed-refs"),
            format!("{A} refs/heads/main\n{A} refs/heads/old\n"),
        )
        .expect("write");
        let packed_only = RefMap::from([
            ("refs/heads/main".to_owned(), id(A)),
            ("refs/heads/old".to_owned(), id(A)),
        ]);
        std::fs::write(git.join("refs/heads/main"), format!("{B}\n")).expect("write");
        let held = branches_and_tags(git).expect("lists");
        // a loose ref moves while `held` is kept: a new listing
        std::fs::write(git.join("refs/heads/drafts/ws"), format!("{B}\n")).expect("write");
        std::fs::remove_file(git.join("refs/heads/main")).expect("remove");
        let next = branches_and_tags(git).expect("lists");
        assert_eq!(held["refs/heads/main"], id(B));
        assert!(!held.contains_key("refs/heads/drafts/ws"));
        let mut expected = packed_only.clone();
        expected.insert("refs/heads/drafts/ws".to_owned(), id(B));
        assert_eq!(*next, expected);
        // released, it is brought up to date in place: a loose ref over a
        // packed one and a loose ref of its own, both gone again
        let released = Arc::as_ptr(&next);
        drop((held, next));
        std::fs::remove_file(git.join("refs/heads/drafts/ws")).expect("remove");
        std::fs::write(git.join("refs/heads/old"), format!("{B}\n")).expect("write");
        let in_place = branches_and_tags(git).expect("lists");
        assert_eq!(Arc::as_ptr(&in_place), released);
        let mut expected = packed_only.clone();
        expected.insert("refs/heads/old".to_owned(), id(B));
        assert_eq!(*in_place, expected);
        drop(in_place);
        std::fs::remove_file(git.join("refs/heads/old")).expect("remove");
        assert_eq!(*branches_and_tags(git).expect("lists"), packed_only);
    }

    #[test]
    fn differences_are_found_in_one_walk_as_lookups_would_find_them() {
        let names = [
            "refs/heads/a",
            "refs/heads/b",
            "refs/heads/c",
            "refs/tags/a/v1",
            "refs/tags/z",
        ];
        // every pair of maps over these names with ids A, B or absent
        let maps: Vec<RefMap> = (0..3usize.pow(5))
            .map(|mut code| {
                let mut map = RefMap::new();
                for name in names {
                    match code % 3 {
                        1 => drop(map.insert(name.to_owned(), id(A))),
                        2 => drop(map.insert(name.to_owned(), id(B))),
                        _ => {}
                    }
                    code /= 3;
                }
                map
            })
            .collect();
        for before in &maps {
            for after in maps.iter().step_by(7) {
                let by_lookup: Vec<(&str, Option<ObjectId>, Option<ObjectId>)> = names
                    .iter()
                    .map(|n| (*n, before.get(n).copied(), after.get(n).copied()))
                    .filter(|(_, old, new)| old != new)
                    .collect();
                assert_eq!(differences(before, after), by_lookup);
            }
        }
    }
}
