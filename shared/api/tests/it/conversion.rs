//! v1alpha1 ↔ v1alpha2 round trips are identities: property tests over
//! generated objects, including values only one version can express.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use porch_api::common::*;
use porch_api::convert::{
    V1ALPHA1_FIELDS_ANNOTATION, V1ALPHA2_FIELDS_ANNOTATION, to_v1alpha1, to_v1alpha2,
};
use porch_api::v1alpha1::{self as v1, Task, TaskType};
use porch_api::v1alpha2::{self as v2, PackageSource};
use porch_api::{LATEST_REVISION_LABEL, V1ALPHA1_LATEST_REVISION_LABEL};
use pretty_assertions::assert_eq;
use proptest::collection::{btree_map, vec};
use proptest::option::of;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn word() -> impl Strategy<Value = String> {
    "[a-z0-9-]{0,8}"
}

fn some_word() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,8}"
}

fn time() -> impl Strategy<Value = Time> {
    (0i64..4_000_000_000).prop_map(|s| Time(Timestamp::from_second(s).expect("in range")))
}

fn name_ref() -> impl Strategy<Value = NameRef> {
    word().prop_map(|name| NameRef { name })
}

fn git_package() -> impl Strategy<Value = GitPackage> {
    (word(), word(), word(), word()).prop_map(|(repo, ref_, directory, secret)| GitPackage {
        repo,
        ref_,
        directory,
        secret_ref: SecretRef { name: secret },
    })
}

fn repo_type() -> impl Strategy<Value = RepositoryType> {
    prop_oneof![Just(RepositoryType::Git), Just(RepositoryType::Oci)]
}

fn strategy() -> impl Strategy<Value = UpgradeStrategy> {
    prop_oneof![
        Just(UpgradeStrategy::ResourceMerge),
        Just(UpgradeStrategy::FastForward),
        Just(UpgradeStrategy::ForceDeleteReplace),
        Just(UpgradeStrategy::CopyMerge),
    ]
}

fn init_fields() -> impl Strategy<Value = (String, String, Vec<String>, String)> {
    (word(), word(), vec(some_word(), 0..3), word())
}

fn source() -> impl Strategy<Value = PackageSource> {
    let init = init_fields()
        .prop_map(|(subpackage, description, keywords, site)| v2::InitSpec {
            subpackage,
            description,
            keywords,
            site,
        })
        .boxed();
    let clone = (of(repo_type()), of(git_package()), of(name_ref()))
        .prop_map(|(type_, git, upstream_ref)| v2::CloneSpec {
            type_,
            git,
            upstream_ref,
        })
        .boxed();
    let upgrade = (name_ref(), name_ref(), name_ref(), of(strategy()))
        .prop_map(|(o, n, c, s)| v2::UpgradeSpec {
            old_upstream: o,
            new_upstream: n,
            current_package: c,
            strategy: s,
        })
        .boxed();
    // weighted towards exactly one member, but zero and several happen too
    let one = prop_oneof![
        init.clone().prop_map(|i| PackageSource {
            init: Some(i),
            ..Default::default()
        }),
        clone.clone().prop_map(|c| PackageSource {
            clone_from: Some(c),
            ..Default::default()
        }),
        name_ref().prop_map(|c| PackageSource {
            copy_from: Some(c),
            ..Default::default()
        }),
        upgrade.clone().prop_map(|u| PackageSource {
            upgrade: Some(u),
            ..Default::default()
        }),
    ];
    let any = (of(init), of(clone), of(name_ref()), of(upgrade)).prop_map(|(i, c, cp, u)| {
        PackageSource {
            init: i,
            clone_from: c,
            copy_from: cp,
            upgrade: u,
        }
    });
    prop_oneof![4 => one, 1 => any]
}

fn lifecycle() -> impl Strategy<Value = Lifecycle> {
    prop::sample::select(Lifecycle::ALL.to_vec())
}

