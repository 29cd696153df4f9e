//! A PackageVariantSet through the relay on real git served over smart
//! HTTP: a blueprint published in one repository fans out to three downstream repositories chosen by a
//! repository selector, each with its own package context; a new blueprint
//! revision becomes an upgrade draft in all three; deleting the set
//! proposes the published downstreams for deletion.

use std::path::PathBuf;
use std::sync::Arc;

use porch_api::repository::Repository;
use porch_relay::invoker::InProcess;
use porch_relay::relay::{Relay, RelayConfig};
use serde_json::json;

use crate::support::{GitServer, World, git, publish, publish_copy};

const SITES: [&str; 3] = ["edge1", "edge2", "edge3"];

/// A bare repository beside the world's.
fn edge_repository(world: &World, name: &str) -> PathBuf {
    let root = world.bare.parent().expect("root");
    git(
        root,
        &["init", "--bare", "-q", "-b", "main", &format!("{name}.git")],
    );
    root.join(format!("{name}.git"))
}

/// A Repository at `url`, labelled `tier=edge`.
fn registered(name: &str, url: &str) -> Repository {
    serde_json::from_value(json!({
        "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "labels": {"tier": "edge"}},
        "spec": {"type": "git", "git": {"repo": url, "branch": "main"}}
    }))
    .expect("a Repository")
}

fn lifecycle(world: &World, name: &str) -> Option<String> {
    world
        .object(name)
        .and_then(|p| p.spec.lifecycle)
        .map(|l| l.as_str().to_owned())
}

#[tokio::test]
async fn a_set_fans_a_blueprint_out_upgrades_it_and_cleans_up() {
    let world = World::new();
    let relay = Relay::new(
        Arc::clone(&world.cluster),
        Arc::new(InProcess::new(Arc::clone(&world.runner))),
        RelayConfig::default(),
    );
    let bares: Vec<PathBuf> = SITES
        .iter()
        .map(|site| edge_repository(&world, site))
        .collect();
    // every repository, the blueprints' too, reached over smart HTTP
    let server = GitServer::start(world.bare.parent().expect("root"));
    let mut blueprints = world.repository.clone();
    if let Some(git) = blueprints.spec.git.as_mut() {
        git.repo = format!("{}/repo.git", server.base);
    }
    relay.observe_repository(blueprints);
    for site in SITES {
        relay.observe_repository(registered(site, &format!("{}/{site}.git", server.base)));
    }
    relay.observe_revision(world.create_draft("app"));
    relay.drain().await;
    publish(&world, &relay, "blueprints.app.v1").await;

    let set = world
        .cluster
        .lock()
        .expect("lock")
        .create_object(json!({
            "apiVersion": "config.porch.kpt.dev/v1alpha2", "kind": "PackageVariantSet",
            "metadata": {"name": "app-edge", "namespace": "default"},
            "spec": {
                "upstream": {"repo": "blueprints", "package": "app", "workspaceName": "v1"},
                "targets": [{
                    "repositorySelector": {"matchLabels": {"tier": "edge"}},
                    "template": {
                        "packageContext": {"dataExprs": [{"key": "site", "valueExpr": "repository.name"}]}
                    }
                }]
            }
        }))
        .expect("created");
    relay.observe_variant_set(serde_json::from_value(set).expect("typed"));
    relay.drain().await;

    // three variants, three drafts, each with its own package context
    for (site, bare) in SITES.iter().zip(&bares) {
        let name = format!("{site}.app.packagevariant-1");
        assert_eq!(lifecycle(&world, &name).as_deref(), Some("Draft"), "{name}");
        let context = git(
            bare,
            &[
                "show",
                "drafts/app/packagevariant-1:app/package-context.yaml",
            ],
        );
        assert!(context.contains(&format!("site: {site}")), "{context}");
        assert!(
            world
                .cluster
                .lock()
                .expect("lock")
                .object("PackageVariant", "default", &format!("app-edge-{site}-app"))
                .is_some()
        );
    }

    // the drafts are published; then the blueprint moves to v2 (the set
    // follows workspace v2)
    for site in SITES {
        publish(&world, &relay, &format!("{site}.app.packagevariant-1")).await;
    }
    publish_copy(&world, &relay, "v1", "v2").await;
    let edited = world
        .cluster
        .lock()
        .expect("lock")
        .update_object("PackageVariantSet", "default", "app-edge", |o| {
            o["spec"]["upstream"]["workspaceName"] = json!("v2");
        })
        .expect("updated")
        .expect("kept");
    relay.observe_variant_set(serde_json::from_value(edited).expect("typed"));
    relay.drain().await;
    for (site, bare) in SITES.iter().zip(&bares) {
        let upgrade = world
            .object(&format!("{site}.app.packagevariant-2"))
            .unwrap_or_else(|| panic!("an upgrade draft in {site}"));
        assert_eq!(
            upgrade.status.as_ref().map(|s| s.creation_source.as_str()),
            Some("upgrade")
        );
        // the upgrade keeps the site's context
        let context = git(
            bare,
            &[
                "show",
                "drafts/app/packagevariant-2:app/package-context.yaml",
            ],
        );
        assert!(context.contains(&format!("site: {site}")), "{context}");
    }

    // the set goes: its variants go, the published downstreams are
    // proposed for deletion, the upgrade drafts deleted
    let deleted = world
        .cluster
        .lock()
        .expect("lock")
        .delete_object("PackageVariantSet", "default", "app-edge")
        .expect("deleted")
        .expect("kept while its finalizer is there");
    relay.observe_variant_set(serde_json::from_value(deleted).expect("typed"));
    for _ in 0..80 {
        relay.drain().await;
        let gone = world
            .cluster
            .lock()
            .expect("lock")
            .object("PackageVariantSet", "default", "app-edge")
            .is_none();
        if gone {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let objects = world.cluster.lock().expect("lock");
    assert!(
        objects
            .object("PackageVariantSet", "default", "app-edge")
            .is_none(),
        "the set went"
    );
    assert!(
        !objects
            .others
            .keys()
            .any(|k| k.starts_with("PackageVariant/")),
        "its variants went: {:?}",
        objects.others.keys().collect::<Vec<_>>()
    );
    drop(objects);
    for (site, bare) in SITES.iter().zip(&bares) {
        assert_eq!(
            lifecycle(&world, &format!("{site}.app.packagevariant-1")).as_deref(),
            Some("DeletionProposed")
        );
        assert!(
            world
                .object(&format!("{site}.app.packagevariant-2"))
                .is_none()
        );
        assert!(!git(bare, &["branch", "--list"]).contains("packagevariant-2"));
    }
}
