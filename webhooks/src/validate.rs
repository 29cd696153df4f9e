//! `/validate`: the admission rules for PackageRevision (both versions),
//! Repository, and PackageVariant and PackageVariantSet ([`variant`]), as
//! pure decisions. The one decision that needs I/O (the
//! approval right) is returned as [`Verdict::NeedsApproval`] for the caller.
//!
//! Controllers (the relay, see [`WebhookConfig::controller_users`]) may
//! create revisions discovered in git (no source, any lifecycle) and manage
//! the latest-revision label and the conversion annotations; everyone else is
//! held to every rule.

use crate::config::WebhookConfig;
use crate::decode::{DecodeError, decode_raw};
use crate::review::{AdmissionInput, Meta, Object, RequestHead, RevisionReview};
use kube::core::admission::Operation;
use porch_api::common::RepositoryType;
use porch_api::convert::{
    V1ALPHA1_FIELDS_ANNOTATION, V1ALPHA2_FIELDS_ANNOTATION, check_stash_annotation,
    spec_to_v1alpha2,
};
use porch_api::lifecycle::{self, Transition};
use porch_api::naming::{
    RevisionName, validate_branch_name, validate_git_url, validate_label, validate_package_path,
    validate_repo_directory,
};
use porch_api::repository::{Repository, RepositorySpec};
use porch_api::v1alpha2::{PackageRevisionSpec, PackageSource};
use porch_api::{
    APPROVED_BY_ANNOTATION, LATEST_REVISION_LABEL, PROPOSED_BY_ANNOTATION,
    V1ALPHA1_LATEST_REVISION_LABEL, v1alpha1,
};
use serde_json::value::RawValue;

pub mod variant;

pub use variant::{package_variant, package_variant_set};

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

/// Keys only the package orchestrator writes.
const MANAGED_LABELS: [&str; 2] = [LATEST_REVISION_LABEL, V1ALPHA1_LATEST_REVISION_LABEL];
const CONVERSION_ANNOTATIONS: [&str; 2] = [V1ALPHA1_FIELDS_ANNOTATION, V1ALPHA2_FIELDS_ANNOTATION];
const PROVENANCE_ANNOTATIONS: [&str; 2] = [PROPOSED_BY_ANNOTATION, APPROVED_BY_ANNOTATION];

/// A PackageRevision as the rules see it: the v1alpha2 spec, plus the
/// v1alpha1 spec when the request came in that version.
struct Revision {
    meta: Meta,
    v2: PackageRevisionSpec,
    v1: Option<v1alpha1::PackageRevisionSpec>,
    api_version: &'static str,
}

impl Revision {
    /// Decodes the object of a request. `stored` objects come from the
    /// apiserver (already pruned to the schema), so unknown fields are only
    /// looked for in what the client sent.
    fn decode(
        raw: Option<&RawValue>,
        version: &str,
        which: &str,
        stored: bool,
    ) -> Result<Self, Verdict> {
        let raw = raw.ok_or_else(|| Verdict::Deny(format!("the request has no {which}")))?;
        fn typed<T: serde::de::DeserializeOwned>(
            raw: &RawValue,
            stored: bool,
        ) -> Result<T, DecodeError> {
            if stored {
                serde_json::from_str(raw.get()).map_err(|source| DecodeError::Invalid {
                    what: "PackageRevision",
                    source,
                })
            } else {
                decode_raw(raw, "PackageRevision")
            }
        }
        match version {
            "v1alpha2" => Ok(Revision::from_v2(typed(raw, stored)?)),
            "v1alpha1" => {
                let object: Object<v1alpha1::PackageRevisionSpec> = typed(raw, stored)?;
                Ok(Revision {
                    meta: object.metadata,
                    v2: spec_to_v1alpha2(&object.spec),
                    v1: Some(object.spec),
                    api_version: "porch.kpt.dev/v1alpha1",
                })
            }
            other => Err(Verdict::Deny(format!(
                "unsupported PackageRevision version {other:?}: expected v1alpha1 or v1alpha2"
            ))),
        }
    }

