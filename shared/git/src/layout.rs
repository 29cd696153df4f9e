//! Where package revisions live in a repository (spec §4.1).
//!
//! | revision | ref |
//! |---|---|
//! | Draft | `refs/heads/drafts/<fullpath>/<workspace>` |
//! | Proposed | `refs/heads/proposed/<fullpath>/<workspace>` |
//! | Published | `refs/tags/<fullpath>/v<N>` (and the package on the branch) |
//! | DeletionProposed | Published + `refs/heads/deletionProposed/<fullpath>/v<N>` |
//! | placeholder | the package on `refs/heads/<branch>`, revision -1 |
//!
//! `<fullpath>` is `Repository.spec.git.directory` (slashes trimmed) joined
//! with the package name; parsed refs give package names relative to that
//! directory again, and refs outside it are not this repository's.

use porch_api::naming::{NameError, validate_label, validate_package_path};

/// Branch prefix of drafts.
pub const DRAFTS_PREFIX: &str = "refs/heads/drafts/";
/// Branch prefix of proposed revisions.
pub const PROPOSED_PREFIX: &str = "refs/heads/proposed/";
/// Branch prefix of deletion proposals.
pub const DELETION_PROPOSED_PREFIX: &str = "refs/heads/deletionProposed/";
/// Prefix of tags.
pub const TAGS_PREFIX: &str = "refs/tags/";
/// Prefix of branches.
pub const HEADS_PREFIX: &str = "refs/heads/";

/// The layout of one registered repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoLayout {
    /// `spec.git.directory` with leading and trailing slashes removed.
    directory: String,
    /// `spec.git.branch`.
    branch: String,
}

/// A ref name parsed back into the revision it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevisionRef {
    Draft {
        package: String,
        workspace: String,
    },
    Proposed {
        package: String,
        workspace: String,
    },
    /// A tag `<path>/v<N>`; `revision` is -1 when `N` is not a number.
    Tag {
        package: String,
        revision: i64,
    },
    /// `deletionProposed/<path>/<v<N> or branch>`.
    DeletionProposed {
        package: String,
        version: String,
    },
    /// The registered branch (placeholders).
    Branch,
}

impl RepoLayout {
    /// The layout for `spec.git.directory` and `spec.git.branch`.
    pub fn new(directory: &str, branch: &str) -> Self {
        Self {
            directory: directory.trim_matches('/').to_owned(),
            branch: branch.to_owned(),
        }
    }

    /// The registered branch.
    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// The repository directory (no leading or trailing slash; empty for the root).
    pub fn directory(&self) -> &str {
        &self.directory
    }

    /// `<directory>/<package>`: the package's path in the git tree.
    pub fn full_path(&self, package: &str) -> String {
        let package = package.trim_matches('/');
        if self.directory.is_empty() {
            package.to_owned()
        } else {
            format!("{}/{package}", self.directory)
        }
    }

    /// `refs/heads/<branch>`.
    pub fn branch_ref(&self) -> String {
        format!("{HEADS_PREFIX}{}", self.branch)
    }

    /// The branch of a draft.
    ///
    /// # Errors
    /// A package path or workspace that is not safe in a ref.
    pub fn draft_ref(&self, package: &str, workspace: &str) -> Result<String, NameError> {
        checked(package, workspace)?;
        Ok(format!(
            "{DRAFTS_PREFIX}{}/{workspace}",
            self.full_path(package)
        ))
    }

    /// The branch of a proposed revision.
    ///
    /// # Errors
    /// A package path or workspace that is not safe in a ref.
    pub fn proposed_ref(&self, package: &str, workspace: &str) -> Result<String, NameError> {
        checked(package, workspace)?;
        Ok(format!(
            "{PROPOSED_PREFIX}{}/{workspace}",
            self.full_path(package)
        ))
    }

    /// The tag of a published revision, `<fullpath>/v<N>`.
    ///
    /// # Errors
    /// A package path that is not safe in a ref.
    pub fn tag_ref(&self, package: &str, revision: u64) -> Result<String, NameError> {
        validate_package_path(package)?;
        Ok(format!(
            "{TAGS_PREFIX}{}/v{revision}",
            self.full_path(package)
        ))
    }

