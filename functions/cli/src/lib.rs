//! The `porch` CLI: the PackageRevision control plane with no cluster. The
//! objects a cluster would hold live in a local file; every command runs
//! the same handlers the Lambda functions run, in-process, against the git
//! repositories registered with `repo add`.

pub mod cluster;
pub mod home;

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use porch_api::common::Lifecycle;
use porch_api::naming::RevisionName;
use porch_api::v1alpha2::PackageRevision;
use porch_api::{
    APPROVED_BY_ANNOTATION, LATEST_REVISION_LABEL, PROPOSED_BY_ANNOTATION,
    RENDER_REQUEST_ANNOTATION,
};
use porch_engine::runner::Runner;
use porch_engine::secrets::SecretDirectory;
use porch_git::repo::{Files, GitRepo};
use porch_git::s3::{AnyStore, S3Options, S3Store};
use porch_git::store::LocalDirStore;
use porch_krm::builtins::BuiltinRuntime;
use porch_krm::runtime::Runtimes;
use serde_json::{Value, json};

use cluster::{Control, Objects, Repositories, Step, objects_path};
use home::{Config, RepoEntry};

/// The package orchestrator, without a cluster.
#[derive(Debug, Parser)]
#[command(name = "porch", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Options of every command.
#[derive(Debug, Clone, Args)]
pub struct Global {
    /// Registered repositories and the objects.
    #[arg(long, env = "PORCH_CONFIG_DIR", global = true)]
    pub config_dir: Option<PathBuf>,
    /// Git mirrors and, without S3, the snapshot store.
    #[arg(long, env = "PORCH_CACHE_DIR", global = true)]
    pub cache_dir: Option<PathBuf>,
    #[arg(short, long, default_value = "default", global = true)]
    pub namespace: String,
    /// Who proposes and approves (recorded in git and `publishedBy`).
    #[arg(long, env = "PORCH_USER", global = true)]
    pub user: Option<String>,
    /// Keep snapshots in this S3 bucket instead of the cache directory
    /// (credentials and region from the AWS environment).
    #[arg(long, env = "PORCH_S3_BUCKET", global = true)]
    pub s3_bucket: Option<String>,
    /// An S3-compatible endpoint (path-style addressing).
    #[arg(long, env = "PORCH_S3_ENDPOINT", global = true)]
    pub s3_endpoint: Option<String>,
    #[arg(long, env = "PORCH_S3_PREFIX", default_value = "", global = true)]
    pub s3_prefix: String,
    /// Print nothing but results and errors.
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Register and list repositories.
    #[command(subcommand)]
    Repo(RepoCommand),
    /// Work with package revisions.
    #[command(subcommand)]
    Rpkg(RpkgCommand),
    /// Keep git credentials that repositories and clones name with
    /// `--secret`.
    #[command(subcommand)]
    Secret(SecretCommand),
    /// A short tour: a new bare repository under DIR, a package drafted,
    /// rendered, proposed, approved and copied (state under DIR too unless
    /// --config-dir / --cache-dir say otherwise).
    Demo {
        #[arg(default_value = "porch-demo")]
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum RepoCommand {
    /// Register a git repository (a URL, or a path to a bare repository).
    Add {
        name: String,
        url: String,
        #[arg(long, default_value = "main")]
        branch: String,
        /// The directory of the packages inside the repository.
        #[arg(long, default_value = "")]
        directory: String,
        /// Packages here are deployable instances.
        #[arg(long)]
        deployment: bool,
        /// Create the bare repository when the path does not exist.
        #[arg(long)]
        create: bool,
        /// The Secret holding the credentials (see `porch secret set`).
        #[arg(long)]
        secret: Option<String>,
    },
    /// The registered repositories.
    List,
    /// Unregister a repository (git is left alone).
    Rm { name: String },
}

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Store credentials as Secret NAME: `--username` with the password on
    /// standard input, or `--bearer-token` with the token on standard input.
    Set {
        name: String,
        #[arg(
            long,
            conflicts_with = "bearer_token",
            required_unless_present = "bearer_token"
        )]
        username: Option<String>,
        #[arg(long)]
        bearer_token: bool,
    },
}

