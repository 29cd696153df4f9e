//! The AdmissionReview envelope, read without copying the objects.
//!
//! The request's fields are kube's types (`GroupVersionKind`, `Operation`,
//! `UserInfo`); `object` and `oldObject` stay raw JSON until a rule decodes
//! them into the typed resource, so each object is parsed once, straight into
//! its type. Answers are kube's `AdmissionResponse`.

use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::admission::{AdmissionResponse, Operation};
use kube::core::{GroupVersionKind, Status};
use porch_api::v1alpha2::PackageRevisionSpec;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::ops::Deref;

/// What an admission request says besides its objects.
#[derive(Debug)]
pub struct RequestHead {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub sub_resource: Option<String>,
    pub name: String,
    pub namespace: Option<String>,
    pub operation: Operation,
    pub user_info: UserInfo,
}

/// One admission request, its objects borrowed raw from the request body.
#[derive(Debug)]
pub struct AdmissionInput<'a> {
    pub head: RequestHead,
    pub object: Option<&'a RawValue>,
    pub old_object: Option<&'a RawValue>,
}

impl Deref for AdmissionInput<'_> {
    type Target = RequestHead;
    fn deref(&self) -> &RequestHead {
        &self.head
    }
}

/// The parts of an object's metadata the rules read; the rest (managed
/// fields, owner references, …) is skipped, not decoded.
#[derive(Deserialize, Default, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub deletion_timestamp: Option<String>,
}

/// An object as the rules read it: metadata and spec; `status` is skipped.
#[derive(Deserialize, Debug)]
pub struct Object<S> {
    #[serde(default)]
    pub metadata: Meta,
    pub spec: S,
}

/// A `porch.kpt.dev/v1alpha2` PackageRevision review decoded in one pass:
/// the objects straight into their typed form, the fields of `object` that
/// no type knows collected on the way.
#[derive(Debug)]
pub struct RevisionReview {
    pub head: RequestHead,
    pub object: Option<Object<PackageRevisionSpec>>,
    pub old_object: Option<Object<PackageRevisionSpec>>,
    /// Unknown fields of `object`, relative to it (`spec.bogus`).
    pub unknown_fields: Vec<String>,
}

impl Deref for RevisionReview {
    type Target = RequestHead;
    fn deref(&self) -> &RequestHead {
        &self.head
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<R> {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default = "none")]
    request: Option<R>,
}

fn none<R>() -> Option<R> {
    None
}

/// The request of a review, its objects as `O`: raw JSON for the generic
/// reader, typed for the one-pass one.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "O: Deserialize<'de>"))]
struct Request<O> {
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
    #[serde(default = "none")]
    object: Option<O>,
    #[serde(default = "none")]
    old_object: Option<O>,
}

impl<O> Request<O> {
    fn into_parts(self) -> (RequestHead, Option<O>, Option<O>) {
        let head = RequestHead {
            uid: self.uid,
            kind: self.kind,
            sub_resource: self.sub_resource,
            name: self.name,
            namespace: self.namespace,
            operation: self.operation,
            user_info: self.user_info,
        };
        (head, self.object, self.old_object)
    }
}

/// Reads a v1alpha2 PackageRevision review in one pass. `None` when the body
/// is anything else or does not decode this way; [`parse`] then reads it
/// generically and reports precisely what is wrong.
pub fn parse_revision_review(body: &[u8]) -> Option<RevisionReview> {
    let text = std::str::from_utf8(body).ok()?;
    let mut unknown_fields = Vec::new();
    let mut de = serde_json::Deserializer::from_str(text);
    let envelope: Envelope<Request<Object<PackageRevisionSpec>>> =
        serde_ignored::deserialize(&mut de, |path| {
            if let Some(field) = unknown_object_field(&path) {
                unknown_fields.push(field);
            }
        })
        .ok()?;
    de.end().ok()?;
    if envelope.api_version != "admission.k8s.io/v1" || envelope.kind != "AdmissionReview" {
        return None;
    }
    let request = envelope.request?;
    let k = &request.kind;
    if k.group != "porch.kpt.dev" || k.version != "v1alpha2" || k.kind != "PackageRevision" {
        return None;
    }
    let (head, object, old_object) = request.into_parts();
    Some(RevisionReview {
        head,
        object,
        old_object,
        unknown_fields,
    })
}

/// `request.object.<field>` outside metadata, status, apiVersion and kind,
/// as `<field>`; everything else the envelope ignores on purpose.
fn unknown_object_field(path: &serde_ignored::Path<'_>) -> Option<String> {
    let segments = crate::decode::field_segments(path);
    match segments.as_slice() {
        [request, object, top, ..]
            if request == "request"
                && object == "object"
                && !crate::decode::OWN_FIELDS.contains(&top.as_str()) =>
        {
            Some(segments[2..].join("."))
        }
        _ => None,
    }
}

/// Reads an AdmissionReview `admission.k8s.io/v1` with a request.
///
/// # Errors
/// The answer to send: `invalid` with the reason (and the uid when known).
pub fn parse(body: &[u8]) -> Result<AdmissionInput<'_>, Box<AdmissionResponse>> {
    // validating UTF-8 once up front lets the parser skip it per string
    let text = std::str::from_utf8(body).map_err(|e| {
        Box::new(AdmissionResponse::invalid(format!(
            "invalid AdmissionReview: not UTF-8: {e}"
        )))
    })?;
    let envelope: Envelope<Request<&RawValue>> = serde_json::from_str(text).map_err(|e| {
        let mut response = AdmissionResponse::invalid(format!("invalid AdmissionReview: {e}"));
        response.uid = uid_of(text);
        Box::new(response)
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
    let (head, object, old_object) = request.into_parts();
    Ok(AdmissionInput {
        head,
        object,
        old_object,
    })
}

/// `request.uid` of a review that did not decode, so that its refusal still
/// names the request; empty when the body is not JSON or has no string uid.
pub fn uid_of(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|review| {
            review
                .get("request")?
                .get("uid")?
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

impl RequestHead {
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
