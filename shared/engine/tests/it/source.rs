//! The source handler: init, copy, clone and upgrade as new drafts, and the
//! checks the reference skips.

use porch_api::invocation::{Invocation, Outcome};
use porch_api::v1alpha2::PackageSource;
use porch_engine::source::source;
use porch_git::repo::GitRepo;
use pretty_assertions::assert_eq;

use crate::support::{Files, Repo, empty_repo, invocation, now, publish, published_revision};

/// A source Invocation for `app`/`v2` with `spec.source` set.
fn with_source(package: &str, workspace: &str, source_spec: serde_json::Value) -> Invocation {
    let mut inv = invocation("source", serde_json::json!({}));
    if let Some(pr) = inv.package_revision.as_mut() {
        pr.metadata.name = Some(format!("blueprints.{package}.{workspace}"));
        pr.spec.package_name = package.into();
        pr.spec.workspace_name = workspace.into();
        pr.spec.source =
            Some(serde_json::from_value::<PackageSource>(source_spec).expect("a valid source"));
        pr.status = None;
    }
    inv
}

fn status(outcome: &Outcome) -> serde_json::Value {
    serde_json::to_value(&outcome.patches[0].patch).expect("patch")[1]["value"].clone()
}

fn draft(repo: &Repo, package: &str, workspace: &str) -> anyhow::Result<Option<Files>> {
    let git = GitRepo::open(&repo.remote)?;
    match git.ref_id(&format!("refs/heads/drafts/{package}/{workspace}"))? {
        Some(head) => Ok(Some(git.read_files(head, package)?)),
        None => Ok(None),
    }
}

fn text(files: &Files, name: &str) -> String {
    String::from_utf8_lossy(&files[name]).into_owned()
}

fn base(version: &str) -> Files {
    [
        ("Kptfile", "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: base\n".to_owned()),
        ("cm.yaml", format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  version: \"{version}\"\n  local: \"no\"\n")),
    ]
    .into_iter()
    .map(|(p, c)| (p.to_owned(), c.into_bytes()))
    .collect()
}

#[tokio::test]
async fn init_creates_the_package_kpt_would() -> anyhow::Result<()> {
    let repo = empty_repo()?;
    let inv = with_source(
        "app",
        "v1",
        serde_json::json!({"init": {"description": "my app", "keywords": ["a", "b"]}}),
    );
    let outcome = source(&inv, &repo.mirror, &now()).await?;
    let files = draft(&repo, "app", "v1")?.ok_or_else(|| anyhow::anyhow!("no draft"))?;
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        vec!["Kptfile", "README.md", "package-context.yaml"]
    );
    assert_eq!(
        text(&files, "Kptfile"),
        "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: app\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\ninfo:\n  description: my app\n  keywords:\n    - a\n    - b\n"
    );
    assert!(text(&files, "package-context.yaml").contains("name: kptfile.kpt.dev"));
    let s = status(&outcome);
    assert_eq!(s["creationSource"], "init");
    // Delivered again: the same draft, no second commit.
    let head = GitRepo::open(&repo.remote)?.ref_id("refs/heads/drafts/app/v1")?;
    let again = source(&inv, &repo.mirror, &now()).await?;
    assert_eq!(
        GitRepo::open(&repo.remote)?.ref_id("refs/heads/drafts/app/v1")?,
        head
    );
    assert_eq!(status(&again)["creationSource"], "init");
    Ok(())
}

#[tokio::test]
async fn copy_clone_and_upgrade_build_on_published_revisions() -> anyhow::Result<()> {
    let repo = empty_repo()?;
    assert_eq!(publish(&repo.mirror, "base", "v1", base("1")).await?, 1);
    assert_eq!(publish(&repo.mirror, "base", "v2", base("2")).await?, 2);

    // clone base v1 as app
    let mut clone = with_source(
        "app",
        "v1",
        serde_json::json!({"cloneFrom": {"upstreamRef": {"name": "blueprints.base.v1"}}}),
    );
    clone.upstream = Some(published_revision("blueprints.base.v1", "base", "v1", 1));
    let outcome = source(&clone, &repo.mirror, &now()).await?;
    assert_eq!(status(&outcome)["creationSource"], "clone");
    let cloned = draft(&repo, "app", "v1")?.ok_or_else(|| anyhow::anyhow!("no clone"))?;
    let kptfile = text(&cloned, "Kptfile");
    assert!(
        kptfile.contains("metadata: # kpt-merge: /app\n  name: app\n"),
        "{kptfile}"
    );
    assert!(kptfile.contains("upstream:\n  type: git\n  git:\n    repo: file:///unused.git\n    directory: base\n    ref: base/v1\n"), "{kptfile}");
    assert!(kptfile.contains("upstreamLock:"), "{kptfile}");
    assert!(
        text(&cloned, "cm.yaml")
            .contains("internal.kpt.dev/upstream-identifier: '|ConfigMap|default|cm'")
    );

    // publish the clone with a local change, then upgrade it onto base v2
    let mut local = cloned.clone();
    local.insert(
        "cm.yaml".into(),
        text(&cloned, "cm.yaml")
            .replace("local: \"no\"", "local: \"yes\"")
            .into_bytes(),
    );
    assert_eq!(
        publish(&repo.mirror, "app", "v1-published", local).await?,
        1
    );
    let mut upgrade = with_source(
        "app",
        "v2",
        serde_json::json!({"upgrade": {"oldUpstream": {"name": "blueprints.base.v1"}, "newUpstream": {"name": "blueprints.base.v2"}, "currentPackage": {"name": "blueprints.app.p1"}}}),
    );
    upgrade.related = vec![
        published_revision("blueprints.base.v1", "base", "v1", 1),
        published_revision("blueprints.base.v2", "base", "v2", 2),
        published_revision("blueprints.app.p1", "app", "v1-published", 1),
    ];
    let outcome = source(&upgrade, &repo.mirror, &now()).await?;
    assert_eq!(
        status(&outcome)["creationSource"],
        "upgrade",
        "{}",
        status(&outcome)
    );
    let upgraded = draft(&repo, "app", "v2")?.ok_or_else(|| anyhow::anyhow!("no upgrade"))?;
    let cm = text(&upgraded, "cm.yaml");
    assert!(cm.contains("version: \"2\""), "{cm}");
    assert!(cm.contains("local: \"yes\""), "{cm}");
    assert!(text(&upgraded, "Kptfile").contains("ref: base/v2"));

    // copy app revision 1 as a new workspace
    let mut copy = with_source(
        "app",
        "v3",
        serde_json::json!({"copyFrom": {"name": "blueprints.app.p1"}}),
    );
    copy.related = vec![published_revision(
        "blueprints.app.p1",
        "app",
        "v1-published",
        1,
    )];
    let outcome = source(&copy, &repo.mirror, &now()).await?;
    assert_eq!(status(&outcome)["creationSource"], "copy");
    assert!(
        text(&draft(&repo, "app", "v3")?.unwrap_or_default(), "cm.yaml").contains("local: \"yes\"")
    );
    Ok(())
}

