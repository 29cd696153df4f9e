//! Lossless conversion between PackageRevision v1alpha1 and v1alpha2 (spec §2.3).
//!
//! Fields map one to one where both versions can express them. What one
//! version cannot express travels in an annotation on the converted object and
//! is restored on the way back:
//!
//! * on v1alpha1 objects, `porch.kpt.dev/v1alpha2-fields` keeps the v1alpha2-only
//!   status (`conditions`, `observedGeneration`, render tracking,
//!   `creationSource`), a `source` that is not exactly one task, and label
//!   values the label mapping cannot carry (`porch.kpt.dev/latest-revision:
//!   "false"`);
//! * on v1alpha2 objects, `porch.kpt.dev/v1alpha1-fields` keeps `spec.parent`,
//!   task lists that are not exactly the one source task, and
//!   `status.renderStatus`.
//!
//! Mapped values are stashed together with what they mapped to. On the way
//! back the stash is used only while the mapped value is unchanged, so an edit
//! made through the other version wins over a stale stash.
//!
//! Both round trips are identities for every object (property-tested), up to
//! two normalisations the apiserver makes too: an empty `metadata.annotations`
//! or `metadata.labels` map is dropped, and so is an empty `status`.

use crate::common::NameRef;
use crate::v1alpha1::{self as v1, Task, TaskType};
use crate::v1alpha2::{self as v2, PackageSource};
use crate::{LATEST_REVISION_LABEL, V1ALPHA1_LATEST_REVISION_LABEL};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Annotation on v1alpha1 objects holding what only v1alpha2 can express.
pub const V1ALPHA2_FIELDS_ANNOTATION: &str = "porch.kpt.dev/v1alpha2-fields";
/// Annotation on v1alpha2 objects holding what only v1alpha1 can express.
pub const V1ALPHA1_FIELDS_ANNOTATION: &str = "porch.kpt.dev/v1alpha1-fields";

type LabelPair = (Option<String>, Option<String>);

/// v1alpha2 data with no v1alpha1 home.
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct V2Only {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<Stashed<Option<PackageSource>, Vec<Task>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labels: Option<Stashed<LabelPair, LabelPair>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    observed_prr_resource_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    rendering_prr_resource_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    creation_source: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    conditions: Vec<Condition>,
    /// A value that was already under the stash key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shadowed: Option<String>,
}

/// v1alpha1 data with no v1alpha2 home.
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct V1Only {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent: Option<NameRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tasks: Option<Stashed<Vec<Task>, Option<PackageSource>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labels: Option<Stashed<LabelPair, LabelPair>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    render_status: Option<v1::RenderStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shadowed: Option<String>,
}

/// An original value and what it was mapped to at conversion time.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
struct Stashed<O, M> {
    original: O,
    mapped: M,
}

impl<O: Clone, M: PartialEq> Stashed<O, M> {
    /// The original if the mapped value has not changed since.
    fn restore(stash: Option<&Self>, current: &M) -> Option<O> {
        stash
            .filter(|s| &s.mapped == current)
            .map(|s| s.original.clone())
    }
}

/// Why an object could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ConversionError {
    #[error("failed to encode the {0} annotation")]
    Encode(&'static str, #[source] serde_json::Error),
    #[error(
        "the fields only the other version can hold take {size} bytes, more than the {MAX_STASH_BYTES} an annotation may carry here: shorten them (e.g. status.renderStatus)"
    )]
    TooLarge { size: usize },
}

/// Largest stash written; Kubernetes allows 256 KiB for all annotations.
pub const MAX_STASH_BYTES: usize = 128 * 1024;

