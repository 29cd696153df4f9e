//! set-labels, v0.2 series (spec §5.2).
//!
//! Difference from the catalog: pod affinity and anti-affinity terms'
//! `labelSelector.matchLabels` are updated (the catalog walks them at the
//! wrong depth and never does).

use std::collections::BTreeMap;

use super::{Builtin, Failure, config_data, config_kind, is_gvk};
use crate::resource::Resource;
use crate::resourcelist::{ResultItem, Results};
use crate::yaml::Node;

pub(crate) struct SetLabels;

fn read_labels(config: Option<&Node>) -> Result<BTreeMap<String, String>, Failure> {
    let Some(config) = config.filter(|c| c.as_mapping().is_some_and(|m| !m.is_empty())) else {
        return Err(Failure::new("`FunctionConfig` is not given"));
    };
    match config_kind(config) {
        ("v1", "ConfigMap") => Ok(config_data(config)),
        ("fn.kpt.dev/v1alpha1", "SetLabels") => {
            let mut out = BTreeMap::new();
            if let Some(entries) = config.get("labels").and_then(Node::as_mapping) {
                for (k, v) in entries {
                    match (k.as_str(), v.as_str()) {
                        (Some(k), Some(v)) => {
                            out.insert(k.to_owned(), v.to_owned());
                        }
                        _ => return Err(Failure::new("`labels` must map strings to strings")),
                    }
                }
            }
            Ok(out)
        }
        (api, kind) => Err(Failure::new(format!(
            "`functionConfig` must be a `ConfigMap` or `SetLabels`, got {kind} {api}"
        ))),
    }
}

/// Sets `key` in the map at `path`, creating it when `create`; otherwise only
/// overwrites an existing key.
fn set_in(node: &mut Node, path: &[&str], key: &str, value: &str, create: bool) {
    let mut target = node;
    for segment in path {
        if create {
            match target.mapping_at(segment) {
                Some(next) => target = next,
                None => return,
            }
        } else {
            match target.get_mut(segment) {
                Some(next) if next.as_mapping().is_some() => target = next,
                _ => return,
            }
        }
    }
    match target.get_mut(key) {
        Some(existing) => existing.set_string(value),
        None if create => target.set(key, Node::string(value)),
        None => {}
    }
}

fn each_item(node: &mut Node, path: &[&str], f: &mut dyn FnMut(&mut Node)) {
    if let Some(items) = node.lookup_mut(path).and_then(Node::as_sequence_mut) {
        items.iter_mut().for_each(f);
    }
}

/// Labels inside a pod spec: topology spread constraints and affinity terms.
fn pod_spec(spec: &mut Node, key: &str, value: &str) {
    each_item(spec, &["topologySpreadConstraints"], &mut |c| {
        set_in(c, &["labelSelector", "matchLabels"], key, value, false);
    });
    for affinity in ["podAffinity", "podAntiAffinity"] {
        each_item(
            spec,
            &[
                "affinity",
                affinity,
                "requiredDuringSchedulingIgnoredDuringExecution",
            ],
            &mut |term| set_in(term, &["labelSelector", "matchLabels"], key, value, false),
        );
        each_item(
            spec,
            &[
                "affinity",
                affinity,
                "preferredDuringSchedulingIgnoredDuringExecution",
            ],
            &mut |term| {
                set_in(
                    term,
                    &["podAffinityTerm", "labelSelector", "matchLabels"],
                    key,
                    value,
                    false,
                );
            },
        );
    }
}

fn pod_template(template: &mut Node, key: &str, value: &str) {
    set_in(template, &["metadata", "labels"], key, value, true);
    if let Some(spec) = template.get_mut("spec") {
        pod_spec(spec, key, value);
    }
}

fn apply(r: &mut Resource, key: &str, value: &str) {
    set_in(&mut r.object, &["metadata", "labels"], key, value, true);
    let workload = ["Deployment", "ReplicaSet", "DaemonSet"]
        .iter()
        .any(|k| is_gvk(r, "", "", k));
    let stateful = is_gvk(r, "apps", "", "StatefulSet");
    let rc = is_gvk(r, "", "v1", "ReplicationController");
    let job = is_gvk(r, "batch", "", "Job");
    let obj = &mut r.object;
    if is_gvk_of(obj, "", "v1", "Service") || rc {
        set_in(obj, &["spec", "selector"], key, value, true);
    }
    if workload || stateful {
        set_in(obj, &["spec", "selector", "matchLabels"], key, value, true);
    }
    if job || is_gvk_of(obj, "policy", "", "PodDisruptionBudget") {
        set_in(obj, &["spec", "selector", "matchLabels"], key, value, false);
    }
    if is_gvk_of(obj, "networking.k8s.io", "", "NetworkPolicy") {
        set_in(
            obj,
            &["spec", "podSelector", "matchLabels"],
            key,
            value,
            false,
        );
        each_item(obj, &["spec", "ingress"], &mut |rule| {
            each_item(rule, &["from"], &mut |peer| {
                set_in(peer, &["podSelector", "matchLabels"], key, value, false);
            });
        });
        each_item(obj, &["spec", "egress"], &mut |rule| {
            each_item(rule, &["to"], &mut |peer| {
                set_in(peer, &["podSelector", "matchLabels"], key, value, false);
            });
        });
    }
    if (rc || workload || stateful || job)
        && let Some(template) = obj.lookup_mut(&["spec", "template"])
    {
        pod_template(template, key, value);
    }
    if is_gvk_of(obj, "batch", "", "CronJob") {
        if let Some(job_template) = obj.lookup_mut(&["spec", "jobTemplate"]) {
            set_in(job_template, &["metadata", "labels"], key, value, true);
            set_in(
                job_template,
                &["spec", "selector", "matchLabels"],
                key,
                value,
                false,
            );
        }
        if let Some(template) = obj.lookup_mut(&["spec", "jobTemplate", "spec", "template"]) {
            pod_template(template, key, value);
        }
    }
    if stateful {
        each_item(obj, &["spec", "volumeClaimTemplates"], &mut |claim| {
            set_in(claim, &["metadata", "labels"], key, value, true);
            set_in(
                claim,
                &["spec", "selector", "matchLabels"],
                key,
                value,
                false,
            );
        });
    }
}

fn is_gvk_of(obj: &Node, group: &str, version: &str, kind: &str) -> bool {
    let api = obj.str_at(&["apiVersion"]).unwrap_or("");
    let (g, v) = api.rsplit_once('/').unwrap_or(("", api));
    let k = obj.str_at(&["kind"]).unwrap_or("");
    let ok = |want: &str, have: &str| want.is_empty() || have.is_empty() || want == have;
    ok(group, g) && ok(version, v) && ok(kind, k)
}

impl Builtin for SetLabels {
    fn name(&self) -> &'static str {
        "set-labels"
    }

    fn series(&self) -> &'static [&'static str] {
        &["v0.2"]
    }

    fn run(
        &self,
        items: &mut Vec<Resource>,
        config: Option<&Node>,
    ) -> Result<Vec<ResultItem>, Failure> {
        let labels = read_labels(config)?;
        if labels.is_empty() {
            return Ok(vec![ResultItem::warning("no labels are given")]);
        }
        let mut count = 0usize;
        for r in items.iter_mut().filter(|r| !r.is_local_config()) {
            for (key, value) in &labels {
                apply(r, key, value);
                count += 1;
            }
        }
        Ok(vec![ResultItem::info(format!(
            "set {count} labels in total"
        ))])
    }
}
