//! [`Cluster`] on a real API server through kube-rs.
//!
//! Patches go as `application/json-patch+json` to the object or its
//! `status` subresource. A failed `test` guard answers 422 ("Testing value
//! … failed"); that and 409 are conflicts, 404 a missing object. Applies are
//! server-side applies with the Outcome's field manager; Events are
//! `events.k8s.io/v1`.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use porch_api::invocation::{Apply, EventRecord, EventType, ObjectPatch, ObjectRef, Subresource};
use serde_json::Value;

use crate::cluster::{Cluster, ClusterError, Written};

/// Who the relay says it is, as field manager and Event reporter.
pub const RELAY: &str = "porch-relay";

/// The API server behind a kube client.
#[derive(Clone)]
pub struct KubeCluster {
    client: Client,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster").finish_non_exhaustive()
    }
}

/// The resource of a kind the relay writes: `PackageRevision` →
/// `packagerevisions`, `Repository` → `repositories`.
pub fn resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let lower = kind.to_ascii_lowercase();
    let plural = if let Some(stem) = lower.strip_suffix('y') {
        format!("{stem}ies")
    } else if lower.ends_with('s') {
        format!("{lower}es")
    } else {
        format!("{lower}s")
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural)
}

enum Failure {
    Conflict(String),
    Missing,
    Other(ClusterError),
}

fn classify(error: kube::Error) -> Failure {
    match error {
        kube::Error::Api(status) if status.code == 404 => Failure::Missing,
        kube::Error::Api(status) if status.code == 409 => Failure::Conflict(status.message),
        kube::Error::Api(status)
            if status.code == 422
                && status
                    .message
                    .to_ascii_lowercase()
                    .contains("testing value") =>
        {
            Failure::Conflict(status.message)
        }
        other => Failure::Other(ClusterError(other.to_string())),
    }
}

fn written(result: Result<DynamicObject, kube::Error>) -> Result<Written, ClusterError> {
    match result {
        Ok(object) => serde_json::to_value(object)
            .map(Written::Applied)
            .map_err(|e| ClusterError(e.to_string())),
        Err(e) => match classify(e) {
            Failure::Conflict(message) => Ok(Written::Conflict(message)),
            Failure::Missing => Ok(Written::Missing),
            Failure::Other(e) => Err(e),
        },
    }
}

impl KubeCluster {
    pub fn new(client: Client) -> Self {
        KubeCluster { client }
    }

    fn api(&self, api_version: &str, kind: &str, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &resource(api_version, kind))
    }
}

impl Cluster for KubeCluster {
    async fn get(&self, target: &ObjectRef) -> Result<Option<Value>, ClusterError> {
        let api = self.api(&target.api_version, &target.kind, &target.namespace);
        let object = api
            .get_opt(&target.name)
            .await
            .map_err(|e| ClusterError(e.to_string()))?;
        object
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| ClusterError(e.to_string()))
    }

    async fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
    ) -> Result<Vec<Value>, ClusterError> {
        let api = self.api(api_version, kind, namespace);
        let list = api
            .list(&kube::api::ListParams::default())
            .await
            .map_err(|e| ClusterError(e.to_string()))?;
        list.items
            .into_iter()
            .map(|mut object| {
                // items of a list carry no type: the list's kind says it
                object.types = Some(kube::api::TypeMeta {
                    api_version: api_version.to_owned(),
                    kind: kind.to_owned(),
                });
                serde_json::to_value(object).map_err(|e| ClusterError(e.to_string()))
            })
            .collect()
    }

    async fn patch(&self, patch: &ObjectPatch) -> Result<Written, ClusterError> {
        let target = &patch.target;
        let api = self.api(&target.api_version, &target.kind, &target.namespace);
        let body: Patch<()> = Patch::Json(patch.patch.clone());
        let params = PatchParams {
            field_manager: Some(RELAY.to_owned()),
            ..PatchParams::default()
        };
        let result = match patch.subresource {
            Subresource::Status => api.patch_status(&target.name, &params, &body).await,
            Subresource::Main => api.patch(&target.name, &params, &body).await,
        };
        written(result)
    }

    async fn apply(&self, apply: &Apply) -> Result<Written, ClusterError> {
        let object = &apply.object;
        let text = |pointer: &str| {
            object
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        let name = text("/metadata/name");
        if name.is_empty() {
            return Err(ClusterError("an apply without metadata.name".into()));
        }
        let namespace = match text("/metadata/namespace") {
            "" => "default",
            ns => ns,
        };
        let api = self.api(text("/apiVersion"), text("/kind"), namespace);
        let mut params = PatchParams::apply(&apply.field_manager);
        params.force = apply.force;
        let body = Patch::Apply(object);
        let result = match apply.subresource {
            Subresource::Status => api.patch_status(name, &params, &body).await,
            Subresource::Main => api.patch(name, &params, &body).await,
        };
        written(result)
    }

    async fn delete(&self, target: &ObjectRef) -> Result<(), ClusterError> {
        let api = self.api(&target.api_version, &target.kind, &target.namespace);
        let mut params = DeleteParams::default();
        if !target.uid.is_empty() {
            // never delete a newer object of the same name
            params.preconditions = Some(kube::api::Preconditions {
                uid: Some(target.uid.clone()),
                resource_version: None,
            });
        }
        match api.delete(&target.name, &params).await {
            Ok(_) => Ok(()),
            Err(e) => match classify(e) {
                Failure::Missing | Failure::Conflict(_) => Ok(()),
                Failure::Other(e) => Err(e),
            },
        }
    }

    async fn record(&self, event: &EventRecord) -> Result<(), ClusterError> {
        let regarding = &event.regarding;
        let api: Api<Event> = Api::namespaced(self.client.clone(), &regarding.namespace);
        let now = k8s_openapi::jiff::Timestamp::now();
        let object = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", regarding.name)),
                namespace: Some(regarding.namespace.clone()),
                ..ObjectMeta::default()
            },
            action: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            note: Some(event.message.chars().take(1024).collect()),
            reason: Some(event.reason.clone()),
            regarding: Some(ObjectReference {
                api_version: Some(regarding.api_version.clone()),
                kind: Some(regarding.kind.clone()),
                name: Some(regarding.name.clone()),
                namespace: Some(regarding.namespace.clone()),
                uid: (!regarding.uid.is_empty()).then(|| regarding.uid.clone()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(format!("porch.kpt.dev/{RELAY}")),
            reporting_instance: Some(
                std::env::var("POD_NAME").unwrap_or_else(|_| RELAY.to_owned()),
            ),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            ..Event::default()
        };
        api.create(&PostParams::default(), &object)
            .await
            .map(|_| ())
            .map_err(|e| ClusterError(e.to_string()))
    }
}