    fn from_v2(object: Object<PackageRevisionSpec>) -> Self {
        Revision {
            meta: object.metadata,
            v2: object.spec,
            v1: None,
            api_version: "porch.kpt.dev/v1alpha2",
        }
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.meta.labels.as_ref()?.get(key).map(String::as_str)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.meta.annotations.as_ref()?.get(key).map(String::as_str)
    }

    fn terminating(&self) -> bool {
        self.meta.deletion_timestamp.is_some()
    }

    /// Whether anything but the lifecycle differs between two specs, in the
    /// version sent.
    fn spec_differs_from(&self, other: &Revision) -> bool {
        match (&self.v1, &other.v1) {
            (Some(a), Some(b)) => {
                let mut a = a.clone();
                a.lifecycle = b.lifecycle;
                a != *b
            }
            _ => {
                let mut a = self.v2.clone();
                a.lifecycle = other.v2.lifecycle;
                a != other.v2
            }
        }
    }
}

/// Decides a PackageRevision request.
pub fn package_revision(input: &AdmissionInput<'_>, config: &WebhookConfig) -> Verdict {
    let version = input.kind.version.as_str();
    decide_revision(
        input,
        config,
        || Revision::decode(input.object, version, "object", false),
        input.old_object.is_some(),
        || Revision::decode(input.old_object, version, "oldObject", true),
    )
}

/// Decides a v1alpha2 PackageRevision review read in one pass
/// ([`crate::review::parse_revision_review`]).
/// Hands the request back with the verdict, for the answer.
pub fn package_revision_review(
    review: RevisionReview,
    config: &WebhookConfig,
) -> (RequestHead, Verdict) {
    let RevisionReview {
        head,
        object,
        old_object,
        unknown_fields,
    } = review;
    let has_old = old_object.is_some();
    let verdict = decide_revision(
        &head,
        config,
        move || {
            if !unknown_fields.is_empty() {
                return Err(DecodeError::UnknownFields {
                    what: "PackageRevision",
                    fields: unknown_fields,
                }
                .into());
            }
            object
                .map(Revision::from_v2)
                .ok_or_else(|| Verdict::Deny("the request has no object".to_owned()))
        },
        has_old,
        move || {
            old_object
                .map(Revision::from_v2)
                .ok_or_else(|| Verdict::Deny("the request has no oldObject".to_owned()))
        },
    );
    (head, verdict)
}

fn decide_revision(
    head: &RequestHead,
    config: &WebhookConfig,
    new: impl FnOnce() -> Result<Revision, Verdict>,
    has_old: bool,
    old: impl FnOnce() -> Result<Revision, Verdict>,
) -> Verdict {
    if head.sub_resource.is_some() {
        // status and other subresources carry no user-controlled spec
        return Verdict::Allow;
    }
    let controller = config.is_controller(head.username());
    let result = match head.operation {
        Operation::Create => new().map(|new| check_create(&new, controller)),
        Operation::Update => {
            new().and_then(|new| Ok(check_update(&old()?, &new, head, config, controller)))
        }
        Operation::Delete if !has_old => Ok(Verdict::Allow),
        Operation::Delete if config.may_delete_published(head.username()) => Ok(Verdict::Allow),
        Operation::Delete => old().map(|old| match lifecycle::check_delete(old.v2.lifecycle) {
            Ok(()) => Verdict::Allow,
            Err(e) => Verdict::Deny(e.to_string()),
        }),
        Operation::Connect => Ok(Verdict::Allow),
    };
    result.unwrap_or_else(|verdict| verdict)
}

