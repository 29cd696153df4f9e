//! The relay's core: the objects it has seen, a work queue of revisions,
//! the planner deciding the operation due, the invoker running it and the
//! Outcome applied through the cluster.
//!
//! - One queue entry per revision (events for a queued revision coalesce);
//!   operations on one repository run one at a time, so handlers rarely
//!   race on a branch; at most `concurrency` run at once, renders at most
//!   `render_concurrency`.
//! - An Invocation is planned once: a redelivery (after a retryable error)
//!   carries the same `time` and the next `attempt`, so the handler gives
//!   the same Outcome and recognises its own commit.
//! - Retryable errors back off exponentially with jitter; an Invocation the
//!   handler calls invalid is reported as a Warning Event and not retried
//!   until the object changes (the reference swallows both: spec §9 item 4).
//! - A patch whose guard fails means the object changed: the relay reads it
//!   again and plans again, never overwrites.
//! - Writes are read back into the relay's view at once, so the next step
//!   does not wait for the watch.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use porch_api::invocation::{
    Apply, EventRecord, EventType, Invocation, ObjectRef, Operation, Outcome, Subresource,
};
use porch_api::planner;
use porch_api::repository::Repository;
use porch_api::v1alpha2::PackageRevision;
use porch_api::variant::{PACKAGE_VARIANT_SET_LABEL, PackageVariant, PackageVariantSet};
use serde_json::Value;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use crate::cluster::{Cluster, ClusterError, WriteFailure, Written, apply_outcome};
use crate::invoker::{InvokeError, Invoker};
use crate::metrics::Metrics;

/// How the relay paces its work.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Handler runs at once (the reference's default: 50).
    pub concurrency: usize,
    /// Render runs at once (the reference's default: 20).
    pub render_concurrency: usize,
    /// The first pause after a retryable error; doubled per attempt.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// How often each Repository is synced with git (discovery of
    /// revisions made or deleted outside the API). The reference checks
    /// health every 5 minutes and syncs fully every hour; a sync here
    /// costs a fetch of what changed, so it runs at the health-check pace.
    pub sync_interval: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            concurrency: 50,
            render_concurrency: 20,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(300),
            sync_interval: Duration::from_secs(300),
        }
    }
}

/// What the relay has done, for `/metrics` and tests.
#[derive(Debug, Default)]
pub struct Stats {
    pub invocations: AtomicU64,
    pub succeeded: AtomicU64,
    pub retried: AtomicU64,
    pub invalid: AtomicU64,
    pub conflicts: AtomicU64,
    pub syncs: AtomicU64,
}

/// `<namespace>/<name>`.
type Key = String;

fn key_of(namespace: Option<&str>, name: Option<&str>) -> Key {
    format!("{}/{}", namespace.unwrap_or("default"), name.unwrap_or(""))
}

fn revision_key(pr: &PackageRevision) -> Key {
    key_of(
        pr.metadata.namespace.as_deref(),
        pr.metadata.name.as_deref(),
    )
}

/// One queue entry: a revision to plan for, a Repository to sync, or a
/// PackageVariant to reconcile.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Work {
    Revision(Key),
    Sync(Key),
    Variant(Key),
    VariantSet(Key),
}

/// `(namespace, repository, package)`: what a variant names upstream and
/// downstream.
type PackageKey = (String, String, String);

/// An Invocation planned for one version of a revision.
#[derive(Debug, Clone)]
struct Delivery {
    operation: Operation,
    resource_version: String,
    time: Time,
    attempt: u32,
    request_id: String,
}

#[derive(Debug, Default)]
struct State {
    revisions: BTreeMap<Key, PackageRevision>,
    /// Each revision's Repository (`<namespace>/<repository>`), and each
    /// Repository's revisions: kept with `revisions` by `put` and `remove`.
    repository_of: BTreeMap<Key, Key>,
    members: BTreeMap<Key, BTreeSet<Key>>,
    repositories: BTreeMap<Key, Repository>,
    /// Revisions and Repositories with work to look at, and from when.
    queue: BTreeMap<Work, Instant>,
    in_flight: BTreeSet<Work>,
    busy_repositories: BTreeSet<Key>,
    deliveries: BTreeMap<Key, Delivery>,
    /// (operation, resourceVersion) an invalid Invocation was refused at.
    refused: BTreeMap<Key, (Operation, String)>,
    variants: BTreeMap<Key, PackageVariant>,
    /// Each variant's downstream Repository, its uid, and the variants
    /// naming each package (upstream or downstream): a revision's event
    /// wakes only the variants that own it or name its package.
    variant_repository: BTreeMap<Key, Key>,
    variant_uids: BTreeMap<String, Key>,
    variants_by_package: BTreeMap<PackageKey, BTreeSet<Key>>,
    /// The variants each in-cluster object may be injected into, by
    /// `(namespace, kind, name)` of their injectors.
    variants_by_injectable: BTreeMap<PackageKey, BTreeSet<Key>>,
    /// The revisions each variant (by uid) owns.
    owned_by_variant: BTreeMap<String, BTreeSet<Key>>,
    /// A refused variant's (or variant set's) resourceVersion.
    refused_variants: BTreeMap<Key, String>,
    sets: BTreeMap<Key, PackageVariantSet>,
    /// Each set's upstream Repository, its uid, and the sets naming each
    /// upstream package.
    set_repository: BTreeMap<Key, Key>,
    set_uids: BTreeMap<String, Key>,
    sets_by_package: BTreeMap<PackageKey, BTreeSet<Key>>,
}

impl State {
    fn repository_key<'a>(&'a self, work: &'a Work) -> Option<&'a Key> {
        match work {
            Work::Sync(repository) => Some(repository),
            Work::Revision(key) => self.repository_of.get(key),
            Work::Variant(key) => self.variant_repository.get(key),
            Work::VariantSet(key) => self.set_repository.get(key),
        }
    }

    /// Keeps a revision and its place in the repository index.
    fn put(&mut self, key: Key, pr: PackageRevision) {
        self.unindex_owners(&key);
        for r in variant_owners(&pr) {
            self.owned_by_variant
                .entry(r.to_owned())
                .or_default()
                .insert(key.clone());
        }
        let repository = key_of(pr.metadata.namespace.as_deref(), Some(&pr.spec.repository));
        if let Some(old) = self.repository_of.insert(key.clone(), repository.clone())
            && old != repository
            && let Some(set) = self.members.get_mut(&old)
        {
            set.remove(&key);
        }
        self.members
            .entry(repository)
            .or_default()
            .insert(key.clone());
        self.revisions.insert(key, pr);
    }

    fn remove(&mut self, key: &Key) {
        self.unindex_owners(key);
        self.revisions.remove(key);
        if let Some(repository) = self.repository_of.remove(key)
            && let Some(set) = self.members.get_mut(&repository)
        {
            set.remove(key);
        }
    }

    /// Takes a revision out of the owner index (before it changes or goes).
    fn unindex_owners(&mut self, key: &Key) {
        let Some(old) = self.revisions.get(key) else {
            return;
        };
        let uids: Vec<String> = variant_owners(old).map(str::to_owned).collect();
        for uid in uids {
            if let Some(set) = self.owned_by_variant.get_mut(&uid) {
                set.remove(key);
                if set.is_empty() {
                    self.owned_by_variant.remove(&uid);
                }
            }
        }
    }

