//! `/validate`: the admission rules for PackageRevision (both versions) and
//! Repository, as pure decisions. The one decision that needs I/O (the
//! approval right) is returned as [`Verdict::NeedsApproval`] for the caller.

use crate::config::WebhookConfig;
use crate::decode::{DecodeError, decode_object};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};

use porch_api::convert::{check_stash_annotation, to_v1alpha2};
use porch_api::lifecycle::{self, Transition};
use porch_api::naming::{
    RevisionName, validate_branch_name, validate_git_url, validate_label, validate_package_path,
    validate_repo_directory,
};
use porch_api::repository::Repository;
use porch_api::v1alpha2::{PackageRevision, PackageSource};
use porch_api::{
    LATEST_REVISION_LABEL, PROPOSED_BY_ANNOTATION, V1ALPHA1_LATEST_REVISION_LABEL, v1alpha1,
};

/// What the rules decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny(String),
    /// Allowed if the user holds the approval right on this revision.
    NeedsApproval {
        namespace: String,
        name: String,
    },
}

impl From<DecodeError> for Verdict {
    fn from(e: DecodeError) -> Self {
        Verdict::Deny(e.to_string())
    }
}

macro_rules! deny {
    ($($arg:tt)*) => {
        return Verdict::Deny(format!($($arg)*))
    };
}

/// A PackageRevision as the rules see it: always v1alpha2, plus the
/// v1alpha1 object when the request came in that version.
struct Revision {
    v2: PackageRevision,
    v1: Option<v1alpha1::PackageRevision>,
    api_version: String,
}

fn revision(raw: Option<&DynamicObject>, version: &str, which: &str) -> Result<Revision, Verdict> {
    let raw = raw.ok_or_else(|| Verdict::Deny(format!("the request has no {which}")))?;
    match version {
        "v1alpha2" => Ok(Revision {
            v2: decode_object(raw, "PackageRevision")?,
            v1: None,
            api_version: "porch.kpt.dev/v1alpha2".to_owned(),
        }),
        "v1alpha1" => {
            let v1: v1alpha1::PackageRevision = decode_object(raw, "PackageRevision")?;
            let v2 = to_v1alpha2(&v1).map_err(|e| Verdict::Deny(e.to_string()))?;
            Ok(Revision {
                v2,
                v1: Some(v1),
                api_version: "porch.kpt.dev/v1alpha1".to_owned(),
            })
        }
        other => Err(Verdict::Deny(format!(
            "unsupported PackageRevision version {other:?}: expected v1alpha1 or v1alpha2"
        ))),
    }
}

/// Decides a PackageRevision request.
pub fn package_revision(req: &AdmissionRequest<DynamicObject>, config: &WebhookConfig) -> Verdict {
    if req.sub_resource.is_some() {
        // status and other subresources carry no user-controlled spec
        return Verdict::Allow;
    }
    let version = req.kind.version.as_str();
    let controller = config.is_controller(req.user_info.username.as_deref());
    let result = match req.operation {
        Operation::Create => revision(req.object.as_ref(), version, "object")
            .map(|new| check_create(&new, controller)),
        Operation::Update => revision(req.object.as_ref(), version, "object").and_then(|new| {
            let old = revision(req.old_object.as_ref(), version, "oldObject")?;
            Ok(check_update(&old, &new, req, config, controller))
        }),
        Operation::Delete => match req.old_object.as_ref() {
            // nothing to check without the stored object
            None => Ok(Verdict::Allow),
            Some(_) => revision(req.old_object.as_ref(), version, "oldObject").map(|old| {
                match lifecycle::check_delete(old.v2.spec.lifecycle) {
                    Ok(()) => Verdict::Allow,
                    Err(e) => Verdict::Deny(e.to_string()),
                }
            }),
        },
        Operation::Connect => Ok(Verdict::Allow),
    };
    result.unwrap_or_else(|verdict| verdict)
}

