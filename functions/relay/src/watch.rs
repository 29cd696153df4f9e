//! Kubernetes watches feeding the relay: PackageRevisions (v1alpha2),
//! Repositories, PackageVariants and PackageVariantSets, through kube-runtime watchers (list, then watch, resumed
//! from the last resourceVersion after a disconnect, re-listed when it is
//! too old, with backoff).
//!
//! After each (re-)list the relay forgets the objects the list no longer
//! holds: a deletion missed while disconnected is not missed for good.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use porch_api::repository::Repository;
use porch_api::v1alpha2::PackageRevision;
use porch_api::variant::{PackageVariant, PackageVariantSet};
use tokio_stream::StreamExt;

use crate::cluster::Cluster;
use crate::invoker::Invoker;
use crate::relay::Relay;

fn key(namespace: Option<&str>, name: Option<&str>) -> (String, String) {
    (
        namespace.unwrap_or("default").to_owned(),
        name.unwrap_or("").to_owned(),
    )
}

/// What a watch does with the objects of one kind.
trait Feed<K> {
    fn observe(&self, object: K);
    fn forget(&self, namespace: &str, name: &str);
    fn retain(&self, listed: &BTreeSet<(String, String)>);
}

impl<C: Cluster + 'static, I: Invoker + 'static> Feed<PackageRevision> for Relay<C, I> {
    fn observe(&self, object: PackageRevision) {
        self.observe_revision(object);
    }
    fn forget(&self, namespace: &str, name: &str) {
        self.forget_revision(namespace, name);
    }
    fn retain(&self, listed: &BTreeSet<(String, String)>) {
        self.retain_revisions(listed);
    }
}

impl<C: Cluster + 'static, I: Invoker + 'static> Feed<Repository> for Relay<C, I> {
    fn observe(&self, object: Repository) {
        self.observe_repository(object);
    }
    fn forget(&self, namespace: &str, name: &str) {
        self.forget_repository(namespace, name);
    }
    fn retain(&self, listed: &BTreeSet<(String, String)>) {
        self.retain_repositories(listed);
    }
}

impl<C: Cluster + 'static, I: Invoker + 'static> Feed<PackageVariant> for Relay<C, I> {
    fn observe(&self, object: PackageVariant) {
        self.observe_variant(object);
    }
    fn forget(&self, namespace: &str, name: &str) {
        self.forget_variant(namespace, name);
    }
    fn retain(&self, listed: &BTreeSet<(String, String)>) {
        self.retain_variants(listed);
    }
}

impl<C: Cluster + 'static, I: Invoker + 'static> Feed<PackageVariantSet> for Relay<C, I> {
    fn observe(&self, object: PackageVariantSet) {
        self.observe_variant_set(object);
    }
    fn forget(&self, namespace: &str, name: &str) {
        self.forget_variant_set(namespace, name);
    }
    fn retain(&self, listed: &BTreeSet<(String, String)>) {
        self.retain_variant_sets(listed);
    }
}

/// Feeds every event of `api` to `feed` until the stream ends; sets
/// `listed` after the first complete list.
async fn follow<K, F>(feed: &F, api: Api<K>, listed: &AtomicBool)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
    F: Feed<K>,
{
    let kind = K::kind(&()).into_owned();
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    tokio::pin!(stream);
    let mut seen = BTreeSet::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => seen.clear(),
            Ok(Event::InitApply(object)) => {
                seen.insert(key(
                    object.meta().namespace.as_deref(),
                    object.meta().name.as_deref(),
                ));
                feed.observe(object);
            }
            Ok(Event::InitDone) => {
                feed.retain(&seen);
                listed.store(true, Ordering::SeqCst);
            }
            Ok(Event::Apply(object)) => feed.observe(object),
            Ok(Event::Delete(object)) => feed.forget(
                object.meta().namespace.as_deref().unwrap_or("default"),
                object.meta().name.as_deref().unwrap_or(""),
            ),
            Err(e) => tracing::warn!(kind = %kind, error = %e, "watch interrupted; resuming"),
        }
    }
}

/// Feeds every PackageRevision event to the relay until the stream ends;
/// sets `listed` after the first complete list.
pub async fn revisions<C, I>(
    relay: Arc<Relay<C, I>>,
    api: Api<PackageRevision>,
    listed: Arc<AtomicBool>,
) where
    C: Cluster + 'static,
    I: Invoker + 'static,
{
    follow(&*relay, api, &listed).await;
}

/// Feeds every Repository event to the relay until the stream ends; sets
/// `listed` after the first complete list.
pub async fn repositories<C, I>(
    relay: Arc<Relay<C, I>>,
    api: Api<Repository>,
    listed: Arc<AtomicBool>,
) where
    C: Cluster + 'static,
    I: Invoker + 'static,
{
    follow(&*relay, api, &listed).await;
}

/// Feeds every PackageVariant event to the relay until the stream ends;
/// sets `listed` after the first complete list.
pub async fn variants<C, I>(
    relay: Arc<Relay<C, I>>,
    api: Api<PackageVariant>,
    listed: Arc<AtomicBool>,
) where
    C: Cluster + 'static,
    I: Invoker + 'static,
{
    follow(&*relay, api, &listed).await;
}

/// Feeds every PackageVariantSet event to the relay until the stream ends;
/// sets `listed` after the first complete list.
pub async fn variant_sets<C, I>(
    relay: Arc<Relay<C, I>>,
    api: Api<PackageVariantSet>,
    listed: Arc<AtomicBool>,
) where
    C: Cluster + 'static,
    I: Invoker + 'static,
{
    follow(&*relay, api, &listed).await;
}

/// Follows the objects of one kind some variant injects (`api_version`,
/// `kind`, in `namespace` or all), telling the relay of each change so the
/// variants naming the object are reconciled again (the reference has no
/// such watch: packagevariants spec §1.5).
pub async fn injectables<C, I>(
    relay: Arc<Relay<C, I>>,
    client: kube::Client,
    api_version: String,
    kind: String,
    namespace: Option<String>,
) where
    C: Cluster + 'static,
    I: Invoker + 'static,
{
    let resource = crate::kube::resource(&api_version, &kind);
    let api: Api<kube::api::DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(client, ns, &resource),
        None => Api::all_with(client, &resource),
    };
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    tokio::pin!(stream);
    while let Some(event) = stream.next().await {
        let object = match event {
            Ok(Event::InitApply(o) | Event::Apply(o) | Event::Delete(o)) => o,
            Ok(Event::Init | Event::InitDone) => continue,
            Err(e) => {
                tracing::warn!(kind = %kind, error = %e, "watch interrupted; resuming");
                continue;
            }
        };
        relay.observe_injectable(
            &kind,
            object.metadata.namespace.as_deref().unwrap_or("default"),
            object.metadata.name.as_deref().unwrap_or(""),
        );
    }
}
