//! Typed decoding of objects in reviews, with unknown fields reported.

use kube::core::DynamicObject;
use serde::de::DeserializeOwned;

/// An object in a review that is not a valid instance of its kind.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("invalid {what}: {source}")]
    Invalid {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid {what}: unknown field(s) {}", fields.join(", "))]
    UnknownFields {
        what: &'static str,
        fields: Vec<String>,
    },
}

/// Decodes an object of a review into its typed form.
///
/// # Errors
/// Wrong types or unknown fields outside `metadata`.
pub fn decode_object<T: DeserializeOwned>(
    raw: &DynamicObject,
    what: &'static str,
) -> Result<T, DecodeError> {
    let value =
        serde_json::to_value(raw).map_err(|source| DecodeError::Invalid { what, source })?;
    decode_value(&value, what)
}

/// Decodes a JSON value into its typed form, reporting ignored fields.
///
/// # Errors
/// Wrong types or unknown fields outside `metadata`, `apiVersion` and `kind`.
pub fn decode_value<T: DeserializeOwned>(
    value: &serde_json::Value,
    what: &'static str,
) -> Result<T, DecodeError> {
    let mut unknown = Vec::new();
    let typed = serde_ignored::deserialize(value, |path| {
        let path = path.to_string();
        let top = path.split('.').next().unwrap_or_default();
        if !matches!(top, "metadata" | "apiVersion" | "kind") {
            unknown.push(path);
        }
    })
    .map_err(|source| DecodeError::Invalid { what, source })?;
    if !unknown.is_empty() {
        unknown.sort();
        unknown.dedup();
        return Err(DecodeError::UnknownFields {
            what,
            fields: unknown,
        });
    }
    Ok(typed)
}