fn locator() -> impl Strategy<Value = Locator> {
    (word(), of((word(), word(), word(), word()))).prop_map(|(type_, git)| Locator {
        type_,
        git: git.map(|(repo, directory, ref_, commit)| GitLock {
            repo,
            directory,
            ref_,
            commit,
        }),
    })
}

fn package_condition() -> impl Strategy<Value = PackageCondition> {
    (
        some_word(),
        prop_oneof![
            Just(ConditionStatus::True),
            Just(ConditionStatus::False),
            Just(ConditionStatus::Unknown)
        ],
        word(),
        ".{0,12}",
    )
        .prop_map(|(type_, status, reason, message)| PackageCondition {
            type_,
            status,
            reason,
            message,
        })
}

fn condition() -> impl Strategy<Value = Condition> {
    (
        some_word(),
        time(),
        ".{0,12}",
        of(0i64..100),
        some_word(),
        prop::sample::select(vec!["True", "False", "Unknown"]),
    )
        .prop_map(|(type_, t, message, og, reason, status)| Condition {
            type_,
            last_transition_time: t,
            message,
            observed_generation: og,
            reason,
            status: status.to_owned(),
        })
}

fn package_metadata() -> impl Strategy<Value = PackageMetadata> {
    (
        btree_map(some_word(), word(), 0..3),
        btree_map(some_word(), word(), 0..3),
    )
        .prop_map(|(labels, annotations)| PackageMetadata {
            labels,
            annotations,
        })
}

fn readiness_gates() -> impl Strategy<Value = Vec<ReadinessGate>> {
    vec(
        word().prop_map(|condition_type| ReadinessGate { condition_type }),
        0..3,
    )
}

/// Labels, sometimes with either latest-revision key and any value.
fn labels() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    let latest = prop::sample::select(vec!["true", "false", "yes", ""]);
    (
        btree_map("app-[a-z]{1,4}", word(), 0..3),
        of(latest.clone()),
        prop::bool::weighted(0.1),
        latest,
    )
        .prop_map(|(mut m, v2, with_v1, v1)| {
            if let Some(v) = v2 {
                m.insert(LATEST_REVISION_LABEL.to_owned(), v.to_owned());
            }
            if with_v1 {
                m.insert(V1ALPHA1_LATEST_REVISION_LABEL.to_owned(), v1.to_owned());
            }
            (!m.is_empty()).then_some(m)
        })
}

/// Annotations, sometimes with a foreign value under `foreign_key`: the stash
/// key of the *other* version, which conversion must carry through. (A
/// foreign value under an object's own incoming stash key is refused by
/// admission, see `convert::check_reserved_annotations`.)
fn annotations(
    foreign_key: &'static str,
) -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    let foreign = prop::sample::select(vec!["x", "{}", "{\"parent\":", "null", "[]"]);
    (
        btree_map("note-[a-z]{1,4}", ".{0,10}", 0..3),
        prop::bool::weighted(0.15),
        foreign,
    )
        .prop_map(move |(mut m, with_foreign, value)| {
            if with_foreign {
                m.insert(foreign_key.to_owned(), value.to_owned());
            }
            (!m.is_empty()).then_some(m)
        })
}

fn metadata(foreign_key: &'static str) -> impl Strategy<Value = ObjectMeta> {
    (
        some_word(),
        of(some_word()),
        of(word()),
        of(1i64..10),
        labels(),
        annotations(foreign_key),
        of(vec(some_word(), 1..3)),
        of(time()),
    )
        .prop_map(
            |(name, namespace, uid, generation, labels, annotations, finalizers, created)| {
                ObjectMeta {
                    name: Some(name),
                    namespace,
                    uid,
                    generation,
                    labels,
                    annotations,
                    finalizers,
                    creation_timestamp: created,
                    resource_version: Some("42".to_owned()),
                    ..ObjectMeta::default()
                }
            },
        )
}

