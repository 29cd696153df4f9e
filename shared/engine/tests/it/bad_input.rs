//! Malformed and hostile Invocations: every handler answers with a
//! non-retryable error and writes nothing to git.

use porch_api::invocation::{Invocation, Operation};
use porch_engine::HandlerError;
use porch_git::repo::GitRepo;

use crate::support::{LABELS, invocation, now, package, repo_with_draft};

async fn run(
    inv: &Invocation,
    mirror: &porch_git::mirror::Mirror<porch_git::remote::LocalRemote>,
) -> Result<porch_api::invocation::Outcome, HandlerError> {
    let context = porch_engine::render::RenderContext {
        functions: std::sync::Arc::new(porch_krm::runtime::Runtimes::new()),
        options: Default::default(),
        now: now(),
    };
    match inv.operation {
        Operation::Adopt => porch_engine::adopt::adopt(inv),
        Operation::Source => porch_engine::source::source(inv, mirror, &now()).await,
        Operation::Render => porch_engine::render::render(inv, mirror, &context).await,
        Operation::Lifecycle => porch_engine::lifecycle::lifecycle(inv, mirror, &now()).await,
        Operation::Delete => porch_engine::delete::delete(inv, mirror, &now()).await,
        Operation::Sync => porch_engine::sync::sync(inv, mirror).await,
        Operation::Variant => {
            porch_engine::variant::reconcile(inv, &now()).map(|p| p.finish(false, None))
        }
        Operation::VariantSet => porch_engine::variant_set::reconcile(inv, &now()),
    }
}

#[tokio::test]
async fn hostile_and_incomplete_invocations_are_refused_without_writes() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    let before = GitRepo::open(&repo.remote)?.refs()?;
    let operations = [
        Operation::Adopt,
        Operation::Source,
        Operation::Render,
        Operation::Lifecycle,
        Operation::Delete,
    ];
    let mut cases: Vec<(String, Invocation)> = Vec::new();
    for op in operations {
        let mut missing = invocation(op.as_str(), serde_json::json!({}));
        missing.package_revision = None;
        cases.push((format!("{} without a revision", op.as_str()), missing));
        for (field, value) in [
            ("packageName", "../../etc"),
            ("packageName", "/abs"),
            ("packageName", "a/.git/b"),
            ("workspaceName", "Bad Workspace"),
            ("workspaceName", "../x"),
        ] {
            let mut hostile = invocation(op.as_str(), serde_json::json!({}));
            if let Some(pr) = hostile.package_revision.as_mut() {
                match field {
                    "packageName" => pr.spec.package_name = value.into(),
                    _ => pr.spec.workspace_name = value.into(),
                }
                // Make every operation due, so the checks are what stops it.
                pr.metadata.deletion_timestamp = (op == Operation::Delete).then(now);
                pr.spec.source = Some(serde_json::from_value(serde_json::json!({"init": {}}))?);
                if op == Operation::Source {
                    pr.status = None;
                }
            }
            cases.push((format!("{} with {field} {value:?}", op.as_str()), hostile));
        }
        let mut no_git = invocation(op.as_str(), serde_json::json!({}));
        no_git.repository.spec.git = None;
        cases.push((
            format!("{} on a repository without git", op.as_str()),
            no_git,
        ));
    }
    let mut no_git = invocation("sync", serde_json::json!({}));
    no_git.repository.spec.git = None;
    cases.push(("sync without git".into(), no_git));

    for (what, inv) in cases {
        match run(&inv, &repo.mirror).await {
            Err(e) => assert!(!e.is_retryable(), "{what}: {e}"),
            Ok(outcome) => panic!("{what}: accepted: {outcome:?}"),
        }
    }
    assert_eq!(GitRepo::open(&repo.remote)?.refs()?, before);
    Ok(())
}

/// A push over the package limits (one file too large, too many files, too
/// many bytes in all) is refused, not retried, and writes nothing.
#[tokio::test]
async fn pushes_over_the_package_limits_are_refused_without_writes() -> anyhow::Result<()> {
    use porch_api::limits::{MAX_FILE_BYTES, MAX_PACKAGE_FILES};
    let repo = repo_with_draft(package(LABELS)).await?;
    let before = GitRepo::open(&repo.remote)?.refs()?;
    let inv = invocation("render", serde_json::json!({}));
    let pr = inv.package_revision.clone().expect("revision");
    let mut repository = inv.repository.clone();
    repository.spec.git.as_mut().expect("git").repo = format!("file://{}", repo.remote.display());
    let tmp = tempfile::tempdir()?;
    let runner = porch_engine::runner::Runner::<porch_git::store::LocalDirStore>::new(
        tmp.path(),
        std::sync::Arc::new(porch_krm::runtime::Runtimes::new()),
    );
    let mut one_large = package(LABELS);
    one_large.insert("big.yaml".into(), vec![b'#'; MAX_FILE_BYTES + 1]);
    let mut many = package(LABELS);
    for i in 0..MAX_PACKAGE_FILES {
        many.insert(format!("f/{i}.yaml"), b"# x\n".to_vec());
    }
    let mut heavy = package(LABELS);
    for i in 0..8 {
        heavy.insert(format!("h{i}.yaml"), vec![b'#'; MAX_FILE_BYTES]);
    }
    for (name, files, expected) in [
        ("one large file", one_large, "big.yaml has 8388609 bytes"),
        ("too many files", many, "more than 10000 files"),
        ("too many bytes", heavy, "more than 67108864 bytes in all"),
    ] {
        let error = runner
            .write_draft(&repository, &pr, files, "alice@example.com")
            .await
            .expect_err(name);
        assert!(!error.is_retryable(), "{name}: {error}");
        assert!(error.to_string().contains(expected), "{name}: {error}");
    }
    assert_eq!(GitRepo::open(&repo.remote)?.refs()?, before);
    Ok(())
}