/// How `rpkg get` prints.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Output {
    Table,
    Yaml,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum RpkgCommand {
    /// List package revisions (discovered from git).
    Get {
        name: Option<String>,
        #[arg(long)]
        repository: Option<String>,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// A new package as a draft.
    Init {
        package: String,
        #[arg(long)]
        repository: String,
        #[arg(long)]
        workspace: String,
        #[arg(long, default_value = "")]
        description: String,
        #[arg(long, value_delimiter = ',')]
        keywords: Vec<String>,
        #[arg(long, default_value = "")]
        site: String,
    },
    /// A new package cloned from a published revision (of any registered
    /// repository) or from a package at a git URL or path.
    Clone {
        /// A PackageRevision name, or a git URL / path with --ref and --directory.
        upstream: String,
        package: String,
        #[arg(long)]
        repository: String,
        #[arg(long)]
        workspace: String,
        /// For a git upstream: the branch, tag or commit.
        #[arg(long = "ref", default_value = "main")]
        reference: String,
        /// For a git upstream: the package's directory.
        #[arg(long, default_value = "")]
        directory: String,
        /// For a git upstream: the Secret holding the credentials.
        #[arg(long)]
        secret: Option<String>,
    },
    /// A new draft of a package from one of its published revisions.
    Copy {
        source: String,
        #[arg(long)]
        workspace: String,
    },
    /// A new draft of a cloned package, merged onto a newer upstream revision.
    Upgrade {
        name: String,
        #[arg(long)]
        workspace: String,
        /// The upstream revision (default: its latest).
        #[arg(long)]
        revision: Option<i64>,
        #[arg(long, value_enum, default_value = "resource-merge")]
        strategy: Strategy,
    },
    /// Write a revision's files into a local directory.
    Pull { name: String, dir: PathBuf },
    /// Replace a draft's files with a local directory's, then render.
    Push { name: String, dir: PathBuf },
    /// Render a draft again.
    Render { name: String },
    /// Draft → Proposed.
    Propose { names: Vec<String> },
    /// Proposed → Published.
    Approve { names: Vec<String> },
    /// Proposed → Draft.
    Reject { names: Vec<String> },
    /// Published → DeletionProposed.
    ProposeDelete { names: Vec<String> },
    /// Delete revisions (published ones must be proposed for deletion first).
    Del { names: Vec<String> },
}

/// The upgrade merge strategies.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Strategy {
    ResourceMerge,
    FastForward,
    ForceDeleteReplace,
    CopyMerge,
}

impl Strategy {
    fn api_name(self) -> &'static str {
        match self {
            Strategy::ResourceMerge => "resource-merge",
            Strategy::FastForward => "fast-forward",
            Strategy::ForceDeleteReplace => "force-delete-replace",
            Strategy::CopyMerge => "copy-merge",
        }
    }
}

fn out(line: impl std::fmt::Display) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// An open state directory with its runner and objects.
struct App {
    global: Global,
    config_dir: PathBuf,
    config: Config,
    objects: Objects,
    runner: Runner<AnyStore>,
    /// Every repository synced already in this command.
    refreshed: bool,
    _lock: home::Lock,
}

impl App {
    async fn open(global: Global) -> anyhow::Result<Self> {
        let config_dir = global
            .config_dir
            .clone()
            .unwrap_or_else(home::default_config_dir);
        let cache_dir = global
            .cache_dir
            .clone()
            .unwrap_or_else(home::default_cache_dir);
        let lock = home::lock(&config_dir)?;
        let config = Config::load(&config_dir)?;
        let objects = Objects::load(&objects_path(&config_dir))?;
        let store = match &global.s3_bucket {
            Some(bucket) => AnyStore::S3(
                S3Store::connect(S3Options {
                    bucket: bucket.clone(),
                    prefix: global.s3_prefix.clone(),
                    endpoint: global.s3_endpoint.clone(),
                    force_path_style: global.s3_endpoint.is_some(),
                    ..S3Options::default()
                })
                .await?,
            ),
            None => AnyStore::Local(LocalDirStore::new(cache_dir.join("snapshots"))),
        };
        let functions = Arc::new(Runtimes::new().with(Arc::new(BuiltinRuntime::catalog())));
        let runner = Runner::new(cache_dir.join("mirrors"), functions)
            .with_store(store)
            .with_secrets(Arc::new(SecretDirectory::new(home::secrets_dir(
                &config_dir,
            ))))
            // the user's own machine and the user's own URLs: nothing to guard
            .with_clone_egress(porch_git::egress::EgressPolicy::unrestricted());
        Ok(App {
            global,
            config_dir,
            config,
            objects,
            runner,
            refreshed: false,
            _lock: lock,
        })
    }

    fn save(&self) -> anyhow::Result<()> {
        self.config.save(&self.config_dir)?;
        self.objects.save(&objects_path(&self.config_dir))
    }

    fn repositories(&self) -> anyhow::Result<Repositories> {
        let mut map = BTreeMap::new();
        for entry in &self.config.repositories {
            map.insert(
                entry.name.clone(),
                entry.repository(&self.global.namespace)?,
            );
        }
        Ok(Repositories(map))
    }

