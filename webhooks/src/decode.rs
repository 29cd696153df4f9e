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
        let segments = field_segments(&path);
        // metadata belongs to the apiserver; status is not written here
        if !segments
            .first()
            .is_some_and(|top| OWN_FIELDS.contains(&top.as_str()))
        {
            unknown.push(segments.join("."));
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

/// Top-level fields of an object that belong to the apiserver or are not
/// written by clients; fields under them are not checked.
pub(crate) const OWN_FIELDS: [&str; 4] = ["metadata", "apiVersion", "kind", "status"];

/// The keys and indices of an ignored field, outermost first, without the
/// `?` serde_ignored shows for an optional value (`spec.git.bogus`, not
/// `spec.git.?.bogus`).
pub(crate) fn field_segments(path: &serde_ignored::Path<'_>) -> Vec<String> {
    let mut segments = Vec::new();
    let mut at = path;
    loop {
        match at {
            serde_ignored::Path::Root => break,
            serde_ignored::Path::Map { parent, key } => {
                segments.push(key.clone());
                at = parent;
            }
            serde_ignored::Path::Seq { parent, index } => {
                segments.push(index.to_string());
                at = parent;
            }
            serde_ignored::Path::Some { parent }
            | serde_ignored::Path::NewtypeStruct { parent }
            | serde_ignored::Path::NewtypeVariant { parent } => at = parent,
        }
    }
    segments.reverse();
    segments
}
