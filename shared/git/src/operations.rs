//! The lifecycle operations on a local repository (spec §4.2–§4.7), every
//! ref change a compare-and-swap, every operation safe to repeat: a commit
//! whose annotation names the same PackageRevision uid and generation is
//! recognised and not written twice.

use crate::annotation::{
    Annotation, approval_message, delete_message, draft_message, parse_annotations,
};
use crate::identity::{Identity, committer};
use crate::layout::{RepoLayout, RevisionRef};
use crate::repo::{Files, GitRepo, RefUpdate, RepoError};
use gix::ObjectId;
use porch_api::v1alpha1::Task;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How far back the branch history is searched for earlier approvals.
const APPROVAL_HISTORY_LIMIT: usize = 100_000;

/// Who asks for an operation, for idempotency and authorship.
#[derive(Debug, Clone)]
pub struct Actor {
    /// uid of the PackageRevision.
    pub uid: String,
    /// its `metadata.generation`.
    pub generation: i64,
    /// the author of new commits.
    pub author: Identity,
    /// commit time, seconds since the epoch.
    pub time: i64,
}

/// A package of one repository, with its layout.
#[derive(Debug)]
pub struct Packages<'r> {
    pub repo: &'r GitRepo,
    pub layout: RepoLayout,
}

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OperationError {
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    Name(#[from] porch_api::naming::NameError),
    #[error("package revision {0} does not exist in git")]
    Missing(String),
    #[error("workspace {workspace:?} of package {package:?} already exists")]
    WorkspaceExists { package: String, workspace: String },
    /// The change is not allowed in the revision's state.
    #[error("{0}")]
    Refused(String),
}

impl Packages<'_> {
    fn head(&self, name: &str) -> Result<Option<ObjectId>, RepoError> {
        self.repo.ref_id(name)
    }

    fn annotated_for(&self, commit: ObjectId, actor: &Actor) -> Result<bool, RepoError> {
        let (found, _) = parse_annotations(&self.repo.commit_info(commit)?.message);
        Ok(found
            .iter()
            .any(|a| a.made_for(&actor.uid, actor.generation)))
    }

    fn annotation(
        &self,
        package: &str,
        workspace: &str,
        revision: &str,
        task: Option<Task>,
        actor: &Actor,
    ) -> Annotation {
        Annotation {
            package_path: self.layout.full_path(package),
            workspace_name: workspace.to_owned(),
            revision: revision.to_owned(),
            task,
            uid: actor.uid.clone(),
            generation: Some(actor.generation),
        }
    }

    /// A draft commit: `files` as the package inside the tree of `base`
    /// (empty without one), on top of `base`.
    fn draft_commit(
        &self,
        package: &str,
        workspace: &str,
        files: &Files,
        task: Task,
        actor: &Actor,
        base: Option<ObjectId>,
    ) -> Result<ObjectId, OperationError> {
        let tree = base.map(|c| self.repo.tree_of(c)).transpose()?;
        let subtree = self.repo.write_files(files)?;
        let tree =
            self.repo
                .replace_subtree(tree, &self.layout.full_path(package), Some(subtree))?;
        let message = draft_message(&self.annotation(package, workspace, "0", Some(task), actor));
        let parents: Vec<ObjectId> = base.into_iter().collect();
        Ok(self.repo.commit(
            tree,
            &parents,
            &message,
            &actor.author,
            &committer(),
            actor.time,
        )?)
    }

    /// A new draft from the branch head with `files` as the package.
    /// Repeating it for the same uid and generation returns the same commit.
    ///
    /// # Errors
    /// The workspace exists (made by someone else), unsafe names, git errors.
    pub fn create_draft(
        &self,
        package: &str,
        workspace: &str,
        files: &Files,
        task: Task,
        actor: &Actor,
    ) -> Result<ObjectId, OperationError> {
        let draft = self.layout.draft_ref(package, workspace)?;
        let proposed = self.layout.proposed_ref(package, workspace)?;
        for existing in [&draft, &proposed] {
            if let Some(head) = self.head(existing)? {
                if self.annotated_for(head, actor)? {
                    return Ok(head);
                }
                return Err(OperationError::WorkspaceExists {
                    package: package.to_owned(),
                    workspace: workspace.to_owned(),
                });
            }
        }
        let branch = self.head(&self.layout.branch_ref())?;
        let commit = self.draft_commit(package, workspace, files, task, actor, branch)?;
        self.repo.update_ref(&draft, None, Some(commit))?;
        Ok(commit)
    }

    /// A new commit on a draft with `files` as the package; a repeat for the
    /// same uid and generation finds the commit it made.
    ///
    /// # Errors
    /// No such draft, or it moved meanwhile ([`RepoError::Conflict`]).
    pub fn update_draft(
        &self,
        package: &str,
        workspace: &str,
        files: &Files,
        task: Task,
        actor: &Actor,
    ) -> Result<ObjectId, OperationError> {
        self.write_draft(package, workspace, files, task, actor, &|head| {
            self.annotated_for(head, actor).map_err(Into::into)
        })
    }

    /// A new commit on a draft only if `files` differ from the package it
    /// holds: content, not authorship, decides (render writes what it read
    /// back, so a repeated render finds nothing to do).
    ///
    /// # Errors
    /// No such draft, or it moved meanwhile ([`RepoError::Conflict`]).
    pub fn replace_draft_content(
        &self,
        package: &str,
        workspace: &str,
        files: &Files,
        task: Task,
        actor: &Actor,
    ) -> Result<ObjectId, OperationError> {
        let full = self.layout.full_path(package);
        self.write_draft(package, workspace, files, task, actor, &|head| {
            Ok(&self.repo.read_files(head, &full)? == files)
        })
    }

    /// Commits `files` on the draft only while its head is still
    /// `expected` (what they were computed from, as a render's output is);
    /// `None`, with no change, when the draft moved meanwhile.
    ///
    /// # Errors
    /// The draft does not exist; git failures.
    pub fn replace_draft_content_from(
        &self,
        package: &str,
        workspace: &str,
        files: &Files,
        task: Task,
        actor: &Actor,
        expected: ObjectId,
    ) -> Result<Option<ObjectId>, OperationError> {
        let draft = self.layout.draft_ref(package, workspace)?;
        let head = self
            .head(&draft)?
            .ok_or_else(|| OperationError::Missing(draft.clone()))?;
        if head != expected {
            return Ok(None);
        }
        self.replace_draft_content(package, workspace, files, task, actor)
            .map(Some)
    }

    /// A commit of `files` on the draft unless `done` says the head already
    /// has them.
    fn write_draft(
        &self,
        package: &str,
        workspace: &str,
        files: &Files,
        task: Task,
        actor: &Actor,
        done: &dyn Fn(ObjectId) -> Result<bool, OperationError>,
    ) -> Result<ObjectId, OperationError> {
        let draft = self.layout.draft_ref(package, workspace)?;
        let head = self
            .head(&draft)?
            .ok_or_else(|| OperationError::Missing(draft.clone()))?;
        if done(head)? {
            return Ok(head);
        }
        let commit = self.draft_commit(package, workspace, files, task, actor, Some(head))?;
        self.repo.update_ref(&draft, Some(head), Some(commit))?;
        Ok(commit)
    }

    /// Moves a revision between its draft and proposed branches (propose
    /// with `to_proposed`, reject without). Already moved: no change.
    ///
    /// # Errors
    /// Neither branch exists, or one moved meanwhile.
    pub fn move_branch(
        &self,
        package: &str,
        workspace: &str,
        to_proposed: bool,
    ) -> Result<ObjectId, OperationError> {
        let draft = self.layout.draft_ref(package, workspace)?;
        let proposed = self.layout.proposed_ref(package, workspace)?;
        let (from, to) = if to_proposed {
            (draft, proposed)
        } else {
            (proposed, draft)
        };
        match (self.head(&from)?, self.head(&to)?) {
            (Some(head), None) => {
                self.repo.update_refs(&[
                    RefUpdate {
                        name: to,
                        expected: None,
                        new: Some(head),
                    },
                    RefUpdate {
                        name: from,
                        expected: Some(head),
                        new: None,
                    },
                ])?;
                Ok(head)
            }
            (None, Some(head)) => Ok(head),
            _ => Err(OperationError::Missing(from)),
        }
    }

    /// Draft → Proposed: the draft branch becomes the proposed branch.
    ///
    /// # Errors
    /// As [`Packages::move_branch`].
    pub fn propose(&self, package: &str, workspace: &str) -> Result<ObjectId, OperationError> {
        self.move_branch(package, workspace, true)
    }

    /// Proposed → Draft.
    ///
    /// # Errors
    /// As [`Packages::move_branch`].
    pub fn reject(&self, package: &str, workspace: &str) -> Result<ObjectId, OperationError> {
        self.move_branch(package, workspace, false)
    }

    /// Published → DeletionProposed.
    ///
    /// # Errors
    /// As [`Packages::set_deletion_proposed`].
    pub fn propose_delete(&self, package: &str, revision: u64) -> Result<(), OperationError> {
        self.set_deletion_proposed(package, revision, true)
    }

    /// DeletionProposed → Published.
    ///
    /// # Errors
    /// As [`Packages::set_deletion_proposed`].
    pub fn restore(&self, package: &str, revision: u64) -> Result<(), OperationError> {
        self.set_deletion_proposed(package, revision, false)
    }

    /// The highest revision ever published for `package`: tags, and the
    /// approvals recorded on the branch (so a deleted top revision is never
    /// reused, unlike the reference: spec §9 item 27).
    ///
    /// # Errors
    /// Unreadable refs or commits.
    pub fn highest_revision(&self, package: &str) -> Result<i64, OperationError> {
        let full = self.layout.full_path(package);
        let mut highest = self.package_tags(package)?.into_keys().max().unwrap_or(0);
        if let Some(head) = self.head(&self.layout.branch_ref())? {
            let approvals = ApprovalIndex::updated(self.repo, &self.layout.branch_ref(), head)?;
            highest = highest.max(approvals.highest.get(&full).copied().unwrap_or(0));
        }
        Ok(highest.max(0))
    }

    /// The published revisions of `package` from its tags: revision → commit.
    fn package_tags(&self, package: &str) -> Result<BTreeMap<i64, ObjectId>, OperationError> {
        let prefix = format!("refs/tags/{}/", self.layout.full_path(package));
        Ok(self
            .repo
            .refs_with_prefix(&prefix)?
            .into_iter()
            .filter_map(|(name, id)| match self.layout.parse_ref(&name) {
                Some(RevisionRef::Tag {
                    package: p,
                    revision,
                }) if p == package && revision > 0 => Some((revision, id)),
                _ => None,
            })
            .collect())
    }

    /// Publishes a proposed revision: a merge commit on the branch (parents:
    /// branch head, proposed head) with the package replaced, the tag
    /// `v<N>` for the next revision, and the proposed branch removed, in one
    /// transaction. Returns the revision. Repeating it returns the same one.
    ///
    /// # Errors
    /// No proposed branch, or a concurrent change ([`RepoError::Conflict`]:
    /// re-read and retry; the next attempt takes the next number).
    pub fn publish(
        &self,
        package: &str,
        workspace: &str,
        actor: &Actor,
    ) -> Result<u64, OperationError> {
        let proposed = self.layout.proposed_ref(package, workspace)?;
        let Some(head) = self.head(&proposed)? else {
            return self
                .published_by(package, actor)?
                .ok_or(OperationError::Missing(proposed));
        };
        let revision = u64::try_from(self.highest_revision(package)? + 1).unwrap_or(1);
        let branch_ref = self.layout.branch_ref();
        let branch = self.head(&branch_ref)?;
        let full = self.layout.full_path(package);
        let package_tree = self.repo.read_files(head, &full)?;
        let subtree = self.repo.write_files(&package_tree)?;
        let base = branch.map(|c| self.repo.tree_of(c)).transpose()?;
        let tree = self.repo.replace_subtree(base, &full, Some(subtree))?;
        let message = approval_message(&self.annotation(
            package,
            workspace,
            &revision.to_string(),
            None,
            actor,
        ));
        let parents: Vec<ObjectId> = branch.into_iter().chain([head]).collect();
        let merge = self.repo.commit(
            tree,
            &parents,
            &message,
            &actor.author,
            &committer(),
            actor.time,
        )?;
        self.repo.update_refs(&[
            RefUpdate {
                name: branch_ref,
                expected: branch,
                new: Some(merge),
            },
            RefUpdate {
                name: self.layout.tag_ref(package, revision)?,
                expected: None,
                new: Some(merge),
            },
            RefUpdate {
                name: proposed,
                expected: Some(head),
                new: None,
            },
        ])?;
        Ok(revision)
    }

    /// The revision an earlier `publish` by this actor produced, if any.
    fn published_by(&self, package: &str, actor: &Actor) -> Result<Option<u64>, OperationError> {
        for (revision, commit) in self.package_tags(package)?.into_iter().rev() {
            if self.annotated_for(commit, actor)? {
                return Ok(u64::try_from(revision).ok());
            }
        }
        Ok(None)
    }

    /// Proposes (`true`) or withdraws (`false`) the deletion of a published
    /// revision. Already in that state: no change.
    ///
    /// # Errors
    /// No such tag, or a concurrent change.
    pub fn set_deletion_proposed(
        &self,
        package: &str,
        revision: u64,
        proposed: bool,
    ) -> Result<(), OperationError> {
        let tag = self.layout.tag_ref(package, revision)?;
        let marker = self.layout.deletion_proposed_ref(package, revision)?;
        let commit = self.head(&tag)?.ok_or(OperationError::Missing(tag))?;
        match (self.head(&marker)?, proposed) {
            (None, true) => self.repo.update_ref(&marker, None, Some(commit))?,
            (Some(current), false) => self.repo.update_ref(&marker, Some(current), None)?,
            _ => {}
        }
        Ok(())
    }

    /// Deletes a draft or proposed revision (its branch) or a published one
    /// (its tag and deletion proposal; the package stays on the branch).
    /// Already gone: no change.
    ///
    /// # Errors
    /// A concurrent change.
    pub fn delete_revision(
        &self,
        package: &str,
        workspace: &str,
        revision: u64,
    ) -> Result<(), OperationError> {
        let mut updates = Vec::new();
        let mut names = vec![
            self.layout.draft_ref(package, workspace)?,
            self.layout.proposed_ref(package, workspace)?,
        ];
        if revision > 0 {
            names.push(self.layout.tag_ref(package, revision)?);
            names.push(self.layout.deletion_proposed_ref(package, revision)?);
        }
        for name in names {
            if let Some(id) = self.head(&name)? {
                updates.push(RefUpdate {
                    name,
                    expected: Some(id),
                    new: None,
                });
            }
        }
        if !updates.is_empty() {
            self.repo.update_refs(&updates)?;
        }
        Ok(())
    }

    /// Deletes the placeholder: a `Delete <path>` commit on the branch and
    /// the placeholder's deletion proposal. Already gone: no change.
    ///
    /// # Errors
    /// A concurrent change.
    pub fn delete_placeholder(&self, package: &str, actor: &Actor) -> Result<(), OperationError> {
        let branch_ref = self.layout.branch_ref();
        let marker = self.layout.placeholder_deletion_proposed_ref(package)?;
        let full = self.layout.full_path(package);
        let mut updates = Vec::new();
        if let Some(head) = self.head(&branch_ref)?
            && self.repo.file(head, &format!("{full}/Kptfile"))?.is_some()
        {
            let tree = self
                .repo
                .replace_subtree(Some(self.repo.tree_of(head)?), &full, None)?;
            let commit = self.repo.commit(
                tree,
                &[head],
                &delete_message(&full),
                &actor.author,
                &committer(),
                actor.time,
            )?;
            updates.push(RefUpdate {
                name: branch_ref,
                expected: Some(head),
                new: Some(commit),
            });
        }
        if let Some(id) = self.head(&marker)? {
            updates.push(RefUpdate {
                name: marker,
                expected: Some(id),
                new: None,
            });
        }
        if !updates.is_empty() {
            self.repo.update_refs(&updates)?;
        }
        Ok(())
    }
}

