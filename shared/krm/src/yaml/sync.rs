//! After a function that speaks the wire format, kpt copies comments from
//! each input object onto the matching fields of its output and puts the
//! output's keys back in the input's order (new keys after).

use super::node::{Node, Value};

/// Copies comments the output lacks from the input, and orders mapping keys
/// as in the input.
pub fn sync_comments_and_order(input: &Node, output: &mut Node) {
    if output.head_comment.is_empty() {
        output.head_comment.clone_from(&input.head_comment);
    }
    if output.line_comment.is_none() {
        output.line_comment.clone_from(&input.line_comment);
    }
    if output.foot_comment.is_empty() {
        output.foot_comment.clone_from(&input.foot_comment);
    }
    match (&input.value, &mut output.value) {
        (Value::Mapping(before), Value::Mapping(after)) => {
            let position = |key: &Node| {
                before
                    .iter()
                    .position(|(k, _)| k.as_str().is_some() && k.as_str() == key.as_str())
            };
            // Stable: keys known to the input in its order, then new keys.
            after.sort_by_key(|(k, _)| position(k).unwrap_or(usize::MAX));
            for (key, value) in after.iter_mut() {
                if let Some(i) = position(key) {
                    let (in_key, in_value) = &before[i];
                    sync_comments_and_order(in_key, key);
                    sync_comments_and_order(in_value, value);
                }
            }
        }
        (Value::Sequence(before), Value::Sequence(after)) => {
            for (in_item, out_item) in before.iter().zip(after.iter_mut()) {
                sync_comments_and_order(in_item, out_item);
            }
        }
        _ => {}
    }
}
