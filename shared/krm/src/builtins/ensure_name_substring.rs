//! ensure-name-substring, v0.2 series (spec §5.7): names get a prefix or
//! suffix unless they already contain it, and references to renamed objects
//! follow (pod volumes and env, service accounts, role bindings, ingress
//! backends, scale targets, `depends-on`).

use std::collections::HashMap;

use serde::Deserialize;

use super::{Builtin, Failure, FieldSpec, config_data, config_kind, is_gvk, typed_config};
use crate::resource::Resource;
use crate::resourcelist::{ResultItem, Results};
use crate::yaml::Node;

pub(crate) struct EnsureNameSubstring;

const DEPENDS_ON: &str = "config.kubernetes.io/depends-on";

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Prepend,
    Append,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypedConfig {
    #[serde(default)]
    substring: String,
    #[serde(default)]
    edit_mode: String,
    #[serde(default)]
    additional_name_fields: Vec<FieldSpec>,
    #[serde(default)]
    field_specs: Vec<FieldSpec>,
}

fn read_config(config: Option<&Node>) -> Result<(String, Mode, Vec<FieldSpec>), Failure> {
    let Some(config) = config else {
        return Err(Failure::new("`functionConfig` is not given"));
    };
    match config_kind(config) {
        ("v1", "ConfigMap") => {
            let data = config_data(config);
            if data.len() != 1 {
                return Err(Failure::new(
                    "ConfigMap functionConfig must have exactly one entry: `prepend` or `append`",
                ));
            }
            let (key, value) = data.into_iter().next().unwrap_or_default();
            let mode = match key.as_str() {
                "prepend" => Mode::Prepend,
                "append" => Mode::Append,
                other => {
                    return Err(Failure::new(format!(
                        "unknown key {other:?}: expected `prepend` or `append`"
                    )));
                }
            };
            Ok((value, mode, Vec::new()))
        }
        ("fn.kpt.dev/v1alpha1", "EnsureNameSubstring") => {
            let typed: TypedConfig = typed_config(config)?;
            let mode = match typed.edit_mode.as_str() {
                "" | "prepend" => Mode::Prepend,
                "append" => Mode::Append,
                other => return Err(Failure::new(format!("unknown editMode {other:?}"))),
            };
            let mut specs = typed.additional_name_fields;
            specs.extend(typed.field_specs);
            Ok((typed.substring, mode, specs))
        }
        (api, kind) => Err(Failure::new(format!(
            "`functionConfig` must be a `ConfigMap` or `EnsureNameSubstring`, got {kind} {api}"
        ))),
    }
}

fn skipped(r: &Resource) -> bool {
    is_gvk(r, "apiextensions.k8s.io", "", "CustomResourceDefinition")
        || is_gvk(r, "apiregistration.k8s.io", "", "APIService")
        || (r.group().is_empty() && r.kind() == "Namespace")
        || (r.group() == "kpt.dev" && r.kind() == "Kptfile")
}

fn edit(value: &str, substring: &str, mode: Mode) -> Option<String> {
    if value.is_empty() || value.contains(substring) {
        return None;
    }
    Some(match mode {
        Mode::Prepend => format!("{substring}{value}"),
        Mode::Append => format!("{value}{substring}"),
    })
}

/// Renames `(kind, old) → new`.
type Renames = HashMap<(String, String), String>;

fn rename_ref(node: Option<&mut Node>, kind: &str, renames: &Renames) {
    if let Some(slot) = node
        && let Some(old) = slot.as_str()
        && let Some(new) = renames.get(&(kind.to_owned(), old.to_owned()))
    {
        let new = new.clone();
        slot.set_string(&new);
    }
}

fn for_items(node: &mut Node, path: &[&str], f: &mut dyn FnMut(&mut Node)) {
    if let Some(items) = node.lookup_mut(path).and_then(Node::as_sequence_mut) {
        items.iter_mut().for_each(f);
    }
}

fn pod_spec(spec: &mut Node, renames: &Renames) {
    rename_ref(
        spec.get_mut("serviceAccountName"),
        "ServiceAccount",
        renames,
    );
    rename_ref(spec.get_mut("serviceAccount"), "ServiceAccount", renames);
    for_items(spec, &["imagePullSecrets"], &mut |s| {
        rename_ref(s.get_mut("name"), "Secret", renames)
    });
    for_items(spec, &["volumes"], &mut |v| {
        rename_ref(v.lookup_mut(&["configMap", "name"]), "ConfigMap", renames);
        rename_ref(v.lookup_mut(&["secret", "secretName"]), "Secret", renames);
        rename_ref(
            v.lookup_mut(&["persistentVolumeClaim", "claimName"]),
            "PersistentVolumeClaim",
            renames,
        );
        for_items(v, &["projected", "sources"], &mut |s| {
            rename_ref(s.lookup_mut(&["configMap", "name"]), "ConfigMap", renames);
            rename_ref(s.lookup_mut(&["secret", "name"]), "Secret", renames);
        });
    });
    for containers in ["containers", "initContainers", "ephemeralContainers"] {
        for_items(spec, &[containers], &mut |c| {
            for_items(c, &["env"], &mut |e| {
                rename_ref(
                    e.lookup_mut(&["valueFrom", "configMapKeyRef", "name"]),
                    "ConfigMap",
                    renames,
                );
                rename_ref(
                    e.lookup_mut(&["valueFrom", "secretKeyRef", "name"]),
                    "Secret",
                    renames,
                );
            });
            for_items(c, &["envFrom"], &mut |e| {
                rename_ref(
                    e.lookup_mut(&["configMapRef", "name"]),
                    "ConfigMap",
                    renames,
                );
                rename_ref(e.lookup_mut(&["secretRef", "name"]), "Secret", renames);
            });
        });
    }
}