    fn user(&self) -> String {
        self.global
            .user
            .clone()
            .or_else(|| std::env::var("USER").ok())
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "porch-cli".to_owned())
    }

    fn progress(&self, line: impl std::fmt::Display) {
        if !self.global.quiet {
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
    }

    /// Syncs every registered repository (or one), then runs what is due.
    async fn refresh(&mut self, only: Option<&str>) -> anyhow::Result<()> {
        if self.refreshed {
            return Ok(());
        }
        let repositories = self.repositories()?;
        let control = Control {
            runner: &self.runner,
            repositories: &repositories,
            namespace: self.global.namespace.clone(),
        };
        for (name, repository) in &repositories.0 {
            if only.is_some_and(|o| o != name) {
                continue;
            }
            control
                .sync(&mut self.objects, repository)
                .await
                .with_context(|| format!("failed to sync repository {name:?}"))?;
        }
        let quiet = self.global.quiet;
        let mut count = 0usize;
        let steps = control
            .converge(&mut self.objects, |_| {
                count += 1;
                if !quiet && count.is_multiple_of(100) {
                    let _ = writeln!(std::io::stderr().lock(), "  {count} revisions reconciled…");
                }
            })
            .await;
        for step in steps.iter().filter(|s| s.error.is_some()) {
            self.progress(describe(step));
        }
        self.refreshed = only.is_none();
        Ok(())
    }

    /// Runs what is due, showing the steps taken on `focus`.
    async fn converge(&mut self, focus: &[String]) -> anyhow::Result<Vec<Step>> {
        let repositories = self.repositories()?;
        let control = Control {
            runner: &self.runner,
            repositories: &repositories,
            namespace: self.global.namespace.clone(),
        };
        let quiet = self.global.quiet;
        let steps = control
            .converge(&mut self.objects, |step| {
                if !quiet && (focus.contains(&step.name) || step.error.is_some()) {
                    let _ = writeln!(std::io::stderr().lock(), "{}", describe(step));
                }
            })
            .await;
        Ok(steps)
    }

    fn typed(&self, name: &str) -> anyhow::Result<PackageRevision> {
        let object = self
            .objects
            .get(&self.global.namespace, name)
            .ok_or_else(|| anyhow!("package revision {name:?} not found"))?;
        Ok(serde_json::from_value(object.clone())?)
    }

    fn entry(&self, repository: &str) -> anyhow::Result<&RepoEntry> {
        self.config.find(repository).ok_or_else(|| {
            anyhow!("repository {repository:?} is not registered; use `porch repo add`")
        })
    }

    /// Creates a new draft with `source`, then runs its handlers.
    async fn create(
        &mut self,
        repository: &str,
        package: &str,
        workspace: &str,
        source: Value,
    ) -> anyhow::Result<()> {
        self.entry(repository)?;
        porch_api::naming::validate_package_path(package)?;
        porch_api::naming::validate_label("workspace", workspace)?;
        let name = RevisionName::compose(repository, package, workspace);
        RevisionName::parse(&name)?;
        self.refresh(Some(repository)).await?;
        self.objects.create(json!({
            "apiVersion": "porch.kpt.dev/v1alpha2",
            "kind": "PackageRevision",
            "metadata": {"name": name, "namespace": self.global.namespace},
            "spec": {
                "packageName": package,
                "repository": repository,
                "workspaceName": workspace,
                "lifecycle": "Draft",
                "source": source,
            }
        }))?;
        self.converge(std::slice::from_ref(&name)).await?;
        let result = self.report(&name);
        self.save()?;
        result?;
        out(format_args!("{name} created"));
        Ok(())
    }

    /// Fails with the object's Ready message when it is not ready.
    fn report(&self, name: &str) -> anyhow::Result<()> {
        let Some(object) = self.objects.get(&self.global.namespace, name) else {
            return Ok(());
        };
        let ready = object["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"));
        match ready {
            Some(c) if c["status"] == "False" && c["reason"] != "Pending" => bail!(
                "{name}: {} ({})",
                c["message"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or("")
            ),
            _ => Ok(()),
        }
    }

    /// Moves revisions to `to`, as a user with the webhook's stamps.
    async fn transition(&mut self, names: &[String], to: Lifecycle) -> anyhow::Result<()> {
        if names.is_empty() {
            bail!("name at least one package revision");
        }
        self.refresh(None).await?;
        let user = self.user();
        for name in names {
            let pr = self.typed(name)?;
            porch_api::lifecycle::transition(pr.spec.lifecycle, Some(to))
                .map_err(|e| anyhow!("{name}: {e}"))?;
            let stamp = match to {
                Lifecycle::Proposed => Some(PROPOSED_BY_ANNOTATION),
                Lifecycle::Published => Some(APPROVED_BY_ANNOTATION),
                _ => None,
            };
            self.objects
                .update(&self.global.namespace, name, |object| {
                    object["spec"]["lifecycle"] = json!(to.as_str());
                    if let Some(key) = stamp {
                        set_annotation(object, key, &user);
                    }
                })?;
        }
        self.converge(names).await?;
        let mut failed = Vec::new();
        for name in names {
            match self.report(name) {
                Ok(()) => {
                    let pr = self.typed(name)?;
                    let revision = pr.status.as_ref().and_then(|s| s.revision).unwrap_or(0);
                    match to {
                        Lifecycle::Published => {
                            out(format_args!("{name} published as revision {revision}"));
                        }
                        other => out(format_args!("{name} {}", past(other))),
                    }
                }
                Err(e) => failed.push(e.to_string()),
            }
        }
        self.save()?;
        if !failed.is_empty() {
            bail!("{}", failed.join("\n"));
        }
        Ok(())
    }
}

