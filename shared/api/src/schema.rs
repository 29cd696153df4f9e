//! Schema helpers for fields that schemars cannot describe structurally.

use schemars::{Schema, SchemaGenerator, json_schema};

/// Any JSON value, kept as is by the apiserver (no pruning).
pub(crate) fn any_value(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}
