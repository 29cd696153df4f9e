//! Object names and the paths inside them (spec §6.2).
//!
//! A PackageRevision is named `<repo>.<dotted package path>.<workspace>`, e.g.
//! `blueprints.net.basens.v1` for package `net/basens`, workspace `v1`. Parsing
//! accepts the legacy form where the workspace is a dotted version (`.v1.2`).

use std::fmt;

/// Longest DNS-1123 label.
pub const MAX_LABEL_LEN: usize = 63;
/// Longest DNS-1123 subdomain (and so the longest object name).
pub const MAX_SUBDOMAIN_LEN: usize = 253;
/// Most directory levels a package path may have.
pub const MAX_PACKAGE_DEPTH: usize = 16;

/// Why a name or path is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{what} must not be empty")]
    Empty { what: &'static str },
    #[error("{what} {value:?} is longer than {max} characters")]
    TooLong {
        what: &'static str,
        value: String,
        max: usize,
    },
    #[error(
        "{what} {value:?} is not a DNS-1123 label: use lowercase letters, digits and '-', starting and ending with a letter or digit"
    )]
    NotLabel { what: &'static str, value: String },
    #[error(
        "{what} {value:?} is not a DNS-1123 subdomain: use lowercase letters, digits, '-' and '.'"
    )]
    NotSubdomain { what: &'static str, value: String },
    #[error("{what} {value:?} must be a relative path: {reason}")]
    UnsafePath {
        what: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error(
        "branch {value:?} is not a valid branch name: use letters, digits, '.', '_', '-' and '/', with no '..', no empty or dot-led segments, and no '.lock' ending"
    )]
    BadBranch { value: String },
    #[error("directory {value:?} cannot be part of a git ref name: {reason}")]
    NotInRef { value: String, reason: &'static str },
    #[error("package name {value:?} has more than {max} path segments")]
    TooDeep { value: String, max: usize },
    #[error(
        "name {value:?} must have the form <repository>.<package path>.<workspace> with at least three dot-separated parts"
    )]
    Shape { value: String },
}

/// Whether `s` is a DNS-1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL_LEN
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a DNS-1123 subdomain: labels joined by '.', at most 253.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SUBDOMAIN_LEN && s.split('.').all(is_dns1123_label)
}

