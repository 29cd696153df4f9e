//! A cluster in memory: PackageRevision objects kept as an API server
//! keeps them (uid, generation, resourceVersion, finalizers, deletion),
//! with guarded JSON patches and server-side applies. The `porch` CLI keeps
//! its objects in one (saved to a file); the relay's tests run against one.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use porch_api::invocation::{Apply, EventRecord, ObjectPatch, ObjectRef, Outcome, Subresource};
use porch_api::v1alpha2::PackageRevision;
use porch_api::{PACKAGE_REVISION_FINALIZER, REPOSITORY_LABEL};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::cluster::{Cluster, ClusterError, Written};

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
    /// Repositories by `<namespace>/<name>`, as far as Outcomes write them
    /// (the status repository sync sets).
    #[serde(default)]
    pub repositories: BTreeMap<String, Value>,
    /// Objects of every other kind (PackageVariants, the objects they
    /// inject) by `<kind>/<namespace>/<name>`.
    #[serde(default)]
    pub others: BTreeMap<String, Value>,
    /// Events recorded, oldest first (not saved).
    #[serde(skip)]
    pub events: Vec<EventRecord>,
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
/// fields it states: maps merge, `conditions` merge by `type` (a list map
/// in every schema here), everything else is replaced. Without `force`,
/// fields already set are left alone.
fn merge(target: &mut Value, patch: &Value, force: bool) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                match t.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        merge(existing, v, force);
                    }
                    Some(Value::Array(existing)) if k == "conditions" && v.is_array() => {
                        for condition in v.as_array().into_iter().flatten() {
                            match existing.iter_mut().find(|c| c["type"] == condition["type"]) {
                                Some(c) if force => *c = condition.clone(),
                                Some(_) => {}
                                None => existing.push(condition.clone()),
                            }
                        }
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
        if edit_stored(object, &version, edit) {
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

    /// Applies a handler's Outcome as the relay does
    /// ([`crate::cluster::apply_outcome`]); returns how many patches were
    /// skipped because their guard failed (the next round plans again).
    pub async fn apply_outcome(&mut self, outcome: &Outcome) -> usize {
        let cell = Mutex::new(std::mem::take(self));
        let applied = crate::cluster::apply_outcome(&cell, outcome).await;
        *self = cell.into_inner().unwrap_or_else(PoisonError::into_inner);
        applied.map_or(0, |a| a.conflicts.len())
    }

    /// One guarded JSON patch: a guard that fails (or a missing object)
    /// changes nothing.
    pub fn patch(&mut self, patch: &ObjectPatch) -> Written {
        let target = &patch.target;
        if target.kind != "PackageRevision" {
            return self.patch_other(patch);
        }
        let Some(object) = self.get(&target.namespace, &target.name).cloned() else {
            return Written::Missing;
        };
        let mut patched = object;
        if let Err(e) = json_patch::patch(&mut patched, &patch.patch) {
            return Written::Conflict(e.to_string());
        }
        let subresource = patch.subresource;
        let kept = patched.clone();
        let _ = self.update(&target.namespace, &target.name, |object| {
            take_patched(object, patched, subresource);
        });
        // an object whose last finalizer went is gone; report it as written
        Written::Applied(
            self.get(&target.namespace, &target.name)
                .cloned()
                .unwrap_or(kept),
        )
    }

    /// One server-side apply, as the API server merges it.
    pub fn server_side_apply(&mut self, apply: &Apply) -> Written {
        if apply.object["kind"] != "PackageRevision" {
            return self.apply_other(apply);
        }
        let namespace = apply.object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let Some(name) = apply.object["metadata"]["name"].as_str().map(str::to_owned) else {
            return Written::Missing;
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
                    // owner references are a list map keyed by uid: an
                    // apply sets its entries and leaves other managers'
                    if let Some(Value::Array(owners)) = metadata.remove("ownerReferences") {
                        let list = &mut object["metadata"]["ownerReferences"];
                        if !list.is_array() {
                            *list = json!([]);
                        }
                        if let Some(list) = list.as_array_mut() {
                            for owner in owners {
                                match list.iter_mut().find(|o| o["uid"] == owner["uid"]) {
                                    Some(existing) => *existing = owner,
                                    None => list.push(owner),
                                }
                            }
                        }
                    }
                }
            }
            merge(object, &fields, force);
        });
        self.get(&namespace, &name)
            .cloned()
            .map_or(Written::Missing, Written::Applied)
    }
}