    /// Keeps a variant and its places in the indexes.
    fn put_variant(&mut self, key: Key, pv: PackageVariant) {
        self.unindex_variant(&key);
        let namespace = pv
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        if let Some(uid) = &pv.metadata.uid {
            self.variant_uids.insert(uid.clone(), key.clone());
        }
        let upstream = pv.spec.upstream.clone().unwrap_or_default();
        let downstream = pv.spec.downstream.clone().unwrap_or_default();
        for (repo, package) in [
            (upstream.repo, upstream.package),
            (downstream.repo.clone(), downstream.package),
        ] {
            self.variants_by_package
                .entry((namespace.clone(), repo, package))
                .or_default()
                .insert(key.clone());
        }
        self.variant_repository.insert(
            key.clone(),
            key_of(Some(&namespace), Some(&downstream.repo)),
        );
        for injector in &pv.spec.injectors {
            self.variants_by_injectable
                .entry((
                    namespace.clone(),
                    injector.kind.clone().unwrap_or_else(|| "ConfigMap".into()),
                    injector.name.clone(),
                ))
                .or_default()
                .insert(key.clone());
        }
        // the set that made it looks again
        self.enqueue_set_of(&pv, Instant::now());
        self.variants.insert(key, pv);
    }

    /// Keeps a variant set and its places in the indexes.
    fn put_set(&mut self, key: Key, set: PackageVariantSet) {
        self.unindex_set(&key);
        let namespace = set
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        if let Some(uid) = &set.metadata.uid {
            self.set_uids.insert(uid.clone(), key.clone());
        }
        let upstream = set.spec.upstream.clone().unwrap_or_default();
        self.sets_by_package
            .entry((namespace.clone(), upstream.repo.clone(), upstream.package))
            .or_default()
            .insert(key.clone());
        self.set_repository
            .insert(key.clone(), key_of(Some(&namespace), Some(&upstream.repo)));
        self.sets.insert(key, set);
    }

    fn unindex_set(&mut self, key: &Key) {
        let Some(old) = self.sets.remove(key) else {
            return;
        };
        if let Some(uid) = &old.metadata.uid {
            self.set_uids.remove(uid);
        }
        self.set_repository.remove(key);
        for set in self.sets_by_package.values_mut() {
            set.remove(key);
        }
        self.sets_by_package.retain(|_, set| !set.is_empty());
    }

    /// Wakes the set that made `pv`, if any.
    fn enqueue_set_of(&mut self, pv: &PackageVariant, at: Instant) {
        let set = pv
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(PACKAGE_VARIANT_SET_LABEL))
            .and_then(|uid| self.set_uids.get(uid))
            .cloned();
        if let Some(key) = set {
            self.enqueue(Work::VariantSet(key), at);
        }
    }

    /// Wakes every set of a namespace (a Repository came, went or was
    /// relabelled: selectors may choose differently).
    fn enqueue_sets_in(&mut self, namespace: &str, at: Instant) {
        let keys: Vec<Key> = self
            .sets
            .iter()
            .filter(|(_, s)| s.metadata.namespace.as_deref().unwrap_or("default") == namespace)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            self.enqueue(Work::VariantSet(key), at);
        }
    }

    fn unindex_variant(&mut self, key: &Key) {
        let Some(old) = self.variants.remove(key) else {
            return;
        };
        self.enqueue_set_of(&old, Instant::now());
        if let Some(uid) = &old.metadata.uid {
            self.variant_uids.remove(uid);
        }
        self.variant_repository.remove(key);
        for index in [
            &mut self.variants_by_package,
            &mut self.variants_by_injectable,
        ] {
            for set in index.values_mut() {
                set.remove(key);
            }
            index.retain(|_, set| !set.is_empty());
        }
    }

    /// The variants a revision's change may matter to: those owning it
    /// and those naming its package.
    fn variants_of(&self, pr: &PackageRevision) -> Vec<Key> {
        let mut keys: BTreeSet<Key> = variant_owners(pr)
            .filter_map(|uid| self.variant_uids.get(uid).cloned())
            .collect();
        let package = (
            pr.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            pr.spec.repository.clone(),
            pr.spec.package_name.clone(),
        );
        if let Some(set) = self.variants_by_package.get(&package) {
            keys.extend(set.iter().cloned());
        }
        keys.into_iter().collect()
    }

    fn enqueue_variants_of(&mut self, pr: &PackageRevision, at: Instant) {
        for key in self.variants_of(pr) {
            self.enqueue(Work::Variant(key), at);
        }
        let package = (
            pr.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            pr.spec.repository.clone(),
            pr.spec.package_name.clone(),
        );
        let sets: Vec<Key> = self
            .sets_by_package
            .get(&package)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        for key in sets {
            self.enqueue(Work::VariantSet(key), at);
        }
    }

    fn enqueue(&mut self, work: Work, at: Instant) {
        self.queue
            .entry(work)
            .and_modify(|due| *due = (*due).min(at))
            .or_insert(at);
    }

    /// The next work due by `now` that is not running and whose repository
    /// is free; it is marked running.
    fn take_ready(&mut self, now: Instant) -> Option<Work> {
        let work = self
            .queue
            .iter()
            .filter(|(_, due)| **due <= now)
            .map(|(w, _)| w)
            .find(|w| {
                !self.in_flight.contains(*w)
                    && self
                        .repository_key(w)
                        .is_none_or(|r| !self.busy_repositories.contains(r))
            })?
            .clone();
        self.queue.remove(&work);
        self.in_flight.insert(work.clone());
        if let Some(repository) = self.repository_key(&work).cloned() {
            self.busy_repositories.insert(repository);
        }
        Some(work)
    }

    fn release(&mut self, work: &Work, repository: Option<&Key>) {
        self.in_flight.remove(work);
        if let Some(repository) = repository {
            self.busy_repositories.remove(repository);
        }
    }

    fn store(&mut self, object: &Value) {
        if object["kind"] == "Repository" {
            // the status a sync wrote: kept, so the next status write
            // compares with it; no revision needs planning for it
            let key = key_of(
                object["metadata"]["namespace"].as_str(),
                object["metadata"]["name"].as_str(),
            );
            if let Some(known) = self.repositories.get_mut(&key)
                && let Ok(status) = serde_json::from_value(object["status"].clone())
            {
                known.status = Some(status);
                known.metadata.resource_version = object["metadata"]["resourceVersion"]
                    .as_str()
                    .map(str::to_owned);
            }
            return;
        }
        if object["kind"] == "PackageVariantSet" {
            if let Ok(set) = serde_json::from_value::<PackageVariantSet>(object.clone()) {
                let key = key_of(
                    set.metadata.namespace.as_deref(),
                    set.metadata.name.as_deref(),
                );
                let gone = set.metadata.deletion_timestamp.is_some()
                    && set.metadata.finalizers.as_ref().is_none_or(Vec::is_empty);
                let stale = self.sets.get(&key).is_some_and(|known| {
                    !newer(
                        &set.metadata.resource_version,
                        &known.metadata.resource_version,
                    )
                });
                if gone {
                    self.unindex_set(&key);
                } else if !stale {
                    self.put_set(key, set);
                }
            }
            return;
        }
        if object["kind"] == "PackageVariant" {
            if let Ok(pv) = serde_json::from_value::<PackageVariant>(object.clone()) {
                let key = key_of(
                    pv.metadata.namespace.as_deref(),
                    pv.metadata.name.as_deref(),
                );
                let gone = pv.metadata.deletion_timestamp.is_some()
                    && pv.metadata.finalizers.as_ref().is_none_or(Vec::is_empty);
                let stale = self.variants.get(&key).is_some_and(|known| {
                    !newer(
                        &pv.metadata.resource_version,
                        &known.metadata.resource_version,
                    )
                });
                if gone {
                    self.unindex_variant(&key);
                } else if stale {
                    // the view already holds a newer version (a watch event
                    // that overtook this write's answer): look at that one
                    self.enqueue(Work::Variant(key), Instant::now());
                } else {
                    // written by an Outcome (a set made or deleted it, or
                    // its own status): reconciled again with what it is now
                    self.put_variant(key.clone(), pv);
                    self.enqueue(Work::Variant(key), Instant::now());
                }
            }
            return;
        }
        if object["kind"] != "PackageRevision" {
            return;
        }
        if let Ok(pr) = serde_json::from_value::<PackageRevision>(object.clone()) {
            self.enqueue_variants_of(&pr, Instant::now());
            let key = revision_key(&pr);
            // a write that released the last finalizer of an object being
            // deleted leaves nothing: the API server removes it
            let gone = pr.metadata.deletion_timestamp.is_some()
                && pr.metadata.finalizers.as_ref().is_none_or(Vec::is_empty);
            // A write's answer can arrive after a newer version of the same
            // object was observed (a client changed it meanwhile): the view
            // keeps the newer one, or that change would never be planned.
            let stale = self.revisions.get(&key).is_some_and(|known| {
                !newer(
                    &pr.metadata.resource_version,
                    &known.metadata.resource_version,
                )
            });
            if gone {
                self.remove(&key);
            } else if !stale {
                self.put(key, pr);
            }
        }
    }
}

