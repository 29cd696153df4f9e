//! A mirror's branches and tags written as one `packed-refs` file, the way
//! `git pack-refs` does it: under `packed-refs.lock`, then the loose files
//! the new file stands for removed, and the directories they leave empty.
//!
//! A mirror writes a few changed refs as loose files ([`crate::repo`]),
//! and every listing reads every loose file again ([`crate::listing`]).
//! A long-lived mirror gains one loose tag per publish, so it packs them
//! once they pass [`PACK_LOOSE_AT`], as well as whenever many refs move at
//! once.
//!
//! Several processes may share a mirror (the CLI, `cargo lambda watch`).
//! The lock keeps two rewrites of `packed-refs` (this one, or gix deleting
//! a packed ref) from losing each other's work. Each loose file is removed
//! under its own lock, and one whose value is neither the one packed nor
//! the one listed before was written by another writer meanwhile: it is
//! newer, and stays.
//!
//! Unlike git, a `packed-refs.lock` older than [`LOCK_STALE`] is broken:
//! a mirror is a cache that only this code writes, for milliseconds at a
//! time, and one crash inside a write would otherwise stop it for good. A
//! writer that stood still for that long inside its write finds its lock
//! gone and writes nothing.

use crate::listing::{RefMap, is_branch_or_tag};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// Loose branches and tags a mirror keeps before it packs them all.
pub const PACK_LOOSE_AT: usize = 256;

/// How long a rewrite waits for another writer's `packed-refs.lock`.
const LOCK_WAIT: Duration = Duration::from_secs(1);

/// The age at which a `packed-refs.lock` is taken to be left by a writer
/// that died: a rewrite holds it for milliseconds.
pub const LOCK_STALE: Duration = Duration::from_secs(30);