prop_compose! {
    fn v2_status()(
        observed_generation in of(0i64..50),
        revision in of(-1i64..20),
        upstream_lock in of(locator()),
        self_lock in of(locator()),
        published_by in word(),
        published_at in of(time()),
        deployment in any::<bool>(),
        observed in word(),
        rendering in word(),
        creation_source in prop::sample::select(vec!["", "init", "clone", "copy", "upgrade"]),
        package_conditions in vec(package_condition(), 0..3),
        conditions in vec(condition(), 0..3),
    ) -> v2::PackageRevisionStatus {
        v2::PackageRevisionStatus {
            observed_generation,
            revision,
            upstream_lock,
            self_lock,
            published_by,
            published_at,
            deployment,
            observed_prr_resource_version: observed,
            rendering_prr_resource_version: rendering,
            creation_source: creation_source.to_owned(),
            package_conditions,
            conditions,
        }
    }
}

prop_compose! {
    fn v2_object()(
        metadata in metadata(V1ALPHA2_FIELDS_ANNOTATION),
        package_name in word(),
        repository in word(),
        workspace_name in word(),
        lifecycle in of(lifecycle()),
        source in of(source()),
        readiness_gates in readiness_gates(),
        package_metadata in of(package_metadata()),
        status in of(v2_status()),
    ) -> v2::PackageRevision {
        v2::PackageRevision {
            metadata,
            spec: v2::PackageRevisionSpec {
                package_name,
                repository,
                workspace_name,
                lifecycle,
                source,
                readiness_gates,
                package_metadata,
            },
            status: status.filter(|s| *s != v2::PackageRevisionStatus::default()),
        }
    }
}

fn task() -> impl Strategy<Value = Task> {
    let ty = prop::sample::select(vec![
        TaskType::Init,
        TaskType::Clone,
        TaskType::Edit,
        TaskType::Upgrade,
        TaskType::Render,
        TaskType::Push,
        TaskType::Unspecified,
    ]);
    let init = init_fields()
        .prop_map(
            |(subpackage, description, keywords, site)| v1::InitTaskSpec {
                subpackage,
                description,
                keywords,
                site,
            },
        )
        .boxed();
    let clone = (
        of(repo_type()),
        of(git_package()),
        of(word()),
        of(name_ref()),
    )
        .prop_map(|(type_, git, oci, upstream_ref)| v1::CloneTaskSpec {
            upstream: v1::UpstreamPackage {
                type_,
                git,
                oci: oci.map(|image| v1::OciPackage { image }),
                upstream_ref,
            },
        })
        .boxed();
    let edit = of(name_ref())
        .prop_map(|source| v1::EditTaskSpec { source })
        .boxed();
    let upgrade = (name_ref(), name_ref(), name_ref(), of(strategy()))
        .prop_map(|(o, n, l, s)| v1::UpgradeTaskSpec {
            old_upstream_ref: o,
            new_upstream_ref: n,
            local_package_revision_ref: l,
            strategy: s,
        })
        .boxed();
    // mostly well-formed tasks (payload matching the type), sometimes anything
    let matching = prop_oneof![
        init.clone().prop_map(|i| Task {
            type_: TaskType::Init,
            init: Some(i),
            ..Default::default()
        }),
        clone.clone().prop_map(|c| Task {
            type_: TaskType::Clone,
            clone: Some(c),
            ..Default::default()
        }),
        edit.clone().prop_map(|e| Task {
            type_: TaskType::Edit,
            edit: Some(e),
            ..Default::default()
        }),
        upgrade.clone().prop_map(|u| Task {
            type_: TaskType::Upgrade,
            upgrade: Some(u),
            ..Default::default()
        }),
    ];
    let anything = (ty, of(init), of(clone), of(edit), of(upgrade)).prop_map(
        |(type_, init, clone, edit, upgrade)| Task {
            type_,
            init,
            clone,
            edit,
            upgrade,
        },
    );
    prop_oneof![3 => matching, 1 => anything]
}