/// The relay: feed it objects, run it, and it keeps them converging.
#[derive(Debug)]
pub struct Relay<C, I> {
    cluster: Arc<C>,
    invoker: Arc<I>,
    config: RelayConfig,
    state: Mutex<State>,
    wake: Notify,
    renders: Semaphore,
    pub stats: Stats,
    pub metrics: Metrics,
}

impl<C: Cluster + 'static, I: Invoker + 'static> Relay<C, I> {
    pub fn new(cluster: Arc<C>, invoker: Arc<I>, config: RelayConfig) -> Self {
        let renders = Semaphore::new(config.render_concurrency.max(1));
        Relay {
            cluster,
            invoker,
            config,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            renders,
            stats: Stats::default(),
            metrics: Metrics::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A revision was added or changed: keep it and look at it now.
    pub fn observe_revision(&self, pr: PackageRevision) {
        let key = revision_key(&pr);
        {
            let mut state = self.state();
            if let Some(known) = state.revisions.get(&key)
                && !newer(
                    &pr.metadata.resource_version,
                    &known.metadata.resource_version,
                )
            {
                // the echo of the relay's own write, or an older event
                return;
            }
            state.enqueue_variants_of(&pr, Instant::now());
            state.put(key.clone(), pr);
            state.enqueue(Work::Revision(key), Instant::now());
        }
        self.wake.notify_one();
    }

    /// A PackageVariant was added or changed: keep it and reconcile it.
    pub fn observe_variant(&self, pv: PackageVariant) {
        let key = key_of(
            pv.metadata.namespace.as_deref(),
            pv.metadata.name.as_deref(),
        );
        {
            let mut state = self.state();
            if let Some(known) = state.variants.get(&key)
                && !newer(
                    &pv.metadata.resource_version,
                    &known.metadata.resource_version,
                )
            {
                return;
            }
            state.put_variant(key.clone(), pv);
            state.enqueue(Work::Variant(key), Instant::now());
        }
        self.wake.notify_one();
    }

    /// A PackageVariant is gone.
    pub fn forget_variant(&self, namespace: &str, name: &str) {
        let key = key_of(Some(namespace), Some(name));
        let mut state = self.state();
        state.unindex_variant(&key);
        state.queue.remove(&Work::Variant(key.clone()));
        state.refused_variants.remove(&key);
    }

    /// Forgets the PackageVariants a complete list no longer holds.
    pub fn retain_variants(&self, listed: &BTreeSet<(String, String)>) {
        let mut state = self.state();
        for key in unlisted(&state.variants, listed, |pv| &pv.metadata) {
            state.unindex_variant(&key);
            state.queue.remove(&Work::Variant(key.clone()));
            state.refused_variants.remove(&key);
        }
    }

    /// A PackageVariantSet was added or changed: keep it and reconcile it.
    pub fn observe_variant_set(&self, set: PackageVariantSet) {
        let key = key_of(
            set.metadata.namespace.as_deref(),
            set.metadata.name.as_deref(),
        );
        {
            let mut state = self.state();
            if let Some(known) = state.sets.get(&key)
                && !newer(
                    &set.metadata.resource_version,
                    &known.metadata.resource_version,
                )
            {
                return;
            }
            state.put_set(key.clone(), set);
            state.enqueue(Work::VariantSet(key), Instant::now());
        }
        self.wake.notify_one();
    }

    /// A PackageVariantSet is gone.
    pub fn forget_variant_set(&self, namespace: &str, name: &str) {
        let key = key_of(Some(namespace), Some(name));
        let mut state = self.state();
        state.unindex_set(&key);
        state.queue.remove(&Work::VariantSet(key.clone()));
        state.refused_variants.remove(&format!("set:{key}"));
    }

    /// Forgets the PackageVariantSets a complete list no longer holds.
    pub fn retain_variant_sets(&self, listed: &BTreeSet<(String, String)>) {
        let mut state = self.state();
        for key in unlisted(&state.sets, listed, |s| &s.metadata) {
            state.unindex_set(&key);
            state.queue.remove(&Work::VariantSet(key.clone()));
        }
    }

    /// An in-cluster object of a kind some variant injects changed (or
    /// went): the variants whose injectors name it are reconciled again.
    pub fn observe_injectable(&self, kind: &str, namespace: &str, name: &str) {
        {
            let mut state = self.state();
            let keys: Vec<Key> = state
                .variants_by_injectable
                .get(&(namespace.to_owned(), kind.to_owned(), name.to_owned()))
                .into_iter()
                .flatten()
                .cloned()
                .collect();
            if keys.is_empty() {
                return;
            }
            for key in keys {
                state.enqueue(Work::Variant(key), Instant::now());
            }
        }
        self.wake.notify_one();
    }

    /// The kinds (`apiVersion`, `kind`) the variants' injectors name: the
    /// relay watches them (a ConfigMap when an injector names no kind).
    pub fn injectable_kinds(&self) -> BTreeSet<(String, String)> {
        self.state()
            .variants
            .values()
            .flat_map(|pv| pv.spec.injectors.iter())
            .map(|i| {
                let version = i.version.clone().unwrap_or_else(|| "v1".into());
                let api_version = match i.group.as_deref() {
                    None | Some("") => version,
                    Some(group) => format!("{group}/{version}"),
                };
                (
                    api_version,
                    i.kind.clone().unwrap_or_else(|| "ConfigMap".into()),
                )
            })
            .collect()
    }

    /// The relay's view of a PackageVariant.
    pub fn variant(&self, namespace: &str, name: &str) -> Option<PackageVariant> {
        self.state()
            .variants
            .get(&key_of(Some(namespace), Some(name)))
            .cloned()
    }

    /// Forgets the revisions a complete list no longer holds (deleted
    /// while the watch was away).
    pub fn retain_revisions(&self, listed: &BTreeSet<(String, String)>) {
        let mut state = self.state();
        for key in unlisted(&state.revisions, listed, |pr| &pr.metadata) {
            state.remove(&key);
            state.queue.remove(&Work::Revision(key.clone()));
            state.deliveries.remove(&key);
            state.refused.remove(&key);
        }
    }

    /// Forgets the Repositories a complete list no longer holds.
    pub fn retain_repositories(&self, listed: &BTreeSet<(String, String)>) {
        let mut state = self.state();
        for key in unlisted(&state.repositories, listed, |r| &r.metadata) {
            state.queue.remove(&Work::Sync(key.clone()));
            state.repositories.remove(&key);
        }
    }

    /// A revision is gone.
    pub fn forget_revision(&self, namespace: &str, name: &str) {
        let key = key_of(Some(namespace), Some(name));
        let mut state = self.state();
        if let Some(pr) = state.revisions.get(&key).cloned() {
            state.enqueue_variants_of(&pr, Instant::now());
        }
        state.remove(&key);
        state.queue.remove(&Work::Revision(key.clone()));
        state.deliveries.remove(&key);
        state.refused.remove(&key);
    }

    /// A Repository was added or changed: keep it and look at its
    /// revisions again.
    pub fn observe_repository(&self, repository: Repository) {
        let namespace = repository.metadata.namespace.clone();
        let name = repository.metadata.name.clone().unwrap_or_default();
        {
            let mut state = self.state();
            let repository_key = key_of(namespace.as_deref(), Some(&name));
            let known = state.repositories.get(&repository_key);
            if known.is_some_and(|k| {
                k.metadata.resource_version.is_some()
                    && k.metadata.resource_version == repository.metadata.resource_version
            }) {
                return;
            }
            // a new Repository or a new spec syncs now; a status change
            // (most often the relay's own sync status) waits for the next
            // periodic sync and plans nothing
            let spec_changed = known.is_none_or(|k| k.spec != repository.spec);
            let deleting_changed = known.is_some_and(|k| {
                k.metadata.deletion_timestamp != repository.metadata.deletion_timestamp
            });
            if known.is_none_or(|k| k.metadata.labels != repository.metadata.labels) {
                state.enqueue_sets_in(namespace.as_deref().unwrap_or("default"), Instant::now());
            }
            state
                .repositories
                .insert(repository_key.clone(), repository);
            let now = Instant::now();
            if spec_changed {
                state.enqueue(Work::Sync(repository_key), now);
            }
            if !spec_changed && !deleting_changed {
                drop(state);
                self.wake.notify_one();
                return;
            }
            let keys: Vec<Key> = state
                .revisions
                .iter()
                .filter(|(_, pr)| pr.spec.repository == name && pr.metadata.namespace == namespace)
                .map(|(k, _)| k.clone())
                .collect();
            for key in keys {
                state.enqueue(Work::Revision(key), now);
            }
        }
        self.wake.notify_one();
    }

    /// Syncs a Repository now instead of at its next interval.
    pub fn request_sync(&self, namespace: &str, name: &str) {
        self.state().enqueue(
            Work::Sync(key_of(Some(namespace), Some(name))),
            Instant::now(),
        );
        self.wake.notify_one();
    }

    /// A Repository is gone; its revisions are looked at again (their
    /// delete handler releases them).
    pub fn forget_repository(&self, namespace: &str, name: &str) {
        let mut state = self.state();
        state.enqueue_sets_in(namespace, Instant::now());
        state
            .repositories
            .remove(&key_of(Some(namespace), Some(name)));
    }

    /// The relay's view of a revision.
    pub fn revision(&self, namespace: &str, name: &str) -> Option<PackageRevision> {
        self.state()
            .revisions
            .get(&key_of(Some(namespace), Some(name)))
            .cloned()
    }

    /// Revisions and Repositories waiting (due now or later).
    pub fn queue_depth(&self) -> usize {
        self.state().queue.len()
    }

    /// The Prometheus text exposition, the queue depth taken now.
    pub fn encode_metrics(&self) -> String {
        self.metrics
            .queue_depth
            .set(i64::try_from(self.queue_depth()).unwrap_or(i64::MAX));
        self.metrics.encode()
    }

    /// Runs everything due now, one at a time, until nothing is: the
    /// deterministic loop of tests and of one-shot runs. Returns the
    /// handler runs made.
    pub async fn drain(&self) -> usize {
        let mut runs = 0;
        loop {
            let next = self.state().take_ready(Instant::now());
            let Some(work) = next else {
                return runs;
            };
            if self.process(&work).await {
                runs += 1;
            }
        }
    }

    /// Runs until `shutdown` resolves, then lets the runs in flight finish.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let permits = Arc::new(Semaphore::new(self.config.concurrency.max(1)));
        let mut running = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let next = self.state().take_ready(Instant::now());
            if let Some(work) = next {
                let permit = tokio::select! {
                    permit = Arc::clone(&permits).acquire_owned() => permit,
                    () = &mut shutdown => break,
                };
                let Ok(permit) = permit else { break };
                let relay = Arc::clone(&self);
                running.spawn(async move {
                    relay.process(&work).await;
                    drop(permit);
                    relay.wake.notify_one();
                });
                continue;
            }
            let earliest = self.state().queue.values().min().copied();
            let sleep = earliest.map_or(Duration::from_secs(3600), |at| {
                at.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1))
            });
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(sleep) => {}
                () = &mut shutdown => break,
            }
            while running.try_join_next().is_some() {}
        }
        while running.join_next().await.is_some() {}
    }

    /// Plans, invokes and applies for one revision, or syncs one
    /// Repository; `true` when a handler ran.
    async fn process(&self, work: &Work) -> bool {
        let repository_key = self.state().repository_key(work).cloned();
        let ran = match work {
            Work::Revision(key) => match self.plan(key) {
                Some(invocation) => {
                    self.run_invocation(key, invocation).await;
                    true
                }
                None => false,
            },
            Work::Sync(repository) => self.sync(repository).await,
            Work::Variant(key) => self.reconcile_variant(key).await,
            Work::VariantSet(key) => self.reconcile_set(key).await,
        };
        self.state().release(work, repository_key.as_ref());
        if ran {
            self.wake.notify_one();
        }
        ran
    }

    /// The Invocation for a variant: its downstream Repository (a bare
    /// stand-in when there is none, which the handler reports), and the
    /// revisions of its upstream and downstream packages and those it owns.
    fn plan_variant(&self, key: &Key) -> Option<Invocation> {
        let state = self.state();
        let pv = state.variants.get(key)?.clone();
        let version = pv.metadata.resource_version.clone().unwrap_or_default();
        if state.refused_variants.get(key) == Some(&version) {
            return None;
        }
        let namespace = pv
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let uid = pv.metadata.uid.clone().unwrap_or_default();
        let upstream = pv.spec.upstream.clone().unwrap_or_default();
        let downstream = pv.spec.downstream.clone().unwrap_or_default();
        let repository = state
            .repositories
            .get(&key_of(Some(&namespace), Some(&downstream.repo)))
            .cloned()
            .unwrap_or_else(|| Repository {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(downstream.repo.clone()),
                    namespace: Some(namespace.clone()),
                    ..Default::default()
                },
                spec: Default::default(),
                status: None,
            });
        let mut related = Vec::new();
        for (repo, package) in [
            (&upstream.repo, &upstream.package),
            (&downstream.repo, &downstream.package),
        ] {
            for k in state
                .members
                .get(&key_of(Some(&namespace), Some(repo)))
                .into_iter()
                .flatten()
            {
                if let Some(pr) = state.revisions.get(k)
                    && pr.spec.package_name == *package
                    && !related.contains(pr)
                {
                    related.push(pr.clone());
                }
            }
        }
        // owned revisions that are no longer the target (the downstream
        // changed): deleted or orphaned by the handler
        for pr in state
            .owned_by_variant
            .get(&uid)
            .into_iter()
            .flatten()
            .filter_map(|k| state.revisions.get(k))
        {
            if pr.metadata.namespace.as_deref() == Some(namespace.as_str()) && !related.contains(pr)
            {
                related.push(pr.clone());
            }
        }
        Some(Invocation {
            operation: Operation::Variant,
            package_revision: None,
            repository,
            upstream: None,
            upstream_repository: None,
            related,
            package_variant: Some(pv),
            package_variant_set: None,
            variants: Vec::new(),
            repositories: Vec::new(),
            cluster_objects: Vec::new(),
            time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
            attempt: 1,
            request_id: uuid::Uuid::new_v4().to_string(),
        })
    }

    /// The in-cluster objects a variant's injectors name (a ConfigMap when
    /// the injector names no kind), read now.
    async fn injectables(&self, pv: &PackageVariant) -> Vec<Value> {
        let namespace = pv
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let mut found = Vec::new();
        for injector in &pv.spec.injectors {
            let group = injector.group.clone().unwrap_or_default();
            let version = injector.version.clone().unwrap_or_else(|| "v1".into());
            let kind = injector.kind.clone().unwrap_or_else(|| "ConfigMap".into());
            let api_version = if group.is_empty() {
                version
            } else {
                format!("{group}/{version}")
            };
            let target = ObjectRef {
                api_version,
                kind,
                namespace: namespace.clone(),
                name: injector.name.clone(),
                uid: String::new(),
            };
            match self.cluster.get(&target).await {
                Ok(Some(object)) if !found.contains(&object) => found.push(object),
                Ok(_) => {}
                Err(e) => tracing::warn!(object = %target.name, error = %e, "injectable not read"),
            }
        }
        found
    }

    /// Reconciles a variant; `true` when its handler ran.
    async fn reconcile_variant(&self, key: &Key) -> bool {
        let Some(mut invocation) = self.plan_variant(key) else {
            return false;
        };
        let Some(pv) = invocation.package_variant.clone() else {
            return false;
        };
        invocation.cluster_objects = self.injectables(&pv).await;
        let regarding = ObjectRef {
            api_version: "config.porch.kpt.dev/v1alpha1".into(),
            kind: "PackageVariant".into(),
            namespace: pv.metadata.namespace.clone().unwrap_or_default(),
            name: pv.metadata.name.clone().unwrap_or_default(),
            uid: pv.metadata.uid.clone().unwrap_or_default(),
        };
        let version = pv.metadata.resource_version.clone().unwrap_or_default();
        self.run_keyed(
            Work::Variant(key.clone()),
            key.clone(),
            invocation,
            regarding,
            version,
        )
        .await;
        true
    }

    /// The Invocation for a variant set: its upstream Repository (a bare
    /// stand-in when there is none), the revisions of its upstream
    /// package, the variants it made and the namespace's Repositories.
    fn plan_set(&self, key: &Key) -> Option<Invocation> {
        let state = self.state();
        let set = state.sets.get(key)?.clone();
        let version = set.metadata.resource_version.clone().unwrap_or_default();
        if state.refused_variants.get(&format!("set:{key}")) == Some(&version) {
            return None;
        }
        let namespace = set
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let uid = set.metadata.uid.clone().unwrap_or_default();
        let upstream = set.spec.upstream.clone().unwrap_or_default();
        let repositories: Vec<Repository> = state
            .repositories
            .values()
            .filter(|r| r.metadata.namespace.as_deref() == Some(namespace.as_str()))
            .cloned()
            .collect();
        let repository = repositories
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(upstream.repo.as_str()))
            .cloned()
            .unwrap_or_else(|| Repository {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(upstream.repo.clone()),
                    namespace: Some(namespace.clone()),
                    ..Default::default()
                },
                spec: Default::default(),
                status: None,
            });
        let related = state
            .members
            .get(&key_of(Some(&namespace), Some(&upstream.repo)))
            .into_iter()
            .flatten()
            .filter_map(|k| state.revisions.get(k))
            .filter(|pr| pr.spec.package_name == upstream.package)
            .cloned()
            .collect();
        let variants = state
            .variants
            .values()
            .filter(|pv| {
                pv.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(PACKAGE_VARIANT_SET_LABEL))
                    == Some(&uid)
            })
            .cloned()
            .collect();
        Some(Invocation {
            operation: Operation::VariantSet,
            package_revision: None,
            repository,
            upstream: None,
            upstream_repository: None,
            related,
            package_variant: None,
            package_variant_set: Some(set),
            variants,
            repositories,
            cluster_objects: Vec::new(),
            time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
            attempt: 1,
            request_id: uuid::Uuid::new_v4().to_string(),
        })
    }

    /// Reconciles a variant set; `true` when its handler ran.
    async fn reconcile_set(&self, key: &Key) -> bool {
        let Some(mut invocation) = self.plan_set(key) else {
            return false;
        };
        let Some(set) = invocation.package_variant_set.clone() else {
            return false;
        };
        // the objects its object selectors choose from, listed now
        let namespace = set
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let mut kinds: Vec<(String, String)> = set
            .spec
            .targets
            .iter()
            .filter_map(|t| t.object_selector.as_ref())
            .map(|o| (o.api_version.clone(), o.kind.clone()))
            .filter(|(v, k)| !(v == "config.porch.kpt.dev/v1alpha1" && k == "Repository"))
            .collect();
        kinds.sort();
        kinds.dedup();
        for (api_version, kind) in kinds {
            match self.cluster.list(&api_version, &kind, &namespace).await {
                Ok(objects) => invocation.cluster_objects.extend(objects),
                Err(e) => {
                    // an unreadable kind must not look like an empty one
                    // (that would remove its variants): try again later
                    tracing::warn!(set = %key, kind = %kind, error = %e, "objects not listed");
                    let pause = self.backoff(1);
                    self.state()
                        .enqueue(Work::VariantSet(key.clone()), Instant::now() + pause);
                    return false;
                }
            }
        }
        let regarding = ObjectRef {
            api_version: "config.porch.kpt.dev/v1alpha2".into(),
            kind: "PackageVariantSet".into(),
            namespace: set.metadata.namespace.clone().unwrap_or_default(),
            name: set.metadata.name.clone().unwrap_or_default(),
            uid: set.metadata.uid.clone().unwrap_or_default(),
        };
        let version = set.metadata.resource_version.clone().unwrap_or_default();
        self.run_keyed(
            Work::VariantSet(key.clone()),
            format!("set:{key}"),
            invocation,
            regarding,
            version,
        )
        .await;
        true
    }

    /// Invokes the handler of a variant or variant set and applies its
    /// Outcome: retried with backoff, refused with a Warning Event on the
    /// object (not again until it changes), and looked at again when the
    /// Outcome changed something or asks to.
    async fn run_keyed(
        &self,
        work: Work,
        key: String,
        invocation: Invocation,
        regarding: ObjectRef,
        version: String,
    ) {
        let operation = invocation.operation;
        self.stats.invocations.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let result = self.invoker.invoke(&invocation).await;
        let label = match &result {
            Ok(_) => "ok",
            Err(InvokeError::Retryable(_)) => "retryable",
            Err(InvokeError::Invalid(_)) => "invalid",
        };
        self.metrics
            .observe(operation.as_str(), label, started.elapsed());
        let delivery = format!("{}:{key}", operation.as_str());
        let attempt = self
            .state()
            .deliveries
            .get(&delivery)
            .map_or(1, |d| d.attempt + 1);
        let retry = |message: &str| {
            self.stats.retried.fetch_add(1, Ordering::Relaxed);
            self.metrics.retries.inc();
            let pause = self.backoff(attempt);
            tracing::warn!(object = %key, operation = operation.as_str(), attempt, error = %message, "handler failed; retrying");
            let mut state = self.state();
            state.deliveries.insert(
                delivery.clone(),
                Delivery {
                    operation,
                    resource_version: version.clone(),
                    time: Time(k8s_openapi::jiff::Timestamp::now()),
                    attempt,
                    request_id: String::new(),
                },
            );
            state.enqueue(work.clone(), Instant::now() + pause);
        };
        match result {
            Ok(outcome) => match self.settle_outcome(&outcome).await {
                Ok((_, failed)) if failed.is_empty() => {
                    self.stats.succeeded.fetch_add(1, Ordering::Relaxed);
                    let mut state = self.state();
                    state.deliveries.remove(&delivery);
                    let now = Instant::now();
                    if !(outcome.patches.is_empty()
                        && outcome.apply.is_empty()
                        && outcome.delete.is_empty())
                    {
                        state.enqueue(work.clone(), now);
                    }
                    if let Some(seconds) = outcome.requeue_after_seconds {
                        state.enqueue(work.clone(), now + Duration::from_secs(seconds));
                    }
                }
                Ok((_, failed)) => {
                    let message: Vec<String> = failed
                        .iter()
                        .map(|f| format!("{}: {}", f.target, f.message))
                        .collect();
                    retry(&message.join("; "));
                }
                Err(e) => retry(&e.to_string()),
            },
            Err(InvokeError::Retryable(message)) => retry(&message),
            Err(InvokeError::Invalid(message)) => {
                self.stats.invalid.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(object = %key, operation = operation.as_str(), error = %message, "handler refused the invocation");
                self.state().refused_variants.insert(key.clone(), version);
                let event = EventRecord {
                    regarding,
                    type_: EventType::Warning,
                    reason: "InvocationRefused".into(),
                    message: format!("{}: {message}", operation.as_str()),
                };
                if let Err(e) = self.cluster.record(&event).await {
                    tracing::warn!(error = %e, "event not recorded");
                }
            }
        }
    }

    /// Syncs a Repository with git: revisions discovered are applied,
    /// stale ones deleted; the next sync is scheduled.
    async fn sync(&self, repository_key: &Key) -> bool {
        let invocation = {
            let state = self.state();
            let Some(repository) = state.repositories.get(repository_key).cloned() else {
                return false;
            };
            let related = state
                .revisions
                .values()
                .filter(|p| p.metadata.namespace == repository.metadata.namespace)
                .cloned()
                .collect();
            Invocation {
                operation: Operation::Sync,
                package_revision: None,
                repository,
                upstream: None,
                upstream_repository: None,
                related,
                package_variant: None,
                package_variant_set: None,
                variants: Vec::new(),
                repositories: Vec::new(),
                cluster_objects: Vec::new(),
                time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                attempt: 1,
                request_id: uuid::Uuid::new_v4().to_string(),
            }
        };
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        self.stats.invocations.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let result = self.invoker.invoke(&invocation).await;
        self.metrics.observe(
            Operation::Sync.as_str(),
            match &result {
                Ok(_) => "ok",
                Err(InvokeError::Retryable(_)) => "retryable",
                Err(InvokeError::Invalid(_)) => "invalid",
            },
            started.elapsed(),
        );
        let retry_soon = self
            .config
            .backoff_base
            .max(Duration::from_secs(1))
            .min(self.config.sync_interval);
        let next = match result {
            Ok(outcome) => match self.settle_outcome(&outcome).await {
                Ok((_, failed)) => {
                    let complete = sync_complete_condition(&failed);
                    self.write_repository_condition(
                        &invocation.repository,
                        complete,
                        crate::kube::RELAY,
                    )
                    .await;
                    if failed.is_empty() {
                        self.stats.succeeded.fetch_add(1, Ordering::Relaxed);
                        self.config.sync_interval
                    } else {
                        self.stats.retried.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(repository = %repository_key, failed = failed.len(), "sync partly failed");
                        retry_soon
                    }
                }
                Err(e) => {
                    self.stats.retried.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(repository = %repository_key, error = %e, "sync outcome not applied");
                    self.config.backoff_base
                }
            },
            Err(e) => {
                // the handler's error says which repository and why; the
                // Repository says so too, and the sync is retried sooner
                // than the interval
                self.stats.retried.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(repository = %repository_key, error = %e, "sync failed");
                let ready = repository_condition(
                    porch_engine::sync::REPOSITORY_READY,
                    false,
                    "Error",
                    &e.to_string(),
                );
                self.write_repository_condition(
                    &invocation.repository,
                    ready,
                    porch_engine::sync::OWNER_MANAGER,
                )
                .await;
                retry_soon
            }
        };
        self.state()
            .enqueue(Work::Sync(repository_key.clone()), Instant::now() + next);
        true
    }

    /// The Invocation due for a revision, if any: a redelivery of the one
    /// planned for this version, or a new one.
    fn plan(&self, key: &Key) -> Option<Invocation> {
        let mut state = self.state();
        let pr = state.revisions.get(key)?.clone();
        let namespace = pr.metadata.namespace.clone();
        let repository = state
            .repositories
            .get(&key_of(namespace.as_deref(), Some(&pr.spec.repository)))?
            .clone();
        let operation = planner::plan(&pr, &repository).into_iter().next()?;
        let version = pr.metadata.resource_version.clone().unwrap_or_default();
        if state
            .refused
            .get(key)
            .is_some_and(|(op, v)| *op == operation && *v == version)
        {
            return None;
        }
        let delivery = match state.deliveries.get(key) {
            Some(d) if d.operation == operation && d.resource_version == version => Delivery {
                attempt: d.attempt + 1,
                ..d.clone()
            },
            _ => Delivery {
                operation,
                resource_version: version,
                time: Time(k8s_openapi::jiff::Timestamp::now()),
                attempt: 1,
                request_id: uuid::Uuid::new_v4().to_string(),
            },
        };
        state.deliveries.insert(key.clone(), delivery.clone());
        // what the handlers read: the revisions of the same repository
        // (workspaces, nesting, latest-revision labels), those the source
        // names and, for a deletion, the downstreams of any repository;
        // not the whole namespace, so an Invocation stays small however
        // many repositories there are
        let mut named = porch_engine::source::ExternalSources::referenced(&pr);
        if let Some(copy) = pr.spec.source.as_ref().and_then(|s| s.copy_from.as_ref()) {
            named.push(copy.name.clone());
        }
        let repository_key = key_of(namespace.as_deref(), Some(&pr.spec.repository));
        let mut keys: BTreeSet<Key> = state
            .members
            .get(&repository_key)
            .cloned()
            .unwrap_or_default();
        keys.extend(named.iter().map(|n| key_of(namespace.as_deref(), Some(n))));
        if operation == Operation::Delete {
            // a deletion checks every downstream that locks onto it
            keys.extend(
                state
                    .revisions
                    .iter()
                    .filter(|(_, p)| {
                        p.metadata.namespace == namespace
                            && p.status.as_ref().is_some_and(|s| s.upstream_lock.is_some())
                    })
                    .map(|(k, _)| k.clone()),
            );
        }
        let related: Vec<PackageRevision> = keys
            .iter()
            .filter_map(|k| state.revisions.get(k))
            .cloned()
            .collect();
        let upstream = upstream_of(&pr, &related);
        let upstream_repository = upstream
            .as_ref()
            .filter(|u| u.spec.repository != pr.spec.repository)
            .and_then(|u| {
                state
                    .repositories
                    .get(&key_of(namespace.as_deref(), Some(&u.spec.repository)))
            })
            .cloned();
        Some(Invocation {
            operation,
            package_revision: Some(pr),
            repository,
            upstream,
            upstream_repository,
            related,
            package_variant: None,
            package_variant_set: None,
            variants: Vec::new(),
            repositories: Vec::new(),
            cluster_objects: Vec::new(),
            time: Some(delivery.time),
            attempt: delivery.attempt,
            request_id: delivery.request_id,
        })
    }

    async fn run_invocation(&self, key: &Key, invocation: Invocation) {
        self.stats.invocations.fetch_add(1, Ordering::Relaxed);
        let _render = if invocation.operation == Operation::Render {
            self.renders.acquire().await.ok()
        } else {
            None
        };
        let started = std::time::Instant::now();
        let result = self.invoker.invoke(&invocation).await;
        let label = match &result {
            Ok(_) => "ok",
            Err(InvokeError::Retryable(_)) => "retryable",
            Err(InvokeError::Invalid(_)) => "invalid",
        };
        self.metrics
            .observe(invocation.operation.as_str(), label, started.elapsed());
        match result {
            Ok(outcome) => self.settle(key, &invocation, &outcome).await,
            Err(InvokeError::Retryable(message)) => {
                self.stats.retried.fetch_add(1, Ordering::Relaxed);
                self.metrics.retries.inc();
                let pause = self.backoff(invocation.attempt);
                tracing::warn!(
                    revision = %key,
                    operation = invocation.operation.as_str(),
                    attempt = invocation.attempt,
                    retry_in_ms = pause.as_millis() as u64,
                    error = %message,
                    "handler failed; retrying"
                );
                self.state()
                    .enqueue(Work::Revision(key.clone()), Instant::now() + pause);
            }
            Err(InvokeError::Invalid(message)) => {
                self.stats.invalid.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(revision = %key, operation = invocation.operation.as_str(), error = %message, "handler refused the invocation");
                if let Some(pr) = &invocation.package_revision {
                    let version = pr.metadata.resource_version.clone().unwrap_or_default();
                    {
                        let mut state = self.state();
                        state.deliveries.remove(key);
                        state
                            .refused
                            .insert(key.clone(), (invocation.operation, version));
                    }
                    let event = EventRecord {
                        regarding: ObjectRef::package_revision(pr),
                        type_: EventType::Warning,
                        reason: "InvocationRefused".into(),
                        message: format!("{}: {message}", invocation.operation.as_str()),
                    };
                    if let Err(e) = self.cluster.record(&event).await {
                        tracing::warn!(error = %e, "event not recorded");
                    }
                }
            }
        }
    }

    /// Applies an Outcome, reads back what it changed into the relay's
    /// view and queues the revisions it touched; the keys touched and the
    /// writes that failed.
    async fn settle_outcome(
        &self,
        outcome: &Outcome,
    ) -> Result<(Vec<Key>, Vec<WriteFailure>), ClusterError> {
        let applied = apply_outcome(&*self.cluster, outcome).await?;
        // what the writes left, read back at once
        let mut reread = Vec::new();
        for target in &applied.conflicts {
            self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
            self.metrics.conflicts.inc();
            reread.push(target.clone());
        }
        reread.extend(outcome.delete.iter().cloned());
        let mut fresh = Vec::new();
        for target in &reread {
            match self.cluster.get(target).await {
                Ok(object) => fresh.push((target.clone(), object)),
                Err(e) => tracing::warn!(error = %e, "re-read failed; the watch brings it"),
            }
        }
        let mut state = self.state();
        for object in applied.objects.values() {
            state.store(object);
        }
        let mut touched: Vec<Key> = applied.objects.keys().cloned().collect();
        for (target, object) in fresh {
            let k = key_of(Some(&target.namespace), Some(&target.name));
            match object {
                Some(object) => state.store(&object),
                None if target.kind == "PackageVariant" => state.unindex_variant(&k),
                None if target.kind == "PackageVariantSet" => state.unindex_set(&k),
                None => state.remove(&k),
            }
            touched.push(k);
        }
        let now = Instant::now();
        for (target, k) in reread
            .iter()
            .map(|t| (t, key_of(Some(&t.namespace), Some(&t.name))))
        {
            if target.kind == "PackageVariant" && state.variants.contains_key(&k) {
                state.enqueue(Work::Variant(k), now);
            } else if target.kind == "PackageVariantSet" && state.sets.contains_key(&k) {
                state.enqueue(Work::VariantSet(k), now);
            }
        }
        touched.retain(|k| state.revisions.contains_key(k));
        for k in &touched {
            state.enqueue(Work::Revision(k.clone()), now);
        }
        Ok((touched, applied.failed))
    }

    /// Applies a revision's Outcome and decides when to look at it again.
    async fn settle(&self, key: &Key, invocation: &Invocation, outcome: &Outcome) {
        let settled = match self.settle_outcome(outcome).await {
            Ok((_, failed)) if !failed.is_empty() => Err(ClusterError(
                failed
                    .iter()
                    .map(|f| format!("{}: {}", f.target, f.message))
                    .collect::<Vec<_>>()
                    .join("; "),
            )),
            other => other.map(|_| ()),
        };
        if let Err(e) = settled {
            // the API server is unreachable or refused a write: the same
            // Invocation again later gives the same Outcome
            self.stats.retried.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(revision = %key, error = %e, "outcome not applied; retrying");
            let pause = self.backoff(invocation.attempt);
            self.state()
                .enqueue(Work::Revision(key.clone()), Instant::now() + pause);
            return;
        }
        self.stats.succeeded.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state();
        state.deliveries.remove(key);
        let now = Instant::now();
        let changed =
            !(outcome.patches.is_empty() && outcome.apply.is_empty() && outcome.delete.is_empty());
        // an Outcome that changes objects: plan again with what the write
        // (or the re-read) left; one that only reports (events) settles
        // the revision until it changes or asks to come back
        if changed && state.revisions.contains_key(key) {
            state.enqueue(Work::Revision(key.clone()), now);
        }
        if let Some(seconds) = outcome.requeue_after_seconds {
            state.enqueue(
                Work::Revision(key.clone()),
                now + Duration::from_secs(seconds),
            );
        }
    }

    /// Sets one condition of a Repository's status with a server-side
    /// apply by `manager`, when it says something new (status, reason or
    /// message); `lastTransitionTime` moves only when the status does. A
    /// write that fails is logged: the next sync writes again.
    async fn write_repository_condition(
        &self,
        repository: &Repository,
        mut condition: Condition,
        manager: &str,
    ) {
        let key = key_of(
            repository.metadata.namespace.as_deref(),
            repository.metadata.name.as_deref(),
        );
        let current = self.state().repositories.get(&key).cloned();
        let known = current
            .as_ref()
            .and_then(|r| r.status.as_ref())
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == condition.type_))
            .cloned();
        if let Some(known) = &known {
            if known.status == condition.status
                && known.reason == condition.reason
                && known.message == condition.message
            {
                return;
            }
            if known.status == condition.status {
                condition.last_transition_time = known.last_transition_time.clone();
            }
        }
        condition.observed_generation = current.as_ref().and_then(|r| r.metadata.generation);
        let apply = Apply {
            field_manager: manager.to_owned(),
            force: true,
            subresource: Subresource::Status,
            object: serde_json::json!({
                "apiVersion": "config.porch.kpt.dev/v1alpha1",
                "kind": "Repository",
                "metadata": {
                    "name": repository.metadata.name,
                    "namespace": repository.metadata.namespace,
                },
                "status": {"conditions": [condition]},
            }),
        };
        match self.cluster.apply(&apply).await {
            Ok(Written::Applied(object)) => self.state().store(&object),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(repository = %key, error = %e, "Repository status not written")
            }
        }
    }

    /// The pause before delivery `attempt + 1`: exponential, capped, with
    /// up to a quarter of jitter so retries of many revisions spread out.
    fn backoff(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(20);
        let base = self
            .config
            .backoff_base
            .saturating_mul(1_u32 << exponent)
            .min(self.config.backoff_max);
        let random = uuid::Uuid::new_v4().as_u128() % 1000;
        let jitter = base.mul_f64(random as f64 / 4000.0);
        base + jitter
    }
}

