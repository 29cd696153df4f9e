//! [`Node`] ⇄ JSON values, for typed decoding of configs and Kptfiles and for
//! building nodes from typed values.

use serde_json::{Map, Number, Value as Json};

use super::YamlError;
use super::node::{Node, STR_TAG, Style, Value};
use super::resolve::resolve_plain;

/// The JSON value of a node, resolving plain scalars to null, booleans and
/// numbers as YAML does; quoted scalars and `!!str` are strings.
///
/// # Errors
/// Aliases (not supported in typed values) and non-string mapping keys.
pub fn to_json(node: &Node) -> Result<Json, YamlError> {
    Ok(match &node.value {
        Value::Alias(name) => {
            return Err(YamlError::Convert(format!(
                "aliases are not supported here: *{name}"
            )));
        }
        Value::Sequence(items) => Json::Array(items.iter().map(to_json).collect::<Result<_, _>>()?),
        Value::Mapping(entries) => {
            let mut map = Map::new();
            for (k, v) in entries {
                let Some(key) = k.as_str() else {
                    return Err(YamlError::Convert("mapping keys must be scalars".into()));
                };
                map.insert(key.to_owned(), to_json(v)?);
            }
            Json::Object(map)
        }
        Value::Scalar(s) => scalar_json(node, s),
    })
}

fn scalar_json(node: &Node, s: &str) -> Json {
    let tag = match (&node.tag, node.style) {
        (Some(tag), _) => tag.as_str(),
        (None, Style::Plain) => resolve_plain(s),
        (None, _) => STR_TAG,
    };
    match tag {
        "!!null" => Json::Null,
        "!!bool" => Json::Bool(s.eq_ignore_ascii_case("true")),
        "!!int" => parse_int(s).map_or_else(|| Json::String(s.to_owned()), Json::from),
        "!!float" => s
            .replace('_', "")
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map_or_else(|| Json::String(s.to_owned()), Json::Number),
        _ => Json::String(s.to_owned()),
    }
}

fn parse_int(s: &str) -> Option<i64> {
    let plain = s.replace('_', "");
    let (negative, digits) = match plain.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, plain.strip_prefix('+').unwrap_or(&plain)),
    };
    let value = if let Some(hex) = digits.strip_prefix("0x") {
        i64::from_str_radix(hex, 16).ok()?
    } else if let Some(oct) = digits.strip_prefix("0o") {
        i64::from_str_radix(oct, 8).ok()?
    } else if let Some(bin) = digits.strip_prefix("0b") {
        i64::from_str_radix(bin, 2).ok()?
    } else if digits.len() > 1 && digits.starts_with('0') {
        i64::from_str_radix(&digits[1..], 8).ok()?
    } else {
        digits.parse().ok()?
    };
    Some(if negative { -value } else { value })
}

/// A node tree for a JSON value: block collections, strings tagged so they
/// are quoted when they would read back as another type.
pub fn from_json(value: &Json) -> Node {
    match value {
        Json::Null => Node::plain("null"),
        Json::Bool(b) => Node::plain(b.to_string()),
        Json::Number(n) => Node::plain(n.to_string()),
        Json::String(s) => Node::string(s.clone()),
        Json::Array(items) => {
            let mut node = Node::sequence();
            node.value = Value::Sequence(items.iter().map(from_json).collect());
            node
        }
        Json::Object(map) => {
            let mut node = Node::mapping();
            node.value = Value::Mapping(
                map.iter()
                    .map(|(k, v)| (Node::plain(k.clone()), from_json(v)))
                    .collect(),
            );
            node
        }
    }
}
