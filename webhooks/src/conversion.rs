//! `/convert`: ConversionReview for PackageRevision v1alpha1 ↔ v1alpha2.
//!
//! Every failure is a `Failed` result with a message naming the object; the
//! HTTP status stays 200 so the apiserver reports the message.
//!
//! Objects stay raw JSON until each is decoded straight into its typed
//! version, converted and encoded again; large reviews are split across the
//! available cores. A review of 1,500 objects of 5 kB is a list call of a
//! busy namespace, and the apiserver waits on it.

use kube::core::Status;
use kube::core::conversion::{ConversionResponse, ConversionReview};
use porch_api::convert::{to_v1alpha1, to_v1alpha2};
use porch_api::{v1alpha1, v1alpha2};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

const V1ALPHA1: &str = "porch.kpt.dev/v1alpha1";
const V1ALPHA2: &str = "porch.kpt.dev/v1alpha2";
/// Below this many objects one thread is faster than splitting.
const PARALLEL_THRESHOLD: usize = 64;

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
struct Request<'a> {
    uid: String,
    #[serde(rename = "desiredAPIVersion")]
    desired_api_version: String,
    #[serde(borrow)]
    objects: Vec<&'a RawValue>,
}

/// What identifies an object before it is decoded.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Head<'a> {
    #[serde(borrow, default)]
    api_version: Cow<'a, str>,
    #[serde(borrow, default)]
    kind: Cow<'a, str>,
    #[serde(default)]
    metadata: Option<HeadMeta>,
}

#[derive(Deserialize)]
struct HeadMeta {
    #[serde(default)]
    name: Option<String>,
}

/// A successful answer: kube's `Status`, objects written as they were encoded.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Converted<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ConvertedResponse<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConvertedResponse<'a> {
    uid: &'a str,
    result: Status,
    converted_objects: Vec<Box<RawValue>>,
}

/// Answers one ConversionReview body with the JSON to send back.
pub fn review(body: &[u8]) -> Vec<u8> {
    // JSON is UTF-8; checking it once up front also covers the fields the
    // envelope skips, which the parser does not look into
    let text = match std::str::from_utf8(body) {
        Ok(text) => text,
        Err(e) => {
            return encode(&invalid(format!(
                "invalid ConversionReview: not UTF-8: {e}"
            )));
        }
    };
    let envelope: Envelope<'_> = match serde_json::from_str(text) {
        Ok(e) => e,
        Err(e) => {
            let mut review = invalid(format!("invalid ConversionReview: {e}"));
            if let Some(response) = review.response.as_mut() {
                response.uid = crate::review::uid_of(text);
            }
            return encode(&review);
        }
    };
    if envelope.api_version != "apiextensions.k8s.io/v1" || envelope.kind != "ConversionReview" {
        let mut review = invalid(format!(
            "unsupported review {}/{}: expected apiextensions.k8s.io/v1 ConversionReview",
            envelope.api_version, envelope.kind
        ));
        if let (Some(response), Some(request)) = (review.response.as_mut(), envelope.request) {
            response.uid = request.uid;
        }
        return encode(&review);
    }
    let Some(request) = envelope.request else {
        return encode(&invalid("ConversionReview has no request".to_owned()));
    };
    match convert_all(&request.objects, &request.desired_api_version) {
        Ok(converted_objects) => serde_json::to_vec(&Converted {
            api_version: "apiextensions.k8s.io/v1",
            kind: "ConversionReview",
            response: ConvertedResponse {
                uid: &request.uid,
                result: Status::success(),
                converted_objects,
            },
        })
        .unwrap_or_else(|e| encode(&invalid(format!("failed to encode the response: {e}")))),
        Err(message) => {
            let mut response = ConversionResponse::invalid(Status::failure(&message, "Invalid"));
            response.uid = request.uid;
            encode(&response.into_review())
        }
    }
}