/// Converts a v1alpha2 PackageRevision to v1alpha1.
///
/// # Errors
/// Only if the stash cannot be encoded, which typed values rule out.
pub fn to_v1alpha1(obj: &v2::PackageRevision) -> Result<v1::PackageRevision, ConversionError> {
    let mut metadata = obj.metadata.clone();
    let mut annotations = metadata.annotations.take().unwrap_or_default();
    let mut labels = metadata.labels.take().unwrap_or_default();
    let v1_only = take_stash::<V1Only>(&mut annotations, V1ALPHA1_FIELDS_ANNOTATION);
    let v1_only = v1_only.as_ref();

    let spec = &obj.spec;
    let status = obj.status.clone().unwrap_or_default();
    let mut v2_only = V2Only {
        observed_generation: status.observed_generation,
        observed_prr_resource_version: status.observed_prr_resource_version.clone(),
        rendering_prr_resource_version: status.rendering_prr_resource_version.clone(),
        creation_source: status.creation_source.clone(),
        conditions: status.conditions.clone(),
        ..V2Only::default()
    };

    // spec.source -> spec.tasks
    let mapped_tasks = source_to_tasks(spec.source.as_ref());
    if tasks_to_source(&mapped_tasks) != spec.source {
        v2_only.source = Some(Stashed {
            original: spec.source.clone(),
            mapped: mapped_tasks.clone(),
        });
    }
    let tasks = Stashed::restore(v1_only.and_then(|s| s.tasks.as_ref()), &spec.source)
        .unwrap_or(mapped_tasks);

    // latest-revision label: porch.kpt.dev/... "true"|"false" -> kpt.dev/... "true"
    let pair = take_label_pair(&mut labels);
    let mapped_pair = v2_labels_to_v1(&pair);
    if v1_labels_to_v2(&mapped_pair) != pair {
        v2_only.labels = Some(Stashed {
            original: pair.clone(),
            mapped: mapped_pair.clone(),
        });
    }
    let out_pair =
        Stashed::restore(v1_only.and_then(|s| s.labels.as_ref()), &pair).unwrap_or(mapped_pair);
    put_label_pair(&mut labels, out_pair);

    if let Some(shadowed) = v1_only.and_then(|s| s.shadowed.clone()) {
        annotations.insert(V1ALPHA1_FIELDS_ANNOTATION.to_owned(), shadowed);
    }
    put_stash(&mut annotations, V1ALPHA2_FIELDS_ANNOTATION, v2_only)?;
    metadata.annotations = non_empty(annotations);
    metadata.labels = non_empty(labels);

    let v1_status = non_default(v1::PackageRevisionStatus {
        upstream_lock: status.upstream_lock,
        self_lock: status.self_lock,
        published_by: status.published_by,
        publish_timestamp: status.published_at,
        deployment: status.deployment,
        conditions: status.package_conditions,
        render_status: v1_only.and_then(|s| s.render_status.clone()),
    });

    Ok(v1::PackageRevision {
        metadata,
        spec: v1::PackageRevisionSpec {
            package_name: spec.package_name.clone(),
            repository: spec.repository.clone(),
            workspace_name: spec.workspace_name.clone(),
            revision: status.revision,
            parent: v1_only.and_then(|s| s.parent.clone()),
            lifecycle: spec.lifecycle,
            tasks,
            readiness_gates: spec.readiness_gates.clone(),
            package_metadata: spec.package_metadata.clone(),
        },
        status: v1_status,
    })
}

