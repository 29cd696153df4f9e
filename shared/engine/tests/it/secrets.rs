//! Credentials by reference: Secrets from a directory and from AWS Secrets
//! Manager (moto), used for registered repositories and for clones from a
//! git URL behind basic auth.

use std::path::Path;
use std::sync::Arc;

use porch_api::invocation::{Invocation, Operation};
use porch_engine::HandlerError;
use porch_engine::runner::Runner;
use porch_engine::secrets::{AwsSecrets, SecretDirectory, SecretResolver, remote_options};
use porch_git::remote::{Credentials, RemoteOptions};
use porch_git::store::LocalDirStore;
use porch_krm::builtins::BuiltinRuntime;
use porch_krm::runtime::Runtimes;

use crate::support::{git, invocation, moto, served_with_auth};

const AUTH: &str = "porch:s3cret-c4n4ry";

fn secret(root: &Path, namespace: &str, name: &str, keys: &[(&str, &str)]) {
    let dir = root.join(namespace).join(name);
    std::fs::create_dir_all(&dir).expect("secret dir");
    for (key, value) in keys {
        std::fs::write(dir.join(key), value).expect("secret key");
    }
}

fn runner(root: &Path, secrets: Arc<dyn SecretResolver>) -> Runner<LocalDirStore> {
    let functions = Arc::new(Runtimes::new().with(Arc::new(BuiltinRuntime::catalog())));
    Runner::new(root.join("cache"), functions)
        .with_store(LocalDirStore::new(root.join("store")))
        .with_secrets(secrets)
}

/// A sync Invocation of a Repository at `url` naming Secret `secret`.
fn sync_of(url: &str, secret: Option<&str>) -> Invocation {
    let mut inv = invocation("sync", serde_json::json!({}));
    inv.package_revision = None;
    let git = inv.repository.spec.git.as_mut().expect("git spec");
    git.repo = url.to_owned();
    git.secret_ref = secret.map(|name| porch_api::common::SecretRef { name: name.into() });
    inv
}

#[tokio::test]
async fn a_secret_directory_gives_basic_and_bearer_credentials() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path();
    secret(
        root,
        "default",
        "basic",
        &[("username", "porch"), ("password", "pw-c4n4ry\n")],
    );
    secret(
        root,
        "default",
        "token",
        &[("bearerToken", "tkn-c4n4ry"), ("..data", "x")],
    );
    secret(root, "default", "empty", &[("other", "v")]);
    secret(root, "default", "default-ca-bundle", &[("ca.crt", "PEM")]);
    let secrets = SecretDirectory::new(root);
    let base = RemoteOptions::default();
    let credentials = |o: RemoteOptions| o.credentials.and_then(|c| c.resolve("http://x"));

    let basic = remote_options(&secrets, &base, "default", Some("basic"))
        .await
        .expect("basic");
    assert_eq!(basic.ca_bundle.as_deref(), Some(b"PEM".as_slice()));
    assert_eq!(
        credentials(basic),
        Some(Credentials::Basic {
            username: "porch".into(),
            password: "pw-c4n4ry".into()
        })
    );
    let token = remote_options(&secrets, &base, "default", Some("token"))
        .await
        .expect("bearer");
    assert_eq!(
        credentials(token),
        Some(Credentials::Bearer("tkn-c4n4ry".into()))
    );
    // no Secret named: the options as they were
    let none = remote_options(&secrets, &base, "default", None)
        .await
        .expect("none");
    assert!(none.credentials.is_none() && none.ca_bundle.is_none());

    for (namespace, name, needle) in [
        ("default", "missing", "Secret default/missing: not found"),
        (
            "default",
            "empty",
            "neither username and password nor bearerToken",
        ),
        ("default", "../default/basic", "is not a valid Secret name"),
        ("default", "a/b", "is not a valid Secret name"),
        ("..", "basic", "namespace"),
        ("default", "UPPER", "is not a valid Secret name"),
    ] {
        let err = remote_options(&secrets, &base, namespace, Some(name))
            .await
            .expect_err(name);
        assert!(err.contains(needle), "{name}: {err}");
    }
    // a value too large to be a credential
    secret(
        root,
        "default",
        "huge",
        &[("password", &"x".repeat(2 << 20)), ("username", "u")],
    );
    let err = remote_options(&secrets, &base, "default", Some("huge"))
        .await
        .expect_err("huge");
    assert!(err.contains("larger than"), "{err}");
}