/// The Repository condition that says whether the last sync wrote every
/// PackageRevision it should have (the reference's TODO, spec §9 item 7).
pub const SYNC_COMPLETE: &str = "PackageRevisionSyncComplete";

/// How many failed writes a condition message names.
const FAILURES_NAMED: usize = 5;

fn repository_condition(type_: &str, ok: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.chars().take(1024).collect(),
        observed_generation: None,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

/// `PackageRevisionSyncComplete` after a sync whose writes `failed`.
fn sync_complete_condition(failed: &[WriteFailure]) -> Condition {
    if failed.is_empty() {
        return repository_condition(
            SYNC_COMPLETE,
            true,
            "Synced",
            "every package revision in git has its PackageRevision",
        );
    }
    let mut message = format!("{} PackageRevision writes failed: ", failed.len());
    let named: Vec<String> = failed
        .iter()
        .take(FAILURES_NAMED)
        .map(|f| format!("{}: {}", f.target, f.message))
        .collect();
    message.push_str(&named.join("; "));
    if failed.len() > FAILURES_NAMED {
        message.push_str(&format!("; and {} more", failed.len() - FAILURES_NAMED));
    }
    repository_condition(SYNC_COMPLETE, false, "PartialFailure", &message)
}

/// The uids of the PackageVariants among a revision's owners.
fn variant_owners(pr: &PackageRevision) -> impl Iterator<Item = &str> {
    pr.metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.kind == "PackageVariant")
        .map(|r| r.uid.as_str())
}