fn past(lifecycle: Lifecycle) -> &'static str {
    match lifecycle {
        Lifecycle::Draft => "rejected",
        Lifecycle::Proposed => "proposed",
        Lifecycle::Published => "published",
        Lifecycle::DeletionProposed => "proposed for deletion",
    }
}

fn set_annotation(object: &mut Value, key: &str, value: &str) {
    let annotations = &mut object["metadata"]["annotations"];
    if !annotations.is_object() {
        *annotations = json!({});
    }
    annotations[key] = json!(value);
}

fn describe(step: &Step) -> String {
    match &step.error {
        None => format!(
            "  {:<9} {} ({} ms)",
            step.operation.as_str(),
            step.name,
            step.millis
        ),
        Some(e) => format!("  {:<9} {} failed: {e}", step.operation.as_str(), step.name),
    }
}

/// An error and its causes on one line, each cause only when the message
/// so far does not already say it.
pub fn message(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
    }
    text
}

/// Runs one CLI invocation.
///
/// # Errors
/// Whatever the command fails on, with a message for the user.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    // each command's future boxed: together they nest too deep for the
    // compiler's layout of one state machine
    match cli.command {
        Command::Repo(command) => Box::pin(repo(cli.global, command)).await,
        Command::Rpkg(command) => Box::pin(rpkg(cli.global, command)).await,
        Command::Secret(command) => secret(&cli.global, command),
        Command::Demo { dir } => Box::pin(demo(cli.global, &dir)).await,
    }
}

const DEMO_PIPELINE: &str = "pipeline:
  mutators:
    - image: ghcr.io/kptdev/krm-functions-catalog/set-namespace:v0.4
      configMap:
        namespace: shop
    - image: ghcr.io/kptdev/krm-functions-catalog/set-labels:v0.2
      configMap:
        app: hello
";

const DEMO_DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: hello # the web front end
spec:
  replicas: 2
  template:
    spec:
      containers:
        - name: hello
          image: nginx:1.27
";

