//! YAML with kpt's formatting: parse files into [`Node`] trees that keep
//! comments, key order and scalar styles, and write them back the way kpt
//! writes package files.

mod emit;
mod json;
mod node;
mod parse;
mod resolve;
mod sync;

pub use emit::{SeqIndent, emit_document, emit_documents, emit_settled};
pub use json::{from_json, to_json};
pub use node::{Node, STR_TAG, Style, Value};
pub use parse::{Document, parse_document, parse_documents};
pub use resolve::resolve_plain;
pub use sync::sync_comments_and_order;

/// Why a YAML text could not be read.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum YamlError {
    #[error("yaml: line {line}: {message}")]
    Syntax { line: usize, message: String },
    #[error("yaml: {0}")]
    Convert(String),
}
