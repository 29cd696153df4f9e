//! set-annotations, v0.1 series (spec §5.3): every object, local-config
//! ones included, plus the pod templates of workloads.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Builtin, Failure, FieldSpec, config_data, config_kind, is_gvk, typed_config};
use crate::resource::Resource;
use crate::resourcelist::{ResultItem, Results};
use crate::yaml::Node;

pub(crate) struct SetAnnotations;

#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct TypedConfig {
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    additional_annotation_fields: Vec<FieldSpec>,
    #[serde(default)]
    field_specs: Vec<FieldSpec>,
}

fn read_config(
    config: Option<&Node>,
) -> Result<(BTreeMap<String, String>, Vec<FieldSpec>), Failure> {
    let Some(config) = config else {
        return Err(Failure::new("`functionConfig` is not given"));
    };
    match config_kind(config) {
        ("v1", "ConfigMap") => Ok((config_data(config), Vec::new())),
        ("fn.kpt.dev/v1alpha1", "SetAnnotations" | "SetAnnotationConfig") => {
            let typed: TypedConfig = typed_config(config)?;
            if !typed.additional_annotation_fields.is_empty() && !typed.field_specs.is_empty() {
                return Err(Failure::new(
                    "`fieldSpecs` is deprecated and cannot be used with `additionalAnnotationFields`",
                ));
            }
            let mut specs = typed.additional_annotation_fields;
            specs.extend(typed.field_specs);
            Ok((typed.annotations, specs))
        }
        (api, kind) => Err(Failure::new(format!(
            "`functionConfig` must be a `ConfigMap` or `SetAnnotations`, got {kind} {api}"
        ))),
    }
}

/// The default places annotations go, beyond `metadata.annotations`.
fn default_paths(r: &Resource) -> Vec<&'static [&'static str]> {
    let mut paths: Vec<&'static [&'static str]> = vec![&["metadata", "annotations"]];
    let templated = is_gvk(r, "", "v1", "ReplicationController")
        || ["Deployment", "ReplicaSet", "DaemonSet"]
            .iter()
            .any(|k| is_gvk(r, "", "", k))
        || is_gvk(r, "apps", "", "StatefulSet")
        || is_gvk(r, "batch", "", "Job");
    if templated {
        paths.push(&["spec", "template", "metadata", "annotations"]);
    }
    if is_gvk(r, "batch", "", "CronJob") {
        paths.push(&["spec", "jobTemplate", "metadata", "annotations"]);
        paths.push(&[
            "spec",
            "jobTemplate",
            "spec",
            "template",
            "metadata",
            "annotations",
        ]);
    }
    paths
}

fn set_map(
    object: &mut Node,
    path: &[&str],
    annotations: &BTreeMap<String, String>,
    create: bool,
) -> bool {
    let mut target = object;
    for segment in path {
        let next = if create {
            target.mapping_at(segment)
        } else {
            target.get_mut(segment).filter(|n| n.as_mapping().is_some())
        };
        match next {
            Some(n) => target = n,
            None => return false,
        }
    }
    for (k, v) in annotations {
        match target.get_mut(k) {
            Some(existing) => existing.set_string(v),
            None => target.set(k, Node::string(v.clone())),
        }
    }
    true
}

impl Builtin for SetAnnotations {
    fn name(&self) -> &'static str {
        "set-annotations"
    }

    fn series(&self) -> &'static [&'static str] {
        &["v0.1"]
    }

    fn run(
        &self,
        items: &mut Vec<Resource>,
        config: Option<&Node>,
    ) -> Result<Vec<ResultItem>, Failure> {
        let (annotations, specs) = read_config(config)?;
        if annotations.is_empty() {
            return Err(Failure::new("input annotation list cannot be empty"));
        }
        let rendered = serde_json::to_string(&annotations).unwrap_or_default();
        let mut results = Vec::new();
        for r in items.iter_mut() {
            let mut paths: Vec<(Vec<String>, bool)> = default_paths(r)
                .into_iter()
                .map(|p| (p.iter().map(|s| (*s).to_owned()).collect(), true))
                .collect();
            for spec in &specs {
                if let Some(segments) = spec.segments_for(r) {
                    paths.push((
                        segments.into_iter().map(str::to_owned).collect(),
                        spec.create,
                    ));
                }
            }
            for (path, create) in paths {
                let segments: Vec<&str> = path.iter().map(String::as_str).collect();
                if set_map(&mut r.object, &segments, &annotations, create) {
                    let message = format!("set annotations: {rendered}");
                    let item = ResultItem::info(message).at(r, &path.join("."));
                    results.push(item);
                }
            }
        }
        if results.is_empty() {
            results.push(ResultItem::info("no annotations applied"));
        }
        Ok(results)
    }
}
