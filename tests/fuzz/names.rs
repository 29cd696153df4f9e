//! Names and paths: what validation accepts is safe to use as a path and as
//! a git ref, and names parse back to what they were composed from.

use porch_api::naming::{
    RevisionName, is_dns1123_label, validate_branch_name, validate_git_url, validate_package_path,
    validate_repo_directory,
};
use porch_git::layout::{RepoLayout, RevisionRef};
use porch_git::repo::validate_file_path;

/// No empty, `.`, `..` or `.git` segment, no leading slash, no backslash or
/// control character.
fn assert_safe_path(what: &str, path: &str) {
    assert!(!path.starts_with('/'), "{what} {path:?} is absolute");
    assert!(
        !path.chars().any(|c| c.is_control() || c == '\\'),
        "{what} {path:?} has a control character or backslash"
    );
    for segment in path.split('/') {
        assert!(
            !matches!(segment, "" | "." | "..") && !segment.eq_ignore_ascii_case(".git"),
            "{what} {path:?} has the segment {segment:?}"
        );
    }
}

fn assert_ref(name: &str) {
    assert!(
        gix::refs::FullName::try_from(name).is_ok(),
        "{name:?} is not a valid git ref name"
    );
}

/// One value against every validator on its own.
fn single(value: &str) {
    if validate_package_path(value).is_ok() {
        assert_safe_path("package path", value);
        for segment in value.split('/') {
            assert!(is_dns1123_label(segment), "{value:?}: {segment:?}");
        }
        // a package path is a safe file path
        assert!(
            validate_file_path(value).is_ok(),
            "package path {value:?} is not a safe file path"
        );
    }
    if validate_file_path(value).is_ok() {
        assert_safe_path("file path", value);
        assert!(
            porch_krm::package::check_path(value).is_ok(),
            "file path {value:?} is refused by the package reader"
        );
    }
    if validate_repo_directory(value).is_ok() {
        let trimmed = value.trim_matches('/');
        if !trimmed.is_empty() {
            assert_safe_path("directory", trimmed);
            // the directory is part of its packages' ref names
            assert_ref(&format!("refs/heads/drafts/{trimmed}/pkg/ws"));
        }
    }
    if validate_branch_name(value).is_ok() {
        assert_ref(&format!("refs/heads/{value}"));
    }
    if validate_git_url(value).is_ok() {
        assert!(
            !value.chars().any(|c| c.is_whitespace() || c.is_control()),
            "URL {value:?} has whitespace or a control character"
        );
    }
    if is_dns1123_label(value) {
        assert!(!value.is_empty() && value.len() <= 63, "label {value:?}");
        assert!(
            value
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
            "label {value:?}"
        );
    }
    if let Ok(name) = RevisionName::parse(value) {
        assert_eq!(name.to_name(), value, "{name:?} composes another name");
    }
}

/// The input is `package\nworkspace\ndirectory\nbranch`; each part is also
/// checked on its own, and the whole input too.
pub fn names(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    single(&text);
    let mut parts = text.splitn(4, '\n');
    let package = parts.next().unwrap_or_default();
    let workspace = parts.next().unwrap_or_default();
    let directory = parts.next().unwrap_or_default();
    let branch = parts.next().unwrap_or_default();
    for part in [package, workspace, directory, branch] {
        single(part);
    }
    let layout = RepoLayout::new(directory, branch);
    let layout_ok =
        validate_repo_directory(directory).is_ok() && validate_branch_name(branch).is_ok();
    if let Ok(draft) = layout.draft_ref(package, workspace) {
        assert!(validate_package_path(package).is_ok(), "{draft}");
        if layout_ok {
            assert_ref(&draft);
            assert_eq!(
                layout.parse_ref(&draft),
                Some(RevisionRef::Draft {
                    package: package.to_owned(),
                    workspace: workspace.to_owned(),
                }),
                "{draft} does not parse back"
            );
        }
    }
    if let Ok(proposed) = layout.proposed_ref(package, workspace)
        && layout_ok
    {
        assert_ref(&proposed);
        assert_eq!(
            layout.parse_ref(&proposed),
            Some(RevisionRef::Proposed {
                package: package.to_owned(),
                workspace: workspace.to_owned(),
            }),
            "{proposed} does not parse back"
        );
    }
    let revision = u64::from(data.len() as u32 % 1000);
    if let Ok(tag) = layout.tag_ref(package, revision)
        && layout_ok
    {
        assert_ref(&tag);
        assert_eq!(
            layout.parse_ref(&tag),
            Some(RevisionRef::Tag {
                package: package.to_owned(),
                revision: i64::try_from(revision).expect("below 1000"),
            }),
            "{tag} does not parse back"
        );
    }
    if let Ok(deletion) = layout.deletion_proposed_ref(package, revision)
        && layout_ok
    {
        assert_ref(&deletion);
    }
    if validate_package_path(package).is_ok() && workspace_ok(workspace) {
        let name = RevisionName::compose("repo", package, workspace);
        if let Ok(parsed) = RevisionName::parse(&name) {
            assert_eq!(parsed.to_name(), name);
        }
    }
}

fn workspace_ok(workspace: &str) -> bool {
    is_dns1123_label(workspace)
}
