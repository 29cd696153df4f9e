//! Fixtures and the kpt oracle.

use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Writes an exec function that echoes its ResourceList: kpt then only
/// reads and rewrites the package.
pub(crate) fn identity_function(dir: &Path) -> PathBuf {
    let path = dir.join("identity.sh");
    std::fs::write(&path, "#!/bin/sh\nexec cat\n").expect("write identity function");
    let mut perms = std::fs::metadata(&path).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).expect("chmod");
    path
}

/// Runs `kpt fn render` on a directory; panics with kpt's output on failure.
pub(crate) fn kpt_render(dir: &Path) {
    let output = Command::new("kpt")
        .args(["fn", "render", "--allow-exec", "--truncate-output=false"])
        .arg(dir)
        .output()
        .expect("kpt is installed on this machine");
    assert!(
        output.status.success(),
        "kpt fn render failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Every file under a directory: relative slash path → bytes.
pub(crate) fn read_tree(root: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path
                    .strip_prefix(root)
                    .expect("under root")
                    .to_string_lossy()
                    .replace('\\', "/");
                out.insert(rel, std::fs::read(&path).expect("read file"));
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(root, root, &mut out);
    out
}