fn check_create(new: &Revision, controller: bool) -> Verdict {
    let spec = &new.v2.spec;
    if let Err(e) = validate_label("repository", &spec.repository) {
        deny!("spec.repository: {e}");
    }
    if let Err(e) = validate_package_path(&spec.package_name) {
        deny!("spec.packageName: {e}");
    }
    if let Err(e) = validate_label("workspaceName", &spec.workspace_name) {
        deny!("spec.workspaceName: {e}");
    }
    let composed =
        RevisionName::compose(&spec.repository, &spec.package_name, &spec.workspace_name);
    if let Err(e) = RevisionName::parse(&composed) {
        deny!("the composed name {composed:?} is not valid: {e}");
    }
    match new.v2.metadata.name.as_deref() {
        Some(name) if name == composed => {}
        Some(name) => deny!(
            "metadata.name {name:?} must be {composed:?}: <repository>.<packageName with '/' as '.'>.<workspaceName>"
        ),
        None => deny!("metadata.name must be set to {composed:?} (generateName is not supported)"),
    }
    if !controller && let Err(e) = lifecycle::check_create(spec.lifecycle) {
        deny!("{e}");
    }
    if let Some(v1) = &new.v1 {
        if v1.spec.tasks.len() > 1 {
            deny!(
                "at most one task is allowed on create, found {}: later tasks are recorded by the package orchestrator",
                v1.spec.tasks.len()
            );
        }
        if v1.spec.tasks.first().is_some_and(|_| spec.source.is_none()) {
            deny!(
                "spec.tasks[0] is not a valid source task: use one of init, clone (git or upstreamRef), edit or upgrade with its matching field set"
            );
        }
    }
    match &spec.source {
        Some(source) => {
            if let Err(message) = check_source(source) {
                return Verdict::Deny(message);
            }
        }
        // v1alpha1 creates without a task mean "init" (defaulted by /mutate)
        None if new.v1.is_none() && !controller => deny!(
            "spec.source is required: set exactly one of init, cloneFrom, copyFrom or upgrade"
        ),
        None => {}
    }
    if !controller {
        for key in [LATEST_REVISION_LABEL, V1ALPHA1_LATEST_REVISION_LABEL] {
            if label(&new.v2, key).is_some() {
                deny!("label {key} is managed by the package orchestrator and cannot be set");
            }
        }
    }
    if let Err(e) = check_stash_annotation(new_annotations(new), &new.api_version) {
        deny!("{e}");
    }
    Verdict::Allow
}

fn check_update(
    old: &Revision,
    new: &Revision,
    req: &AdmissionRequest<DynamicObject>,
    config: &WebhookConfig,
    controller: bool,
) -> Verdict {
    let (o, n) = (&old.v2.spec, &new.v2.spec);
    for (field, before, after) in [
        ("spec.packageName", &o.package_name, &n.package_name),
        ("spec.repository", &o.repository, &n.repository),
        ("spec.workspaceName", &o.workspace_name, &n.workspace_name),
    ] {
        if before != after {
            deny!("{field} is immutable: it was {before:?}, the update sets {after:?}");
        }
    }
    if o.source != n.source {
        deny!("spec.source is immutable: create a new revision (copyFrom or upgrade) instead");
    }
    if let (Some(o1), Some(n1)) = (&old.v1, &new.v1) {
        if o1.spec.tasks != n1.spec.tasks {
            deny!("spec.tasks is immutable: create a new revision (edit or upgrade) instead");
        }
        if o1.spec.revision != n1.spec.revision && !controller {
            deny!("spec.revision is set by the package orchestrator and cannot be changed");
        }
    }
    let transition = match lifecycle::transition(o.lifecycle, n.lifecycle) {
        Ok(t) => t,
        Err(e) => deny!("{e}"),
    };
    let mut rest_old = o.clone();
    let mut rest_new = n.clone();
    rest_old.lifecycle = None;
    rest_new.lifecycle = None;
    if let Err(e) = lifecycle::check_spec_change(o.lifecycle, rest_old != rest_new) {
        deny!("{e}");
    }
    if !controller {
        for key in [LATEST_REVISION_LABEL, V1ALPHA1_LATEST_REVISION_LABEL] {
            if label(&old.v2, key) != label(&new.v2, key) {
                deny!(
                    "label {key} is managed by the package orchestrator and cannot be set or changed"
                );
            }
        }
    }
    if let Err(e) = check_stash_annotation(new_annotations(new), &new.api_version) {
        deny!("{e}");
    }
    if transition == Transition::Approve {
        let user = req.user_info.username.as_deref().unwrap_or("");
        if config.approval.deny_self_approval
            && old
                .v2
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(PROPOSED_BY_ANNOTATION))
                .is_some_and(|proposer| proposer == user)
        {
            deny!(
                "user {user:?} proposed this revision and may not also approve it: another user with the approve right must approve"
            );
        }
        return Verdict::NeedsApproval {
            namespace: req.namespace.clone().unwrap_or_default(),
            name: req.name.clone(),
        };
    }
    Verdict::Allow
}

fn new_annotations(rev: &Revision) -> Option<&std::collections::BTreeMap<String, String>> {
    match &rev.v1 {
        Some(v1) => v1.metadata.annotations.as_ref(),
        None => rev.v2.metadata.annotations.as_ref(),
    }
}

fn label<'a>(obj: &'a PackageRevision, key: &str) -> Option<&'a str> {
    obj.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// Rules on the one source member.
