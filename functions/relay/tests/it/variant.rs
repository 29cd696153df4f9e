//! A PackageVariant through the relay on real git: the downstream cloned
//! from the upstream's latest published revision (and taken through
//! source, render and Ready by the revision handlers), an upgrade draft
//! when a new upstream revision is published, an edit draft when only the
//! variant's pipeline changes, no duplicates however often the events
//! come, and the deletion policy applied before the finalizer goes.

use std::sync::Arc;

use porch_api::variant::PackageVariant;
use porch_relay::invoker::InProcess;
use porch_relay::memory::Objects;
use porch_relay::relay::{Relay, RelayConfig};
use serde_json::{Value, json};

use crate::support::{World, condition, git, publish, publish_copy};

fn variant_object(world: &World) -> Option<Value> {
    world
        .cluster
        .lock()
        .expect("lock")
        .object("PackageVariant", "default", "app-dev")
        .cloned()
}

fn typed_variant(world: &World) -> PackageVariant {
    serde_json::from_value(variant_object(world).expect("the variant")).expect("typed")
}

/// The revisions of the downstream package: (name, lifecycle, owned).
fn downstreams(objects: &Objects) -> Vec<(String, String, bool)> {
    objects
        .typed("default")
        .into_iter()
        .filter(|p| p.spec.package_name == "app-dev")
        .map(|p| {
            let owned = p
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.kind == "PackageVariant" && r.name == "app-dev");
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.spec
                    .lifecycle
                    .map(|l| l.as_str().to_owned())
                    .unwrap_or_default(),
                owned,
            )
        })
        .collect()
}