/// The keys of `objects` a complete list (namespace, name) does not hold.
fn unlisted<T>(
    objects: &BTreeMap<Key, T>,
    listed: &BTreeSet<(String, String)>,
    metadata: impl Fn(&T) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Vec<Key> {
    objects
        .iter()
        .filter(|(_, object)| {
            let meta = metadata(object);
            !listed.contains(&(
                meta.namespace.clone().unwrap_or_else(|| "default".into()),
                meta.name.clone().unwrap_or_default(),
            ))
        })
        .map(|(k, _)| k.clone())
        .collect()
}

/// Whether resourceVersion `new` is later than `known`. Versions are
/// opaque to clients, but the API server's are etcd revisions: compared
/// as numbers when both are, otherwise any different version is news.
fn newer(new: &Option<String>, known: &Option<String>) -> bool {
    match (new, known) {
        (Some(n), Some(k)) => match (n.parse::<u64>(), k.parse::<u64>()) {
            (Ok(n), Ok(k)) => n > k,
            _ => n != k,
        },
        _ => true,
    }
}

/// The upstream a source names: a clone's upstream, or an upgrade's new
/// upstream (its old upstream lives in the same repository).
pub fn upstream_of(pr: &PackageRevision, all: &[PackageRevision]) -> Option<PackageRevision> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn revision(resource_version: &str, generation: i64) -> Value {
        serde_json::json!({
            "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
            "metadata": {"name": "r.p.v1", "namespace": "default",
                         "resourceVersion": resource_version, "generation": generation},
            "spec": {"packageName": "p", "repository": "r", "workspaceName": "v1", "lifecycle": "Draft"}
        })
    }

    /// A client's change observed while a write of the relay was in flight
    /// is not undone in the view by that write's (older) answer.
    #[test]
    fn an_older_write_answer_does_not_replace_a_newer_observed_version() {
        let mut state = State::default();
        let newer_seen: PackageRevision =
            serde_json::from_value(revision("10", 5)).expect("revision");
        state.put("default/r.p.v1".into(), newer_seen);
        state.store(&revision("9", 4));
        let kept = &state.revisions["default/r.p.v1"];
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("10"));
        assert_eq!(kept.metadata.generation, Some(5));
        // a newer answer does replace it
        state.store(&revision("11", 5));
        assert_eq!(
            state.revisions["default/r.p.v1"]
                .metadata
                .resource_version
                .as_deref(),
            Some("11")
        );
    }
}
