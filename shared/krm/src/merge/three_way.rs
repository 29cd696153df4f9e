//! Field-level three-way merge of YAML trees (spec §6.4, §6.3): what
//! upstream changed wins, everything else stays as the local copy has it.
//! The result is built on the local (`dest`) tree, so its comments and key
//! order survive; keys upstream added come after.

use crate::yaml::{Node, Value};

/// How sequences are matched element by element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListRule {
    /// Merge keys of Kubernetes' built-in types, by field name.
    Schema,
    /// Any list whose elements are maps with one of kyaml's inference keys
    /// (the Kptfile merge).
    Inference,
}

const INFERENCE_KEYS: [&str; 7] = [
    "name",
    "mountPath",
    "devicePath",
    "ip",
    "type",
    "topologyKey",
    "containerPort",
];

/// The merge key of a list field of a built-in type, if it is associative.
fn schema_key(field: &str, items: &[&Node]) -> Option<&'static str> {
    let has = |key: &str| items.iter().all(|n| n.get(key).is_some());
    let key = match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "volumeClaimTemplates" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        "conditions" => "type",
        "readinessGates" => "conditionType",
        "ownerReferences" => "uid",
        "ports" if has("containerPort") => "containerPort",
        "ports" if has("port") => "port",
        _ => return None,
    };
    has(key).then_some(key)
}

fn inferred_key(items: &[&Node]) -> Option<&'static str> {
    if items.is_empty() || items.iter().any(|n| n.as_mapping().is_none()) {
        return None;
    }
    INFERENCE_KEYS
        .iter()
        .find(|k| items.iter().all(|n| n.get(k).is_some()))
        .copied()
}

/// Structural equality, ignoring comments and styles.
pub fn same(a: &Node, b: &Node) -> bool {
    match (&a.value, &b.value) {
        (Value::Scalar(x), Value::Scalar(y)) => x == y && (a.is_null() == b.is_null()),
        (Value::Alias(x), Value::Alias(y)) => x == y,
        (Value::Sequence(x), Value::Sequence(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Mapping(x), Value::Mapping(y)) => {
            x.len() == y.len()
                && x.iter().all(|(k, v)| {
                    y.iter()
                        .find(|(k2, _)| k2.as_str() == k.as_str())
                        .is_some_and(|(_, v2)| same(v, v2))
                })
        }
        _ => false,
    }
}

fn opt_same(a: Option<&Node>, b: Option<&Node>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => same(a, b),
        _ => false,
    }
}

/// Merges one field. `None` in the result means the field is removed.
pub fn merge(
    original: Option<&Node>,
    updated: Option<&Node>,
    dest: Option<&Node>,
    field: &str,
    rule: ListRule,
) -> Option<Node> {
    // An explicit null upstream or locally removes the field.
    if updated.is_some_and(Node::is_null) && !original.is_some_and(Node::is_null) {
        return None;
    }
    if dest.is_some_and(Node::is_null) && !original.is_some_and(Node::is_null) {
        return None;
    }
    let kind_of = |n: Option<&Node>| n.map(|n| std::mem::discriminant(&n.value));
    let all_maps = [original, updated, dest]
        .iter()
        .flatten()
        .all(|n| n.as_mapping().is_some());
    let all_seqs = [original, updated, dest]
        .iter()
        .flatten()
        .all(|n| n.as_sequence().is_some());
    if all_maps && (updated.is_some() || dest.is_some()) {
        if updated.is_none() && dest.is_none() {
            return None;
        }
        // Upstream removed the whole map and the local copy did not change it.
        if updated.is_none() && opt_same(original, dest) {
            return None;
        }
        let merged = merge_maps(original, updated, dest, rule);
        // A map deleted locally whose fields upstream left alone stays deleted.
        if dest.is_none() && merged.as_mapping().is_some_and(Vec::is_empty) && original.is_some() {
            return None;
        }
        return Some(merged);
    }
    if all_seqs && updated.is_some() && dest.is_some() && kind_of(updated) == kind_of(dest) {
        let items: Vec<&Node> = [original, updated, dest]
            .iter()
            .flatten()
            .flat_map(|n| n.as_sequence().into_iter().flatten())
            .collect();
        let key = match rule {
            ListRule::Schema => schema_key(field, &items),
            ListRule::Inference => inferred_key(&items),
        };
        if let Some(key) = key {
            return Some(merge_lists(original, updated, dest, key, rule));
        }
    }
    merge_values(original, updated, dest)
}