fn render_status() -> impl Strategy<Value = v1::RenderStatus> {
    let item = (
        ".{0,10}",
        prop::sample::select(vec!["", "error", "info"]),
        of(0i64..3),
    )
        .prop_map(|(message, severity, idx)| v1::ResultItem {
            message,
            severity: severity.to_owned(),
            file: idx.map(|index| v1::FileRef {
                path: "a.yaml".to_owned(),
                index,
            }),
            field: idx.map(|i| v1::FieldRef {
                path: "spec.x".to_owned(),
                current_value: Some(serde_json::json!({ "n": i })),
                proposed_value: None,
            }),
            ..Default::default()
        });
    let result = (0i64..2, vec((word(), vec(item, 0..2)), 0..2)).prop_map(|(exit_code, fns)| {
        v1::ResultList {
            exit_code,
            items: fns
                .into_iter()
                .map(|(image, results)| v1::FunctionResult {
                    image,
                    exit_code,
                    results,
                    ..Default::default()
                })
                .collect(),
        }
    });
    (of(result), word()).prop_map(|(result, error)| v1::RenderStatus { result, error })
}

prop_compose! {
    fn v1_status()(
        upstream_lock in of(locator()),
        self_lock in of(locator()),
        published_by in word(),
        publish_timestamp in of(time()),
        deployment in any::<bool>(),
        conditions in vec(package_condition(), 0..3),
        render_status in of(render_status()),
    ) -> v1::PackageRevisionStatus {
        v1::PackageRevisionStatus {
            upstream_lock,
            self_lock,
            published_by,
            publish_timestamp,
            deployment,
            conditions,
            render_status,
        }
    }
}

prop_compose! {
    fn v1_object()(
        metadata in metadata(V1ALPHA1_FIELDS_ANNOTATION),
        package_name in word(),
        repository in word(),
        workspace_name in word(),
        revision in of(-1i64..20),
        parent in of(name_ref()),
        lifecycle in of(lifecycle()),
        tasks in prop_oneof![3 => vec(task(), 0..2), 1 => vec(task(), 0..4)],
        readiness_gates in readiness_gates(),
        package_metadata in of(package_metadata()),
        status in of(v1_status()),
    ) -> v1::PackageRevision {
        v1::PackageRevision {
            metadata,
            spec: v1::PackageRevisionSpec {
                package_name,
                repository,
                workspace_name,
                revision,
                parent,
                lifecycle,
                tasks,
                readiness_gates,
                package_metadata,
            },
            status: status.filter(|s| *s != v1::PackageRevisionStatus::default()),
        }
    }
}

/// JSON round trip, as the webhook sees objects.
fn through_json<T: serde::Serialize + serde::de::DeserializeOwned>(value: &T) -> T {
    let text = serde_json::to_string(value).expect("serialize");
    serde_json::from_str(&text).expect("deserialize")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn v1alpha2_to_v1alpha1_and_back_is_identity(obj in v2_object()) {
        let down = through_json(&to_v1alpha1(&obj).expect("to v1alpha1"));
        let back = to_v1alpha2(&down).expect("to v1alpha2");
        prop_assert_eq!(back, obj);
    }

    #[test]
    fn v1alpha1_to_v1alpha2_and_back_is_identity(obj in v1_object()) {
        let up = through_json(&to_v1alpha2(&obj).expect("to v1alpha2"));
        let back = to_v1alpha1(&up).expect("to v1alpha1");
        prop_assert_eq!(back, obj);
    }

    #[test]
    fn twice_around_is_still_identity(obj in v2_object()) {
        let once = to_v1alpha2(&to_v1alpha1(&obj).expect("down")).expect("up");
        let twice = to_v1alpha2(&to_v1alpha1(&once).expect("down")).expect("up");
        prop_assert_eq!(twice, obj);
    }
}

