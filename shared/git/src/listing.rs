//! A repository's branches and tags read straight from its ref files, for
//! the callers that want all of them on every operation (the snapshot's
//! save and load, the local remote's fetch).
//!
//! A large repository keeps most refs in `packed-refs`: at 10,000 packages
//! that is 20,000 lines to parse, check and copy into a map each time. The
//! parse is kept per repository for as long as the file's bytes stay the
//! same (compared byte for byte, not by size or time, which a rewrite in
//! the same clock tick can leave unchanged); loose ref files are read every
//! time, and they are few, since a mirror rewrites `packed-refs` when many
//! refs move. Anything unexpected in the files (a line that is not an id
//! and a name, an id that is not SHA-1, a name git would refuse) makes the
//! caller fall back to listing through gix.

use gix::ObjectId;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

/// Branch and tag names → the ids their files hold (an annotated tag's own
/// id).
pub type RefMap = BTreeMap<String, ObjectId>;

/// Repositories whose `packed-refs` parse is kept; more drop them all.
const MAX_REPOSITORIES: usize = 64;

struct Parsed {
    packed_bytes: Vec<u8>,
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
    let mut refs = RefMap::new();
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
        refs.insert(name.to_owned(), id);
    }
    Some(refs)
}

/// Every loose branch and tag, sorted by name; `None` for anything
/// unexpected. Symbolic refs are skipped, as a listing of direct refs does.
fn read_loose(git_dir: &Path) -> Option<Vec<(String, ObjectId)>> {
    let mut out = Vec::new();
    let mut stack: Vec<(PathBuf, String)> = ["refs/heads", "refs/tags"]
        .iter()
        .map(|top| (git_dir.join(top), (*top).to_owned()))
        .collect();
    while let Some((dir, prefix)) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => return None,
        };
        for entry in entries {
            let entry = entry.ok()?;
            let file_name = entry.file_name();
            let file_name = file_name.to_str()?;
            let name = format!("{prefix}/{file_name}");
            let kind = entry.file_type().ok()?;
            if kind.is_dir() {
                stack.push((entry.path(), name));
                continue;
            }
            if file_name.ends_with(".lock") {
                continue;
            }
            let contents = match std::fs::read(entry.path()) {
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
    }
    out.sort();
    Some(out)
}

/// The branches and tags of the repository at `git_dir`, loose refs over
/// packed ones; `None` when the files hold something this reader does not
/// expect (list through gix instead).
pub fn branches_and_tags(git_dir: &Path) -> Option<Arc<RefMap>> {
    let packed_bytes = match std::fs::read(git_dir.join("packed-refs")) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(_) => return None,
    };
    let loose = read_loose(git_dir)?;
    let mut parsed = PARSED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(entry) = parsed.get_mut(git_dir)
        && entry.packed_bytes == packed_bytes
    {
        if entry.loose != loose {
            let mut merged = RefMap::clone(&entry.packed);
            merged.extend(loose.iter().cloned());
            entry.merged = Arc::new(merged);
            entry.loose = loose;
        }
        return Some(Arc::clone(&entry.merged));
    }
    // parsed outside the lock would let two threads parse the same file;
    // a parse is rare (the file changed) and short next to its use
    let packed = Arc::new(parse_packed(&packed_bytes)?);
    let mut merged = RefMap::clone(&packed);
    merged.extend(loose.iter().cloned());
    let merged = Arc::new(merged);
    if parsed.len() >= MAX_REPOSITORIES && !parsed.contains_key(git_dir) {
        parsed.clear();
    }
    parsed.insert(
        git_dir.to_path_buf(),
        Parsed {
            packed_bytes,
            packed,
            loose,
            merged: Arc::clone(&merged),
        },
    );
    Some(merged)
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
}