/// Changes a stored object with `edit` as the API server would: a new
/// generation when the spec changed, a new resourceVersion; `true` when
/// the object is gone (deleted, and its last finalizer went).
fn edit_stored(object: &mut Value, version: &str, edit: impl FnOnce(&mut Value)) -> bool {
    let before = object["spec"].clone();
    edit(object);
    if object["spec"] != before {
        let generation = object["metadata"]["generation"].as_i64().unwrap_or(0);
        object["metadata"]["generation"] = json!(generation + 1);
    }
    object["metadata"]["resourceVersion"] = json!(version);
    !object["metadata"]["deletionTimestamp"].is_null()
        && object["metadata"]["finalizers"]
            .as_array()
            .is_none_or(Vec::is_empty)
}

/// Takes the patched object's part that `subresource` names (the status,
/// or everything but the status) into the stored object.
fn take_patched(object: &mut Value, mut patched: Value, subresource: Subresource) {
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
}

fn other_key(kind: &str, namespace: &str, name: &str) -> String {
    format!("{kind}/{namespace}/{name}")
}

impl Objects {
    /// Stores an object of any kind but PackageRevision as the API server
    /// creates it (uid, generation 1, a resourceVersion); returns it.
    ///
    /// # Errors
    /// No name, or the name is taken.
    pub fn create_object(&mut self, mut object: Value) -> Result<Value, ObjectError> {
        let kind = object["kind"].as_str().unwrap_or("").to_owned();
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let name = object["metadata"]["name"]
            .as_str()
            .ok_or_else(|| ObjectError::Invalid("metadata.name is required".into()))?
            .to_owned();
        let k = other_key(&kind, &namespace, &name);
        if self.others.contains_key(&k) {
            return Err(ObjectError::AlreadyExists(name));
        }
        let version = self.next_version();
        let metadata = &mut object["metadata"];
        metadata["namespace"] = json!(namespace);
        metadata["uid"] = json!(uuid::Uuid::new_v4().to_string());
        metadata["generation"] = json!(1);
        metadata["resourceVersion"] = json!(version);
        metadata["creationTimestamp"] = json!(now());
        self.others.insert(k, object.clone());
        Ok(object)
    }

    /// An object of any kind but PackageRevision.
    pub fn object(&self, kind: &str, namespace: &str, name: &str) -> Option<&Value> {
        if kind == "Repository" {
            return self.repositories.get(&key(namespace, name));
        }
        self.others.get(&other_key(kind, namespace, name))
    }

    /// Changes an object of any kind but PackageRevision with `edit` as
    /// [`Objects::update`] does (generation, resourceVersion, gone once
    /// deleted without finalizers); returns it, or `None` once gone.
    ///
    /// # Errors
    /// No such object.
    pub fn update_object(
        &mut self,
        kind: &str,
        namespace: &str,
        name: &str,
        edit: impl FnOnce(&mut Value),
    ) -> Result<Option<Value>, ObjectError> {
        let version = self.next_version();
        let k = other_key(kind, namespace, name);
        let object = self
            .others
            .get_mut(&k)
            .ok_or_else(|| ObjectError::NotFound(name.to_owned()))?;
        if edit_stored(object, &version, edit) {
            self.others.remove(&k);
            return Ok(None);
        }
        Ok(Some(object.clone()))
    }