async fn demo(global: Global, dir: &Path) -> anyhow::Result<()> {
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        bail!(
            "{} is not empty; remove it or name another directory",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir)?;
    let dir = dir.canonicalize()?;
    let global = Global {
        config_dir: Some(global.config_dir.unwrap_or_else(|| dir.join("config"))),
        cache_dir: Some(global.cache_dir.unwrap_or_else(|| dir.join("cache"))),
        ..global
    };
    let step = |text: &str| out(format_args!("\n# {text}"));
    step("a new bare repository, registered");
    let bare = dir.join("blueprints.git");
    repo(
        global.clone(),
        RepoCommand::Add {
            name: "blueprints".into(),
            url: bare.display().to_string(),
            branch: "main".into(),
            directory: String::new(),
            deployment: false,
            create: true,
            secret: None,
        },
    )
    .await?;
    step("porch rpkg init hello --repository blueprints --workspace v1");
    let rpkg_run = |command| rpkg(global.clone(), command);
    rpkg_run(RpkgCommand::Init {
        package: "hello".into(),
        repository: "blueprints".into(),
        workspace: "v1".into(),
        description: "hello, world".into(),
        keywords: Vec::new(),
        site: String::new(),
    })
    .await?;
    step("porch rpkg pull, add a Deployment and a pipeline, porch rpkg push (renders)");
    let work = dir.join("hello");
    rpkg_run(RpkgCommand::Pull {
        name: "blueprints.hello.v1".into(),
        dir: work.clone(),
    })
    .await?;
    let kptfile = std::fs::read_to_string(work.join("Kptfile"))?;
    let kptfile = kptfile
        .split("status:")
        .next()
        .unwrap_or_default()
        .to_owned();
    std::fs::write(work.join("Kptfile"), kptfile + DEMO_PIPELINE)?;
    std::fs::write(work.join("deployment.yaml"), DEMO_DEPLOYMENT)?;
    rpkg_run(RpkgCommand::Push {
        name: "blueprints.hello.v1".into(),
        dir: work.clone(),
    })
    .await?;
    step("porch rpkg propose / approve");
    rpkg_run(RpkgCommand::Propose {
        names: vec!["blueprints.hello.v1".into()],
    })
    .await?;
    rpkg_run(RpkgCommand::Approve {
        names: vec!["blueprints.hello.v1".into()],
    })
    .await?;
    step("porch rpkg copy blueprints.hello.v1 --workspace v2");
    rpkg_run(RpkgCommand::Copy {
        source: "blueprints.hello.v1".into(),
        workspace: "v2".into(),
    })
    .await?;
    step("porch rpkg get");
    rpkg_run(RpkgCommand::Get {
        name: None,
        repository: None,
        output: Output::Table,
    })
    .await?;
    step("the rendered Deployment, as published in git (tag hello/v1)");
    let rendered = GitRepo::open(&bare).ok().and_then(|repo| {
        let tag = repo.ref_id("refs/tags/hello/v1").ok().flatten()?;
        repo.file(tag, "hello/deployment.yaml").ok().flatten()
    });
    if let Some(bytes) = rendered {
        let _ = write!(
            std::io::stdout().lock(),
            "{}",
            String::from_utf8_lossy(&bytes)
        );
    }
    let config = global.config_dir.clone().unwrap_or_default();
    let cache = global.cache_dir.clone().unwrap_or_default();
    step("look around");
    out(format_args!(
        "git --git-dir {} log --all --oneline --decorate\nporch --config-dir {} --cache-dir {} rpkg get",
        bare.display(),
        config.display(),
        cache.display()
    ));
    Ok(())
}

fn secret(global: &Global, command: SecretCommand) -> anyhow::Result<()> {
    let SecretCommand::Set {
        name,
        username,
        bearer_token,
    } = command;
    let config_dir = global
        .config_dir
        .clone()
        .unwrap_or_else(home::default_config_dir);
    std::fs::create_dir_all(&config_dir)?;
    let _lock = home::lock(&config_dir)?;
    let mut value = String::new();
    std::io::stdin()
        .lock()
        .take(64 << 10)
        .read_line(&mut value)
        .context("reading the secret value from standard input")?;
    let value = value.trim_end_matches(['\n', '\r']);
    if value.is_empty() {
        bail!("no value on standard input");
    }
    let keys: Vec<(&str, &str)> = match (&username, bearer_token) {
        (Some(user), false) => vec![("username", user.as_str()), ("password", value)],
        _ => vec![("bearerToken", value)],
    };
    let dir = home::write_secret(&config_dir, &global.namespace, &name, &keys)?;
    out(format_args!("secret {name} stored in {}", dir.display()));
    Ok(())
}

async fn repo(global: Global, command: RepoCommand) -> anyhow::Result<()> {
    let mut app = App::open(global).await?;
    match command {
        RepoCommand::Add {
            name,
            url,
            branch,
            directory,
            deployment,
            create,
            secret,
        } => {
            porch_api::naming::validate_label("repository name", &name)?;
            if let Some(secret) = &secret {
                porch_api::naming::validate_label("secret name", secret)?;
            }
            porch_api::naming::validate_branch_name(&branch)?;
            porch_api::naming::validate_repo_directory(&directory)?;
            if app.config.find(&name).is_some() {
                bail!("repository {name:?} is already registered");
            }
            let url = normalise_url(&url, create)?;
            app.config.repositories.push(RepoEntry {
                name: name.clone(),
                url,
                branch,
                directory,
                deployment,
                secret,
                uid: uuid::Uuid::new_v4().to_string(),
            });
            // nothing is registered when the repository cannot be read
            app.refresh(Some(&name)).await?;
            app.save()?;
            let count = app
                .objects
                .typed(&app.global.namespace)
                .iter()
                .filter(|p| p.spec.repository == name)
                .count();
            out(format_args!(
                "repository {name} registered ({count} package revisions)"
            ));
        }
        RepoCommand::List => {
            let mut table = vec![vec![
                "NAME".to_owned(),
                "URL".to_owned(),
                "BRANCH".to_owned(),
                "DIRECTORY".to_owned(),
                "DEPLOYMENT".to_owned(),
            ]];
            for r in &app.config.repositories {
                table.push(vec![
                    r.name.clone(),
                    r.url.clone(),
                    r.branch.clone(),
                    r.directory.clone(),
                    r.deployment.to_string(),
                ]);
            }
            print_table(&table);
        }
        RepoCommand::Rm { name } => {
            app.entry(&name)?;
            app.config.repositories.retain(|r| r.name != name);
            let namespace = app.global.namespace.clone();
            let gone: Vec<String> = app
                .objects
                .typed(&namespace)
                .into_iter()
                .filter(|p| p.spec.repository == name)
                .filter_map(|p| p.metadata.name)
                .collect();
            for pr in &gone {
                app.objects
                    .package_revisions
                    .remove(&format!("{namespace}/{pr}"));
            }
            app.save()?;
            out(format_args!("repository {name} unregistered"));
        }
    }
    Ok(())
}

