//! The handlers end to end over smart HTTP: a real git server that accepts
//! pushes, each Outcome applied to the object as the relay would, and the
//! repository checked with the git CLI.

use std::path::Path;
use std::process::Command;

use porch_api::common::Lifecycle;
use porch_api::invocation::{Invocation, Operation, Outcome, Subresource};
use porch_api::v1alpha2::PackageRevision;
use porch_engine::{delete::delete, lifecycle::lifecycle, render, source::source, sync::sync};
use porch_git::mirror::{Mirror, RetryPolicy};
use porch_git::remote::{RemoteOptions, SmartRemote};
use porch_krm::builtins::BuiltinRuntime;
use porch_krm::runtime::Runtimes;
use pretty_assertions::assert_eq;

use crate::support::{invocation, now};

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(["-c", "safe.directory=*"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A bare repository served over smart HTTP with pushes allowed.
fn served(root: &Path) -> (Server, String) {
    let bare = root.join("repo.git");
    git(root, &["init", "--bare", "-q", "-b", "main", "repo.git"]);
    git(&bare, &["config", "http.receivepack", "true"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../git/tests/servers/git_http_server.py");
    let child = Command::new("python3")
        .arg(script)
        .arg(root)
        .arg(port.to_string())
        .spawn()
        .expect("python3 runs");
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    (Server(child), format!("http://127.0.0.1:{port}/repo.git"))
}

/// What the relay does with an Outcome: the status patch becomes the
/// object's status, label patches its labels, and the resourceVersion moves.
fn applied(mut pr: PackageRevision, outcome: &Outcome) -> PackageRevision {
    for patch in &outcome.patches {
        if patch.target.name != pr.metadata.name.clone().unwrap_or_default() {
            continue;
        }
        let json = serde_json::to_value(&patch.patch).expect("patch");
        if patch.subresource == Subresource::Status {
            pr.status = serde_json::from_value(json[1]["value"].clone()).expect("status");
        } else if let Some(label) = json[1]["value"].as_str() {
            pr.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(porch_api::LATEST_REVISION_LABEL.into(), label.into());
        }
    }
    let version: u64 = pr
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or("0")
        .parse()
        .unwrap_or(0);
    pr.metadata.resource_version = Some((version + 1).to_string());
    pr
}

fn with(pr: &PackageRevision, operation: Operation, url: &str) -> Invocation {
    let mut inv = invocation(operation.as_str(), serde_json::json!({}));
    inv.package_revision = Some(pr.clone());
    if let Some(git) = inv.repository.spec.git.as_mut() {
        git.repo = url.to_owned();
    }
    inv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_render_propose_publish_sync_and_delete_over_http() -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    let (_server, url) = served(root.path());
    let bare = root.path().join("repo.git");
    let mirror = Mirror::new(
        root.path().join("mirror"),
        SmartRemote::new(&url, RemoteOptions::default())?,
        RetryPolicy::default(),
    )?;

    // The object as the user creates it: a Draft with an init source.
    let mut pr = invocation("source", serde_json::json!({}))
        .package_revision
        .expect("revision");
    pr.status = None;
    pr.spec.source = Some(serde_json::from_value(
        serde_json::json!({"init": {"description": "e2e"}}),
    )?);

    let outcome = source(&with(&pr, Operation::Source, &url), &mirror, &now()).await?;
    pr = applied(pr, &outcome);
    assert_eq!(
        pr.status.as_ref().map(|s| s.creation_source.as_str()),
        Some("init")
    );
    assert!(git(&bare, &["branch", "--list"]).contains("drafts/app/v1"));

    let context = render::RenderContext {
        functions: std::sync::Arc::new(
            Runtimes::new().with(std::sync::Arc::new(BuiltinRuntime::catalog())),
        ),
        options: Default::default(),
        now: now(),
    };
    let outcome = render::render(&with(&pr, Operation::Render, &url), &mirror, &context).await?;
    pr = applied(pr, &outcome);
    let kptfile = git(&bare, &["show", "drafts/app/v1:app/Kptfile"]);
    assert!(kptfile.contains("reason: RenderSuccess"), "{kptfile}");

    for desired in [Lifecycle::Proposed, Lifecycle::Published] {
        pr.spec.lifecycle = Some(desired);
        pr.metadata.generation = pr.metadata.generation.map(|g| g + 1);
        if desired == Lifecycle::Published {
            pr.metadata.annotations = Some(
                [(
                    porch_api::APPROVED_BY_ANNOTATION.to_owned(),
                    "bob@example.com".to_owned(),
                )]
                .into(),
            );
        }
        let outcome = lifecycle(&with(&pr, Operation::Lifecycle, &url), &mirror, &now()).await?;
        pr = applied(pr, &outcome);
    }
    assert_eq!(pr.status.as_ref().and_then(|s| s.revision), Some(1));
    assert_eq!(git(&bare, &["tag", "--list"]).trim(), "app/v1");
    let approval = git(&bare, &["log", "-1", "--format=%an <%ae>%n%s", "app/v1"]);
    assert!(approval.contains("bob@example.com"), "{approval}");
    assert!(
        approval.contains("Approving package revision app/1"),
        "{approval}"
    );
    git(&bare, &["fsck", "--strict"]);

    // Repository sync sees the published revision and the placeholder.
    let mut sync_inv = with(&pr, Operation::Sync, &url);
    sync_inv.package_revision = None;
    let synced = sync(&sync_inv, &mirror).await?;
    let mut names: Vec<String> = synced
        .apply
        .iter()
        .filter(|a| {
            a.field_manager == porch_engine::sync::OWNER_MANAGER
                && a.subresource == Subresource::Main
        })
        .filter_map(|a| a.object["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    assert_eq!(names, vec!["blueprints.app.main", "blueprints.app.v1"]);

    // Propose the deletion, then delete.
    pr.spec.lifecycle = Some(Lifecycle::DeletionProposed);
    pr.metadata.generation = pr.metadata.generation.map(|g| g + 1);
    let outcome = lifecycle(&with(&pr, Operation::Lifecycle, &url), &mirror, &now()).await?;
    pr = applied(pr, &outcome);
    assert!(git(&bare, &["branch", "--list"]).contains("deletionProposed/app/v1"));
    pr.metadata.deletion_timestamp = Some(now());
    let outcome = delete(&with(&pr, Operation::Delete, &url), &mirror, &now()).await?;
    assert!(
        outcome
            .patches
            .iter()
            .any(|p| p.subresource == Subresource::Main)
    );
    assert_eq!(git(&bare, &["tag", "--list"]).trim(), "");
    assert!(!git(&bare, &["branch", "--list"]).contains("deletionProposed"));
    git(&bare, &["fsck", "--strict"]);
    Ok(())
}
