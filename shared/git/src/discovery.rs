//! Every package revision of a repository, found from its refs (spec §4.1,
//! §6.2): drafts and proposed revisions from their branches, published
//! revisions from tags (`<path>/v<N>`, with a Kptfile at `<path>`), deletion
//! proposals from their branches, and one placeholder (revision -1,
//! workspace = branch) per package on the registered branch.
//!
//! A package is a directory holding a `Kptfile`; directories with a
//! `Kptfile` below a package are its subpackages, not packages of their own.

use crate::annotation::parse_annotations;
use crate::layout::{RepoLayout, RevisionRef};
use crate::repo::{CommitInfo, GitRepo, PathLookup, RepoError};
use gix::ObjectId;
use porch_api::Lifecycle;
use porch_api::common::{GitLock, Locator};
use porch_api::kptfile::Kptfile;
use porch_api::naming::RevisionName;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One package revision as git holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveredRevision {
    /// The PackageRevision's object name.
    pub name: String,
    /// Package path relative to the repository directory.
    pub package: String,
    pub workspace: String,
    /// 0 for drafts and proposed revisions, N for `v<N>`, -1 for placeholders.
    pub revision: i64,
    pub lifecycle: Lifecycle,
    /// The commit the revision's ref points at.
    pub commit: ObjectId,
    /// Author email and time of that commit: `publishedBy` / `publishedAt`
    /// for published revisions.
    pub author: String,
    pub author_time: i64,
    pub self_lock: Locator,
    /// From the Kptfile's `upstreamLock`, when it has a git one.
    pub upstream_lock: Option<Locator>,
}

/// Finds every package revision of `repository` (the Repository's name).
///
/// # Errors
/// Unreadable refs or objects.
pub fn discover(
    repo: &GitRepo,
    layout: &RepoLayout,
    repository: &str,
    remote_url: &str,
) -> Result<Vec<DiscoveredRevision>, RepoError> {
    let refs = repo.refs()?;
    let parsed: Vec<(&String, &ObjectId, RevisionRef)> = refs
        .iter()
        .filter_map(|(name, id)| layout.parse_ref(name).map(|r| (name, id, r)))
        .collect();
    let deletion_proposed: BTreeSet<(String, String)> = parsed
        .iter()
        .filter_map(|(_, _, r)| match r {
            RevisionRef::DeletionProposed { package, version } => {
                Some((package.clone(), version.clone()))
            }
            _ => None,
        })
        .collect();
    let mut found = BTreeMap::new();
    let mut lookup = PathLookup::new(repo);
    let mut infos: HashMap<ObjectId, CommitInfo> = HashMap::new();
    let mut locks: HashMap<ObjectId, Option<Locator>> = HashMap::new();
    let commit_info = |infos: &mut HashMap<ObjectId, CommitInfo>,
                       id: ObjectId|
     -> Result<CommitInfo, RepoError> {
        if let Some(info) = infos.get(&id) {
            return Ok(info.clone());
        }
        let info = repo.commit_info(id)?;
        infos.insert(id, info.clone());
        Ok(info)
    };
    for (full_ref, commit, parsed_ref) in &parsed {
        let short = short_ref(full_ref);
        let candidates: Vec<(String, String, i64, Lifecycle)> = match parsed_ref {
            RevisionRef::Draft { package, workspace } => {
                vec![(package.clone(), workspace.clone(), 0, Lifecycle::Draft)]
            }
            RevisionRef::Proposed { package, workspace } => {
                vec![(package.clone(), workspace.clone(), 0, Lifecycle::Proposed)]
            }
            RevisionRef::Tag { package, revision } if *revision > 0 => {
                let kptfile = format!("{}/Kptfile", layout.full_path(package));
                if lookup.entry(**commit, &kptfile)?.is_none() {
                    continue;
                }
                let info = commit_info(&mut infos, **commit)?;
                let (annotations, _) = parse_annotations(&info.message);
                let workspace = annotations
                    .iter()
                    .rev()
                    .find(|a| {
                        a.package_path == layout.full_path(package) && !a.workspace_name.is_empty()
                    })
                    .map_or_else(|| format!("v{revision}"), |a| a.workspace_name.clone());
                let lifecycle =
                    if deletion_proposed.contains(&(package.clone(), format!("v{revision}"))) {
                        Lifecycle::DeletionProposed
                    } else {
                        Lifecycle::Published
                    };
                vec![(package.clone(), workspace, *revision, lifecycle)]
            }
            RevisionRef::Branch => packages_on(repo, **commit, layout)?
                .into_iter()
                .map(|package| {
                    let lifecycle = if deletion_proposed
                        .contains(&(package.clone(), layout.branch().to_owned()))
                    {
                        Lifecycle::DeletionProposed
                    } else {
                        Lifecycle::Published
                    };
                    (package, layout.branch().to_owned(), -1, lifecycle)
                })
                .collect(),
            _ => continue,
        };
        for (package, workspace, revision, lifecycle) in candidates {
            let name = RevisionName::compose(repository, &package, &workspace);
            // a directory name that cannot be part of an object name is no revision
            if RevisionName::parse(&name).is_err() {
                continue;
            }
            let info = commit_info(&mut infos, **commit)?;
            let kptfile =
                lookup.entry(**commit, &format!("{}/Kptfile", layout.full_path(&package)))?;
            let upstream_lock = match kptfile {
                Some((_, blob)) => match locks.get(&blob) {
                    Some(lock) => lock.clone(),
                    None => {
                        let lock = upstream_lock_of(&lookup.blob(blob)?);
                        locks.insert(blob, lock.clone());
                        lock
                    }
                },
                None => None,
            };
            found.insert(
                name.clone(),
                DiscoveredRevision {
                    name,
                    self_lock: Locator {
                        type_: "git".to_owned(),
                        git: Some(GitLock {
                            repo: remote_url.to_owned(),
                            directory: layout.full_path(&package),
                            ref_: short.to_owned(),
                            commit: commit.to_string(),
                        }),
                    },
                    package,
                    workspace,
                    revision,
                    lifecycle,
                    commit: **commit,
                    author: info.author_email,
                    author_time: info.author_time,
                    upstream_lock,
                },
            );
        }
    }
    Ok(found.into_values().collect())
}