fn published_v2() -> v2::PackageRevision {
    let mut obj = v2::PackageRevision::new(
        "blueprints.basens.v1",
        v2::PackageRevisionSpec {
            package_name: "basens".into(),
            repository: "blueprints".into(),
            workspace_name: "v1".into(),
            lifecycle: Some(Lifecycle::Published),
            source: Some(PackageSource {
                init: Some(v2::InitSpec {
                    description: "basens description".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    obj.metadata.labels = Some(BTreeMap::from([(
        LATEST_REVISION_LABEL.into(),
        "true".into(),
    )]));
    obj.status = Some(v2::PackageRevisionStatus {
        revision: Some(1),
        creation_source: "init".into(),
        published_by: "alice@example.com".into(),
        ..Default::default()
    });
    obj
}

#[test]
fn fields_map_to_their_v1alpha1_homes() {
    let v1 = to_v1alpha1(&published_v2()).expect("convert");
    assert_eq!(v1.spec.revision, Some(1));
    assert_eq!(v1.spec.tasks.len(), 1);
    assert_eq!(v1.spec.tasks[0].type_, TaskType::Init);
    assert_eq!(
        v1.spec.tasks[0]
            .init
            .as_ref()
            .map(|i| i.description.as_str()),
        Some("basens description")
    );
    let labels = v1.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get(V1ALPHA1_LATEST_REVISION_LABEL)
            .map(String::as_str),
        Some("true")
    );
    assert!(!labels.contains_key(LATEST_REVISION_LABEL));
    let stash = &v1.metadata.annotations.as_ref().expect("stash")[V1ALPHA2_FIELDS_ANNOTATION];
    assert_eq!(stash, r#"{"creationSource":"init"}"#);
    assert_eq!(
        v1.status.as_ref().map(|s| s.published_by.as_str()),
        Some("alice@example.com")
    );
}

#[test]
fn latest_false_has_no_v1alpha1_label_but_comes_back() {
    let mut obj = published_v2();
    obj.metadata.labels = Some(BTreeMap::from([(
        LATEST_REVISION_LABEL.into(),
        "false".into(),
    )]));
    let v1 = to_v1alpha1(&obj).expect("convert");
    assert_eq!(v1.metadata.labels, None);
    assert_eq!(
        to_v1alpha2(&v1).expect("back").metadata.labels,
        obj.metadata.labels
    );
}

#[test]
fn an_edit_through_v1alpha1_wins_over_a_stale_stash() {
    // "false" is stashed; a v1alpha1 client then marks the revision latest
    let mut obj = published_v2();
    obj.metadata.labels = Some(BTreeMap::from([(
        LATEST_REVISION_LABEL.into(),
        "false".into(),
    )]));
    let mut v1 = to_v1alpha1(&obj).expect("convert");
    v1.metadata.labels = Some(BTreeMap::from([(
        V1ALPHA1_LATEST_REVISION_LABEL.into(),
        "true".into(),
    )]));
    let back = to_v1alpha2(&v1).expect("back");
    assert_eq!(
        back.metadata.labels,
        Some(BTreeMap::from([(
            LATEST_REVISION_LABEL.into(),
            "true".into()
        )]))
    );
}

#[test]
fn extra_tasks_and_parent_survive_v1alpha2() {
    let mut obj = v1::PackageRevision::new("r.p.ws", v1::PackageRevisionSpec::default());
    obj.spec.parent = Some(NameRef { name: "old".into() });
    obj.spec.tasks = vec![
        Task {
            type_: TaskType::Edit,
            edit: Some(v1::EditTaskSpec {
                source: Some(NameRef {
                    name: "r.p.v1".into(),
                }),
            }),
            ..Default::default()
        },
        Task {
            type_: TaskType::Render,
            ..Default::default()
        },
    ];
    let up = to_v1alpha2(&obj).expect("up");
    // the first task is still the source in v1alpha2
    assert_eq!(
        up.spec.source.as_ref().and_then(|s| s.copy_from.clone()),
        Some(NameRef {
            name: "r.p.v1".into()
        })
    );
    assert!(
        up.metadata
            .annotations
            .as_ref()
            .expect("stash")
            .contains_key(V1ALPHA1_FIELDS_ANNOTATION)
    );
    assert_eq!(to_v1alpha1(&up).expect("down"), obj);
}