/// A registered URL: remote URLs as given; paths made absolute, created
/// as bare repositories on request.
fn normalise_url(url: &str, create: bool) -> anyhow::Result<String> {
    if url.contains("://") && !url.starts_with("file://") {
        porch_api::naming::validate_git_url(url)?;
        return Ok(url.to_owned());
    }
    let path = Path::new(url.strip_prefix("file://").unwrap_or(url));
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    if !path.exists() {
        if !create {
            bail!(
                "{} does not exist (add --create to make a bare repository there)",
                path.display()
            );
        }
        GitRepo::init_bare(&path)
            .with_context(|| format!("failed to create a repository at {}", path.display()))?;
    }
    let path = path.canonicalize()?;
    GitRepo::open(&path).with_context(|| format!("{} is not a git repository", path.display()))?;
    Ok(path.display().to_string())
}

fn print_table(rows: &[Vec<String>]) {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out(line.join("   ").trim_end());
    }
}

async fn rpkg(global: Global, command: RpkgCommand) -> anyhow::Result<()> {
    let mut app = App::open(global).await?;
    match command {
        RpkgCommand::Get {
            name,
            repository,
            output,
        } => get(&mut app, name, repository, output).await,
        RpkgCommand::Init {
            package,
            repository,
            workspace,
            description,
            keywords,
            site,
        } => {
            let source =
                json!({"init": {"description": description, "keywords": keywords, "site": site}});
            app.create(&repository, &package, &workspace, source).await
        }
        RpkgCommand::Clone {
            upstream,
            package,
            repository,
            workspace,
            reference,
            directory,
            secret,
        } => {
            let is_git =
                upstream.contains("://") || upstream.contains('/') || upstream.ends_with(".git");
            let source = if is_git {
                let url = if upstream.contains("://") && !upstream.starts_with("file://") {
                    upstream.clone()
                } else {
                    format!("file://{}", normalise_url(&upstream, false)?)
                };
                porch_api::naming::validate_git_url(&url)?;
                json!({"cloneFrom": {"git": {
                    "repo": url,
                    "ref": reference,
                    "directory": directory,
                    "secretRef": {"name": secret.unwrap_or_default()},
                }}})
            } else {
                app.refresh(None).await?;
                app.typed(&upstream)?;
                json!({"cloneFrom": {"upstreamRef": {"name": upstream}}})
            };
            app.create(&repository, &package, &workspace, source).await
        }
        RpkgCommand::Copy { source, workspace } => {
            app.refresh(None).await?;
            let from = app.typed(&source)?;
            let spec = json!({"copyFrom": {"name": source}});
            app.create(
                &from.spec.repository,
                &from.spec.package_name,
                &workspace,
                spec,
            )
            .await
        }
        RpkgCommand::Upgrade {
            name,
            workspace,
            revision,
            strategy,
        } => upgrade(&mut app, &name, &workspace, revision, strategy).await,
        RpkgCommand::Pull { name, dir } => pull(&mut app, &name, &dir).await,
        RpkgCommand::Push { name, dir } => push(&mut app, &name, &dir).await,
        RpkgCommand::Render { name } => {
            app.refresh(None).await?;
            request_render(&mut app, &name)?;
            app.converge(std::slice::from_ref(&name)).await?;
            let result = app.report(&name);
            app.save()?;
            result?;
            out(format_args!("{name} rendered"));
            Ok(())
        }
        RpkgCommand::Propose { names } => app.transition(&names, Lifecycle::Proposed).await,
        RpkgCommand::Approve { names } => app.transition(&names, Lifecycle::Published).await,
        RpkgCommand::Reject { names } => {
            app.refresh(None).await?;
            for name in &names {
                let pr = app.typed(name)?;
                if pr.spec.lifecycle != Some(Lifecycle::Proposed) {
                    bail!("{name} is not proposed");
                }
            }
            app.transition(&names, Lifecycle::Draft).await
        }
        RpkgCommand::ProposeDelete { names } => {
            app.transition(&names, Lifecycle::DeletionProposed).await
        }
        RpkgCommand::Del { names } => {
            if names.is_empty() {
                bail!("name at least one package revision");
            }
            app.refresh(None).await?;
            for name in &names {
                let pr = app.typed(name)?;
                porch_api::lifecycle::check_delete(pr.spec.lifecycle)
                    .map_err(|e| anyhow!("{name}: {e}"))?;
                app.objects.delete(&app.global.namespace, name)?;
            }
            let steps = app.converge(&names).await?;
            app.save()?;
            let mut left = Vec::new();
            for name in &names {
                if app.objects.get(&app.global.namespace, name).is_some() {
                    let why: Vec<String> = steps
                        .iter()
                        .filter(|s| &s.name == name)
                        .flat_map(|s| s.warnings.iter().chain(&s.error).cloned())
                        .collect();
                    left.push(format!("{name}: {}", why.join("; ")));
                } else {
                    out(format_args!("{name} deleted"));
                }
            }
            if !left.is_empty() {
                bail!(
                    "not deleted yet (it stays marked for deletion and goes once unblocked):\n{}",
                    left.join("\n")
                );
            }
            Ok(())
        }
    }
}