#[tokio::test]
async fn aws_secrets_manager_resolves_secrets_by_namespace_and_name() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_server, port) = moto(tmp.path());
    let config = aws_sdk_secretsmanager::Config::builder()
        .behavior_version(aws_sdk_secretsmanager::config::BehaviorVersion::latest())
        .region(aws_sdk_secretsmanager::config::Region::new("us-east-1"))
        .endpoint_url(format!("http://127.0.0.1:{port}"))
        .credentials_provider(aws_sdk_secretsmanager::config::Credentials::new(
            "testing",
            "testing-c4n4ry",
            None,
            None,
            "tests",
        ))
        .build();
    let client = aws_sdk_secretsmanager::Client::from_conf(config);
    for (id, value) in [
        (
            "porch/team-a/git",
            r#"{"username": "porch", "password": "pw-c4n4ry", "n": 1}"#,
        ),
        ("porch/team-a/not-json", "username=porch"),
    ] {
        client
            .create_secret()
            .name(id)
            .secret_string(value)
            .send()
            .await
            .expect("create secret");
    }
    let secrets = AwsSecrets::new(client, "porch/");
    let found = secrets
        .resolve("team-a", "git")
        .await
        .expect("resolved")
        .expect("exists");
    assert_eq!(
        found.credentials().expect("credentials"),
        Credentials::Basic {
            username: "porch".into(),
            password: "pw-c4n4ry".into()
        }
    );
    assert!(!format!("{found:?}").contains("pw-c4n4ry"), "{found:?}");
    assert_eq!(secrets.resolve("team-b", "git").await, Ok(None));
    let err = secrets
        .resolve("team-a", "not-json")
        .await
        .expect_err("not an object");
    assert!(err.contains("JSON object"), "{err}");
    assert!(!err.contains("username=porch"), "{err}");
}

#[tokio::test]
async fn registered_repositories_and_git_url_clones_use_the_named_secret() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_server, url) = served_with_auth(tmp.path(), Some(AUTH));
    // a package on main, written straight into the bare repository
    let work = tmp.path().join("work");
    std::fs::create_dir_all(work.join("app")).expect("work dir");
    std::fs::write(
        work.join("app/Kptfile"),
        "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: app\n",
    )
    .expect("Kptfile");
    git(&work, &["init", "-q", "-b", "main"]);
    git(&work, &["add", "."]);
    git(
        &work,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@x",
            "commit",
            "-q",
            "-m",
            "app",
        ],
    );
    let bare = tmp.path().join("repo.git");
    git(
        &work,
        &["push", "-q", bare.to_str().expect("utf-8"), "main"],
    );

    let secrets_dir = tmp.path().join("secrets");
    let (user, password) = AUTH.split_once(':').expect("pair");
    secret(
        &secrets_dir,
        "default",
        "git",
        &[("username", user), ("password", password)],
    );
    secret(
        &secrets_dir,
        "default",
        "wrong",
        &[("username", user), ("password", "nope")],
    );
    // the test's git server listens on loopback: allowed for clones here
    let runner = runner(tmp.path(), Arc::new(SecretDirectory::new(&secrets_dir)))
        .with_clone_egress(
            porch_git::egress::EgressPolicy::with_allowlist("127.0.0.1").expect("allow"),
        );

    // registered: sync discovers the package with the Secret's credentials
    let outcome = runner
        .handle(&sync_of(&url, Some("git")))
        .await
        .expect("sync with credentials");
    assert!(
        serde_json::to_string(&outcome)
            .expect("json")
            .contains("\"packageName\":\"app\""),
        "{outcome:?}"
    );
    let err = runner
        .handle(&sync_of(&url, Some("absent")))
        .await
        .expect_err("no such secret");
    assert!(matches!(err, HandlerError::Credentials(_)), "{err:?}");
    assert!(
        err.to_string().contains("default/absent: not found"),
        "{err}"
    );
    let err = runner
        .handle(&sync_of(&url, Some("wrong")))
        .await
        .expect_err("rejected credentials");
    assert!(err.to_string().contains("401"), "{err}");
    assert!(!err.to_string().contains("nope") && !err.to_string().contains(password));

    // a clone from the git URL names the Secret in its source
    let deploy = crate::support::empty_repo().expect("deploy repo");
    let clone = |name: &str, secret: &str| {
        let mut inv = invocation("source", serde_json::json!({}));
        inv.repository.spec.git.as_mut().expect("git").repo = deploy.remote.display().to_string();
        let pr = inv.package_revision.as_mut().expect("revision");
        pr.metadata.name = Some(format!("blueprints.{name}.v1"));
        pr.spec.package_name = name.into();
        pr.status = None;
        pr.spec.source = serde_json::from_value(serde_json::json!({"cloneFrom": {"git": {
            "repo": url, "ref": "main", "directory": "app", "secretRef": {"name": secret}}}}))
        .expect("a clone source");
        inv
    };
    assert_eq!(clone("x", "git").operation, Operation::Source);
    runner.handle(&clone("shop", "git")).await.expect("clone");
    let kptfile = git(&deploy.remote, &["show", "drafts/shop/v1:shop/Kptfile"]);
    assert!(kptfile.contains(&format!("repo: {url}")), "{kptfile}");
    // a missing Secret is a refusal in the status, nothing written
    let refused = runner
        .handle(&clone("lost", "absent"))
        .await
        .expect("refused");
    let text = serde_json::to_string(&refused).expect("json");
    assert!(text.contains("Secret default/absent: not found"), "{text}");
    assert!(
        !git(&deploy.remote, &["for-each-ref"]).contains("drafts/lost/"),
        "nothing written"
    );
}