/// The git upstream lock of a Kptfile, if it has one.
fn upstream_lock_of(bytes: &[u8]) -> Option<Locator> {
    let text = std::str::from_utf8(bytes).ok()?;
    let lock = Kptfile::from_yaml(text).ok()?.upstream_lock?;
    lock.git.map(|git| Locator {
        type_: if lock.type_.is_empty() {
            "git".to_owned()
        } else {
            lock.type_
        },
        git: Some(git),
    })
}

fn short_ref(full: &str) -> &str {
    full.strip_prefix("refs/heads/")
        .or_else(|| full.strip_prefix("refs/tags/"))
        .unwrap_or(full)
}

/// Packages (relative to the repository directory) in the tree of `commit`:
/// the shallowest directories holding a Kptfile.
fn packages_on(
    repo: &GitRepo,
    commit: ObjectId,
    layout: &RepoLayout,
) -> Result<Vec<String>, RepoError> {
    let prefix = match layout.directory() {
        "" => String::new(),
        dir => format!("{dir}/"),
    };
    let mut dirs: Vec<String> = repo
        .list_files(commit)?
        .into_iter()
        .filter_map(|path| {
            let relative = path.strip_prefix(prefix.as_str())?;
            relative.strip_suffix("/Kptfile").map(str::to_owned)
        })
        .collect();
    dirs.sort_by_key(|d| (d.matches('/').count(), d.clone()));
    let mut packages: Vec<String> = Vec::new();
    for dir in dirs {
        let nested = packages
            .iter()
            .any(|p| dir.starts_with(p.as_str()) && dir.as_bytes().get(p.len()) == Some(&b'/'));
        if !nested {
            packages.push(dir);
        }
    }
    packages.sort();
    Ok(packages)
}
