//! The `porch` CLI as a user runs it: the binary spawned with its own
//! config and cache directories, its output read, and the repository
//! checked with the git CLI.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pretty_assertions::assert_eq;

/// One user's CLI state against repositories under a shared root.
struct User {
    root: PathBuf,
    config: PathBuf,
    cache: PathBuf,
    name: String,
    env: Vec<(String, String)>,
}

impl User {
    fn new(root: &Path, name: &str) -> Self {
        User {
            root: root.to_path_buf(),
            config: root.join(name).join("config"),
            cache: root.join(name).join("cache"),
            name: format!("{name}@example.com"),
            env: Vec::new(),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_porch"))
            .args(args)
            .current_dir(&self.root)
            .env("PORCH_CONFIG_DIR", &self.config)
            .env("PORCH_CACHE_DIR", &self.cache)
            .env("PORCH_USER", &self.name)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .expect("porch runs")
    }

    /// Runs with `input` on standard input and expects success; returns
    /// stdout.
    fn ok_with_stdin(&self, args: &[&str], input: &str) -> String {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_porch"))
            .args(args)
            .current_dir(&self.root)
            .env("PORCH_CONFIG_DIR", &self.config)
            .env("PORCH_CACHE_DIR", &self.cache)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("porch runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write stdin");
        let output = child.wait_with_output().expect("porch ends");
        assert!(
            output.status.success(),
            "porch {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs and expects success; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "porch {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs and expects failure; returns stderr.
    fn fails(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            !output.status.success(),
            "porch {args:?} succeeded: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// `<repository>.<package>.v1` initialised, proposed and approved.
    fn init_published(&self, repository: &str, package: &str) {
        let name = format!("{repository}.{package}.v1");
        self.ok(&[
            "rpkg",
            "init",
            package,
            "--repository",
            repository,
            "--workspace",
            "v1",
        ]);
        self.ok(&["rpkg", "propose", &name]);
        self.ok(&["rpkg", "approve", &name]);
    }

    /// `rpkg get -o json` as (name, lifecycle, revision, latest).
    fn revisions(&self) -> Vec<(String, String, i64, bool)> {
        let list: serde_json::Value =
            serde_json::from_str(&self.ok(&["rpkg", "get", "-o", "json"])).expect("json");
        assert_eq!(list["kind"], "List");
        list["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|pr| {
                (
                    pr["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                    pr["spec"]["lifecycle"].as_str().unwrap_or("").to_owned(),
                    pr["status"]["revision"].as_i64().unwrap_or(0),
                    pr["metadata"]["labels"]["porch.kpt.dev/latest-revision"] == "true",
                )
            })
            .collect()
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

/// The pulled package at `dir` with a set-labels pipeline in its Kptfile
/// (its rendered status dropped) and a ConfigMap.
fn add_pipeline_and_config_map(dir: &Path) {
    let kptfile = std::fs::read_to_string(dir.join("Kptfile")).expect("Kptfile");
    let kptfile = kptfile
        .split("status:")
        .next()
        .unwrap_or_default()
        .to_owned()
        + PIPELINE;
    std::fs::write(dir.join("Kptfile"), kptfile).expect("write");
    std::fs::write(
        dir.join("cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  a: \"1\"\n",
    )
    .expect("write");
}

/// `<repo>.app.v2` copied from v1 with `a: "2"` in its ConfigMap,
/// published, and `<repo>.shop.v1` (a clone of app v1) upgraded onto it as
/// `<repo>.shop.v2`.
fn copy_change_publish_and_upgrade(user: &User, repo: &str) {
    let (v1, v2) = (format!("{repo}.app.v1"), format!("{repo}.app.v2"));
    user.ok(&["rpkg", "copy", &v1, "--workspace", "v2"]);
    user.ok(&["rpkg", "pull", &v2, "app2"]);
    let cm_path = user.root.join("app2/cm.yaml");
    let cm = std::fs::read_to_string(&cm_path).expect("cm");
    std::fs::write(&cm_path, cm.replace("a: \"1\"", "a: \"2\"")).expect("write");
    user.ok(&["rpkg", "push", &v2, "app2"]);
    user.ok(&["rpkg", "propose", &v2]);
    user.ok(&["rpkg", "approve", &v2]);
    user.ok(&[
        "rpkg",
        "upgrade",
        &format!("{repo}.shop.v1"),
        "--workspace",
        "v2",
    ]);
}

fn refs(bare: &Path) -> String {
    git(bare, &["for-each-ref", "--format=%(refname) %(objectname)"])
}

const PIPELINE: &str =
    "pipeline:\n  mutators:\n    - image: set-labels:v0.2\n      configMap:\n        app: shop\n";

#[test]
fn a_package_from_init_to_deletion_as_a_user_runs_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    let alice = User::new(root, "alice");
    let bare = root.join("blueprints.git");

    let added = alice.ok(&["repo", "add", "blueprints", "./blueprints.git", "--create"]);
    assert_eq!(
        added.trim(),
        "repository blueprints registered (0 package revisions)"
    );
    alice.ok(&[
        "rpkg",
        "init",
        "app",
        "--repository",
        "blueprints",
        "--workspace",
        "v1",
        "--description",
        "the app",
    ]);
    assert!(git(&bare, &["branch", "--list"]).contains("drafts/app/v1"));

    // Pull, edit, push: the push renders with the new pipeline.
    alice.ok(&["rpkg", "pull", "blueprints.app.v1", "app"]);
    let kptfile = std::fs::read_to_string(root.join("app/Kptfile")).expect("Kptfile");
    assert!(kptfile.contains("description: the app"), "{kptfile}");
    add_pipeline_and_config_map(&root.join("app"));
    let pushed = alice.ok(&["rpkg", "push", "blueprints.app.v1", "app"]);
    assert_eq!(pushed.trim(), "blueprints.app.v1: pushed and rendered");
    let cm = git(&bare, &["show", "drafts/app/v1:app/cm.yaml"]);
    assert!(cm.contains("app: shop"), "rendered in git: {cm}");
    // the draft's own files again: nothing to commit
    let head = git(&bare, &["rev-parse", "drafts/app/v1"]);
    alice.ok(&["rpkg", "pull", "blueprints.app.v1", "again"]);
    assert_eq!(
        alice
            .ok(&["rpkg", "push", "blueprints.app.v1", "again"])
            .trim(),
        "blueprints.app.v1: unchanged"
    );
    assert_eq!(git(&bare, &["rev-parse", "drafts/app/v1"]), head);

    alice.ok(&["rpkg", "propose", "blueprints.app.v1"]);
    let approved = alice.ok(&["rpkg", "approve", "blueprints.app.v1"]);
    assert_eq!(approved.trim(), "blueprints.app.v1 published as revision 1");
    assert_eq!(git(&bare, &["tag", "--list"]).trim(), "app/v1");
    let approval = git(&bare, &["log", "-1", "--format=%ae", "app/v1"]);
    assert_eq!(approval.trim(), "alice@example.com");

    // A clone of the blueprint, published.
    alice.ok(&[
        "rpkg",
        "clone",
        "blueprints.app.v1",
        "shop",
        "--repository",
        "blueprints",
        "--workspace",
        "v1",
    ]);
    alice.ok(&["rpkg", "propose", "blueprints.shop.v1"]);
    alice.ok(&["rpkg", "approve", "blueprints.shop.v1"]);

    // A new blueprint revision by copy, then the clone upgraded onto it.
    copy_change_publish_and_upgrade(&alice, "blueprints");
    let upgraded = git(&bare, &["show", "drafts/shop/v2:shop/cm.yaml"]);
    assert!(upgraded.contains("a: \"2\""), "{upgraded}");
    let kptfile = git(&bare, &["show", "drafts/shop/v2:shop/Kptfile"]);
    assert!(kptfile.contains("ref: app/v2"), "{kptfile}");

    let listed = alice.revisions();
    let find = |name: &str| listed.iter().find(|r| r.0 == name).cloned().expect(name);
    assert_eq!(
        find("blueprints.app.v1"),
        ("blueprints.app.v1".into(), "Published".into(), 1, false)
    );
    assert_eq!(
        find("blueprints.app.v2"),
        ("blueprints.app.v2".into(), "Published".into(), 2, true)
    );
    assert_eq!(
        find("blueprints.shop.v2"),
        ("blueprints.shop.v2".into(), "Draft".into(), 0, false)
    );
    assert_eq!(find("blueprints.app.main").2, -1);
    let table = alice.ok(&["rpkg", "get", "--repository", "blueprints"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("blueprints.app.v2"), "{table}");
    let yaml = alice.ok(&["rpkg", "get", "blueprints.app.v2", "-o", "yaml"]);
    assert!(yaml.contains("kind: PackageRevision"), "{yaml}");
    assert!(yaml.contains("publishedBy: alice@example.com"), "{yaml}");

    // Reject a proposal, delete a draft, propose a deletion and delete.
    alice.ok(&["rpkg", "propose", "blueprints.shop.v2"]);
    alice.ok(&["rpkg", "reject", "blueprints.shop.v2"]);
    assert!(git(&bare, &["branch", "--list"]).contains("drafts/shop/v2"));
    alice.ok(&["rpkg", "del", "blueprints.shop.v2"]);
    assert!(!git(&bare, &["branch", "--list"]).contains("shop/v2"));
    alice.ok(&["rpkg", "propose-delete", "blueprints.app.v1"]);
    // shop was cloned from it: the deletion waits while shop refers to it
    let blocked = alice.fails(&["rpkg", "del", "blueprints.app.v1"]);
    assert!(
        blocked.contains("referenced as upstream by: blueprints.shop.main, blueprints.shop.v1"),
        "{blocked}"
    );
    assert!(git(&bare, &["tag", "--list"]).contains("app/v1"));
    alice.ok(&["rpkg", "propose-delete", "blueprints.app.v2"]);
    assert_eq!(
        alice.ok(&["rpkg", "del", "blueprints.app.v2"]).trim(),
        "blueprints.app.v2 deleted"
    );
    let tags = git(&bare, &["tag", "--list"]);
    assert!(!tags.contains("app/v2"), "{tags}");
    assert!(tags.contains("app/v1"), "{tags}");
    let listed = alice.revisions();
    assert!(
        !listed.iter().any(|r| r.0 == "blueprints.app.v2"),
        "{listed:?}"
    );
    // the blocked one is still there, marked for deletion
    assert!(
        listed.iter().any(|r| r.0 == "blueprints.app.v1"),
        "{listed:?}"
    );
    git(&bare, &["fsck", "--strict"]);
}

#[test]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    let alice = User::new(root, "alice");
    let bare = root.join("r.git");
    alice.ok(&["repo", "add", "r", "./r.git", "--create"]);
    alice.init_published("r", "app");
    alice.ok(&[
        "rpkg",
        "init",
        "draft",
        "--repository",
        "r",
        "--workspace",
        "v1",
    ]);
    let before = refs(&bare);

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "rpkg",
                "init",
                "../etc",
                "--repository",
                "r",
                "--workspace",
                "v1",
            ],
            "'.' and '..' segments are not allowed",
        ),
        (
            vec![
                "rpkg",
                "init",
                "/abs",
                "--repository",
                "r",
                "--workspace",
                "v1",
            ],
            "package name",
        ),
        (
            vec![
                "rpkg",
                "init",
                "x",
                "--repository",
                "r",
                "--workspace",
                "Bad_WS",
            ],
            "workspace",
        ),
        (
            vec![
                "rpkg",
                "init",
                "x",
                "--repository",
                "nope",
                "--workspace",
                "v1",
            ],
            "repository \"nope\" is not registered",
        ),
        (
            vec![
                "rpkg",
                "init",
                "app",
                "--repository",
                "r",
                "--workspace",
                "v1",
            ],
            "already exists",
        ),
        (
            vec![
                "rpkg",
                "init",
                "app/sub",
                "--repository",
                "r",
                "--workspace",
                "v9",
            ],
            "would nest",
        ),
        (
            vec!["rpkg", "del", "r.app.v1"],
            "must be proposed for deletion",
        ),
        (vec!["rpkg", "approve", "r.draft.v1"], "r.draft.v1"),
        (vec!["rpkg", "reject", "r.draft.v1"], "is not proposed"),
        (vec!["rpkg", "render", "r.app.v1"], "not a draft"),
        (
            vec!["rpkg", "push", "r.app.v1", "."],
            "only drafts can be changed",
        ),
        (
            vec!["rpkg", "push", "r.draft.v1", "/nonexistent"],
            "/nonexistent",
        ),
        (vec!["rpkg", "pull", "r.nothing.v1", "out"], "not found"),
        (
            vec![
                "rpkg",
                "clone",
                "r.draft.v1",
                "c",
                "--repository",
                "r",
                "--workspace",
                "v1",
            ],
            "must be published",
        ),
        (
            vec!["rpkg", "upgrade", "r.app.v1", "--workspace", "v2"],
            "no upstream",
        ),
        (
            vec!["repo", "add", "Bad_Name", "./x.git"],
            "repository name",
        ),
        (
            vec!["repo", "add", "other", "./missing.git"],
            "does not exist",
        ),
        (vec!["repo", "add", "r", "./r.git"], "already registered"),
        (
            vec!["repo", "add", "web", "ftp://example.com/x.git"],
            "is not valid",
        ),
    ];
    for (args, expected) in cases {
        let stderr = alice.fails(&args);
        assert!(
            stderr.contains(expected),
            "porch {args:?}: expected {expected:?} in {stderr}"
        );
        assert_eq!(refs(&bare), before, "porch {args:?} changed git");
    }
    // A push of a directory without a Kptfile is refused too.
    std::fs::create_dir_all(root.join("nokpt")).expect("dir");
    std::fs::write(root.join("nokpt/cm.yaml"), "a: 1\n").expect("write");
    let stderr = alice.fails(&["rpkg", "push", "r.draft.v1", "nokpt"]);
    assert!(stderr.contains("no Kptfile"), "{stderr}");
    assert_eq!(refs(&bare), before);
    // A damaged config is reported, not overwritten.
    std::fs::write(alice.config.join("config.json"), "{not json").expect("write");
    let stderr = alice.fails(&["rpkg", "get"]);
    assert!(stderr.contains("is not a valid config"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(alice.config.join("config.json")).expect("read"),
        "{not json"
    );
}

#[test]
fn two_users_see_each_other_and_git_changes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    let (alice, bob) = (User::new(root, "alice"), User::new(root, "bob"));
    let bare = root.join("shared.git");
    alice.ok(&["repo", "add", "shared", "./shared.git", "--create"]);
    bob.ok(&["repo", "add", "shared", "./shared.git"]);
    alice.ok(&[
        "rpkg",
        "init",
        "app",
        "--repository",
        "shared",
        "--workspace",
        "v1",
    ]);
    alice.ok(&["rpkg", "propose", "shared.app.v1"]);

    // Bob sees Alice's proposal and approves it.
    let seen = bob.revisions();
    assert!(
        seen.iter()
            .any(|r| r.0 == "shared.app.v1" && r.1 == "Proposed"),
        "{seen:?}"
    );
    bob.ok(&["rpkg", "approve", "shared.app.v1"]);
    assert_eq!(
        git(&bare, &["log", "-1", "--format=%ae", "app/v1"]).trim(),
        "bob@example.com"
    );
    let seen = alice.revisions();
    assert!(
        seen.iter()
            .any(|r| r == &("shared.app.v1".to_owned(), "Published".to_owned(), 1, true)),
        "{seen:?}"
    );

    // A draft deleted directly in git disappears from both.
    alice.ok(&[
        "rpkg",
        "init",
        "gone",
        "--repository",
        "shared",
        "--workspace",
        "v1",
    ]);
    assert!(bob.revisions().iter().any(|r| r.0 == "shared.gone.v1"));
    git(&bare, &["update-ref", "-d", "refs/heads/drafts/gone/v1"]);
    assert!(!alice.revisions().iter().any(|r| r.0 == "shared.gone.v1"));
    assert!(!bob.revisions().iter().any(|r| r.0 == "shared.gone.v1"));
}

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_whole_flow_over_smart_http_with_snapshots_in_s3() {
    use std::io::{Read, Write};
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/git/tests/servers/moto_serial.py");
    let _moto = Server(
        Command::new("python3")
            .arg(script)
            .arg("127.0.0.1")
            .arg(port.to_string())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 runs moto"),
    );
    let mut connected = None;
    for _ in 0..400 {
        if let Ok(stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            connected = Some(stream);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let mut stream = connected.expect("moto listens");
    // create the bucket (moto accepts an unsigned request)
    write!(
        stream,
        "PUT /snaps HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("put");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.contains(" 200 OK"), "{answer}");

    let mut alice = User::new(root, "alice");
    alice.env = vec![
        ("PORCH_S3_BUCKET".into(), "snaps".into()),
        (
            "PORCH_S3_ENDPOINT".into(),
            format!("http://127.0.0.1:{port}"),
        ),
        ("AWS_ACCESS_KEY_ID".into(), "testing".into()),
        ("AWS_SECRET_ACCESS_KEY".into(), "testing-c4n4ry".into()),
        ("AWS_REGION".into(), "us-east-1".into()),
    ];
    // The repository on a smart-HTTP git server that accepts pushes.
    let bare = root.join("served/r.git");
    std::fs::create_dir_all(root.join("served")).expect("dir");
    git(
        &root.join("served"),
        &["init", "--bare", "-q", "-b", "main", "r.git"],
    );
    git(&bare, &["config", "http.receivepack", "true"]);
    let git_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/git/tests/servers/git_http_server.py");
    let _git_server = Server(
        Command::new("python3")
            .arg(script)
            .arg(root.join("served"))
            .arg(git_port.to_string())
            .env("GIT_TEST_AUTH", "porch:pw-c4n4ry")
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 runs the git server"),
    );
    for _ in 0..400 {
        if std::net::TcpStream::connect(("127.0.0.1", git_port)).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let url = format!("http://127.0.0.1:{git_port}/r.git");
    // the server wants credentials: without them, a clear refusal
    let refused = alice.fails(&["repo", "add", "r", &url]);
    assert!(refused.contains("401"), "{refused}");
    assert!(
        alice
            .fails(&["repo", "add", "r", &url, "--secret", "nope"])
            .contains("Secret default/nope: not found")
    );
    let stored = alice.ok_with_stdin(
        &["secret", "set", "git-creds", "--username", "porch"],
        "pw-c4n4ry\n",
    );
    assert!(!stored.contains("pw-c4n4ry"), "{stored}");
    let password = alice.config.join("secrets/default/git-creds/password");
    assert_eq!(
        std::fs::read_to_string(&password).expect("password"),
        "pw-c4n4ry"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&password)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "only the owner reads it: {mode:o}");
    }
    alice.ok(&["repo", "add", "r", &url, "--secret", "git-creds"]);

    // init → push content → render → propose → approve → copy → push →
    // approve → clone → upgrade → propose-delete → delete
    alice.ok(&[
        "rpkg",
        "init",
        "app",
        "--repository",
        "r",
        "--workspace",
        "v1",
    ]);
    alice.ok(&["rpkg", "pull", "r.app.v1", "app"]);
    add_pipeline_and_config_map(&root.join("app"));
    alice.ok(&["rpkg", "push", "r.app.v1", "app"]);
    assert!(git(&bare, &["show", "drafts/app/v1:app/cm.yaml"]).contains("app: shop"));
    alice.ok(&["rpkg", "propose", "r.app.v1"]);
    alice.ok(&["rpkg", "approve", "r.app.v1"]);
    alice.ok(&[
        "rpkg",
        "clone",
        "r.app.v1",
        "shop",
        "--repository",
        "r",
        "--workspace",
        "v1",
    ]);
    alice.ok(&["rpkg", "propose", "r.shop.v1"]);
    alice.ok(&["rpkg", "approve", "r.shop.v1"]);
    copy_change_publish_and_upgrade(&alice, "r");
    assert!(git(&bare, &["show", "drafts/shop/v2:shop/cm.yaml"]).contains("a: \"2\""));
    alice.ok(&["rpkg", "propose", "r.shop.v2"]);
    alice.ok(&["rpkg", "approve", "r.shop.v2"]);
    alice.ok(&["rpkg", "propose-delete", "r.shop.v1"]);
    alice.ok(&["rpkg", "del", "r.shop.v1"]);
    let tags = git(&bare, &["tag", "--list"]);
    assert_eq!(
        tags.split_whitespace().collect::<Vec<_>>(),
        vec!["app/v1", "app/v2", "shop/v2"]
    );
    git(&bare, &["fsck", "--strict"]);
    // nothing went to the local snapshot directory
    assert!(!alice.cache.join("snapshots").exists());
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        stream,
        "GET /snaps?list-type=2 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .expect("get");
    let mut listing = String::new();
    let _ = stream.read_to_string(&mut listing);
    assert!(listing.contains("manifest.json"), "{listing}");
    assert!(listing.contains(".pack"), "{listing}");
}

#[test]
fn the_demo_runs_on_a_fresh_machine_and_refuses_to_overwrite() {
    let tmp = tempfile::tempdir().expect("tmp");
    let home = tmp.path().join("home");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_porch"))
            .args(args)
            .current_dir(tmp.path())
            .env_remove("PORCH_CONFIG_DIR")
            .env_remove("PORCH_CACHE_DIR")
            .env("HOME", &home)
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("XDG_CACHE_HOME")
            .output()
            .expect("porch runs")
    };
    let output = run(&["demo", "tour"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("blueprints.hello.v1 published as revision 1"),
        "{stdout}"
    );
    assert!(stdout.contains("namespace: shop"), "{stdout}");
    let bare = tmp.path().join("tour/blueprints.git");
    assert_eq!(git(&bare, &["tag", "--list"]).trim(), "hello/v1");
    // the state stayed in the demo directory
    assert!(!home.exists(), "nothing written to the home directory");

    let again = run(&["demo", "tour"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("is not empty"));
    assert_eq!(git(&bare, &["tag", "--list"]).trim(), "hello/v1");
}

#[test]
fn clones_cross_repositories_and_come_from_git_paths() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    let alice = User::new(root, "alice");
    alice.ok(&["repo", "add", "blueprints", "./blueprints.git", "--create"]);
    alice.ok(&[
        "repo",
        "add",
        "deploy",
        "./deploy.git",
        "--create",
        "--deployment",
    ]);
    alice.init_published("blueprints", "app");

    alice.ok(&[
        "rpkg",
        "clone",
        "blueprints.app.v1",
        "edge",
        "--repository",
        "deploy",
        "--workspace",
        "v1",
    ]);
    let deploy = root.join("deploy.git");
    let kptfile = git(&deploy, &["show", "drafts/edge/v1:edge/Kptfile"]);
    assert!(kptfile.contains("ref: app/v1"), "{kptfile}");
    let context = git(
        &deploy,
        &["show", "drafts/edge/v1:edge/package-context.yaml"],
    );
    assert!(context.contains("name: edge"), "{context}");

    alice.ok(&[
        "rpkg",
        "clone",
        "./blueprints.git",
        "core",
        "--repository",
        "deploy",
        "--workspace",
        "v1",
        "--ref",
        "app/v1",
        "--directory",
        "app",
    ]);
    let kptfile = git(&deploy, &["show", "drafts/core/v1:core/Kptfile"]);
    assert!(kptfile.contains("directory: app"), "{kptfile}");
    let stderr = alice.fails(&[
        "rpkg",
        "clone",
        "./blueprints.git",
        "none",
        "--repository",
        "deploy",
        "--workspace",
        "v1",
        "--ref",
        "nope",
        "--directory",
        "app",
    ]);
    assert!(stderr.contains("no branch, tag or commit"), "{stderr}");
    assert!(!git(&deploy, &["branch", "--list"]).contains("none"));
}