    /// Deletes an object of any kind but PackageRevision: marked for
    /// deletion while finalizers remain.
    ///
    /// # Errors
    /// No such object.
    pub fn delete_object(
        &mut self,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, ObjectError> {
        self.update_object(kind, namespace, name, |object| {
            if object["metadata"]["deletionTimestamp"].is_null() {
                object["metadata"]["deletionTimestamp"] = json!(now());
            }
        })
    }

    fn patch_other(&mut self, patch: &ObjectPatch) -> Written {
        let target = &patch.target;
        let Some(mut patched) = self
            .object(&target.kind, &target.namespace, &target.name)
            .cloned()
        else {
            return Written::Missing;
        };
        if target.kind == "Repository" {
            // Repositories are written by server-side apply only
            return Written::Conflict("patch a Repository by apply".into());
        }
        if let Err(e) = json_patch::patch(&mut patched, &patch.patch) {
            return Written::Conflict(e.to_string());
        }
        let subresource = patch.subresource;
        let kept = patched.clone();
        match self.update_object(&target.kind, &target.namespace, &target.name, |object| {
            take_patched(object, patched, subresource);
        }) {
            Ok(Some(object)) => Written::Applied(object),
            // the last finalizer went: the object is gone, as written
            Ok(None) => Written::Applied(kept),
            Err(_) => Written::Missing,
        }
    }

    /// A server-side apply to a Repository: its status (what repository
    /// sync writes) merged into the one kept, created if new.
    /// A server-side apply to an object of any kind but PackageRevision:
    /// created if new (uid, generation 1), its spec and metadata or its
    /// status merged into the one kept.
    fn apply_other(&mut self, apply: &Apply) -> Written {
        let text = |pointer: &str| apply.object.pointer(pointer).and_then(Value::as_str);
        let (Some(name), namespace, kind) = (
            text("/metadata/name"),
            text("/metadata/namespace").unwrap_or("default"),
            text("/kind").unwrap_or(""),
        ) else {
            return Written::Missing;
        };
        let repository = kind == "Repository";
        let k = if repository {
            key(namespace, name)
        } else {
            other_key(kind, namespace, name)
        };
        let version = self.next_version();
        let map = if repository {
            &mut self.repositories
        } else {
            &mut self.others
        };
        let created = !map.contains_key(&k);
        let object = map.entry(k).or_insert_with(|| {
            json!({
                "apiVersion": apply.object["apiVersion"],
                "kind": kind,
                "metadata": {"name": name, "namespace": namespace,
                             "uid": uuid::Uuid::new_v4().to_string(), "generation": 1,
                             "creationTimestamp": now()},
            })
        });
        let before = object["spec"].clone();
        if apply.subresource == Subresource::Status {
            if let Some(fields) = apply.object.get("status") {
                if object["status"].is_null() {
                    object["status"] = json!({});
                }
                merge(&mut object["status"], fields, apply.force);
            }
        } else {
            if let Some(fields) = apply.object.get("spec") {
                if object["spec"].is_null() {
                    object["spec"] = json!({});
                }
                merge(&mut object["spec"], fields, apply.force);
            }
            if let Some(metadata) = apply.object.get("metadata").and_then(Value::as_object) {
                for (field, value) in metadata {
                    if matches!(field.as_str(), "name" | "namespace") {
                        continue;
                    }
                    match object["metadata"].get_mut(field) {
                        Some(existing) if existing.is_object() => merge(existing, value, true),
                        _ => object["metadata"][field] = value.clone(),
                    }
                }
            }
        }
        if !created && object["spec"] != before {
            let generation = object["metadata"]["generation"].as_i64().unwrap_or(0);
            object["metadata"]["generation"] = json!(generation + 1);
        }
        object["metadata"]["resourceVersion"] = json!(version);
        Written::Applied(object.clone())
    }
}

fn locked(cell: &Mutex<Objects>) -> std::sync::MutexGuard<'_, Objects> {
    cell.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Cluster for Mutex<Objects> {
    async fn get(&self, target: &ObjectRef) -> Result<Option<Value>, ClusterError> {
        let objects = locked(self);
        Ok(if target.kind == "PackageRevision" {
            objects.get(&target.namespace, &target.name).cloned()
        } else {
            objects
                .object(&target.kind, &target.namespace, &target.name)
                .cloned()
        })
    }

    async fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
    ) -> Result<Vec<Value>, ClusterError> {
        let objects = locked(self);
        let all: Box<dyn Iterator<Item = &Value>> = match kind {
            "PackageRevision" => Box::new(objects.package_revisions.values()),
            "Repository" => Box::new(objects.repositories.values()),
            _ => Box::new(objects.others.values()),
        };
        Ok(all
            .filter(|o| {
                o["apiVersion"] == api_version
                    && o["kind"] == kind
                    && o["metadata"]["namespace"] == namespace
            })
            .cloned()
            .collect())
    }

    async fn patch(&self, patch: &ObjectPatch) -> Result<Written, ClusterError> {
        Ok(locked(self).patch(patch))
    }

    async fn apply(&self, apply: &Apply) -> Result<Written, ClusterError> {
        Ok(locked(self).server_side_apply(apply))
    }

    async fn delete(&self, target: &ObjectRef) -> Result<(), ClusterError> {
        // one already gone is not an error
        let mut objects = locked(self);
        if target.kind == "PackageRevision" {
            let _ = objects.delete(&target.namespace, &target.name);
        } else {
            let _ = objects.delete_object(&target.kind, &target.namespace, &target.name);
        }
        Ok(())
    }

    async fn record(&self, event: &EventRecord) -> Result<(), ClusterError> {
        locked(self).events.push(event.clone());
        Ok(())
    }
}
