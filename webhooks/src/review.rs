//! The AdmissionReview envelope, read without copying the objects.
//!
//! The request's fields are kube's types (`GroupVersionKind`, `Operation`,
//! `UserInfo`); `object` and `oldObject` stay raw JSON until a rule decodes
//! them into the typed resource, so each object is parsed once, straight into
//! its type. Answers are kube's `AdmissionResponse`.

use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::admission::{AdmissionResponse, Operation};
use kube::core::{GroupVersionKind, Status};
use serde::Deserialize;
use serde_json::value::RawValue;

/// One admission request, borrowed from the request body.
#[derive(Debug)]
pub struct AdmissionInput<'a> {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub sub_resource: Option<String>,
    pub name: String,
    pub namespace: Option<String>,
    pub operation: Operation,
    pub user_info: UserInfo,
    pub object: Option<&'a RawValue>,
    pub old_object: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<'a> {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(borrow, default)]
    request: Option<Request<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    uid: String,
    kind: GroupVersionKind,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    operation: Operation,
    user_info: UserInfo,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    old_object: Option<&'a RawValue>,
}

/// Reads an AdmissionReview `admission.k8s.io/v1` with a request.
///
/// # Errors
/// The answer to send: `invalid` with the reason (and the uid when known).
pub fn parse(body: &[u8]) -> Result<AdmissionInput<'_>, Box<AdmissionResponse>> {
    let envelope: Envelope<'_> = serde_json::from_slice(body).map_err(|e| {
        Box::new(AdmissionResponse::invalid(format!(
            "invalid AdmissionReview: {e}"
        )))
    })?;
    if envelope.api_version != "admission.k8s.io/v1" || envelope.kind != "AdmissionReview" {
        let mut response = AdmissionResponse::invalid(format!(
            "unsupported review {}/{}: expected admission.k8s.io/v1 AdmissionReview",
            envelope.api_version, envelope.kind
        ));
        response.uid = envelope.request.map(|r| r.uid).unwrap_or_default();
        return Err(Box::new(response));
    }
    let request = envelope
        .request
        .ok_or_else(|| Box::new(AdmissionResponse::invalid("AdmissionReview has no request")))?;
    Ok(AdmissionInput {
        uid: request.uid,
        kind: request.kind,
        sub_resource: request.sub_resource,
        name: request.name,
        namespace: request.namespace,
        operation: request.operation,
        user_info: request.user_info,
        object: request.object,
        old_object: request.old_object,
    })
}

impl AdmissionInput<'_> {
    /// An allowing answer to this request (deny it with `.deny(..)`).
    pub fn allow(&self) -> AdmissionResponse {
        // kube builds responses from its own request type; this one is
        // borrowed, so start from `invalid` and set what an allow carries
        let mut response = AdmissionResponse::invalid("");
        response.uid.clone_from(&self.uid);
        response.allowed = true;
        response.result = Status::default();
        response
    }

    /// The requesting user's name, if any.
    pub fn username(&self) -> Option<&str> {
        self.user_info.username.as_deref()
    }
}