fn references(r: &mut Resource, renames: &Renames) {
    let kind = r.kind().to_owned();
    let obj = &mut r.object;
    match kind.as_str() {
        "Pod" => {
            if let Some(spec) = obj.get_mut("spec") {
                pod_spec(spec, renames);
            }
        }
        "Deployment"
        | "ReplicaSet"
        | "DaemonSet"
        | "StatefulSet"
        | "Job"
        | "ReplicationController" => {
            if let Some(spec) = obj.lookup_mut(&["spec", "template", "spec"]) {
                pod_spec(spec, renames);
            }
            if kind == "StatefulSet" {
                rename_ref(obj.lookup_mut(&["spec", "serviceName"]), "Service", renames);
            }
        }
        "CronJob" => {
            if let Some(spec) = obj.lookup_mut(&["spec", "jobTemplate", "spec", "template", "spec"])
            {
                pod_spec(spec, renames);
            }
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let role_kind = obj.str_at(&["roleRef", "kind"]).unwrap_or("").to_owned();
            rename_ref(obj.lookup_mut(&["roleRef", "name"]), &role_kind, renames);
            for_items(obj, &["subjects"], &mut |s| {
                if s.str_at(&["kind"]) == Some("ServiceAccount") {
                    rename_ref(s.get_mut("name"), "ServiceAccount", renames);
                }
            });
        }
        "Ingress" => {
            rename_ref(
                obj.lookup_mut(&["spec", "defaultBackend", "service", "name"]),
                "Service",
                renames,
            );
            rename_ref(
                obj.lookup_mut(&["spec", "backend", "serviceName"]),
                "Service",
                renames,
            );
            for_items(obj, &["spec", "tls"], &mut |t| {
                rename_ref(t.get_mut("secretName"), "Secret", renames)
            });
            for_items(obj, &["spec", "rules"], &mut |rule| {
                for_items(rule, &["http", "paths"], &mut |p| {
                    rename_ref(
                        p.lookup_mut(&["backend", "service", "name"]),
                        "Service",
                        renames,
                    );
                    rename_ref(
                        p.lookup_mut(&["backend", "serviceName"]),
                        "Service",
                        renames,
                    );
                });
            });
        }
        "HorizontalPodAutoscaler" => {
            let target = obj
                .str_at(&["spec", "scaleTargetRef", "kind"])
                .unwrap_or("")
                .to_owned();
            rename_ref(
                obj.lookup_mut(&["spec", "scaleTargetRef", "name"]),
                &target,
                renames,
            );
        }
        _ => {}
    }
}

impl Builtin for EnsureNameSubstring {
    fn name(&self) -> &'static str {
        "ensure-name-substring"
    }

    fn series(&self) -> &'static [&'static str] {
        &["v0.1", "v0.2"]
    }

    fn run(
        &self,
        items: &mut Vec<Resource>,
        config: Option<&Node>,
    ) -> Result<Vec<ResultItem>, Failure> {
        let (substring, mode, specs) = read_config(config)?;
        if substring.is_empty() {
            return Err(Failure::new("`substring` must not be empty"));
        }
        let mut renames = Renames::new();
        let mut count = 0usize;
        for r in items.iter_mut().filter(|r| !skipped(r)) {
            let kind = r.kind().to_owned();
            if let Some(slot) = r.object.lookup_mut(&["metadata", "name"])
                && let Some(old) = slot.as_str().map(str::to_owned)
                && let Some(new) = edit(&old, &substring, mode)
            {
                slot.set_string(&new);
                renames.insert((kind, old), new);
                count += 1;
            }
            for spec in &specs {
                let Some(path) = spec.segments_for(r) else {
                    continue;
                };
                if let Some(slot) = r.object.lookup_mut(&path)
                    && let Some(old) = slot.as_str().map(str::to_owned)
                    && let Some(new) = edit(&old, &substring, mode)
                {
                    slot.set_string(&new);
                    count += 1;
                }
            }
        }
        for r in items.iter_mut() {
            references(r, &renames);
            if let Some(value) = r.annotation(DEPENDS_ON).map(str::to_owned) {
                let mut parts: Vec<String> = value.split('/').map(str::to_owned).collect();
                let n = parts.len();
                if (n == 5 || n == 3)
                    && let Some(new) = renames.get(&(parts[n - 2].clone(), parts[n - 1].clone()))
                {
                    parts[n - 1] = new.clone();
                    r.set_annotation(DEPENDS_ON, &parts.join("/"));
                }
            }
        }
        Ok(vec![ResultItem::info(format!("updated {count} name(s)"))])
    }
}
