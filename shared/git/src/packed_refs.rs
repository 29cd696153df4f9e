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
//! a packed ref) from losing each other's work, and a loose file whose
//! value is neither the one packed nor the one listed before was written
//! by another writer meanwhile: it is newer, and stays.

use crate::listing::{RefMap, is_branch_or_tag};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// Loose branches and tags a mirror keeps before it packs them all.
pub const PACK_LOOSE_AT: usize = 256;

/// How long a rewrite waits for another writer's `packed-refs.lock`.
const LOCK_WAIT: Duration = Duration::from_secs(1);

/// The age at which a `packed-refs.lock` is taken to be left by a writer
/// that died: a rewrite holds it for milliseconds.
const LOCK_STALE: Duration = Duration::from_secs(30);

/// Why the refs could not be packed.
#[derive(Debug, thiserror::Error)]
pub enum PackRefsError {
    #[error("{name} is not a branch or tag")]
    NotMirrored { name: String },
    #[error("packed-refs is locked by another writer (packed-refs.lock for over {waited:?})")]
    Locked { waited: Duration },
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

/// `packed-refs.lock`, removed on drop unless it became `packed-refs`.
struct Lock<'a> {
    path: std::path::PathBuf,
    git_dir: &'a Path,
    file: Option<std::fs::File>,
}

impl<'a> Lock<'a> {
    /// Takes the lock, waiting up to [`LOCK_WAIT`] for another writer's and
    /// removing one older than [`LOCK_STALE`].
    fn take(git_dir: &'a Path) -> Result<Self, PackRefsError> {
        let path = git_dir.join("packed-refs.lock");
        let started = Instant::now();
        loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => {
                    return Ok(Lock {
                        path,
                        git_dir,
                        file: Some(file),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io("lock packed-refs")(e)),
            }
            let stale = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| SystemTime::now().duration_since(modified).ok())
                .is_some_and(|age| age > LOCK_STALE);
            if stale {
                // another waiter may have removed it first: either way it
                // is gone
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let waited = started.elapsed();
            if waited >= LOCK_WAIT {
                return Err(PackRefsError::Locked { waited });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Writes `contents` and renames the lock over `packed-refs`.
    fn commit(mut self, contents: &[u8]) -> Result<(), PackRefsError> {
        let mut file = self.file.take().expect("a lock holds its file until used");
        file.write_all(contents).map_err(io("write packed-refs"))?;
        drop(file);
        std::fs::rename(&self.path, self.git_dir.join("packed-refs"))
            .map_err(io("write packed-refs"))?;
        // renamed: nothing left to remove
        self.path = std::path::PathBuf::new();
        Ok(())
    }
}

impl Drop for Lock<'_> {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
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
    let lock = Lock::take(git_dir)?;
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
    lock.commit(lines.as_bytes())?;
    remove_loose(git_dir, current, refs)
}

/// Removes the loose branch and tag files `packed-refs` now stands for, and
/// the directories that leaves empty. A file holding an id other than the
/// one packed and the one `current` listed was written meanwhile: kept.
fn remove_loose(git_dir: &Path, current: &RefMap, refs: &RefMap) -> Result<(), PackRefsError> {
    for top in ["refs/heads", "refs/tags"] {
        // directories in the order met; removed deepest first below
        let mut dirs = Vec::new();
        let mut stack = vec![(git_dir.join(top), top.to_owned())];
        while let Some((dir, prefix)) = stack.pop() {
            let Ok(read) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in read.flatten() {
                let path = entry.path();
                let name = format!("{prefix}/{}", entry.file_name().to_string_lossy());
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(path.clone());
                    stack.push((path, name));
                    continue;
                }
                if name.ends_with(".lock") {
                    continue;
                }
                let newer = std::fs::read(&path).ok().is_some_and(|contents| {
                    gix::ObjectId::from_hex(contents.trim_ascii()).is_ok_and(|id| {
                        refs.get(&name) != Some(&id) && current.get(&name) != Some(&id)
                    })
                });
                if newer {
                    continue;
                }
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io("remove a loose ref")(e)),
                }
            }
        }
        // a directory another writer fills meanwhile is not empty: kept
        for dir in dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
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
        let refs: RefMap = [("refs/heads/main".to_owned(), id('2'))].into();
        let started = Instant::now();
        write_mirror_refs(&git, &listed(&git), &refs).expect("stale lock taken");
        assert!(started.elapsed() < LOCK_WAIT);
        assert_eq!(listed(&git), refs);
        assert!(!lock.exists());
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