    /// The deletion proposal of a published revision.
    ///
    /// # Errors
    /// A package path that is not safe in a ref.
    pub fn deletion_proposed_ref(&self, package: &str, revision: u64) -> Result<String, NameError> {
        validate_package_path(package)?;
        Ok(format!(
            "{DELETION_PROPOSED_PREFIX}{}/v{revision}",
            self.full_path(package)
        ))
    }

    /// The deletion proposal of a placeholder (the package on the branch).
    ///
    /// # Errors
    /// A package path that is not safe in a ref.
    pub fn placeholder_deletion_proposed_ref(&self, package: &str) -> Result<String, NameError> {
        validate_package_path(package)?;
        Ok(format!(
            "{DELETION_PROPOSED_PREFIX}{}/{}",
            self.full_path(package),
            self.branch
        ))
    }

    /// Reads a full ref name back. `None` for refs that hold no revision of
    /// this repository: other branches, release tags without `/`, and
    /// anything outside the repository directory.
    pub fn parse_ref(&self, name: &str) -> Option<RevisionRef> {
        if name == self.branch_ref() {
            return Some(RevisionRef::Branch);
        }
        let split = |rest: &str| -> Option<(String, String)> {
            let (path, last) = rest.rsplit_once('/')?;
            let package = self.relative(path)?;
            (!last.is_empty()).then(|| (package, last.to_owned()))
        };
        if let Some(rest) = name.strip_prefix(DRAFTS_PREFIX) {
            let (package, workspace) = split(rest)?;
            return Some(RevisionRef::Draft { package, workspace });
        }
        if let Some(rest) = name.strip_prefix(PROPOSED_PREFIX) {
            let (package, workspace) = split(rest)?;
            return Some(RevisionRef::Proposed { package, workspace });
        }
        if let Some(rest) = name.strip_prefix(DELETION_PROPOSED_PREFIX) {
            let (package, version) = split(rest)?;
            return Some(RevisionRef::DeletionProposed { package, version });
        }
        if let Some(rest) = name.strip_prefix(TAGS_PREFIX) {
            let (package, version) = split(rest)?;
            return Some(RevisionRef::Tag {
                package,
                revision: parse_revision(&version),
            });
        }
        None
    }

    /// A path in the git tree made relative to the repository directory;
    /// `None` outside it or when nothing is left.
    fn relative(&self, path: &str) -> Option<String> {
        let rest = if self.directory.is_empty() {
            path
        } else {
            path.strip_prefix(&self.directory)?.strip_prefix('/')?
        };
        (!rest.is_empty()).then(|| rest.to_owned())
    }
}

/// `v<N>` → `N`; anything else → -1 (spec §4.1).
pub fn parse_revision(version: &str) -> i64 {
    version
        .strip_prefix('v')
        .unwrap_or(version)
        .parse::<i64>()
        .ok()
        .filter(|n| *n >= 0)
        .unwrap_or(-1)
}