/// Converts a v1alpha1 PackageRevision to v1alpha2.
///
/// # Errors
/// Only if the stash cannot be encoded, which typed values rule out.
pub fn to_v1alpha2(obj: &v1::PackageRevision) -> Result<v2::PackageRevision, ConversionError> {
    let mut metadata = obj.metadata.clone();
    let mut annotations = metadata.annotations.take().unwrap_or_default();
    let mut labels = metadata.labels.take().unwrap_or_default();
    let v2_only = take_stash::<V2Only>(&mut annotations, V1ALPHA2_FIELDS_ANNOTATION);
    let v2_only = v2_only.as_ref();
    let spec = &obj.spec;
    let status = obj.status.clone().unwrap_or_default();

    let mut v1_only = V1Only {
        parent: spec.parent.clone(),
        render_status: status.render_status.clone(),
        ..V1Only::default()
    };

    let mapped_source = tasks_to_source(&spec.tasks);
    if source_to_tasks(mapped_source.as_ref()) != spec.tasks {
        v1_only.tasks = Some(Stashed {
            original: spec.tasks.clone(),
            mapped: mapped_source.clone(),
        });
    }
    let source = Stashed::restore(v2_only.and_then(|s| s.source.as_ref()), &spec.tasks)
        .unwrap_or(mapped_source);

    let pair = take_label_pair(&mut labels);
    let mapped_pair = v1_labels_to_v2(&pair);
    if v2_labels_to_v1(&mapped_pair) != pair {
        v1_only.labels = Some(Stashed {
            original: pair.clone(),
            mapped: mapped_pair.clone(),
        });
    }
    let out_pair =
        Stashed::restore(v2_only.and_then(|s| s.labels.as_ref()), &pair).unwrap_or(mapped_pair);
    put_label_pair(&mut labels, out_pair);

    if let Some(shadowed) = v2_only.and_then(|s| s.shadowed.clone()) {
        annotations.insert(V1ALPHA2_FIELDS_ANNOTATION.to_owned(), shadowed);
    }
    put_stash(&mut annotations, V1ALPHA1_FIELDS_ANNOTATION, v1_only)?;
    metadata.annotations = non_empty(annotations);
    metadata.labels = non_empty(labels);

    let v2 = v2_only.cloned().unwrap_or_default();
    let v2_status = non_default(v2::PackageRevisionStatus {
        observed_generation: v2.observed_generation,
        revision: spec.revision,
        upstream_lock: status.upstream_lock,
        self_lock: status.self_lock,
        published_by: status.published_by,
        published_at: status.publish_timestamp,
        deployment: status.deployment,
        observed_prr_resource_version: v2.observed_prr_resource_version,
        rendering_prr_resource_version: v2.rendering_prr_resource_version,
        creation_source: v2.creation_source,
        package_conditions: status.conditions,
        conditions: v2.conditions,
    });

    Ok(v2::PackageRevision {
        metadata,
        spec: v2::PackageRevisionSpec {
            package_name: spec.package_name.clone(),
            repository: spec.repository.clone(),
            workspace_name: spec.workspace_name.clone(),
            lifecycle: spec.lifecycle,
            source,
            readiness_gates: spec.readiness_gates.clone(),
            package_metadata: spec.package_metadata.clone(),
        },
        status: v2_status,
    })
}

/// The v1alpha2 spec a v1alpha1 spec maps to, leaving out what only a stash
/// restores: what admission compares, the same way on both sides.
pub fn spec_to_v1alpha2(spec: &v1::PackageRevisionSpec) -> v2::PackageRevisionSpec {
    v2::PackageRevisionSpec {
        package_name: spec.package_name.clone(),
        repository: spec.repository.clone(),
        workspace_name: spec.workspace_name.clone(),
        lifecycle: spec.lifecycle,
        source: tasks_to_source(&spec.tasks),
        readiness_gates: spec.readiness_gates.clone(),
        package_metadata: spec.package_metadata.clone(),
    }
}

/// The v1alpha1 task for a v1alpha2 source: one task for exactly one member.
fn source_to_tasks(source: Option<&PackageSource>) -> Vec<Task> {
    let Some(source) = source else {
        return Vec::new();
    };
    if source.members().len() != 1 {
        return Vec::new();
    }
    let task = if let Some(init) = &source.init {
        Task {
            type_: TaskType::Init,
            init: Some(v1::InitTaskSpec {
                subpackage: init.subpackage.clone(),
                description: init.description.clone(),
                keywords: init.keywords.clone(),
                site: init.site.clone(),
            }),
            ..Task::default()
        }
    } else if let Some(clone) = &source.clone_from {
        Task {
            type_: TaskType::Clone,
            clone: Some(v1::CloneTaskSpec {
                upstream: v1::UpstreamPackage {
                    type_: clone.type_,
                    git: clone.git.clone(),
                    oci: None,
                    upstream_ref: clone.upstream_ref.clone(),
                },
            }),
            ..Task::default()
        }
    } else if let Some(copy) = &source.copy_from {
        Task {
            type_: TaskType::Edit,
            edit: Some(v1::EditTaskSpec {
                source: Some(copy.clone()),
            }),
            ..Task::default()
        }
    } else if let Some(upgrade) = &source.upgrade {
        Task {
            type_: TaskType::Upgrade,
            upgrade: Some(v1::UpgradeTaskSpec {
                old_upstream_ref: upgrade.old_upstream.clone(),
                new_upstream_ref: upgrade.new_upstream.clone(),
                local_package_revision_ref: upgrade.current_package.clone(),
                strategy: upgrade.strategy,
            }),
            ..Task::default()
        }
    } else {
        return Vec::new();
    };
    vec![task]
}

