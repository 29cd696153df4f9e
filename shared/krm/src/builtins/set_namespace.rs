//! set-namespace, v0.4 series (spec §5.1).
//!
//! Difference from the catalog: RoleBinding subjects in the old namespace
//! move with it (the catalog leaves them, because its scope table lists
//! RoleBinding as namespaced and only rewrites subjects of cluster-scoped
//! bindings).

use std::collections::BTreeSet;

use super::scope::is_namespaced;
use super::{Builtin, Failure, config_data, config_kind};
use crate::resource::Resource;
use crate::resourcelist::{ResultItem, Results};
use crate::yaml::Node;

pub(crate) struct SetNamespace;

const DEPENDS_ON: &str = "config.kubernetes.io/depends-on";
const UPSTREAM_IDENTIFIER: &str = "internal.kpt.dev/upstream-identifier";
const PACKAGE_CONTEXT_NAME: &str = "kptfile.kpt.dev";

struct Config {
    namespace: String,
    matcher: Option<String>,
}

fn read_config(config: Option<&Node>) -> Result<Config, String> {
    let Some(config) = config else {
        return Err("FunctionConfig is missing. Expect `ConfigMap.v1` or `SetNamespace.v1alpha1.fn.kpt.dev`".into());
    };
    match config_kind(config) {
        ("v1", "ConfigMap") => {
            let data = config_data(config);
            let matcher = data
                .get("namespaceMatcher")
                .filter(|m| !m.is_empty())
                .cloned();
            match data.get("namespace").filter(|n| !n.is_empty()) {
                Some(ns) => Ok(Config {
                    namespace: ns.clone(),
                    matcher,
                }),
                None if config.str_at(&["metadata", "name"]) == Some(PACKAGE_CONTEXT_NAME) => {
                    match data.get("name").filter(|n| !n.is_empty()) {
                        Some(name) => Ok(Config {
                            namespace: name.clone(),
                            matcher,
                        }),
                        None => Err("`data.name` should not be empty".into()),
                    }
                }
                None => Err("`data.namespace` should not be empty".into()),
            }
        }
        ("fn.kpt.dev/v1alpha1", "SetNamespace") => {
            let namespace = config.str_at(&["namespace"]).unwrap_or("").to_owned();
            if namespace.is_empty() {
                return Err("`namespace` should not be empty".into());
            }
            Ok(Config {
                namespace,
                matcher: config
                    .str_at(&["namespaceMatcher"])
                    .filter(|m| !m.is_empty())
                    .map(str::to_owned),
            })
        }
        (api, kind) => Err(format!(
            "unknown functionConfig Kind={kind} ApiVersion={api}, expect `ConfigMap.v1` or `SetNamespace.v1alpha1.fn.kpt.dev`"
        )),
    }
}

/// `group/namespaces/ns/Kind/name` of a namespaced object.
fn object_id(r: &Resource) -> Option<String> {
    if !is_namespaced(r) {
        return None;
    }
    let ns = match r.namespace() {
        "" => "default",
        ns => ns,
    };
    Some(format!(
        "{}/namespaces/{ns}/{}/{}",
        r.group(),
        r.kind(),
        r.name()
    ))
}

/// The namespace of the upstream origin, from the upstream identifier.
fn origin_namespace(r: &Resource) -> Option<String> {
    let id = r.annotation(UPSTREAM_IDENTIFIER)?;
    let parts: Vec<&str> = id.split('|').collect();
    (parts.len() == 4).then(|| parts[2].to_owned())
}

