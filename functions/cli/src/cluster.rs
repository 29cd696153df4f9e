//! The objects a cluster would hold, kept in a local file, and what the
//! relay does with them: plan, invoke the handler in-process, apply its
//! Outcome (guarded JSON patches, server-side applies, deletes), repeat
//! until nothing is due.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use porch_api::invocation::{Apply, EventType, Invocation, Operation, Outcome, Subresource};
use porch_api::repository::Repository;
use porch_api::v1alpha2::PackageRevision;
use porch_api::{PACKAGE_REVISION_FINALIZER, REPOSITORY_LABEL, planner};
use porch_engine::runner::Runner;
use porch_git::store::ObjectStore;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The stored objects of one state directory.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Objects {
    /// The last resourceVersion given out.
    #[serde(default)]
    pub resource_version: u64,
    /// PackageRevisions by `<namespace>/<name>`.
    #[serde(default)]
    pub package_revisions: BTreeMap<String, Value>,
}

/// Why an object write was refused, as the API server would say.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("packagerevisions {0:?} already exists")]
    AlreadyExists(String),
    #[error("packagerevisions {0:?} not found")]
    NotFound(String),
    #[error("the object has been modified; please apply your changes to the latest version")]
    Conflict,
    #[error("invalid object: {0}")]
    Invalid(String),
}

fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Merges `patch` into `target` as a server-side apply would for the
/// fields it states: maps merge, everything else is replaced. Without
/// `force`, fields already set are left alone.
fn merge(target: &mut Value, patch: &Value, force: bool) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                match t.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        merge(existing, v, force);
                    }
                    Some(existing) if !force && !existing.is_null() => {}
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, p) => {
            if force {
                *t = p.clone();
            }
        }
    }
}