/// The v1alpha2 source for a v1alpha1 task list: the first task, if it is a
/// source task whose payload matches its type.
fn tasks_to_source(tasks: &[Task]) -> Option<PackageSource> {
    let task = tasks.first()?;
    let only = |t: &Task, kind: TaskType| {
        t.type_ == kind
            && [
                t.init.is_some(),
                t.clone.is_some(),
                t.edit.is_some(),
                t.upgrade.is_some(),
            ]
            .iter()
            .filter(|s| **s)
            .count()
                == 1
    };
    let mut source = PackageSource::default();
    match task.type_ {
        TaskType::Init if only(task, TaskType::Init) => {
            let init = task.init.as_ref()?;
            source.init = Some(v2::InitSpec {
                subpackage: init.subpackage.clone(),
                description: init.description.clone(),
                keywords: init.keywords.clone(),
                site: init.site.clone(),
            });
        }
        TaskType::Clone if only(task, TaskType::Clone) => {
            let up = &task.clone.as_ref()?.upstream;
            if up.oci.is_some() {
                return None;
            }
            source.clone_from = Some(v2::CloneSpec {
                type_: up.type_,
                git: up.git.clone(),
                upstream_ref: up.upstream_ref.clone(),
            });
        }
        TaskType::Edit if only(task, TaskType::Edit) => {
            source.copy_from = Some(task.edit.as_ref()?.source.clone()?);
        }
        TaskType::Upgrade if only(task, TaskType::Upgrade) => {
            let up = task.upgrade.as_ref()?;
            source.upgrade = Some(v2::UpgradeSpec {
                old_upstream: up.old_upstream_ref.clone(),
                new_upstream: up.new_upstream_ref.clone(),
                current_package: up.local_package_revision_ref.clone(),
                strategy: up.strategy,
            });
        }
        _ => return None,
    }
    Some(source)
}

/// Labels as (`porch.kpt.dev/latest-revision`, `kpt.dev/latest-revision`).
fn take_label_pair(labels: &mut BTreeMap<String, String>) -> LabelPair {
    (
        labels.remove(LATEST_REVISION_LABEL),
        labels.remove(V1ALPHA1_LATEST_REVISION_LABEL),
    )
}

fn put_label_pair(labels: &mut BTreeMap<String, String>, (v2, v1): LabelPair) {
    if let Some(v) = v2 {
        labels.insert(LATEST_REVISION_LABEL.to_owned(), v);
    }
    if let Some(v) = v1 {
        labels.insert(V1ALPHA1_LATEST_REVISION_LABEL.to_owned(), v);
    }
}

/// v1alpha1 marks only the latest revision, with "true".
fn v2_labels_to_v1((v2, _): &LabelPair) -> LabelPair {
    let latest = v2.as_deref() == Some("true");
    (None, latest.then(|| "true".to_owned()))
}

fn v1_labels_to_v2((_, v1): &LabelPair) -> LabelPair {
    let latest = v1.as_deref() == Some("true");
    (latest.then(|| "true".to_owned()), None)
}

/// Removes and decodes a stash. An annotation that does not decode (or is
/// empty) is not ours: it stays where it is, as an ordinary annotation.
fn take_stash<T: for<'de> Deserialize<'de> + Default + PartialEq>(
    annotations: &mut BTreeMap<String, String>,
    key: &str,
) -> Option<T> {
    let decoded: T = serde_json::from_str(annotations.get(key)?).ok()?;
    // an empty stash is never written, so `{}` is someone else's value
    if decoded == T::default() {
        return None;
    }
    annotations.remove(key);
    Some(decoded)
}