fn check_source(source: &PackageSource) -> Result<(), String> {
    let members = source.members();
    if members.len() != 1 {
        return Err(format!(
            "exactly one of init, cloneFrom, copyFrom, or upgrade must be set in spec.source, found {}",
            if members.is_empty() {
                "none".to_owned()
            } else {
                members.join(", ")
            }
        ));
    }
    let ref_name = |field: &str, name: &str| -> Result<(), String> {
        if name.is_empty() {
            return Err(format!(
                "{field} must name a PackageRevision in the same namespace"
            ));
        }
        RevisionName::parse(name)
            .map(|_| ())
            .map_err(|e| format!("{field}: {e}"))
    };
    if let Some(init) = &source.init
        && !init.subpackage.is_empty()
    {
        validate_package_path(&init.subpackage)
            .map_err(|e| format!("spec.source.init.subpackage: {e}"))?;
    }
    if let Some(clone) = &source.clone_from {
        match (&clone.upstream_ref, &clone.git) {
            (Some(r), _) => ref_name("spec.source.cloneFrom.upstreamRef.name", &r.name)?,
            (None, Some(git)) => {
                validate_git_url(&git.repo)
                    .map_err(|e| format!("spec.source.cloneFrom.git.repo: {e}"))?;
                if git.ref_.is_empty() {
                    return Err(
                        "spec.source.cloneFrom.git.ref must be set (a branch, tag or commit)"
                            .to_owned(),
                    );
                }
                validate_repo_directory(&git.directory)
                    .map_err(|e| format!("spec.source.cloneFrom.git.directory: {e}"))?;
            }
            (None, None) => {
                return Err(
                    "spec.source.cloneFrom must specify either upstreamRef or git".to_owned(),
                );
            }
        }
    }
    if let Some(copy) = &source.copy_from {
        ref_name("spec.source.copyFrom.name", &copy.name)?;
    }
    if let Some(upgrade) = &source.upgrade {
        ref_name(
            "spec.source.upgrade.oldUpstream.name",
            &upgrade.old_upstream.name,
        )?;
        ref_name(
            "spec.source.upgrade.newUpstream.name",
            &upgrade.new_upstream.name,
        )?;
        ref_name(
            "spec.source.upgrade.currentPackage.name",
            &upgrade.current_package.name,
        )?;
    }
    Ok(())
}

/// Decides a Repository request.
pub fn repository(req: &AdmissionRequest<DynamicObject>) -> Verdict {
    if req.sub_resource.is_some() || matches!(req.operation, Operation::Delete | Operation::Connect)
    {
        return Verdict::Allow;
    }
    let new: Repository = match req.object.as_ref() {
        Some(raw) => match decode_object(raw, "Repository") {
            Ok(r) => r,
            Err(e) => return e.into(),
        },
        None => deny!("the request has no object"),
    };
    if let Some(name) = new.metadata.name.as_deref()
        && let Err(e) = validate_label("Repository name", name)
    {
        deny!("metadata.name: {e}");
    }
    let spec = &new.spec;
    use porch_api::common::RepositoryType;
    match (spec.type_, &spec.git, &spec.oci) {
        (Some(RepositoryType::Git) | None, Some(git), _) => {
            if let Err(e) = validate_git_url(&git.repo) {
                deny!("spec.git.repo: {e}");
            }
            if let Err(e) = validate_branch_name(&git.branch) {
                deny!("spec.git.branch: {e}");
            }
            if let Err(e) = validate_repo_directory(&git.directory) {
                deny!("spec.git.directory: {e}");
            }
        }
        (Some(RepositoryType::Git) | None, None, _) => {
            deny!("spec.git is required for a git repository")
        }
        (Some(RepositoryType::Oci), _, Some(oci)) if !oci.registry.is_empty() => {}
        (Some(RepositoryType::Oci), _, _) => {
            deny!("spec.oci.registry is required for an oci repository")
        }
    }
    if req.operation == Operation::Update {
        let old: Repository = match req.old_object.as_ref() {
            Some(raw) => match decode_object(raw, "Repository") {
                Ok(r) => r,
                Err(e) => return e.into(),
            },
            None => deny!("the request has no oldObject"),
        };
        let (o, n) = (&old.spec, &new.spec);
        if o.type_.is_some() && o.type_ != n.type_ {
            deny!("spec.type is immutable");
        }
        let git = |s: &porch_api::repository::RepositorySpec| {
            s.git
                .as_ref()
                .map(|g| (g.repo.clone(), g.branch.clone(), g.directory.clone()))
        };
        if let (Some((or, ob, od)), Some((nr, nb, nd))) = (git(o), git(n)) {
            if or != nr {
                deny!("spec.git.repo is immutable: register a new Repository instead");
            }
            if ob != nb {
                deny!("spec.git.branch is immutable: register a new Repository instead");
            }
            if od.trim_matches('/') != nd.trim_matches('/') {
                deny!("spec.git.directory is immutable: register a new Repository instead");
            }
        } else if o.git.is_some() != n.git.is_some() {
            deny!("spec.git cannot be added or removed: register a new Repository instead");
        }
        if o.oci.as_ref().map(|x| &x.registry) != n.oci.as_ref().map(|x| &x.registry)
            && o.oci.is_some()
        {
            deny!("spec.oci.registry is immutable");
        }
    }
    Verdict::Allow
}
