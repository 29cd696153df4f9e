//! `/convert`: ConversionReview for PackageRevision v1alpha1 ↔ v1alpha2.
//!
//! Every failure is a `Failed` result with a message naming the object; the
//! HTTP status stays 200 so the apiserver reports the message.

use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use porch_api::convert::{to_v1alpha1, to_v1alpha2};
use porch_api::{v1alpha1, v1alpha2};
use serde_json::Value;

const V1ALPHA1: &str = "porch.kpt.dev/v1alpha1";
const V1ALPHA2: &str = "porch.kpt.dev/v1alpha2";

/// Answers one ConversionReview body.
pub fn review(body: &[u8]) -> ConversionReview {
    let review: ConversionReview = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return invalid(format!("invalid ConversionReview: {e}")),
    };
    if review.types.api_version != "apiextensions.k8s.io/v1"
        || review.types.kind != "ConversionReview"
    {
        return invalid(format!(
            "unsupported review {}/{}: expected apiextensions.k8s.io/v1 ConversionReview",
            review.types.api_version, review.types.kind
        ));
    }
    let request = match ConversionRequest::from_review(review) {
        Ok(r) => r,
        Err(_) => return invalid("ConversionReview has no request".to_owned()),
    };
    let converted: Result<Vec<Value>, String> = request
        .objects
        .iter()
        .enumerate()
        .map(|(i, obj)| {
            convert(obj, &request.desired_api_version).map_err(|message| {
                let name = obj["metadata"]["name"].as_str().unwrap_or("<unnamed>");
                format!("object {i} ({name}): {message}")
            })
        })
        .collect();
    let response = ConversionResponse::for_request(request);
    match converted {
        Ok(objects) => response.success(objects),
        Err(message) => response.failure(Status::failure(&message, "Invalid")),
    }
    .into_review()
}

fn invalid(message: String) -> ConversionReview {
    ConversionResponse::invalid(Status::failure(&message, "BadRequest")).into_review()
}

/// Converts one object to `desired`.
///
/// # Errors
/// Not a PackageRevision, an unknown version, or fields of the wrong type.
pub fn convert(obj: &Value, desired: &str) -> Result<Value, String> {
    let kind = obj["kind"].as_str().unwrap_or_default();
    if kind != "PackageRevision" {
        return Err(format!(
            "kind {kind:?} cannot be converted: only PackageRevision"
        ));
    }
    let from = obj["apiVersion"].as_str().unwrap_or_default();
    let encode =
        |v: Result<Value, serde_json::Error>| v.map_err(|e| format!("failed to encode: {e}"));
    match (from, desired) {
        (f, d) if f == d && (d == V1ALPHA1 || d == V1ALPHA2) => Ok(obj.clone()),
        (V1ALPHA1, V1ALPHA2) => {
            let v1: v1alpha1::PackageRevision = serde_json::from_value(obj.clone())
                .map_err(|e| format!("invalid {V1ALPHA1} object: {e}"))?;
            encode(serde_json::to_value(
                to_v1alpha2(&v1).map_err(|e| e.to_string())?,
            ))
        }
        (V1ALPHA2, V1ALPHA1) => {
            let v2: v1alpha2::PackageRevision = serde_json::from_value(obj.clone())
                .map_err(|e| format!("invalid {V1ALPHA2} object: {e}"))?;
            encode(serde_json::to_value(
                to_v1alpha1(&v2).map_err(|e| e.to_string())?,
            ))
        }
        _ => Err(format!(
            "cannot convert from {from:?} to {desired:?}: supported versions are {V1ALPHA1} and {V1ALPHA2}"
        )),
    }
}