fn check_create(new: &Revision, controller: bool) -> Verdict {
    let spec = &new.v2;
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
    match RevisionName::parse(&composed) {
        Err(e) => deny!("the composed name {composed:?} is not valid: {e}"),
        Ok(back)
            if back.package_name != spec.package_name
                || back.workspace_name != spec.workspace_name =>
        {
            deny!(
                "package {:?} with workspace {:?} composes the name {composed:?}, which reads back as package {:?} with workspace {:?}: choose another workspace name",
                spec.package_name,
                spec.workspace_name,
                back.package_name,
                back.workspace_name
            )
        }
        Ok(_) => {}
    }
    match new.meta.name.as_deref() {
        Some(name) if name == composed => {}
        Some(name) => deny!(
            "metadata.name {name:?} must be {composed:?}: <repository>.<packageName with '/' as '.'>.<workspaceName>"
        ),
        None => deny!("metadata.name must be set to {composed:?} (generateName is not supported)"),
    }
    if let Some(v1) = &new.v1 {
        if v1.tasks.len() > 1 {
            deny!(
                "at most one task is allowed on create, found {}: later tasks are recorded by the package orchestrator",
                v1.tasks.len()
            );
        }
        if !v1.tasks.is_empty() && spec.source.is_none() {
            deny!(
                "spec.tasks[0] is not a valid source task: use one of init, clone (git or upstreamRef), edit or upgrade with its matching field set"
            );
        }
        if v1.revision.is_some() && !controller {
            deny!("spec.revision is set by the package orchestrator and cannot be set");
        }
    }
    if controller {
        return match &spec.source {
            Some(source) => check_source(source).map_or_else(Verdict::Deny, |()| Verdict::Allow),
            None => Verdict::Allow,
        };
    }
    if let Err(e) = lifecycle::check_create(spec.lifecycle) {
        deny!("{e}");
    }
    match &spec.source {
        Some(source) => {
            if let Err(message) = check_source(source) {
                return Verdict::Deny(message);
            }
        }
        // v1alpha1 creates without a task mean "init" (defaulted by /mutate)
        None if new.v1.is_none() => deny!(
            "spec.source is required: set exactly one of init, cloneFrom, copyFrom or upgrade"
        ),
        None => {}
    }
    for key in MANAGED_LABELS {
        if new.label(key).is_some() {
            deny!("label {key} is managed by the package orchestrator and cannot be set");
        }
    }
    for key in CONVERSION_ANNOTATIONS
        .into_iter()
        .chain(PROVENANCE_ANNOTATIONS)
    {
        if new.annotation(key).is_some() {
            deny!("annotation {key} is written by the package orchestrator and cannot be set");
        }
    }
    Verdict::Allow
}

fn check_update(
    old: &Revision,
    new: &Revision,
    input: &RequestHead,
    config: &WebhookConfig,
    controller: bool,
) -> Verdict {
    let (o, n) = (&old.v2, &new.v2);
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
        if o1.tasks != n1.tasks {
            deny!("spec.tasks is immutable: create a new revision (edit or upgrade) instead");
        }
        if o1.revision != n1.revision && !controller {
            deny!("spec.revision is set by the package orchestrator and cannot be changed");
        }
    }
    let spec_changed = old.spec_differs_from(new);
    if old.terminating() && !controller {
        if spec_changed || o.lifecycle != n.lifecycle {
            deny!(
                "the revision is being deleted: only its metadata (finalizers, labels, annotations) may change"
            );
        }
        return Verdict::Allow;
    }
    if o.lifecycle.is_some() && n.lifecycle.is_none() {
        deny!("spec.lifecycle cannot be cleared");
    }
    let transition = match lifecycle::transition(o.lifecycle, n.lifecycle) {
        Ok(t) => t,
        Err(e) => deny!("{e}"),
    };
    if let Err(e) = lifecycle::check_spec_change(o.lifecycle, spec_changed) {
        deny!("{e}");
    }
    if let Err(e) = check_stash_annotation(new.meta.annotations.as_ref(), new.api_version) {
        deny!("{e}");
    }
    if !controller {
        for key in MANAGED_LABELS {
            if old.label(key) != new.label(key) {
                deny!(
                    "label {key} is managed by the package orchestrator and cannot be set or changed"
                );
            }
        }
        for key in CONVERSION_ANNOTATIONS {
            if old.annotation(key) != new.annotation(key) {
                deny!(
                    "annotation {key} is written by version conversion and cannot be set or changed"
                );
            }
        }
        let user = input.username().unwrap_or("");
        for (key, stamped_on) in [
            (PROPOSED_BY_ANNOTATION, Transition::Propose),
            (APPROVED_BY_ANNOTATION, Transition::Approve),
        ] {
            let expected = if transition == stamped_on {
                Some(user)
            } else {
                old.annotation(key)
            };
            if new.annotation(key) != expected {
                deny!(
                    "annotation {key} is recorded by the package orchestrator and cannot be set or changed"
                );
            }
        }
    }
    if transition == Transition::Approve {
        let user = input.username().unwrap_or("");
        if config.approval.deny_self_approval
            && old.annotation(PROPOSED_BY_ANNOTATION) == Some(user)
        {
            deny!(
                "user {user:?} proposed this revision and may not also approve it: another user with the approve right must approve"
            );
        }
        return Verdict::NeedsApproval {
            namespace: input.namespace.clone().unwrap_or_default(),
            name: input.name.clone(),
        };
    }
    Verdict::Allow
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
        if clone.type_ == Some(RepositoryType::Oci) {
            return Err(
                "spec.source.cloneFrom.type must be git: OCI upstreams are not supported"
                    .to_owned(),
            );
        }
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

