//! Typed decoding of objects in reviews, with unknown fields reported.

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

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

/// Decodes raw JSON into its typed form, reporting ignored fields.
///
/// # Errors
/// Wrong types or unknown fields outside `metadata`, `status`, `apiVersion`
/// and `kind`.
pub fn decode_raw<T: DeserializeOwned>(
    raw: &RawValue,
    what: &'static str,
) -> Result<T, DecodeError> {
    let mut unknown = Vec::new();
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let typed = serde_ignored::deserialize(&mut de, |path| {
        let path = path.to_string();
        let top = path.split('.').next().unwrap_or_default();
        // metadata belongs to the apiserver; status is not written here
        if !matches!(top, "metadata" | "apiVersion" | "kind" | "status") {
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