/// Why the refs could not be packed.
#[derive(Debug, thiserror::Error)]
pub enum PackRefsError {
    #[error("{name} is not a branch or tag")]
    NotMirrored { name: String },
    #[error(
        "packed-refs is locked by another writer ({path} held for over {waited:?}; \
         if no git process runs, remove it)"
    )]
    Locked { path: String, waited: Duration },
    #[error("{path} was broken as stale while this writer held it; nothing was written")]
    LockBroken { path: String },
    #[error("failed to {step}")]
    Io {
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn io(step: &'static str) -> impl FnOnce(std::io::Error) -> PackRefsError {
    move |source| PackRefsError::Io { step, source }
}

/// A lock file (`<file>.lock`, created only if absent), removed on drop
/// unless it was renamed over the file it locks. It is only ever removed
/// or renamed while the path still names the file this lock created.
struct Lock {
    path: PathBuf,
    file: Option<std::fs::File>,
    /// Device and inode of the file created.
    made: (u64, u64),
    done: bool,
}

impl Lock {
    /// Creates the lock file at `path`; `None` while another writer holds
    /// it.
    fn try_take(path: PathBuf) -> std::io::Result<Option<Self>> {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(file) => {
                let meta = file.metadata()?;
                Ok(Some(Lock {
                    path,
                    file: Some(file),
                    made: (meta.dev(), meta.ino()),
                    done: false,
                }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Takes `packed-refs.lock`, waiting up to [`LOCK_WAIT`] for another
    /// writer's and breaking one older than [`LOCK_STALE`].
    fn take_packed(git_dir: &Path) -> Result<Self, PackRefsError> {
        let path = git_dir.join("packed-refs.lock");
        let started = Instant::now();
        loop {
            if let Some(lock) = Self::try_take(path.clone()).map_err(io("lock packed-refs"))? {
                return Ok(lock);
            }
            if break_stale(&path) {
                continue;
            }
            let waited = started.elapsed();
            if waited >= LOCK_WAIT {
                return Err(PackRefsError::Locked {
                    path: path.display().to_string(),
                    waited,
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the path still names the file this lock created.
    fn still_ours(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.made)
    }

    /// Writes `contents` and renames the lock over `target`.
    fn commit(mut self, contents: &[u8], target: &Path) -> Result<(), PackRefsError> {
        let mut file = self.file.take().expect("a lock holds its file until used");
        file.write_all(contents).map_err(io("write packed-refs"))?;
        drop(file);
        if !self.still_ours() {
            // broken as stale while this writer stood still: its file is
            // another writer's now
            self.done = true;
            return Err(PackRefsError::LockBroken {
                path: self.path.display().to_string(),
            });
        }
        std::fs::rename(&self.path, target).map_err(io("write packed-refs"))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if !self.done && self.still_ours() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Removes the lock at `path` if it is older than [`LOCK_STALE`], as left
/// by a writer that died (git and gix never break a lock, so one writer's
/// crash inside its write would stop a mirror for good). Breakers take
/// `<path>.break` first and look at the lock's age again under it, so a
/// lock another breaker removed and a writer took anew is never removed.
/// `true` if it was removed.
fn break_stale(path: &Path) -> bool {
    let stale = |path: &Path| {
        std::fs::symlink_metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|modified| SystemTime::now().duration_since(modified).ok())
            .is_some_and(|age| age > LOCK_STALE)
    };
    if !stale(path) {
        return false;
    }
    let mut breaker = path.as_os_str().to_owned();
    breaker.push(".break");
    let Ok(Some(_breaking)) = Lock::try_take(PathBuf::from(breaker)) else {
        return false;
    };
    stale(path) && std::fs::remove_file(path).is_ok()
}

/// Makes the branches and tags of the repository at `git_dir` exactly
/// `refs`, all in `packed-refs`; `current` is the listing the caller made
/// before (its loose files with those values are the caller's to remove).
/// Refs other than branches and tags keep their packed lines.
///
/// # Errors
/// A name in `refs` that is not a branch or tag (nothing is written), the
/// lock held by another writer past [`LOCK_WAIT`], or a failed write.
pub fn write_mirror_refs(
    git_dir: &Path,
    current: &RefMap,
    refs: &RefMap,
) -> Result<(), PackRefsError> {
    if let Some(name) = refs.keys().find(|name| {
        !is_branch_or_tag(name) || gix::refs::FullName::try_from(name.as_str()).is_err()
    }) {
        return Err(PackRefsError::NotMirrored { name: name.clone() });
    }
    let lock = Lock::take_packed(git_dir)?;
    let packed = git_dir.join("packed-refs");
    // name → the id, and the peeled id of a ref kept from the old file
    let mut entries: BTreeMap<&str, (String, Option<&str>)> = BTreeMap::new();
    let existing = match std::fs::read_to_string(&packed) {
        Ok(existing) => existing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io("read packed-refs")(e)),
    };
    let mut kept: Option<&str> = None;
    for line in existing.lines() {
        if line.starts_with('#') {
            continue;
        }
        if let Some(peeled) = line.strip_prefix('^') {
            if let Some(entry) = kept.and_then(|name| entries.get_mut(name)) {
                entry.1 = Some(peeled);
            }
            continue;
        }
        kept = None;
        // branches and tags come from `refs`; every other ref stays
        if let Some((id, name)) = line.split_once(' ')
            && !is_branch_or_tag(name)
        {
            entries.insert(name, (id.to_owned(), None));
            kept = Some(name);
        }
    }
    for (name, id) in refs {
        entries.insert(name, (id.to_string(), None));
    }
    let mut lines = String::with_capacity(entries.len() * 80 + 32);
    lines.push_str("# pack-refs with: sorted \n");
    for (name, (id, peeled)) in &entries {
        lines.push_str(id);
        lines.push(' ');
        lines.push_str(name);
        lines.push('\n');
        if let Some(peeled) = peeled {
            lines.push('^');
            lines.push_str(peeled);
            lines.push('\n');
        }
    }
    lock.commit(lines.as_bytes(), &packed)?;
    remove_loose(git_dir, current, refs)
}

/// Removes the loose branch and tag files `packed-refs` now stands for, and
/// the directories that leaves empty, each under its `.lock` as git does.
/// Kept: a ref another writer holds locked, a symbolic ref, and a file
/// holding an id other than the one packed and the one `current` listed
/// (written meanwhile).
fn remove_loose(git_dir: &Path, current: &RefMap, refs: &RefMap) -> Result<(), PackRefsError> {
    let loose = crate::listing::loose_files(git_dir).map_err(io("list the loose refs"))?;
    for (name, path) in loose.files {
        // locked as git pack-refs does: a writer holding the lock is moving
        // the ref, and the value it leaves is its own
        let mut lock_path = path.clone().into_os_string();
        lock_path.push(".lock");
        let _lock = match Lock::try_take(PathBuf::from(lock_path)) {
            Ok(Some(lock)) => lock,
            // held by another writer, or the ref and its directory gone
            Ok(None) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("lock a loose ref")(e)),
        };
        let contents = match std::fs::read(&path) {
            Ok(contents) => contents,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("read a loose ref")(e)),
        };
        let text = contents.trim_ascii();
        // a symbolic ref, or an id written meanwhile: kept
        let keep = text.starts_with(b"ref:")
            || gix::ObjectId::from_hex(text)
                .is_ok_and(|id| refs.get(&name) != Some(&id) && current.get(&name) != Some(&id));
        if keep {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("remove a loose ref")(e)),
        }
    }
    // deepest first; a directory another writer fills meanwhile is not
    // empty, and stays
    for dir in loose.dirs.iter().rev() {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gix::ObjectId;

    fn id(fill: char) -> ObjectId {
        ObjectId::from_hex(fill.to_string().repeat(40).as_bytes()).expect("id")
    }

    fn loose(git_dir: &Path, name: &str, value: ObjectId) {
        let path = git_dir.join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        std::fs::write(path, format!("{value}\n")).expect("write");
    }

    fn bare() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("refs/heads")).expect("heads");
        std::fs::create_dir_all(dir.path().join("refs/tags")).expect("tags");
        dir
    }

    fn listed(git_dir: &Path) -> RefMap {
        let refs = crate::listing::branches_and_tags(git_dir).expect("listing");
        (*refs).clone()
    }

    #[test]
    fn loose_refs_are_packed_and_their_empty_directories_removed() {
        let dir = bare();
        let git = dir.path();
        std::fs::write(
            git.join("packed-refs"),
            format!(
                "# pack-refs with: peeled \n{} refs/notes/x\n^{}\n{} refs/tags/old\n",
                id('a'),
                id('b'),
                id('c')
            ),
        )
        .expect("packed");
        loose(git, "refs/tags/p/q/v1", id('1'));
        loose(git, "refs/heads/main", id('2'));
        let current = listed(git);
        let refs: RefMap = [
            ("refs/heads/main".to_owned(), id('3')),
            ("refs/tags/p/q/v1".to_owned(), id('1')),
            ("refs/tags/p/q/v2".to_owned(), id('4')),
        ]
        .into();
        write_mirror_refs(git, &current, &refs).expect("packed");
        assert_eq!(listed(git), refs, "branches and tags exactly as asked");
        let text = std::fs::read_to_string(git.join("packed-refs")).expect("read");
        assert!(
            text.contains(&format!("{} refs/notes/x\n^{}\n", id('a'), id('b'))),
            "a ref other than a branch or tag keeps its peeled line: {text}"
        );
        assert!(!text.contains("refs/tags/old"), "{text}");
        assert!(!git.join("refs/heads/main").exists());
        assert!(!git.join("refs/tags/p").exists(), "emptied directories go");
        assert!(git.join("refs/tags").is_dir(), "the top directories stay");
        assert!(!git.join("packed-refs.lock").exists());
    }

    #[test]
    fn a_loose_ref_written_meanwhile_stays() {
        let dir = bare();
        let git = dir.path();
        loose(git, "refs/heads/main", id('1'));
        loose(git, "refs/heads/gone", id('2'));
        let current = listed(git);
        // another writer moves both after the listing
        loose(git, "refs/heads/main", id('5'));
        loose(git, "refs/heads/gone", id('6'));
        let refs: RefMap = [("refs/heads/main".to_owned(), id('3'))].into();
        write_mirror_refs(git, &current, &refs).expect("packed");
        let after = listed(git);
        assert_eq!(after.get("refs/heads/main"), Some(&id('5')));
        assert_eq!(after.get("refs/heads/gone"), Some(&id('6')));
    }

    #[test]
    fn another_writers_lock_is_waited_for_and_a_stale_one_taken() {
        let dir = bare();
        let git = dir.path().to_path_buf();
        let refs: RefMap = [("refs/heads/main".to_owned(), id('1'))].into();
        let lock = git.join("packed-refs.lock");

        // held past the wait: nothing written, the lock left to its owner
        std::fs::write(&lock, "").expect("lock");
        let error = write_mirror_refs(&git, &RefMap::new(), &refs).expect_err("locked");
        assert!(matches!(error, PackRefsError::Locked { .. }), "{error}");
        assert!(!git.join("packed-refs").exists());
        assert!(lock.exists());

        // released while waiting: written once it is
        let released = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                std::fs::remove_file(lock).expect("release");
            })
        };
        write_mirror_refs(&git, &RefMap::new(), &refs).expect("after the release");
        released.join().expect("thread");
        assert_eq!(listed(&git), refs);

        // left by a writer that died long ago: taken at once
        let file = std::fs::File::create(&lock).expect("lock");
        file.set_modified(SystemTime::now() - LOCK_STALE * 2)
            .expect("age the lock");
        drop(file);
        assert!(!git.join("packed-refs.lock.break").exists());
        let refs: RefMap = [("refs/heads/main".to_owned(), id('2'))].into();
        let started = Instant::now();
        write_mirror_refs(&git, &listed(&git), &refs).expect("stale lock taken");
        assert!(started.elapsed() < LOCK_WAIT);
        assert_eq!(listed(&git), refs);
        assert!(!lock.exists());
    }

    #[test]
    fn a_stale_lock_is_broken_once_and_a_live_one_never() {
        let dir = bare();
        let git = dir.path();
        let refs: RefMap = [("refs/heads/main".to_owned(), id('1'))].into();
        let lock = git.join("packed-refs.lock");
        let age = |path: &Path| {
            std::fs::File::open(path)
                .expect("open")
                .set_modified(SystemTime::now() - LOCK_STALE * 2)
                .expect("age");
        };

        // another breaker at work: the stale lock is left to it
        std::fs::write(&lock, "").expect("lock");
        age(&lock);
        let breaker = git.join("packed-refs.lock.break");
        std::fs::write(&breaker, "").expect("breaker");
        let error = write_mirror_refs(git, &RefMap::new(), &refs).expect_err("left");
        assert!(matches!(error, PackRefsError::Locked { .. }), "{error}");
        assert!(lock.exists() && !git.join("packed-refs").exists());
        std::fs::remove_file(&breaker).expect("breaker done");

        // a stale lock that cannot be removed: refused after the wait, not
        // tried again forever
        std::fs::remove_file(&lock).expect("unlock");
        std::fs::create_dir_all(lock.join("inside")).expect("a directory");
        age(&lock);
        let started = Instant::now();
        let error = write_mirror_refs(git, &RefMap::new(), &refs).expect_err("kept");
        assert!(matches!(error, PackRefsError::Locked { .. }), "{error}");
        assert!(started.elapsed() < LOCK_WAIT * 3);
        assert!(!breaker.exists(), "the breaker's own lock is released");
        std::fs::remove_dir_all(&lock).expect("clean");

        // a lock broken while its writer stood still: that writer renames
        // and removes nothing of the new holder's
        let held = Lock::try_take(lock.clone()).expect("take").expect("free");
        std::fs::remove_file(&lock).expect("broken");
        std::fs::write(&lock, "the new holder's").expect("taken anew");
        let error = held
            .commit(b"stale writer's", &git.join("packed-refs"))
            .expect_err("broken");
        assert!(matches!(error, PackRefsError::LockBroken { .. }), "{error}");
        assert!(!git.join("packed-refs").exists());
        assert_eq!(std::fs::read(&lock).expect("still"), b"the new holder's");
        let held = Lock::try_take(git.join("other.lock"))
            .expect("take")
            .expect("free");
        std::fs::remove_file(git.join("other.lock")).expect("broken");
        std::fs::write(git.join("other.lock"), "").expect("taken anew");
        drop(held);
        assert!(
            git.join("other.lock").exists(),
            "a dropped lock removes only its own file"
        );
    }

    #[test]
    fn a_loose_ref_locked_by_its_writer_and_a_symbolic_ref_stay() {
        let dir = bare();
        let git = dir.path();
        loose(git, "refs/heads/busy", id('1'));
        loose(git, "refs/heads/main", id('2'));
        std::fs::write(git.join("refs/heads/alias"), "ref: refs/heads/main\n").expect("symbolic");
        let current = listed(git);
        std::fs::write(git.join("refs/heads/busy.lock"), "").expect("a writer's lock");
        let refs: RefMap = [("refs/heads/main".to_owned(), id('2'))].into();
        write_mirror_refs(git, &current, &refs).expect("packed");
        assert!(git.join("refs/heads/busy").exists(), "its writer decides");
        assert!(git.join("refs/heads/busy.lock").exists());
        assert!(git.join("refs/heads/alias").exists());
        assert!(!git.join("refs/heads/main").exists(), "packed");
    }

    #[test]
    fn hostile_names_write_nothing() {
        let dir = bare();
        let git = dir.path();
        for name in ["refs/notes/x", "refs/heads/../../config", "refs/heads/a..b"] {
            let mut refs = RefMap::new();
            refs.insert(name.to_owned(), id('1'));
            let error = write_mirror_refs(git, &RefMap::new(), &refs).expect_err(name);
            assert!(
                matches!(error, PackRefsError::NotMirrored { .. }),
                "{name}: {error}"
            );
            assert!(!git.join("packed-refs").exists(), "{name}");
            assert!(!git.join("packed-refs.lock").exists(), "{name}");
        }
    }
}