/// Whether a review body answered with success (for metrics).
pub fn succeeded(answer: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Answer {
        response: Option<AnswerResponse>,
    }
    #[derive(Deserialize)]
    struct AnswerResponse {
        result: Status,
    }
    serde_json::from_slice::<Answer>(answer)
        .ok()
        .and_then(|a| a.response)
        .is_some_and(|r| r.result.status == Some(kube::core::response::StatusSummary::Success))
}

fn invalid(message: String) -> ConversionReview {
    ConversionResponse::invalid(Status::failure(&message, "BadRequest")).into_review()
}

fn encode(review: &ConversionReview) -> Vec<u8> {
    serde_json::to_vec(review).unwrap_or_else(|_| b"{}".to_vec())
}

fn convert_all(objects: &[&RawValue], desired: &str) -> Result<Vec<Box<RawValue>>, String> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    if objects.len() < PARALLEL_THRESHOLD || threads < 2 {
        return convert_chunk(objects, 0, desired);
    }
    let chunk = objects.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = objects
            .chunks(chunk)
            .enumerate()
            .map(|(i, part)| scope.spawn(move || convert_chunk(part, i * chunk, desired)))
            .collect();
        let mut out = Vec::with_capacity(objects.len());
        for handle in handles {
            let part = handle
                .join()
                .map_err(|_| "conversion failed unexpectedly".to_owned())??;
            out.extend(part);
        }
        Ok(out)
    })
}

fn convert_chunk(
    objects: &[&RawValue],
    offset: usize,
    desired: &str,
) -> Result<Vec<Box<RawValue>>, String> {
    objects
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            convert(raw, desired).map_err(|message| {
                let name = serde_json::from_str::<Head<'_>>(raw.get())
                    .ok()
                    .and_then(|h| h.metadata)
                    .and_then(|m| m.name)
                    .unwrap_or_else(|| "<unnamed>".to_owned());
                format!("object {} ({name}): {message}", offset + i)
            })
        })
        .collect()
}

/// Converts one object to `desired`.
///
/// # Errors
/// Not a PackageRevision, an unknown version, or fields of the wrong type.
pub fn convert(raw: &RawValue, desired: &str) -> Result<Box<RawValue>, String> {
    let head: Head<'_> =
        serde_json::from_str(raw.get()).map_err(|e| format!("not an object: {e}"))?;
    // Decoded whole once: the typed decode and an echo in the same version
    // skip the fields no type reads, where JSON the API server cannot read
    // back (a lone UTF-16 surrogate escape) would pass unseen.
    serde_json::from_str::<serde_json::Value>(raw.get())
        .map_err(|e| format!("invalid JSON: {e}"))?;
    if head.kind != "PackageRevision" {
        return Err(format!(
            "kind {:?} cannot be converted: only PackageRevision",
            head.kind
        ));
    }
    let from = head.api_version.as_ref();
    let encode = |text: Result<String, serde_json::Error>| {
        text.and_then(RawValue::from_string)
            .map_err(|e| format!("failed to encode: {e}"))
    };
    match (from, desired) {
        (f, d) if f == d && (d == V1ALPHA1 || d == V1ALPHA2) => Ok(raw.to_owned()),
        (V1ALPHA1, V1ALPHA2) => {
            let v1: v1alpha1::PackageRevision = serde_json::from_str(raw.get())
                .map_err(|e| format!("invalid {V1ALPHA1} object: {e}"))?;
            encode(serde_json::to_string(
                &to_v1alpha2(&v1).map_err(|e| e.to_string())?,
            ))
        }
        (V1ALPHA2, V1ALPHA1) => {
            let v2: v1alpha2::PackageRevision = serde_json::from_str(raw.get())
                .map_err(|e| format!("invalid {V1ALPHA2} object: {e}"))?;
            encode(serde_json::to_string(
                &to_v1alpha1(&v2).map_err(|e| e.to_string())?,
            ))
        }
        _ => Err(format!(
            "cannot convert from {from:?} to {desired:?}: supported versions are {V1ALPHA1} and {V1ALPHA2}"
        )),
    }
}