/// Scalars and non-associative lists: an upstream change wins, otherwise the
/// local value stays.
fn merge_values(
    original: Option<&Node>,
    updated: Option<&Node>,
    dest: Option<&Node>,
) -> Option<Node> {
    if original.is_some() != updated.is_some() {
        // Added or removed upstream.
        return match updated {
            Some(u) => Some(u.clone()),
            None => {
                if opt_same(original, dest) {
                    None
                } else {
                    dest.cloned()
                }
            }
        };
    }
    match (updated, dest) {
        (None, None) => None,
        (None, Some(d)) => Some(d.clone()),
        (Some(u), None) => {
            // Deleted locally: stays deleted unless upstream changed it.
            if opt_same(original, Some(u)) {
                None
            } else {
                Some(u.clone())
            }
        }
        (Some(u), Some(d)) => {
            if !opt_same(original, Some(u)) {
                Some(u.clone())
            } else {
                Some(d.clone())
            }
        }
    }
}

fn entries(node: Option<&Node>) -> &[(Node, Node)] {
    node.and_then(Node::as_mapping).map_or(&[], Vec::as_slice)
}

fn merge_maps(
    original: Option<&Node>,
    updated: Option<&Node>,
    dest: Option<&Node>,
    rule: ListRule,
) -> Node {
    let mut out = dest.cloned().unwrap_or_else(|| {
        let mut m = updated.cloned().unwrap_or_else(Node::mapping);
        m.value = Value::Mapping(Vec::new());
        m
    });
    fn get<'a>(n: Option<&'a Node>, k: &str) -> Option<&'a Node> {
        n.and_then(|n| n.get(k))
    }
    let mut merged: Vec<(Node, Node)> = Vec::new();
    // Local keys in local order, then upstream's new keys in upstream order.
    let mut keys: Vec<&Node> = entries(dest).iter().map(|(k, _)| k).collect();
    for (k, _) in entries(updated) {
        if !keys.iter().any(|d| d.as_str() == k.as_str()) {
            keys.push(k);
        }
    }
    for key in keys {
        let Some(name) = key.as_str() else {
            continue;
        };
        if let Some(value) = merge(
            get(original, name),
            get(updated, name),
            get(dest, name),
            name,
            rule,
        ) {
            merged.push((key.clone(), value));
        }
    }
    out.value = Value::Mapping(merged);
    out
}

fn key_of<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.get(key).and_then(Node::as_str)
}

fn merge_lists(
    original: Option<&Node>,
    updated: Option<&Node>,
    dest: Option<&Node>,
    key: &str,
    rule: ListRule,
) -> Node {
    let items = |n: Option<&Node>| -> Vec<Node> {
        n.and_then(Node::as_sequence).cloned().unwrap_or_default()
    };
    let (orig, upd, dst) = (items(original), items(updated), items(dest));
    let find = |list: &[Node], k: &str| list.iter().find(|n| key_of(n, key) == Some(k)).cloned();
    let mut out = dest.cloned().unwrap_or_else(Node::sequence);
    let mut merged = Vec::new();
    for d in &dst {
        let Some(k) = key_of(d, key) else {
            merged.push(d.clone());
            continue;
        };
        let o = find(&orig, k);
        let u = find(&upd, k);
        // Removed upstream: gone unless it was never upstream.
        if o.is_some() && u.is_none() {
            continue;
        }
        if let Some(m) = merge(o.as_ref(), u.as_ref(), Some(d), "", rule) {
            merged.push(m);
        }
    }
    for u in &upd {
        let Some(k) = key_of(u, key) else {
            continue;
        };
        if dst.iter().any(|d| key_of(d, key) == Some(k)) {
            continue;
        }
        let o = find(&orig, k);
        // Deleted locally and unchanged upstream: stays deleted.
        if o.as_ref().is_some_and(|o| same(o, u)) {
            continue;
        }
        if let Some(m) = merge(o.as_ref(), Some(u), None, "", rule) {
            merged.push(m);
        }
    }
    out.value = Value::Sequence(merged);
    out
}