impl Builtin for SetNamespace {
    fn name(&self) -> &'static str {
        "set-namespace"
    }

    fn series(&self) -> &'static [&'static str] {
        &["v0.4"]
    }

    fn run(
        &self,
        items: &mut Vec<Resource>,
        config: Option<&Node>,
    ) -> Result<Vec<ResultItem>, Failure> {
        let config = match read_config(config) {
            Ok(c) => c,
            // Reported, not failed, as the catalog does.
            Err(message) => return Ok(vec![ResultItem::error(message)]),
        };
        let mut results = Vec::new();
        let targets: Vec<usize> = (0..items.len())
            .filter(|&i| !items[i].is_local_config())
            .collect();
        let ids: BTreeSet<String> = targets
            .iter()
            .filter_map(|&i| object_id(&items[i]))
            .collect();

        let mut origins = BTreeSet::new();
        for &i in &targets {
            let r = &items[i];
            if !is_namespaced(r) {
                continue;
            }
            match origin_namespace(r) {
                Some(ns) if ns == "~C" => {
                    return Ok(vec![ResultItem::error(format!(
                        "{}/{} has a cluster-scoped upstream origin but is namespaced",
                        r.kind(),
                        r.name()
                    ))]);
                }
                Some(ns) => {
                    origins.insert(ns);
                }
                None => {}
            }
        }
        if config.matcher.is_none() && origins.len() > 1 {
            return Ok(vec![ResultItem::error(format!(
                "unable to use origin `namespace` to match. expect a single upstream namespace, found {origins:?}. Please use `namespaceMatcher` to specify the namespace to replace"
            ))]);
        }

        let new = config.namespace.as_str();
        let mut changed = 0usize;
        let mut old_values = BTreeSet::new();
        let mut visit = |slot: &mut Node, origin: &str, old_values: &mut BTreeSet<String>| {
            let current = match slot.as_str() {
                Some("") | None => "default".to_owned(),
                Some(v) => v.to_owned(),
            };
            if origin == "~C" || current == new {
                return;
            }
            let matched = match &config.matcher {
                None => true,
                Some(m) => *m == current || *m == origin,
            };
            if matched {
                old_values.insert(current);
                slot.set_string(new);
                changed += 1;
            }
        };
        for &i in &targets {
            let r = &mut items[i];
            let origin = origin_namespace(r).unwrap_or_default();
            if is_namespaced(r) {
                let origin = if origin.is_empty() {
                    match r.namespace() {
                        "" => "default".to_owned(),
                        ns => ns.to_owned(),
                    }
                } else {
                    origin
                };
                let Some(metadata) = r.object.mapping_at("metadata") else {
                    continue;
                };
                if metadata.get("namespace").is_none() {
                    metadata.set("namespace", Node::string(""));
                }
                if let Some(slot) = metadata.get_mut("namespace") {
                    let before = slot.as_str().map(str::to_owned);
                    visit(slot, &origin, &mut old_values);
                    // An untouched, newly created slot is removed again.
                    if before.as_deref() == Some("") && slot.as_str() == Some("") {
                        metadata.remove("namespace");
                    }
                }
                if r.kind() == "RoleBinding" {
                    rewrite_subjects(&mut r.object, &mut |slot| visit(slot, "", &mut old_values));
                }
                continue;
            }
            match (r.group(), r.kind()) {
                ("", "Namespace") => {
                    if let Some(slot) = r.object.lookup_mut(&["metadata", "name"]) {
                        visit(slot, &origin, &mut old_values);
                    }
                }
                ("apiextensions.k8s.io", "CustomResourceDefinition") => {
                    if let Some(slot) = r.object.lookup_mut(&[
                        "spec",
                        "conversion",
                        "webhook",
                        "clientConfig",
                        "service",
                        "namespace",
                    ]) {
                        visit(slot, "", &mut old_values);
                    }
                }
                ("apiregistration.k8s.io", "APIService") => {
                    if let Some(slot) = r.object.lookup_mut(&["spec", "service", "namespace"]) {
                        visit(slot, "", &mut old_values);
                    }
                }
                (_, "ClusterRoleBinding" | "RoleBinding") => {
                    rewrite_subjects(&mut r.object, &mut |slot| visit(slot, "", &mut old_values));
                }
                _ => {}
            }
        }
        let olds: Vec<String> = old_values.iter().map(|v| format!("{v:?}")).collect();
        results.push(ResultItem::info(if changed > 0 {
            format!(
                "namespace [{}] updated to {new:?}, {changed} value(s) changed",
                olds.join(", ")
            )
        } else {
            format!("all matching namespaces are already {new:?}. no value changed")
        }));

        let mut depends_changed = 0usize;
        let mut depends_old = BTreeSet::new();
        for &i in &targets {
            let r = &mut items[i];
            let Some(value) = r.annotation(DEPENDS_ON).map(str::to_owned) else {
                continue;
            };
            let mut parts: Vec<String> = value.split('/').map(str::to_owned).collect();
            if parts.len() != 5 || parts[1] != "namespaces" || !ids.contains(&value) {
                continue;
            }
            let old = parts[2].clone();
            let matched = config.matcher.as_ref().is_none_or(|m| *m == old);
            if old != new && matched {
                parts[2] = new.to_owned();
                r.set_annotation(DEPENDS_ON, &parts.join("/"));
                depends_old.insert(old);
                depends_changed += 1;
            }
        }
        results.push(ResultItem::info(if depends_changed > 0 {
            let olds: Vec<String> = depends_old.iter().map(|v| format!("{v:?}")).collect();
            format!(
                "`depends-on` annotation namespace [{}] updated to {new:?}, {depends_changed} value(s) changed",
                olds.join(", ")
            )
        } else {
            "all `depends-on` annotations are up-to-date. no `namespace` changed".to_owned()
        }));
        Ok(results)
    }
}

fn rewrite_subjects(object: &mut Node, visit: &mut dyn FnMut(&mut Node)) {
    if let Some(subjects) = object.get_mut("subjects").and_then(Node::as_sequence_mut) {
        for subject in subjects {
            if let Some(slot) = subject.get_mut("namespace") {
                visit(slot);
            }
        }
    }
}