async fn get(
    app: &mut App,
    name: Option<String>,
    repository: Option<String>,
    output: Output,
) -> anyhow::Result<()> {
    if let Some(r) = &repository {
        app.entry(r)?;
    }
    app.refresh(repository.as_deref()).await?;
    app.save()?;
    let namespace = app.global.namespace.clone();
    let mut items: Vec<Value> = app
        .objects
        .package_revisions
        .iter()
        .filter(|(k, _)| k.split_once('/').is_some_and(|(ns, _)| ns == namespace))
        .map(|(_, v)| v.clone())
        .filter(|v| {
            repository
                .as_deref()
                .is_none_or(|r| v["spec"]["repository"] == r)
        })
        .filter(|v| name.as_deref().is_none_or(|n| v["metadata"]["name"] == n))
        .collect();
    items.sort_by(|a, b| {
        a["metadata"]["name"]
            .as_str()
            .cmp(&b["metadata"]["name"].as_str())
    });
    if let Some(n) = &name
        && items.is_empty()
    {
        bail!("package revision {n:?} not found");
    }
    let document = if name.is_some() {
        items.first().cloned().unwrap_or_default()
    } else {
        json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items})
    };
    match output {
        Output::Json => out(serde_json::to_string_pretty(&document)?),
        Output::Yaml => {
            let yaml = porch_api::crd::yaml_of(&document).map_err(|e| anyhow!(e))?;
            let _ = write!(std::io::stdout().lock(), "{yaml}");
        }
        Output::Table => {
            let mut table = vec![
                [
                    "NAME",
                    "PACKAGE",
                    "WORKSPACENAME",
                    "REVISION",
                    "LATEST",
                    "LIFECYCLE",
                    "REPOSITORY",
                ]
                .map(str::to_owned)
                .to_vec(),
            ];
            for v in &items {
                let s = |p: &str| {
                    v.pointer(p)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                };
                let revision = v
                    .pointer("/status/revision")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                let latest = v
                    .pointer("/metadata/labels")
                    .and_then(|l| l.get(LATEST_REVISION_LABEL))
                    .is_some_and(|l| l == "true");
                table.push(vec![
                    s("/metadata/name"),
                    s("/spec/packageName"),
                    s("/spec/workspaceName"),
                    revision.to_string(),
                    latest.to_string(),
                    {
                        let l = s("/spec/lifecycle");
                        if l.is_empty() { "Draft".to_owned() } else { l }
                    },
                    s("/spec/repository"),
                ]);
            }
            print_table(&table);
        }
    }
    Ok(())
}