/// Checks a DNS-1123 label with a message naming the field.
///
/// # Errors
/// Empty, too long, or characters outside the label alphabet.
pub fn validate_label(what: &'static str, value: &str) -> Result<(), NameError> {
    if value.is_empty() {
        return Err(NameError::Empty { what });
    }
    if value.len() > MAX_LABEL_LEN {
        return Err(NameError::TooLong {
            what,
            value: truncate(value),
            max: MAX_LABEL_LEN,
        });
    }
    if !is_dns1123_label(value) {
        return Err(NameError::NotLabel {
            what,
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// Checks `spec.packageName`: a relative slash path whose segments are
/// DNS-1123 labels, so it can be part of an object name and can never escape
/// the repository directory.
///
/// # Errors
/// Absolute paths, `..`, `.`, `.git`, empty segments, backslashes, control
/// characters, too many segments, or a segment that is not a label.
pub fn validate_package_path(value: &str) -> Result<(), NameError> {
    let unsafe_path = |reason| NameError::UnsafePath {
        what: "package name",
        value: truncate(value),
        reason,
    };
    if value.is_empty() {
        return Err(NameError::Empty {
            what: "package name",
        });
    }
    if value.len() > MAX_SUBDOMAIN_LEN {
        return Err(NameError::TooLong {
            what: "package name",
            value: truncate(value),
            max: MAX_SUBDOMAIN_LEN,
        });
    }
    if value.chars().any(char::is_control) {
        return Err(unsafe_path("control characters are not allowed"));
    }
    if value.contains('\\') {
        return Err(unsafe_path("backslashes are not allowed"));
    }
    if value.starts_with('/') {
        return Err(unsafe_path("absolute paths are not allowed"));
    }
    let segments: Vec<&str> = value.split('/').collect();
    if segments.len() > MAX_PACKAGE_DEPTH {
        return Err(NameError::TooDeep {
            value: truncate(value),
            max: MAX_PACKAGE_DEPTH,
        });
    }
    for segment in &segments {
        match *segment {
            "" => return Err(unsafe_path("empty path segments are not allowed")),
            "." | ".." => return Err(unsafe_path("'.' and '..' segments are not allowed")),
            s if s.eq_ignore_ascii_case(".git") => {
                return Err(unsafe_path("'.git' segments are not allowed"));
            }
            s => validate_label("package path segment", s)?,
        }
    }
    Ok(())
}

/// Longest repository URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// Checks a git repository address: `https://`, `http://`, `ssh://`, `git://`
/// or `file://` URLs, or scp-like `user@host:path`. Credentials in the URL are
/// refused (they belong in a Secret).
///
/// # Errors
/// Empty, too long, whitespace or control characters, an unknown scheme, no
/// host, or a password in the URL.
pub fn validate_git_url(value: &str) -> Result<(), UrlError> {
    let err = |reason| UrlError {
        value: truncate(value),
        reason,
    };
    if value.is_empty() {
        return Err(err("it is empty"));
    }
    if value.len() > MAX_URL_LEN {
        return Err(err("it is longer than 2048 characters"));
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(err("it contains whitespace or control characters"));
    }
    let Some((scheme, rest)) = value.split_once("://") else {
        // scp-like syntax: [user@]host:path
        let (host, path) = value.split_once(':').ok_or_else(|| {
            err("use https://, http://, ssh://, git://, file:// or user@host:path")
        })?;
        let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
        if host.is_empty() || path.is_empty() || host.contains('/') || host.starts_with('-') {
            return Err(err(
                "use https://, http://, ssh://, git://, file:// or user@host:path",
            ));
        }
        return Ok(());
    };
    match scheme.to_ascii_lowercase().as_str() {
        "file" => {
            if rest.starts_with('/') {
                Ok(())
            } else {
                Err(err("file:// URLs need an absolute path"))
            }
        }
        "https" | "http" | "ssh" | "git" => {
            let authority = rest.split('/').next().unwrap_or_default();
            let (userinfo, host) = authority.rsplit_once('@').unwrap_or(("", authority));
            if userinfo.contains(':') {
                return Err(err(
                    "put credentials in a Secret (spec.git.secretRef), not in the URL",
                ));
            }
            let host_ok = !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-_:[]".contains(c));
            if host_ok {
                Ok(())
            } else {
                Err(err(
                    "the host is missing or has characters a host cannot have",
                ))
            }
        }
        _ => Err(err("the scheme must be https, http, ssh, git or file")),
    }
}

/// An unacceptable repository address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("repository address {value:?} is not valid: {reason}")]
pub struct UrlError {
    pub value: String,
    pub reason: &'static str,
}

/// Checks a branch name: letters, digits, `.`, `_`, `-` and `/`, with git's
/// rules on where dots and slashes may go.
///
/// # Errors
/// Any character or placement git would refuse, or longer than 255.
pub fn validate_branch_name(value: &str) -> Result<(), NameError> {
    let bad = || NameError::BadBranch {
        value: truncate(value),
    };
    if value.is_empty() {
        return Err(NameError::Empty { what: "branch" });
    }
    if value.len() > 255 {
        return Err(NameError::TooLong {
            what: "branch",
            value: truncate(value),
            max: 255,
        });
    }
    let chars_ok = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c));
    let placement_ok = !value.contains("..")
        && !value.starts_with('-')
        && value.split('/').all(|seg| {
            !seg.is_empty()
                && !seg.starts_with('.')
                && !seg.ends_with('.')
                && !seg.ends_with(".lock")
        });
    if chars_ok && placement_ok {
        Ok(())
    } else {
        Err(bad())
    }
}

/// Checks a directory inside a repository (`spec.git.directory`, a clone's
/// `directory`): leading and trailing slashes are ignored; no `..`, `.git`,
/// empty segments, backslashes or control characters. The directory is part
/// of the names of the refs that hold its packages' revisions, so each
/// segment also follows git's ref rules: no leading `.`, no `..`, no trailing `.` or
/// `.lock`, none of ` ~^:?*[`, no `@{`, and not `@`.
///
/// # Errors
/// Any of the above, or longer than 1024.
pub fn validate_repo_directory(value: &str) -> Result<(), NameError> {
    let unsafe_path = |reason| NameError::UnsafePath {
        what: "directory",
        value: truncate(value),
        reason,
    };
    if value.len() > 1024 {
        return Err(NameError::TooLong {
            what: "directory",
            value: truncate(value),
            max: 1024,
        });
    }
    if value.chars().any(char::is_control) {
        return Err(unsafe_path("control characters are not allowed"));
    }
    if value.contains('\\') {
        return Err(unsafe_path("backslashes are not allowed"));
    }
    let trimmed = value.trim_matches('/');
    if trimmed.is_empty() {
        return Ok(());
    }
    for segment in trimmed.split('/') {
        match segment {
            "" => return Err(unsafe_path("empty path segments are not allowed")),
            "." | ".." => return Err(unsafe_path("'.' and '..' segments are not allowed")),
            s if s.eq_ignore_ascii_case(".git") => {
                return Err(unsafe_path("'.git' segments are not allowed"));
            }
            s => {
                if let Some(reason) = ref_segment_problem(s) {
                    return Err(NameError::NotInRef {
                        value: truncate(value),
                        reason,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Why a path segment cannot be a component of a git ref name, if it cannot.
fn ref_segment_problem(segment: &str) -> Option<&'static str> {
    if segment.starts_with('.') || segment.contains("..") {
        Some("a segment starts with '.' or contains '..'")
    } else if segment.ends_with('.') || segment.ends_with(".lock") {
        Some("a segment ends with '.' or '.lock'")
    } else if segment.contains([' ', '~', '^', ':', '?', '*', '[']) {
        Some("it contains one of ' ~^:?*['")
    } else if segment.contains("@{") || segment == "@" {
        Some("it contains '@{' or a segment '@'")
    } else {
        None
    }
}

/// The identity encoded in a PackageRevision name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionName {
    pub repository: String,
    /// Slash path of the package, relative to the repository directory.
    pub package_name: String,
    pub workspace_name: String,
}

impl RevisionName {
    /// Composes `<repo>.<dotted path>.<workspace>` (Porch's `ComposePkgRevObjName`).
    pub fn compose(repository: &str, package_name: &str, workspace_name: &str) -> String {
        let dotted = package_name.replace('/', ".");
        let dotted = dotted.trim_matches('.');
        let mut name =
            String::with_capacity(repository.len() + dotted.len() + workspace_name.len() + 2);
        name.push_str(repository);
        if !dotted.is_empty() {
            name.push('.');
            name.push_str(dotted);
        }
        name.push('.');
        name.push_str(workspace_name);
        name
    }

    /// The object name of this identity.
    pub fn to_name(&self) -> String {
        Self::compose(&self.repository, &self.package_name, &self.workspace_name)
    }

    /// Parses a name back (Porch's `PkgRevK8sName2Key`) and checks every
    /// DNS-1123 rule: repository, package and workspace are labels (a legacy
    /// `v1.2` workspace is accepted), and the whole name is a subdomain.
    ///
    /// # Errors
    /// Fewer than three parts, or any part breaking its rule.
    pub fn parse(name: &str) -> Result<Self, NameError> {
        if name.len() > MAX_SUBDOMAIN_LEN {
            return Err(NameError::TooLong {
                what: "name",
                value: truncate(name),
                max: MAX_SUBDOMAIN_LEN,
            });
        }
        if let Some(long) = name.split('.').find(|s| s.len() > MAX_LABEL_LEN) {
            return Err(NameError::TooLong {
                what: "name segment",
                value: truncate(long),
                max: MAX_LABEL_LEN,
            });
        }
        if !is_dns1123_subdomain(name) {
            return Err(NameError::NotSubdomain {
                what: "name",
                value: name.to_owned(),
            });
        }
        let parts: Vec<&str> = name.split('.').collect();
        let ws_start = legacy_workspace_start(&parts).unwrap_or(parts.len() - 1);
        if parts.len() < 3 || ws_start < 2 {
            return Err(NameError::Shape {
                value: name.to_owned(),
            });
        }
        let repository = parts[0];
        let package = &parts[1..ws_start];
        let workspace_name = parts[ws_start..].join(".");
        validate_label("repository", repository)?;
        let leaf = package[package.len() - 1];
        validate_label("package", leaf)?;
        let path_len: usize = package[..package.len() - 1].iter().map(|s| s.len()).sum();
        if path_len > MAX_LABEL_LEN {
            return Err(NameError::TooLong {
                what: "package path",
                value: package[..package.len() - 1].join("/"),
                max: MAX_LABEL_LEN,
            });
        }
        if ws_start == parts.len() - 1 {
            validate_label("workspace", &workspace_name)?;
        }
        Ok(RevisionName {
            repository: repository.to_owned(),
            package_name: package.join("/"),
            workspace_name,
        })
    }
}

impl fmt::Display for RevisionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_name())
    }
}

/// Index of the first part of a trailing `v<digits>(.<digits>)+` workspace.
fn legacy_workspace_start(parts: &[&str]) -> Option<usize> {
    let is_digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    let mut i = parts.len();
    while i > 0 && is_digits(parts[i - 1]) {
        i -= 1;
    }
    // at least one numeric part after the `v<digits>` part
    if i == parts.len() || i == 0 {
        return None;
    }
    let head = parts[i - 1];
    (head.len() > 1 && head.starts_with('v') && is_digits(&head[1..])).then_some(i - 1)
}

fn truncate(value: &str) -> String {
    const SHOWN: usize = 80;
    if value.len() <= SHOWN {
        return value.to_owned();
    }
    let mut end = SHOWN;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &value[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(name: &str) -> (String, String, String) {
        let n = RevisionName::parse(name).expect(name);
        (n.repository, n.package_name, n.workspace_name)
    }

    #[test]
    fn composes_like_porch() {
        assert_eq!(
            RevisionName::compose("blueprints", "net/basens", "v1"),
            "blueprints.net.basens.v1"
        );
        assert_eq!(
            RevisionName::compose("blueprints", "basens", "main"),
            "blueprints.basens.main"
        );
        assert_eq!(RevisionName::compose("r", "/a/b/", "ws"), "r.a.b.ws");
    }

    #[test]
    fn parses_paths_and_workspaces() {
        assert_eq!(
            parsed("blueprints.net.basens.v1"),
            ("blueprints".into(), "net/basens".into(), "v1".into())
        );
        assert_eq!(
            parsed("repo.pkg.ws"),
            ("repo".into(), "pkg".into(), "ws".into())
        );
        assert_eq!(
            parsed("repo.a.b.c.pkg.main"),
            ("repo".into(), "a/b/c/pkg".into(), "main".into())
        );
    }

    #[test]
    fn parses_the_legacy_semver_workspace() {
        assert_eq!(
            parsed("repo.pkg.v1.2"),
            ("repo".into(), "pkg".into(), "v1.2".into())
        );
        assert_eq!(
            parsed("repo.a.pkg.v1.2.3"),
            ("repo".into(), "a/pkg".into(), "v1.2.3".into())
        );
        // `v1` alone is an ordinary workspace; `1.2` without `v` is not legacy
        assert_eq!(
            parsed("repo.pkg.v1"),
            ("repo".into(), "pkg".into(), "v1".into())
        );
        assert_eq!(
            parsed("repo.pkg.1.2"),
            ("repo".into(), "pkg.1".replace('.', "/"), "2".into())
        );
    }

    #[test]
    fn compose_and_parse_are_inverse() {
        for (r, p, w) in [
            ("a", "b", "c"),
            ("blueprints", "x/y/z", "draft-1"),
            ("r", "p", "v3.1"),
        ] {
            let name = RevisionName::compose(r, p, w);
            assert_eq!(parsed(&name), (r.into(), p.into(), w.into()));
        }
    }

    #[test]
    fn rejects_bad_names() {
        for bad in [
            "",
            "a.b",
            "Repo.pkg.ws",
            "repo..ws",
            "repo.pkg.ws.",
            "-r.pkg.ws",
            "r.p_kg.ws",
            "r.pkg.v1.2.",
        ] {
            assert!(RevisionName::parse(bad).is_err(), "{bad:?} accepted");
        }
        let long = format!("r.{}.ws", "p".repeat(250));
        assert!(matches!(
            RevisionName::parse(&long),
            Err(NameError::TooLong { .. })
        ));
        let long_label = format!("r.{}.ws", "p".repeat(64));
        assert!(matches!(
            RevisionName::parse(&long_label),
            Err(NameError::TooLong { .. })
        ));
        let err = RevisionName::parse("a.b").expect_err("two parts");
        assert!(
            err.to_string()
                .contains("<repository>.<package path>.<workspace>"),
            "{err}"
        );
    }

    #[test]
    fn package_paths_cannot_escape() {
        for ok in ["basens", "net/basens", "a/b-c/d1"] {
            validate_package_path(ok).expect(ok);
        }
        let cases = [
            ("../etc", "'.' and '..'"),
            ("a/../../b", "'.' and '..'"),
            ("/abs/path", "absolute"),
            ("a//b", "empty path segments"),
            ("a/.git", "'.git'"),
            ("a/.GIT/b", "'.git'"),
            ("a\\b", "backslashes"),
            ("a\0b", "control"),
            ("a/", "empty path segments"),
            ("A/b", "DNS-1123 label"),
            ("a/b_c", "DNS-1123 label"),
            ("", "must not be empty"),
        ];
        for (bad, message) in cases {
            let err = validate_package_path(bad).expect_err(bad);
            assert!(err.to_string().contains(message), "{bad:?}: {err}");
        }
        let deep = vec!["a"; MAX_PACKAGE_DEPTH + 1].join("/");
        assert!(matches!(
            validate_package_path(&deep),
            Err(NameError::TooDeep { .. })
        ));
        let long = "a".repeat(300);
        assert!(matches!(
            validate_package_path(&long),
            Err(NameError::TooLong { .. })
        ));
    }

    #[test]
    fn git_urls() {
        for ok in [
            "https://github.com/kptdev/kpt.git",
            "http://127.0.0.1:8080/repo.git",
            "ssh://git@example.com/x.git",
            "git@github.com:org/repo.git",
            "file:///srv/git/repo.git",
            "https://token@example.com/r.git",
        ] {
            validate_git_url(ok).expect(ok);
        }
        let cases = [
            ("", "empty"),
            ("ftp://example.com/r", "scheme"),
            ("https://user:secret@example.com/r.git", "Secret"),
            ("https:///path", "host"),
            ("file://relative/path", "absolute"),
            ("https://exa mple.com/r", "whitespace"),
            ("just-a-word", "user@host:path"),
            ("-oProxyCommand=x:repo", "user@host:path"),
        ];
        for (bad, why) in cases {
            let err = validate_git_url(bad).expect_err(bad);
            assert!(err.to_string().contains(why), "{bad:?}: {err}");
        }
        assert!(validate_git_url(&format!("https://h/{}", "a".repeat(3000))).is_err());
    }

    #[test]
    fn branches_and_directories() {
        for ok in ["main", "release/v1.2", "feature_x-1"] {
            validate_branch_name(ok).expect(ok);
        }
        for bad in [
            "",
            "illegal$$$Characters",
            "a..b",
            "-x",
            "x.lock",
            "a.lock/b",
            "a//b",
            "/a",
            "a/",
            ".hidden",
            "with space",
        ] {
            assert!(validate_branch_name(bad).is_err(), "{bad:?} accepted");
        }
        for ok in ["", "/", "/blueprints", "a/b/", "pkgs", "v1.2/x_y", "a@b"] {
            validate_repo_directory(ok).expect(ok);
        }
        for bad in [
            "../up",
            "a/../b",
            "a//b",
            ".git",
            "a/.git/x",
            "a\\b",
            "a\u{1}",
            // not in a git ref name
            "/.infra/",
            "a/b.",
            "x.lock",
            "with space",
            "a~1",
            "a^",
            "c:d",
            "a?",
            "*",
            "[x",
            "a@{1}",
            "@",
        ] {
            assert!(validate_repo_directory(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn labels_and_subdomains() {
        assert!(is_dns1123_label("a-1"));
        assert!(!is_dns1123_label("a."));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain("a.b-c.d"));
        assert!(!is_dns1123_subdomain("a..b"));
        let err = validate_label("workspace", "Bad_Name").expect_err("bad");
        assert!(
            err.to_string()
                .contains("workspace \"Bad_Name\" is not a DNS-1123 label"),
            "{err}"
        );
    }
}
