//! The relay's loop over the objects a cluster would hold (kept in a local
//! file, [`Objects`]): plan, invoke the handler in-process, apply its
//! Outcome as the relay does, repeat until nothing is due.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use porch_api::invocation::{EventType, Invocation, Operation, Outcome};
use porch_api::planner;
use porch_api::repository::Repository;
use porch_api::v1alpha2::PackageRevision;
use porch_engine::runner::Runner;
use porch_git::store::ObjectStore;
pub use porch_relay::memory::Objects;
use porch_relay::relay::upstream_of;

/// A handler run, for the progress the CLI shows.
#[derive(Debug, Clone)]
pub struct Step {
    pub operation: Operation,
    pub name: String,
    pub millis: u128,
    pub error: Option<String>,
    /// Warning events the handler recorded.
    pub warnings: Vec<String>,
}

/// The Repositories the objects belong to, by name.
#[derive(Debug, Default)]
pub struct Repositories(pub BTreeMap<String, Repository>);

impl Repositories {
    fn of(&self, pr: &PackageRevision) -> Option<&Repository> {
        self.0.get(&pr.spec.repository)
    }
}

/// Handler runs for one object in one command before it is left alone.
const MAX_RUNS_PER_OBJECT: usize = 32;

/// The relay's loop, in-process.
#[derive(Debug)]
pub struct Control<'a, S> {
    pub runner: &'a Runner<S>,
    pub repositories: &'a Repositories,
    pub namespace: String,
}

impl<S: ObjectStore + Clone + 'static> Control<'_, S> {
    /// Discovers `repository` and reconciles its objects.
    ///
    /// # Errors
    /// The sync handler fails.
    pub async fn sync(&self, objects: &mut Objects, repository: &Repository) -> anyhow::Result<()> {
        let outcome = self.sync_once(objects, repository).await?;
        // Git is the only shared state between CLIs: a revision that moved
        // in git (another user proposed or published it) is taken afresh
        // from git, unless this CLI still has work to do on it.
        let moved: Vec<String> = outcome
            .apply
            .iter()
            .filter(|a| a.field_manager == porch_engine::sync::OWNER_MANAGER)
            .filter_map(|a| a.object["metadata"]["name"].as_str())
            .filter(|name| {
                objects
                    .get(&self.namespace, name)
                    .and_then(|o| serde_json::from_value::<PackageRevision>(o.clone()).ok())
                    .is_some_and(|pr| {
                        pr.metadata.deletion_timestamp.is_none()
                            && planner::plan(&pr, repository).is_empty()
                    })
            })
            .map(str::to_owned)
            .collect();
        objects.apply_outcome(&outcome).await;
        if !moved.is_empty() {
            for name in &moved {
                objects
                    .package_revisions
                    .remove(&format!("{}/{name}", self.namespace));
            }
            let again = self.sync_once(objects, repository).await?;
            objects.apply_outcome(&again).await;
        }
        Ok(())
    }

    async fn sync_once(
        &self,
        objects: &Objects,
        repository: &Repository,
    ) -> anyhow::Result<Outcome> {
        let invocation = Invocation {
            operation: Operation::Sync,
            package_revision: None,
            repository: repository.clone(),
            upstream: None,
            upstream_repository: None,
            related: objects.typed(&self.namespace),
            package_variant: None,
            package_variant_set: None,
            variants: Vec::new(),
            repositories: Vec::new(),
            cluster_objects: Vec::new(),
            time: None,
            attempt: 1,
            request_id: uuid::Uuid::new_v4().to_string(),
        };
        Ok(self.runner.handle(&invocation).await?)
    }

    /// Runs whatever is due until nothing is, calling `progress` after each
    /// handler. A handler that fails is not retried in this run; its error
    /// is in the returned steps.
    pub async fn converge(
        &self,
        objects: &mut Objects,
        mut progress: impl FnMut(&Step),
    ) -> Vec<Step> {
        let mut steps = Vec::new();
        // (name, operation, resourceVersion) already tried without effect
        let mut settled: BTreeSet<(String, Operation, String)> = BTreeSet::new();
        let mut runs: BTreeMap<String, usize> = BTreeMap::new();
        loop {
            let all = objects.typed(&self.namespace);
            let next = all.iter().find_map(|pr| {
                let repository = self.repositories.of(pr)?;
                let op = planner::plan(pr, repository).into_iter().next()?;
                let seen = (
                    pr.metadata.name.clone().unwrap_or_default(),
                    op,
                    pr.metadata.resource_version.clone().unwrap_or_default(),
                );
                (!settled.contains(&seen)).then_some((pr, repository, op, seen))
            });
            let Some((pr, repository, operation, seen)) = next else {
                break;
            };
            let count = runs.entry(seen.0.clone()).or_default();
            *count += 1;
            if *count > MAX_RUNS_PER_OBJECT {
                // a handler whose Outcome never settles the object: a bug
                // to report, not a loop to run forever
                let step = Step {
                    operation,
                    name: seen.0.clone(),
                    millis: 0,
                    error: Some(format!(
                        "still due after {MAX_RUNS_PER_OBJECT} runs; giving up for now"
                    )),
                    warnings: Vec::new(),
                };
                settled.insert(seen);
                progress(&step);
                steps.push(step);
                continue;
            }
            let upstream = upstream_of(pr, &all);
            let upstream_repository = upstream
                .as_ref()
                .filter(|u| u.spec.repository != pr.spec.repository)
                .and_then(|u| self.repositories.0.get(&u.spec.repository))
                .cloned();
            let invocation = Invocation {
                operation,
                package_revision: Some(pr.clone()),
                repository: repository.clone(),
                upstream_repository,
                upstream,
                related: all.clone(),
                package_variant: None,
                package_variant_set: None,
                variants: Vec::new(),
                repositories: Vec::new(),
                cluster_objects: Vec::new(),
                time: None,
                attempt: 1,
                request_id: uuid::Uuid::new_v4().to_string(),
            };
            let started = std::time::Instant::now();
            let result = self.runner.handle(&invocation).await;
            let step = Step {
                operation,
                name: seen.0.clone(),
                millis: started.elapsed().as_millis(),
                error: result.as_ref().err().map(ToString::to_string),
                warnings: result
                    .as_ref()
                    .map(|o| {
                        o.events
                            .iter()
                            .filter(|e| e.type_ == EventType::Warning)
                            .map(|e| e.message.clone())
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            match result {
                // an Outcome that changes objects: plan again at once; one
                // that only reports (or asks to come back later) settles
                Ok(outcome)
                    if !(outcome.patches.is_empty()
                        && outcome.apply.is_empty()
                        && outcome.delete.is_empty()) =>
                {
                    objects.apply_outcome(&outcome).await;
                }
                _ => {
                    settled.insert(seen);
                }
            }
            tracing::debug!(operation = step.operation.as_str(), name = %step.name, error = ?step.error, "handler ran");
            progress(&step);
            steps.push(step);
        }
        steps
    }
}

/// Where the objects of a config directory live.
pub fn objects_path(config_dir: &Path) -> PathBuf {
    config_dir.join("objects.json")
}