async fn upgrade(
    app: &mut App,
    name: &str,
    workspace: &str,
    revision: Option<i64>,
    strategy: Strategy,
) -> anyhow::Result<()> {
    app.refresh(None).await?;
    let current = app.typed(name)?;
    if current.spec.lifecycle != Some(Lifecycle::Published) {
        bail!("{name} must be published to be upgraded");
    }
    let lock = current
        .status
        .as_ref()
        .and_then(|s| s.upstream_lock.as_ref())
        .and_then(|l| l.git.as_ref())
        .ok_or_else(|| anyhow!("{name} has no upstream; only cloned packages can be upgraded"))?;
    let all = app.objects.typed(&app.global.namespace);
    let commit_of = |p: &PackageRevision| {
        p.status
            .as_ref()
            .and_then(|s| s.self_lock.as_ref())
            .and_then(|l| l.git.as_ref())
            .map(|g| g.commit.clone())
    };
    let old = all
        .iter()
        .find(|p| {
            p.spec.lifecycle == Some(Lifecycle::Published)
                && commit_of(p).as_deref() == Some(lock.commit.as_str())
        })
        .ok_or_else(|| {
            anyhow!(
                "the upstream of {name} (commit {}) is not among the registered repositories' revisions",
                lock.commit
            )
        })?;
    let revision_of = |p: &PackageRevision| p.status.as_ref().and_then(|s| s.revision).unwrap_or(0);
    let newer = all
        .iter()
        .filter(|p| {
            p.spec.repository == old.spec.repository
                && p.spec.package_name == old.spec.package_name
                && p.spec.lifecycle == Some(Lifecycle::Published)
                && revision.is_none_or(|r| revision_of(p) == r)
        })
        .max_by_key(|p| revision_of(p))
        .ok_or_else(|| anyhow!("no such published revision of {}", old.spec.package_name))?;
    if revision_of(newer) <= revision_of(old) && revision.is_none() {
        out(format_args!(
            "{name} is up to date with {} revision {}",
            old.spec.package_name,
            revision_of(old)
        ));
        return Ok(());
    }
    let source = json!({"upgrade": {
        "oldUpstream": {"name": old.metadata.name},
        "newUpstream": {"name": newer.metadata.name},
        "currentPackage": {"name": name},
        "strategy": strategy.api_name(),
    }});
    let (repository, package) = (
        current.spec.repository.clone(),
        current.spec.package_name.clone(),
    );
    app.create(&repository, &package, workspace, source).await
}

fn request_render(app: &mut App, name: &str) -> anyhow::Result<()> {
    let pr = app.typed(name)?;
    if pr.spec.lifecycle.unwrap_or(Lifecycle::Draft) != Lifecycle::Draft {
        bail!("{name} is not a draft; only drafts are rendered");
    }
    let request = uuid::Uuid::new_v4().to_string();
    app.objects.update(&app.global.namespace, name, |object| {
        set_annotation(object, RENDER_REQUEST_ANNOTATION, &request);
    })?;
    Ok(())
}

async fn pull(app: &mut App, name: &str, dir: &Path) -> anyhow::Result<()> {
    app.refresh(None).await?;
    let pr = app.typed(name)?;
    let repository = app
        .entry(&pr.spec.repository)?
        .repository(&app.global.namespace)?;
    let files = app.runner.read_revision(&repository, &pr).await?;
    app.save()?;
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        bail!("{} is not empty", dir.display());
    }
    for (path, content) in &files {
        porch_git::repo::validate_file_path(path)?;
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&target, content)?;
    }
    out(format_args!(
        "{name}: {} files written to {}",
        files.len(),
        dir.display()
    ));
    Ok(())
}

/// The files under `dir`, as package paths; hidden directories (`.git`)
/// and symbolic links are skipped.
fn read_dir_files(dir: &Path) -> anyhow::Result<Files> {
    let mut files = Files::new();
    let mut budget = porch_api::limits::PackageBudget::default();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current)
            .with_context(|| format!("failed to read {}", current.display()))?
        {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = entry.path();
            let name = entry.file_name();
            if kind.is_dir() {
                if !name.to_string_lossy().starts_with('.') {
                    pending.push(path);
                }
                continue;
            }
            if !kind.is_file() {
                continue;
            }
            let relative = path
                .strip_prefix(dir)?
                .to_str()
                .ok_or_else(|| anyhow!("{} is not a UTF-8 path", path.display()))?
                .replace(std::path::MAIN_SEPARATOR, "/");
            // checked before reading: nothing over the limits is loaded
            let size = usize::try_from(entry.metadata()?.len()).unwrap_or(usize::MAX);
            budget
                .add(&relative, size)
                .with_context(|| format!("{} cannot be pushed", dir.display()))?;
            files.insert(relative, std::fs::read(&path)?);
        }
    }
    Ok(files)
}

async fn push(app: &mut App, name: &str, dir: &Path) -> anyhow::Result<()> {
    let files = read_dir_files(dir)?;
    app.refresh(None).await?;
    let pr = app.typed(name)?;
    let repository = app
        .entry(&pr.spec.repository)?
        .repository(&app.global.namespace)?;
    let user = app.user();
    let changed = app
        .runner
        .write_draft(&repository, &pr, files, &user)
        .await?;
    if !changed {
        app.save()?;
        out(format_args!("{name}: unchanged"));
        return Ok(());
    }
    request_render(app, name)?;
    app.converge(&[name.to_owned()]).await?;
    let result = app.report(name);
    app.save()?;
    result?;
    out(format_args!("{name}: pushed and rendered"));
    Ok(())
}