/// Encodes a stash, unless it is empty. An annotation already under the key
/// is kept inside the stash and put back on the way back.
fn put_stash<T: Serialize + Default + PartialEq + Shadowing>(
    annotations: &mut BTreeMap<String, String>,
    key: &'static str,
    mut stash: T,
) -> Result<(), ConversionError> {
    if let Some(existing) = annotations.remove(key) {
        stash.set_shadowed(existing);
    }
    if stash == T::default() {
        return Ok(());
    }
    let text = serde_json::to_string(&stash).map_err(|e| ConversionError::Encode(key, e))?;
    if text.len() > MAX_STASH_BYTES {
        return Err(ConversionError::TooLarge { size: text.len() });
    }
    annotations.insert(key.to_owned(), text);
    Ok(())
}

trait Shadowing {
    fn set_shadowed(&mut self, value: String);
}

impl Shadowing for V1Only {
    fn set_shadowed(&mut self, value: String) {
        self.shadowed = Some(value);
    }
}

impl Shadowing for V2Only {
    fn set_shadowed(&mut self, value: String) {
        self.shadowed = Some(value);
    }
}

/// An all-default status is written as no status.
fn non_default<T: Default + PartialEq>(value: T) -> Option<T> {
    (value != T::default()).then_some(value)
}

fn non_empty(map: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!map.is_empty()).then_some(map)
}

/// A reserved conversion annotation holding something conversion did not write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "annotation {key} is reserved for version conversion and holds a value conversion did not write; remove it"
)]
pub struct ReservedAnnotationError {
    pub key: &'static str,
}

/// Checks the stash annotation an object of `api_version` may carry: absent,
/// or a stash written by conversion. Admission refuses anything else, so
/// conversion round trips stay identities.
///
/// # Errors
/// The annotation holds a foreign value.
pub fn check_stash_annotation(
    annotations: Option<&BTreeMap<String, String>>,
    api_version: &str,
) -> Result<(), ReservedAnnotationError> {
    fn decodes<T: for<'de> Deserialize<'de> + Default + PartialEq>(text: &str) -> bool {
        serde_json::from_str::<T>(text).is_ok_and(|t| t != T::default())
    }
    let Some(annotations) = annotations else {
        return Ok(());
    };
    let (key, ok): (&'static str, fn(&str) -> bool) = if api_version.ends_with("/v1alpha1") {
        (V1ALPHA2_FIELDS_ANNOTATION, decodes::<V2Only>)
    } else {
        (V1ALPHA1_FIELDS_ANNOTATION, decodes::<V1Only>)
    };
    match annotations.get(key) {
        Some(value) if !ok(value) => Err(ReservedAnnotationError { key }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_stash_is_an_error_not_a_broken_object() {
        let mut obj =
            crate::v1alpha1::PackageRevision::new("r.p.ws", v1::PackageRevisionSpec::default());
        obj.status = Some(v1::PackageRevisionStatus {
            render_status: Some(v1::RenderStatus {
                error: "x".repeat(MAX_STASH_BYTES + 1),
                ..Default::default()
            }),
            ..Default::default()
        });
        let err = to_v1alpha2(&obj).expect_err("too large");
        assert!(matches!(err, ConversionError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn foreign_values_under_reserved_keys_are_reported() {
        let map = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
        let v1 = "porch.kpt.dev/v1alpha1";
        let v2 = "porch.kpt.dev/v1alpha2";
        check_stash_annotation(None, v1).expect("none");
        check_stash_annotation(
            Some(&map(
                V1ALPHA2_FIELDS_ANNOTATION,
                r#"{"creationSource":"init"}"#,
            )),
            v1,
        )
        .expect("a real stash");
        for bad in ["x", "{}", "{\"unknown\":1}"] {
            let err = check_stash_annotation(Some(&map(V1ALPHA2_FIELDS_ANNOTATION, bad)), v1)
                .expect_err(bad);
            assert!(
                err.to_string().contains("reserved for version conversion"),
                "{err}"
            );
            check_stash_annotation(Some(&map(V1ALPHA1_FIELDS_ANNOTATION, bad)), v1)
                .expect("the other key is carried through");
        }
        check_stash_annotation(
            Some(&map(
                V1ALPHA1_FIELDS_ANNOTATION,
                r#"{"parent":{"name":"p"}}"#,
            )),
            v2,
        )
        .expect("a real stash");
        assert!(check_stash_annotation(Some(&map(V1ALPHA1_FIELDS_ANNOTATION, "x")), v2).is_err());
    }
}