#[tokio::test]
async fn refused_sources_are_reported_and_write_nothing() -> anyhow::Result<()> {
    let repo = empty_repo()?;
    publish(&repo.mirror, "base", "v1", base("1")).await?;
    let refs_before = GitRepo::open(&repo.remote)?.refs()?;
    let cases = [
        // a clone of a package that exists already
        (
            {
                let mut inv = with_source(
                    "base",
                    "v9",
                    serde_json::json!({"cloneFrom": {"upstreamRef": {"name": "blueprints.base.v1"}}}),
                );
                inv.upstream = Some(published_revision("blueprints.base.v1", "base", "v1", 1));
                inv.related = vec![published_revision("blueprints.base.v1", "base", "v1", 1)];
                inv
            },
            "already exists",
        ),
        // a workspace taken
        (
            {
                let mut inv = with_source(
                    "base",
                    "v1",
                    serde_json::json!({"copyFrom": {"name": "blueprints.base.v1"}}),
                );
                inv.related = vec![published_revision("blueprints.base.old", "base", "v1", 1)];
                inv
            },
            "workspace \"v1\" already exists",
        ),
        // a nested package path
        (
            {
                let mut inv = with_source("base/inner", "v1", serde_json::json!({"init": {}}));
                inv.related = vec![published_revision("blueprints.base.v1", "base", "v1", 1)];
                inv
            },
            "would nest",
        ),
        // copy from an unpublished revision
        (
            {
                let mut inv = with_source(
                    "base",
                    "v5",
                    serde_json::json!({"copyFrom": {"name": "blueprints.base.d"}}),
                );
                let mut draft = published_revision("blueprints.base.d", "base", "d", 0);
                draft.spec.lifecycle = Some(porch_api::common::Lifecycle::Draft);
                inv.related = vec![draft];
                inv
            },
            "must be published",
        ),
        // copy from another package
        (
            {
                let mut inv = with_source(
                    "other",
                    "v1",
                    serde_json::json!({"copyFrom": {"name": "blueprints.base.v1"}}),
                );
                inv.related = vec![published_revision("blueprints.base.v1", "base", "v1", 1)];
                inv
            },
            "must be same package",
        ),
    ];
    for (inv, expected) in cases {
        let outcome = source(&inv, &repo.mirror, &now()).await?;
        let s = status(&outcome);
        let ready = s["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(ready["reason"], "Failed", "{expected}: {s}");
        assert!(
            ready["message"].as_str().unwrap_or("").contains(expected),
            "{expected}: {s}"
        );
        assert!(s.get("creationSource").is_none(), "{s}");
    }
    assert_eq!(GitRepo::open(&repo.remote)?.refs()?, refs_before);
    Ok(())
}

#[tokio::test]
async fn a_clone_into_a_deployment_repository_gets_its_package_context() -> anyhow::Result<()> {
    let repo = empty_repo()?;
    let mut upstream = base("1");
    upstream.insert(
        "package-context.yaml".into(),
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kptfile.kpt.dev\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\ndata:\n  name: example\n".to_vec(),
    );
    publish(&repo.mirror, "base", "v1", upstream).await?;
    let mut clone = with_source(
        "edge/site1",
        "v1",
        serde_json::json!({"cloneFrom": {"upstreamRef": {"name": "blueprints.base.v1"}}}),
    );
    clone.upstream = Some(published_revision("blueprints.base.v1", "base", "v1", 1));
    clone.repository.spec.deployment = true;
    source(&clone, &repo.mirror, &now()).await?;
    let files = draft(&repo, "edge/site1", "v1")?.ok_or_else(|| anyhow::anyhow!("no clone"))?;
    let context = text(&files, "package-context.yaml");
    assert!(
        context.contains("data:\n  name: site1\n  package-path: edge/site1\n"),
        "{context}"
    );
    assert!(!context.contains("example"), "{context}");
    Ok(())
}