#[tokio::test]
async fn a_variant_clones_upgrades_and_cleans_up_its_downstream() {
    let world = World::new();
    let relay = Relay::new(
        Arc::clone(&world.cluster),
        Arc::new(InProcess::new(Arc::clone(&world.runner))),
        RelayConfig::default(),
    );
    relay.observe_repository(world.repository.clone());
    relay.observe_revision(world.create_draft("app"));
    relay.drain().await;
    publish(&world, &relay, "blueprints.app.v1").await;
    assert_eq!(git(&world.bare, &["tag", "--list"]).trim(), "app/v1");

    let pv = world
        .cluster
        .lock()
        .expect("lock")
        .create_object(json!({
            "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "PackageVariant",
            "metadata": {"name": "app-dev", "namespace": "default"},
            "spec": {"upstream": {"repo": "blueprints", "package": "app"},
                     "downstream": {"repo": "blueprints", "package": "app-dev"},
                     "labels": {"env": "dev"},
                     "packageContext": {"data": {"env": "dev"}},
                     "pipeline": {"mutators": [{"image": "ghcr.io/kptdev/krm-functions-catalog/set-labels:v0.2.0",
                                                "name": "labels", "configMap": {"tier": "dev"}}]}}
        }))
        .expect("created");
    relay.observe_variant(serde_json::from_value(pv).expect("typed"));
    relay.drain().await;

    // cloned once, sourced, rendered and ready; the variant says so
    let objects = world.cluster.lock().expect("lock").typed("default");
    let draft = objects
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("blueprints.app-dev.packagevariant-1"))
        .expect("the clone draft");
    assert_eq!(
        draft.status.as_ref().map(|s| s.creation_source.as_str()),
        Some("clone")
    );
    assert_eq!(condition(draft, "Rendered"), "True/Rendered");
    assert_eq!(
        draft
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("env"))
            .map(String::as_str),
        Some("dev")
    );
    assert!(git(&world.bare, &["branch", "--list"]).contains("drafts/app-dev/packagevariant-1"));
    // the variant's mutations are in the draft, then rendered
    let context = git(
        &world.bare,
        &[
            "show",
            "drafts/app-dev/packagevariant-1:app-dev/package-context.yaml",
        ],
    );
    assert!(context.contains("env: dev"), "{context}");
    let kptfile = git(
        &world.bare,
        &["show", "drafts/app-dev/packagevariant-1:app-dev/Kptfile"],
    );
    assert!(
        kptfile.contains("name: PackageVariant.app-dev.labels.0"),
        "{kptfile}"
    );
    let draft = world
        .object("blueprints.app-dev.packagevariant-1")
        .expect("the draft");
    assert_eq!(condition(&draft, "Rendered"), "True/Rendered");
    assert!(
        draft
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(porch_api::RENDER_REQUEST_ANNOTATION)),
        "a render was asked for after the mutations"
    );
    crate::support::assert_no_commit_twice(&world.bare, "drafts/app-dev/packagevariant-1");
    let pv = typed_variant(&world);
    assert_eq!(
        pv.metadata.finalizers.as_deref(),
        Some(&["config.porch.kpt.dev/packagevariants".to_owned()][..])
    );
    let status = pv.status.clone().expect("status");
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "{status:?}"
    );
    assert_eq!(
        status.downstream_targets[0].name,
        "blueprints.app-dev.packagevariant-1"
    );
    // more events change nothing: no second draft
    relay.observe_variant(pv.clone());
    relay.request_sync("default", "blueprints");
    relay.drain().await;
    assert_eq!(
        downstreams(&world.cluster.lock().expect("lock")),
        [(
            "blueprints.app-dev.packagevariant-1".to_owned(),
            "Draft".to_owned(),
            true
        )]
    );

    // the downstream is published, then the upstream moves to v2
    publish(&world, &relay, "blueprints.app-dev.packagevariant-1").await;
    publish_copy(&world, &relay, "v1", "v2").await;
    let upgrade = world
        .object("blueprints.app-dev.packagevariant-2")
        .expect("the upgrade draft");
    let source = upgrade.spec.source.clone().expect("source");
    let upgrade_spec = source.upgrade.expect("an upgrade");
    assert_eq!(upgrade_spec.old_upstream.name, "blueprints.app.v1");
    assert_eq!(upgrade_spec.new_upstream.name, "blueprints.app.v2");
    assert_eq!(
        upgrade_spec.current_package.name,
        "blueprints.app-dev.packagevariant-1"
    );
    assert_eq!(
        upgrade.status.as_ref().map(|s| s.creation_source.as_str()),
        Some("upgrade")
    );
    assert!(git(&world.bare, &["branch", "--list"]).contains("drafts/app-dev/packagevariant-2"));

    // the upgrade is published; then only the variant's pipeline changes:
    // an edit draft of the published downstream takes the new function,
    // applied to the parsed Kptfile (no text patch to conflict: nephio#469)
    publish(&world, &relay, "blueprints.app-dev.packagevariant-2").await;
    let edited =
        world
            .cluster
            .lock()
            .expect("lock")
            .update_object("PackageVariant", "default", "app-dev", |o| {
                o["spec"]["pipeline"]["mutators"]
                .as_array_mut()
                .expect("mutators")
                .push(json!({"image": "ghcr.io/kptdev/krm-functions-catalog/set-annotations:v0.1.4",
                             "name": "notes", "configMap": {"owner": "dev"}}));
            })
            .expect("updated")
            .expect("kept");
    relay.observe_variant(serde_json::from_value(edited).expect("typed"));
    relay.drain().await;
    let edit = world
        .object("blueprints.app-dev.packagevariant-3")
        .expect("the edit draft");
    assert_eq!(
        edit.spec
            .source
            .as_ref()
            .and_then(|s| s.copy_from.as_ref())
            .map(|c| c.name.as_str()),
        Some("blueprints.app-dev.packagevariant-2")
    );
    let kptfile = git(
        &world.bare,
        &["show", "drafts/app-dev/packagevariant-3:app-dev/Kptfile"],
    );
    assert!(
        kptfile.contains("name: PackageVariant.app-dev.labels.0")
            && kptfile.contains("name: PackageVariant.app-dev.notes.1"),
        "{kptfile}"
    );

    // the variant goes: its draft is deleted, its published revisions
    // proposed for deletion and orphaned, then the finalizer is released
    let deleted = world
        .cluster
        .lock()
        .expect("lock")
        .delete_object("PackageVariant", "default", "app-dev")
        .expect("deleted")
        .expect("kept while its finalizer is there");
    relay.observe_variant(serde_json::from_value(deleted).expect("typed"));
    for _ in 0..80 {
        relay.drain().await;
        if variant_object(&world).is_none() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(variant_object(&world).is_none(), "the finalizer went");
    let mut left = downstreams(&world.cluster.lock().expect("lock"));
    left.sort();
    assert_eq!(
        left,
        [
            (
                "blueprints.app-dev.packagevariant-1".to_owned(),
                "DeletionProposed".to_owned(),
                false
            ),
            (
                "blueprints.app-dev.packagevariant-2".to_owned(),
                "DeletionProposed".to_owned(),
                false
            )
        ]
    );
    assert!(!git(&world.bare, &["branch", "--list"]).contains("drafts/app-dev/packagevariant-3"));
}
