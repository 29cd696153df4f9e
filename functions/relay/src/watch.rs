//! Kubernetes watches feeding the relay: PackageRevisions (v1alpha2) and
//! Repositories, through kube-runtime watchers (list, then watch, resumed
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
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    tokio::pin!(stream);
    let mut seen = BTreeSet::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => seen.clear(),
            Ok(Event::InitApply(pr)) => {
                seen.insert(key(
                    pr.metadata.namespace.as_deref(),
                    pr.metadata.name.as_deref(),
                ));
                relay.observe_revision(pr);
            }
            Ok(Event::InitDone) => {
                relay.retain_revisions(&seen);
                listed.store(true, Ordering::SeqCst);
            }
            Ok(Event::Apply(pr)) => relay.observe_revision(pr),
            Ok(Event::Delete(pr)) => relay.forget_revision(
                pr.metadata.namespace.as_deref().unwrap_or("default"),
                pr.metadata.name.as_deref().unwrap_or(""),
            ),
            Err(e) => tracing::warn!(error = %e, "PackageRevision watch interrupted; resuming"),
        }
    }
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
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    tokio::pin!(stream);
    let mut seen = BTreeSet::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => seen.clear(),
            Ok(Event::InitApply(repository)) => {
                seen.insert(key(
                    repository.metadata.namespace.as_deref(),
                    repository.metadata.name.as_deref(),
                ));
                relay.observe_repository(repository);
            }
            Ok(Event::InitDone) => {
                relay.retain_repositories(&seen);
                listed.store(true, Ordering::SeqCst);
            }
            Ok(Event::Apply(repository)) => relay.observe_repository(repository),
            Ok(Event::Delete(repository)) => relay.forget_repository(
                repository
                    .metadata
                    .namespace
                    .as_deref()
                    .unwrap_or("default"),
                repository.metadata.name.as_deref().unwrap_or(""),
            ),
            Err(e) => tracing::warn!(error = %e, "Repository watch interrupted; resuming"),
        }
    }
}