/// The highest approved revision of every package in a branch's
/// first-parent history, cached in the git directory next to the branch
/// head it was computed at, so each publish reads only the commits added
/// since the last one instead of the whole history.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ApprovalIndex {
    branch: String,
    head: String,
    /// Full package path → highest revision approved on the branch.
    highest: BTreeMap<String, i64>,
}

impl ApprovalIndex {
    const FILE: &'static str = "porch-approvals.json";

    fn path(repo: &GitRepo, branch: &str) -> std::path::PathBuf {
        // one file per branch; the name is a hash so any branch name is safe
        let digest = gix::objs::compute_hash(
            gix::hash::Kind::Sha1,
            gix::objs::Kind::Blob,
            branch.as_bytes(),
        )
        .map(|id| id.to_string())
        .unwrap_or_default();
        repo.git_dir().join(format!("{}.{digest}", Self::FILE))
    }

    /// The index at `head`: the cached one plus the commits since its head
    /// (all of the history when there is none or it is not an ancestor;
    /// cached values are kept either way, so a revision is never reused).
    fn updated(repo: &GitRepo, branch: &str, head: ObjectId) -> Result<Self, RepoError> {
        let path = Self::path(repo, branch);
        let mut index: Self = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .filter(|i: &Self| i.branch == branch)
            .unwrap_or_default();
        let head_hex = head.to_string();
        if index.head == head_hex {
            return Ok(index);
        }
        let stop = ObjectId::from_hex(index.head.as_bytes()).ok();
        for commit in repo.first_parents(head, APPROVAL_HISTORY_LIMIT)? {
            if Some(commit) == stop {
                break;
            }
            let (found, _) = parse_annotations(&repo.commit_info(commit)?.message);
            for annotation in found {
                if let Ok(n) = annotation.revision.parse::<i64>() {
                    let entry = index.highest.entry(annotation.package_path).or_insert(0);
                    *entry = (*entry).max(n);
                }
            }
        }
        index.branch = branch.to_owned();
        index.head = head_hex;
        // best effort: a failed write only costs the next caller a walk
        if let Ok(bytes) = serde_json::to_vec(&index) {
            static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = std::path::PathBuf::from(format!(
                "{}.tmp-{}-{n}",
                path.display(),
                std::process::id()
            ));
            if std::fs::write(&tmp, bytes).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
        Ok(index)
    }
}