fn checked(package: &str, workspace: &str) -> Result<(), NameError> {
    validate_package_path(package)?;
    validate_label("workspace", workspace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn refs_of_every_state() {
        let root = RepoLayout::new("", "main");
        assert_eq!(
            root.draft_ref("net/basens", "ws1").as_deref(),
            Ok("refs/heads/drafts/net/basens/ws1")
        );
        assert_eq!(
            root.proposed_ref("basens", "ws1").as_deref(),
            Ok("refs/heads/proposed/basens/ws1")
        );
        assert_eq!(
            root.tag_ref("basens", 3).as_deref(),
            Ok("refs/tags/basens/v3")
        );
        assert_eq!(
            root.deletion_proposed_ref("basens", 3).as_deref(),
            Ok("refs/heads/deletionProposed/basens/v3")
        );
        assert_eq!(
            root.placeholder_deletion_proposed_ref("basens").as_deref(),
            Ok("refs/heads/deletionProposed/basens/main")
        );
        assert_eq!(root.branch_ref(), "refs/heads/main");

        let dir = RepoLayout::new("/blueprints/", "release");
        assert_eq!(dir.full_path("a/b"), "blueprints/a/b");
        assert_eq!(
            dir.tag_ref("a/b", 1).as_deref(),
            Ok("refs/tags/blueprints/a/b/v1")
        );
        assert_eq!(
            dir.draft_ref("a", "w").as_deref(),
            Ok("refs/heads/drafts/blueprints/a/w")
        );
    }

    #[test]
    fn parses_refs_back_relative_to_the_directory() {
        let dir = RepoLayout::new("blueprints", "main");
        let cases = [
            (
                "refs/heads/drafts/blueprints/net/basens/ws1",
                Some(RevisionRef::Draft {
                    package: "net/basens".into(),
                    workspace: "ws1".into(),
                }),
            ),
            (
                "refs/heads/proposed/blueprints/basens/ws2",
                Some(RevisionRef::Proposed {
                    package: "basens".into(),
                    workspace: "ws2".into(),
                }),
            ),
            (
                "refs/tags/blueprints/basens/v12",
                Some(RevisionRef::Tag {
                    package: "basens".into(),
                    revision: 12,
                }),
            ),
            (
                "refs/tags/blueprints/basens/latest",
                Some(RevisionRef::Tag {
                    package: "basens".into(),
                    revision: -1,
                }),
            ),
            (
                "refs/heads/deletionProposed/blueprints/basens/v2",
                Some(RevisionRef::DeletionProposed {
                    package: "basens".into(),
                    version: "v2".into(),
                }),
            ),
            ("refs/heads/main", Some(RevisionRef::Branch)),
            // release tags without '/', other directories, other branches
            ("refs/tags/v1.0.0", None),
            ("refs/tags/other/basens/v1", None),
            ("refs/heads/drafts/other/basens/ws", None),
            ("refs/heads/feature", None),
            ("refs/heads/drafts/blueprints/ws", None),
            ("refs/heads/drafts/blueprints/basens/", None),
        ];
        for (name, want) in cases {
            assert_eq!(dir.parse_ref(name), want, "{name}");
        }
        // directory "blue" must not match "blueprints"
        assert_eq!(
            RepoLayout::new("blue", "main").parse_ref("refs/tags/blueprints/a/v1"),
            None
        );
    }

    #[test]
    fn composed_refs_parse_back() {
        for layout in [RepoLayout::new("", "main"), RepoLayout::new("x/y", "trunk")] {
            let draft = layout.draft_ref("a/b/c", "w-1").expect("ref");
            assert_eq!(
                layout.parse_ref(&draft),
                Some(RevisionRef::Draft {
                    package: "a/b/c".into(),
                    workspace: "w-1".into()
                })
            );
            let tag = layout.tag_ref("a/b/c", 7).expect("ref");
            assert_eq!(
                layout.parse_ref(&tag),
                Some(RevisionRef::Tag {
                    package: "a/b/c".into(),
                    revision: 7
                })
            );
        }
    }

    #[test]
    fn hostile_names_never_become_refs() {
        let layout = RepoLayout::new("", "main");
        for package in [
            "../x",
            "a/../../b",
            "/abs",
            "a/.git",
            "a//b",
            "a b",
            "a\\b",
            "a\0b",
        ] {
            assert!(layout.draft_ref(package, "ws").is_err(), "{package:?}");
            assert!(layout.tag_ref(package, 1).is_err(), "{package:?}");
        }
        for workspace in ["..", "a/b", "WS", "x.lock", "a~1", "a:b", ""] {
            assert!(layout.draft_ref("pkg", workspace).is_err(), "{workspace:?}");
        }
    }

    #[test]
    fn revisions_from_versions() {
        assert_eq!(parse_revision("v3"), 3);
        assert_eq!(parse_revision("12"), 12);
        assert_eq!(parse_revision("main"), -1);
        assert_eq!(parse_revision("v1.2"), -1);
        assert_eq!(parse_revision("v-4"), -1);
    }
}