impl Objects {
    /// Reads the objects file; a missing file is an empty cluster.
    ///
    /// # Errors
    /// The file is unreadable or not ours.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("{} is damaged: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Objects::default()),
            Err(e) => Err(anyhow::anyhow!("failed to read {}: {e}", path.display())),
        }
    }

    /// Writes the objects file atomically.
    ///
    /// # Errors
    /// The directory is not writable.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }

    fn next_version(&mut self) -> String {
        self.resource_version += 1;
        self.resource_version.to_string()
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<&Value> {
        self.package_revisions.get(&key(namespace, name))
    }

    /// Every PackageRevision of `namespace`, typed.
    pub fn typed(&self, namespace: &str) -> Vec<PackageRevision> {
        self.package_revisions
            .iter()
            .filter(|(k, _)| k.split_once('/').is_some_and(|(ns, _)| ns == namespace))
            .filter_map(|(_, v)| serde_json::from_value(v.clone()).ok())
            .collect()
    }

    /// Creates an object as the API server and the mutating webhook do:
    /// uid, generation 1, the repository label and the finalizer.
    ///
    /// # Errors
    /// The name is taken or the object has no name.
    pub fn create(&mut self, mut object: Value) -> Result<String, ObjectError> {
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let name = object["metadata"]["name"]
            .as_str()
            .ok_or_else(|| ObjectError::Invalid("metadata.name is required".into()))?
            .to_owned();
        if self.get(&namespace, &name).is_some() {
            return Err(ObjectError::AlreadyExists(name));
        }
        let version = self.next_version();
        let metadata = &mut object["metadata"];
        metadata["namespace"] = json!(namespace);
        metadata["uid"] = json!(uuid::Uuid::new_v4().to_string());
        metadata["generation"] = json!(1);
        metadata["resourceVersion"] = json!(version);
        metadata["creationTimestamp"] = json!(now());
        if let Some(repository) = object["spec"]["repository"].as_str().map(str::to_owned) {
            merge(
                &mut object["metadata"],
                &json!({"labels": {REPOSITORY_LABEL: repository}}),
                true,
            );
        }
        let finalizers = &mut object["metadata"]["finalizers"];
        if !finalizers.is_array() {
            *finalizers = json!([]);
        }
        if let Some(list) = finalizers.as_array_mut()
            && !list.iter().any(|f| f == PACKAGE_REVISION_FINALIZER)
        {
            list.push(json!(PACKAGE_REVISION_FINALIZER));
        }
        self.package_revisions
            .insert(key(&namespace, &name), object);
        Ok(name)
    }

    /// Changes an object with `edit`, bumping the generation when the spec
    /// changed; an object left with a deletion timestamp and no finalizers
    /// goes.
    ///
    /// # Errors
    /// No such object.
    pub fn update(
        &mut self,
        namespace: &str,
        name: &str,
        edit: impl FnOnce(&mut Value),
    ) -> Result<(), ObjectError> {
        let version = self.next_version();
        let k = key(namespace, name);
        let object = self
            .package_revisions
            .get_mut(&k)
            .ok_or_else(|| ObjectError::NotFound(name.to_owned()))?;
        let before = object["spec"].clone();
        edit(object);
        if object["spec"] != before {
            let generation = object["metadata"]["generation"].as_i64().unwrap_or(0);
            object["metadata"]["generation"] = json!(generation + 1);
        }
        object["metadata"]["resourceVersion"] = json!(version);
        let gone = !object["metadata"]["deletionTimestamp"].is_null()
            && object["metadata"]["finalizers"]
                .as_array()
                .is_none_or(Vec::is_empty);
        if gone {
            self.package_revisions.remove(&k);
        }
        Ok(())
    }

    /// Deletes an object: marked for deletion while finalizers remain.
    ///
    /// # Errors
    /// No such object.
    pub fn delete(&mut self, namespace: &str, name: &str) -> Result<(), ObjectError> {
        self.update(namespace, name, |object| {
            if object["metadata"]["deletionTimestamp"].is_null() {
                object["metadata"]["deletionTimestamp"] = json!(now());
            }
        })
    }

    /// Applies a handler's Outcome. A patch whose guard fails is skipped
    /// (the object changed; the next round plans again); returns how many
    /// were skipped.
    pub fn apply_outcome(&mut self, outcome: &Outcome) -> usize {
        let mut conflicts = 0;
        // The patches of one Outcome are one change: each is guarded by the
        // version the handler saw, so after this Outcome's own write to an
        // object, later patches to it are checked against the new version.
        let mut written: BTreeMap<String, (String, String)> = BTreeMap::new();
        for patch in &outcome.patches {
            let target = &patch.target;
            let k = key(&target.namespace, &target.name);
            let Some(object) = self.get(&target.namespace, &target.name).cloned() else {
                conflicts += 1;
                continue;
            };
            let mut operations = patch.patch.clone();
            if let Some((seen, now)) = written.get(&k)
                && let Some(json_patch::PatchOperation::Test(test)) = operations.0.first_mut()
                && test.path.as_str() == "/metadata/resourceVersion"
                && test.value == json!(seen)
            {
                test.value = json!(now);
            }
            let seen = object["metadata"]["resourceVersion"].clone();
            let mut patched = object;
            if json_patch::patch(&mut patched, &operations).is_err() {
                conflicts += 1;
                continue;
            }
            let subresource = patch.subresource;
            let _ = self.update(&target.namespace, &target.name, |object| {
                match subresource {
                    Subresource::Status => object["status"] = patched["status"].take(),
                    Subresource::Main => {
                        let status = object["status"].take();
                        *object = patched;
                        object["status"] = status;
                    }
                }
                if object["status"].is_null()
                    && let Some(map) = object.as_object_mut()
                {
                    map.remove("status");
                }
            });
            if let Some(after) = self.package_revisions.get(&k) {
                let first_seen = written.get(&k).map_or_else(
                    || seen.as_str().unwrap_or("").to_owned(),
                    |(s, _)| s.clone(),
                );
                let now = after["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned();
                written.insert(k, (first_seen, now));
            }
        }
        for apply in &outcome.apply {
            self.server_side_apply(apply);
        }
        for target in &outcome.delete {
            let _ = self.delete(&target.namespace, &target.name);
        }
        conflicts
    }

    fn server_side_apply(&mut self, apply: &Apply) {
        let namespace = apply.object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let Some(name) = apply.object["metadata"]["name"].as_str().map(str::to_owned) else {
            return;
        };
        if self.get(&namespace, &name).is_none() {
            let mut object = json!({
                "apiVersion": apply.object["apiVersion"],
                "kind": apply.object["kind"],
                "metadata": {"name": name, "namespace": namespace},
                "spec": {},
            });
            let version = self.next_version();
            object["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
            object["metadata"]["generation"] = json!(1);
            object["metadata"]["resourceVersion"] = json!(version);
            object["metadata"]["creationTimestamp"] = json!(now());
            self.package_revisions
                .insert(key(&namespace, &name), object);
        }
        let (fields, force) = (apply.object.clone(), apply.force);
        let subresource = apply.subresource;
        let _ = self.update(&namespace, &name, |object| {
            let mut fields = fields;
            if let Some(map) = fields.as_object_mut() {
                map.remove("apiVersion");
                map.remove("kind");
                if subresource == Subresource::Status {
                    map.retain(|k, _| k == "status");
                } else {
                    map.remove("status");
                }
                if let Some(metadata) = map.get_mut("metadata").and_then(Value::as_object_mut) {
                    metadata.remove("name");
                    metadata.remove("namespace");
                    // lists the apply owns are replaced whole
                    if let Some(owners) = metadata.remove("ownerReferences") {
                        object["metadata"]["ownerReferences"] = owners;
                    }
                }
            }
            merge(object, &fields, force);
        });
    }
}

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
        objects.apply_outcome(&outcome);
        if !moved.is_empty() {
            for name in &moved {
                objects
                    .package_revisions
                    .remove(&key(&self.namespace, name));
            }
            let again = self.sync_once(objects, repository).await?;
            objects.apply_outcome(&again);
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
                    objects.apply_outcome(&outcome);
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

/// The upstream a clone names.
fn upstream_of(pr: &PackageRevision, all: &[PackageRevision]) -> Option<PackageRevision> {
    // a clone's upstream, or the new upstream of an upgrade (its old
    // upstream lives in the same repository)
    let source = pr.spec.source.as_ref()?;
    let name = match (&source.clone_from, &source.upgrade) {
        (Some(clone), _) => clone.upstream_ref.as_ref()?.name.clone(),
        (None, Some(upgrade)) => upgrade.new_upstream.name.clone(),
        (None, None) => return None,
    };
    all.iter()
        .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
        .cloned()
}

/// Where the objects of a config directory live.
pub fn objects_path(config_dir: &Path) -> PathBuf {
    config_dir.join("objects.json")
}