/// Decides a Repository request. On update only what changed is checked, so
/// an object stored before a rule existed can still be updated and deleted.
pub fn repository(input: &AdmissionInput<'_>) -> Verdict {
    if input.sub_resource.is_some()
        || matches!(input.operation, Operation::Delete | Operation::Connect)
    {
        return Verdict::Allow;
    }
    let new: Repository = match input.object {
        Some(raw) => match decode_raw(raw, "Repository") {
            Ok(r) => r,
            Err(e) => return e.into(),
        },
        None => deny!("the request has no object"),
    };
    let old: Option<Repository> = match (input.operation.clone(), input.old_object) {
        (Operation::Update, Some(raw)) => match decode_raw(raw, "Repository") {
            Ok(r) => Some(r),
            Err(e) => return e.into(),
        },
        (Operation::Update, None) => deny!("the request has no oldObject"),
        _ => None,
    };
    if old.is_none()
        && let Some(name) = new.metadata.name.as_deref()
        && let Err(e) = validate_label("Repository name", name)
    {
        deny!("metadata.name: {e}");
    }
    let spec = &new.spec;
    let effective_type = |s: &RepositorySpec| s.type_.unwrap_or(RepositoryType::Git);
    if let Some(old) = &old {
        let o = &old.spec;
        if effective_type(o) != effective_type(spec) {
            deny!("spec.type is immutable");
        }
        if o.git.is_some() != spec.git.is_some() {
            deny!("spec.git cannot be added or removed: register a new Repository instead");
        }
        if o.oci.is_some() != spec.oci.is_some() {
            deny!("spec.oci cannot be added or removed: register a new Repository instead");
        }
        if let (Some(og), Some(ng)) = (&o.git, &spec.git) {
            if og.repo != ng.repo {
                deny!("spec.git.repo is immutable: register a new Repository instead");
            }
            if og.branch != ng.branch {
                deny!("spec.git.branch is immutable: register a new Repository instead");
            }
            if og.directory.trim_matches('/') != ng.directory.trim_matches('/') {
                deny!("spec.git.directory is immutable: register a new Repository instead");
            }
        }
        if o.oci.as_ref().map(|x| &x.registry) != spec.oci.as_ref().map(|x| &x.registry) {
            deny!("spec.oci.registry is immutable");
        }
        // the identity is unchanged; it was checked when it was set
        return Verdict::Allow;
    }
    match (effective_type(spec), &spec.git, &spec.oci) {
        (RepositoryType::Git, Some(git), _) => {
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
        (RepositoryType::Git, None, _) => deny!("spec.git is required for a git repository"),
        (RepositoryType::Oci, _, Some(oci)) if !oci.registry.is_empty() => {}
        (RepositoryType::Oci, _, _) => deny!("spec.oci.registry is required for an oci repository"),
    }
    Verdict::Allow
}
