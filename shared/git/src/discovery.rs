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
use serde::{Deserialize, Serialize};
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
    let mut cache = TagCache::load(repo, layout);
    let mut facts_of = |commit: ObjectId, package: &str| -> Result<Facts, RepoError> {
        let info = match infos.get(&commit) {
            Some(info) => info.clone(),
            None => {
                let info = repo.commit_info(commit)?;
                infos.insert(commit, info.clone());
                info
            }
        };
        let kptfile = lookup.entry(commit, &format!("{}/Kptfile", layout.full_path(package)))?;
        let upstream_lock = match kptfile {
            Some((_, blob)) => match locks.get(&blob) {
                Some(lock) => lock.clone(),
                None => {
                    // an oversized Kptfile still lists its package (reading
                    // it fails clearly); only its upstream is unknown
                    let lock = match lookup.blob(blob) {
                        Ok(bytes) => upstream_lock_of(&bytes),
                        Err(RepoError::TooLarge { source, .. }) => {
                            tracing::warn!(package, error = %source, "Kptfile over the size limit");
                            None
                        }
                        Err(e) => return Err(e),
                    };
                    locks.insert(blob, lock.clone());
                    lock
                }
            },
            None => None,
        };
        Ok(Facts {
            commit: commit.to_string(),
            has_kptfile: kptfile.is_some(),
            workspace: None,
            author: info.author_email,
            author_time: info.author_time,
            message: info.message,
            upstream_lock,
        })
    };
    for (full_ref, commit, parsed_ref) in &parsed {
        let short = short_ref(full_ref);
        // (package, workspace, revision, lifecycle, facts of the commit)
        let candidates: Vec<(String, String, i64, Lifecycle, Facts)> = match parsed_ref {
            RevisionRef::Draft { package, workspace } => vec![(
                package.clone(),
                workspace.clone(),
                0,
                Lifecycle::Draft,
                facts_of(**commit, package)?,
            )],
            RevisionRef::Proposed { package, workspace } => vec![(
                package.clone(),
                workspace.clone(),
                0,
                Lifecycle::Proposed,
                facts_of(**commit, package)?,
            )],
            RevisionRef::Tag { package, revision } if *revision > 0 => {
                // a tag's facts never change for its commit: computed once
                let facts = match cache.get(full_ref, **commit) {
                    Some(facts) => facts,
                    None => {
                        let mut facts = facts_of(**commit, package)?;
                        let (annotations, _) = parse_annotations(&facts.message);
                        facts.workspace = annotations
                            .iter()
                            .rev()
                            .find(|a| {
                                a.package_path == layout.full_path(package)
                                    && !a.workspace_name.is_empty()
                            })
                            .map(|a| a.workspace_name.clone());
                        facts.message.clear();
                        cache.insert(full_ref, facts.clone());
                        facts
                    }
                };
                if !facts.has_kptfile {
                    continue;
                }
                let workspace = facts
                    .workspace
                    .clone()
                    .unwrap_or_else(|| format!("v{revision}"));
                let lifecycle =
                    if deletion_proposed.contains(&(package.clone(), format!("v{revision}"))) {
                        Lifecycle::DeletionProposed
                    } else {
                        Lifecycle::Published
                    };
                vec![(package.clone(), workspace, *revision, lifecycle, facts)]
            }
            RevisionRef::Branch => {
                let mut out = Vec::new();
                for package in packages_on(repo, **commit, layout)? {
                    let lifecycle = if deletion_proposed
                        .contains(&(package.clone(), layout.branch().to_owned()))
                    {
                        Lifecycle::DeletionProposed
                    } else {
                        Lifecycle::Published
                    };
                    let facts = facts_of(**commit, &package)?;
                    out.push((package, layout.branch().to_owned(), -1, lifecycle, facts));
                }
                out
            }
            _ => continue,
        };
        for (package, workspace, revision, lifecycle, facts) in candidates {
            let name = RevisionName::compose(repository, &package, &workspace);
            // a directory name that cannot be part of an object name is no revision
            if RevisionName::parse(&name).is_err() {
                continue;
            }
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
                    author: facts.author,
                    author_time: facts.author_time,
                    upstream_lock: facts.upstream_lock,
                },
            );
        }
    }
    cache.save(repo, &refs);
    Ok(found.into_values().collect())
}

/// What discovery reads from one commit for one package.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Facts {
    commit: String,
    has_kptfile: bool,
    /// From the approval annotation (tags only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workspace: Option<String>,
    author: String,
    author_time: i64,
    /// Only while computing; never stored.
    #[serde(skip)]
    message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    upstream_lock: Option<Locator>,
}

/// The facts of every tag, kept in the git directory: a tag's commit does
/// not change, so warm discovery reads no tree and no commit for tags it
/// has seen, however the repository's trees are shaped.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TagCache {
    directory: String,
    tags: BTreeMap<String, Facts>,
    #[serde(skip)]
    changed: bool,
}

/// Where discovery keeps its tag cache in a repository's git directory.
pub const TAG_CACHE_FILE: &str = "porch-discovery.json";

impl TagCache {
    const FILE: &'static str = TAG_CACHE_FILE;

    fn load(repo: &GitRepo, layout: &RepoLayout) -> Self {
        std::fs::read(repo.git_dir().join(Self::FILE))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Self>(&bytes).ok())
            .filter(|c| c.directory == layout.directory())
            .unwrap_or_else(|| Self {
                directory: layout.directory().to_owned(),
                ..Self::default()
            })
    }

    fn get(&self, name: &str, commit: ObjectId) -> Option<Facts> {
        self.tags
            .get(name)
            .filter(|f| ObjectId::from_hex(f.commit.as_bytes()).ok() == Some(commit))
            .cloned()
    }

    fn insert(&mut self, name: &str, facts: Facts) {
        self.tags.insert(name.to_owned(), facts);
        self.changed = true;
    }

    /// Writes the cache back (best effort), without tags that are gone.
    fn save(mut self, repo: &GitRepo, refs: &BTreeMap<String, ObjectId>) {
        let before = self.tags.len();
        self.tags.retain(|name, _| refs.contains_key(name));
        if !self.changed && self.tags.len() == before {
            return;
        }
        let path = repo.git_dir().join(Self::FILE);
        let tmp = repo
            .git_dir()
            .join(format!("{}.tmp-{}", Self::FILE, std::process::id()));
        if let Ok(bytes) = serde_json::to_vec(&self)
            && std::fs::write(&tmp, bytes).is_ok()
        {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
}

/// The git upstream lock of a Kptfile, if it has one.
/// The `upstreamLock` of a Kptfile, as a PackageRevision's status holds it.
pub fn upstream_lock_of(bytes: &[u8]) -> Option<Locator> {
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
