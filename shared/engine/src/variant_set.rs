//! The variant set handler (packagevariants spec §3): a
//! PackageVariantSet's targets unrolled into one PackageVariant spec each
//! (templates with CEL expressions), the variants created, updated when
//! their spec differs, and removed when no target wants them. No git.
//!
//! Where the reference falls short, this handler:
//! - writes a variant only when its desired spec differs (the reference
//!   updates every variant on every reconcile);
//! - keeps the variants of a selector that matches nothing and says so in
//!   `Ready` (the reference deletes them all);
//! - holds a finalizer and deletes its variants itself before it goes (the
//!   reference relies on garbage collection, whose order it does not
//!   control);
//! - refuses CEL expressions too long or too deeply nested to evaluate
//!   safely, with a message.

use std::collections::BTreeMap;

use json_patch::{AddOperation, PatchOperation, RemoveOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use porch_api::invocation::{
    Apply, Invocation, ObjectPatch, ObjectRef, Operation, Outcome, Subresource,
};
use porch_api::kptfile::{Function, Pipeline};
use porch_api::repository::Repository;
use porch_api::v1alpha2::PackageRevision;
use porch_api::variant::{
    Downstream, InjectionSelector, MapExpr, PACKAGE_VARIANT_FINALIZER, PACKAGE_VARIANT_SET_LABEL,
    PackageContext, PackageVariant, PackageVariantSet, PackageVariantSetStatus, PackageVariantSpec,
    PackageVariantTemplate, Target, package_variant_key, package_variant_name,
};
use serde_json::{Value, json};

use crate::HandlerError;

/// Field manager of the variants a set writes.
pub const SET_MANAGER: &str = "packagevariantset-controller";
/// The set's own finalizer: its variants are deleted before it goes.
pub const PACKAGE_VARIANT_SET_FINALIZER: &str = "config.porch.kpt.dev/packagevariantsets";
/// Longest CEL expression evaluated.
pub const MAX_EXPRESSION_LEN: usize = 4096;
/// Deepest nesting of brackets in a CEL expression evaluated.
pub const MAX_EXPRESSION_DEPTH: usize = 32;
const CLEANUP_REQUEUE_SECONDS: u64 = 2;

fn path(p: &str) -> json_patch::jsonptr::PointerBuf {
    p.try_into().unwrap_or_default()
}

fn condition(type_: &str, status: bool, reason: &str, message: &str, now: &Time) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: None,
        last_transition_time: now.clone(),
    }
}

/// What CEL sees of an object: its name, namespace, labels, annotations.
fn cel_object(metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Value {
    json!({
        "name": metadata.name.clone().unwrap_or_default(),
        "namespace": metadata.namespace.clone().unwrap_or_default(),
        "labels": metadata.labels.clone().unwrap_or_default(),
        "annotations": metadata.annotations.clone().unwrap_or_default(),
    })
}

fn cel_object_of(value: &Value) -> Value {
    let metadata = &value["metadata"];
    json!({
        "name": metadata["name"].as_str().unwrap_or(""),
        "namespace": metadata["namespace"].as_str().unwrap_or(""),
        "labels": if metadata["labels"].is_object() { metadata["labels"].clone() } else { json!({}) },
        "annotations": if metadata["annotations"].is_object() { metadata["annotations"].clone() } else { json!({}) },
    })
}

/// Whether `labels` satisfy a label selector (`matchLabels` and
/// `matchExpressions` with `In`, `NotIn`, `Exists`, `DoesNotExist`).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labelled = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    labelled
        && selector.match_expressions.iter().flatten().all(|r| {
            let value = labels.get(&r.key);
            let values = r.values.clone().unwrap_or_default();
            match r.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

fn labels_of(value: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(value["metadata"]["labels"].clone()).unwrap_or_default()
}

/// One variant to render: the template, its defaults and what it targets.
#[derive(Debug)]
struct Context<'a> {
    template: Option<&'a PackageVariantTemplate>,
    repo_default: String,
    package_default: String,
    target: Value,
}

/// The CEL variables of one variant (spec §3.6).
struct Environment {
    variables: Vec<(&'static str, cel::Value)>,
}

impl Environment {
    fn eval(&self, expression: &str) -> Result<String, String> {
        if expression.len() > MAX_EXPRESSION_LEN {
            return Err(format!(
                "expression longer than {MAX_EXPRESSION_LEN} characters"
            ));
        }
        let mut depth = 0usize;
        for c in expression.chars() {
            match c {
                '(' | '[' | '{' => {
                    depth += 1;
                    if depth > MAX_EXPRESSION_DEPTH {
                        return Err(format!(
                            "expression nested deeper than {MAX_EXPRESSION_DEPTH} levels"
                        ));
                    }
                }
                ')' | ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        let program = cel::Program::compile(expression).map_err(|e| e.to_string())?;
        let mut context = cel::Context::default();
        for (name, value) in &self.variables {
            context.add_variable_from_value(*name, value.clone());
        }
        match program.execute(&context) {
            Ok(cel::Value::String(s)) => Ok(s.to_string()),
            Ok(other) => Err(format!(
                "expression must evaluate to a string, not {:?}",
                other.type_of()
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    fn set(&mut self, name: &'static str, value: &Value) -> Result<(), String> {
        let value = cel::to_value(value).map_err(|e| e.to_string())?;
        self.variables.retain(|(n, _)| *n != name);
        self.variables.push((name, value));
        Ok(())
    }
}

/// `base` overlaid with `exprs` in order (later entries win).
fn overlay(
    env: &Environment,
    base: &BTreeMap<String, String>,
    exprs: &[MapExpr],
    field: &str,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = base.clone();
    for (i, e) in exprs.iter().enumerate() {
        let key = match (&e.key, &e.key_expr) {
            (Some(k), _) => k.clone(),
            (None, Some(expr)) => env
                .eval(expr)
                .map_err(|m| format!("{field}[{i}].keyExpr: {m}"))?,
            (None, None) => String::new(),
        };
        let value = match (&e.value, &e.value_expr) {
            (Some(v), _) => v.clone(),
            (None, Some(expr)) => env
                .eval(expr)
                .map_err(|m| format!("{field}[{i}].valueExpr: {m}"))?,
            (None, None) => String::new(),
        };
        out.insert(key, value);
    }
    Ok(out)
}

/// One variant's spec (spec §3.6).
fn render(
    set: &PackageVariantSet,
    upstream: &PackageRevision,
    repositories: &[Repository],
    context: &Context<'_>,
) -> Result<PackageVariantSpec, String> {
    let mut spec = PackageVariantSpec {
        upstream: set.spec.upstream.clone(),
        downstream: Some(Downstream {
            repo: context.repo_default.clone(),
            package: context.package_default.clone(),
        }),
        ..PackageVariantSpec::default()
    };
    let Some(template) = context.template else {
        return Ok(spec);
    };
    let mut env = Environment {
        variables: Vec::new(),
    };
    env.set("repoDefault", &json!(context.repo_default))?;
    env.set("packageDefault", &json!(context.package_default))?;
    env.set("upstream", &cel_object(&upstream.metadata))?;
    env.set("target", &context.target)?;
    let downstream = template.downstream.clone().unwrap_or_default();
    let mut repo = context.repo_default.clone();
    if let Some(r) = downstream.repo.filter(|r| !r.is_empty()) {
        repo = r;
    }
    if let Some(expr) = downstream.repo_expr.filter(|e| !e.is_empty()) {
        repo = env
            .eval(&expr)
            .map_err(|m| format!("template.downstream.repoExpr: {m}"))?;
    }
    let repository = repositories
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(repo.as_str()))
        .ok_or_else(|| format!("repository {repo:?} could not be loaded"))?;
    env.set("repository", &cel_object(&repository.metadata))?;
    let mut package = context.package_default.clone();
    if let Some(p) = downstream.package.filter(|p| !p.is_empty()) {
        package = p;
    }
    if let Some(expr) = downstream.package_expr.filter(|e| !e.is_empty()) {
        package = env
            .eval(&expr)
            .map_err(|m| format!("template.downstream.packageExpr: {m}"))?;
    }
    spec.downstream = Some(Downstream { repo, package });
    spec.adoption_policy = template.adoption_policy.clone();
    spec.deletion_policy = template.deletion_policy.clone();
    spec.labels = overlay(
        &env,
        &template.labels,
        &template.label_exprs,
        "template.labelExprs",
    )?;
    spec.annotations = overlay(
        &env,
        &template.annotations,
        &template.annotation_exprs,
        "template.annotationExprs",
    )?;
    if let Some(pc) = &template.package_context {
        let data = overlay(
            &env,
            &pc.data,
            &pc.data_exprs,
            "template.packageContext.dataExprs",
        )?;
        let mut remove: Vec<String> = pc.remove_keys.clone();
        for (i, expr) in pc.remove_key_exprs.iter().enumerate() {
            remove.push(
                env.eval(expr)
                    .map_err(|m| format!("template.packageContext.removeKeyExprs[{i}]: {m}"))?,
            );
        }
        remove.sort();
        remove.dedup();
        spec.package_context = Some(PackageContext {
            data,
            remove_keys: remove,
        });
    }
    for (i, injector) in template.injectors.iter().enumerate() {
        let name = match (&injector.name, &injector.name_expr) {
            (Some(n), _) => n.clone(),
            (None, Some(expr)) => env
                .eval(expr)
                .map_err(|m| format!("template.injectors[{i}].nameExpr: {m}"))?,
            (None, None) => String::new(),
        };
        spec.injectors.push(InjectionSelector {
            group: injector.group.clone(),
            version: injector.version.clone(),
            kind: injector.kind.clone(),
            name,
        });
    }
    if let Some(pipeline) = &template.pipeline {
        let mut out = Pipeline::default();
        for (list, templates, field) in [
            (&mut out.validators, &pipeline.validators, "validators"),
            (&mut out.mutators, &pipeline.mutators, "mutators"),
        ] {
            for (i, f) in templates.iter().enumerate() {
                let mut function: Function = f.function();
                function.config_map = overlay(
                    &env,
                    &f.config_map,
                    &f.config_map_exprs,
                    &format!("template.pipeline.{field}[{i}].configMapExprs"),
                )?;
                list.push(function);
            }
        }
        if !out.validators.is_empty() || !out.mutators.is_empty() {
            spec.pipeline = Some(out);
        }
    }
    Ok(spec)
}

/// The targets unrolled (spec §3.5), in order; and the indices of selector
/// targets that matched nothing.
fn unroll<'a>(
    set: &'a PackageVariantSet,
    repositories: &[Repository],
    objects: &[Value],
) -> (Vec<Context<'a>>, Vec<usize>) {
    let upstream_package = set
        .spec
        .upstream
        .as_ref()
        .map(|u| u.package.clone())
        .unwrap_or_default();
    let namespace = set.metadata.namespace.clone().unwrap_or_default();
    let mut contexts = Vec::new();
    let mut empty = Vec::new();
    for (i, target) in set.spec.targets.iter().enumerate() {
        let Target {
            repositories: listed,
            repository_selector,
            object_selector,
            template,
        } = target;
        let template = template.as_ref();
        if let Some(listed) = listed {
            for repo in listed {
                let names = if repo.package_names.is_empty() {
                    vec![upstream_package.clone()]
                } else {
                    repo.package_names.clone()
                };
                for package in names {
                    contexts.push(Context {
                        template,
                        repo_default: repo.name.clone(),
                        package_default: package.clone(),
                        target: json!({"repo": repo.name, "package": package}),
                    });
                }
            }
            continue;
        }
        let (selector, api_version, kind) = match (repository_selector, object_selector) {
            (Some(selector), _) => (
                selector.clone(),
                "config.porch.kpt.dev/v1alpha1".to_owned(),
                "Repository".to_owned(),
            ),
            (None, Some(o)) => (o.label_selector(), o.api_version.clone(), o.kind.clone()),
            (None, None) => continue,
        };
        let before = contexts.len();
        if api_version == "config.porch.kpt.dev/v1alpha1" && kind == "Repository" {
            for r in repositories {
                if selects(&selector, &r.metadata.labels.clone().unwrap_or_default()) {
                    let name = r.metadata.name.clone().unwrap_or_default();
                    contexts.push(Context {
                        template,
                        repo_default: name,
                        package_default: upstream_package.clone(),
                        target: cel_object(&r.metadata),
                    });
                }
            }
        } else {
            for o in objects {
                if o["apiVersion"] == api_version.as_str()
                    && o["kind"] == kind.as_str()
                    && o["metadata"]["namespace"].as_str().unwrap_or("") == namespace
                    && selects(&selector, &labels_of(o))
                {
                    contexts.push(Context {
                        template,
                        repo_default: o["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                        package_default: upstream_package.clone(),
                        target: cel_object_of(o),
                    });
                }
            }
        }
        if contexts.len() == before {
            empty.push(i);
        }
    }
    (contexts, empty)
}

fn set_ref(set: &PackageVariantSet) -> ObjectRef {
    ObjectRef {
        api_version: "config.porch.kpt.dev/v1alpha2".into(),
        kind: "PackageVariantSet".into(),
        namespace: set.metadata.namespace.clone().unwrap_or_default(),
        name: set.metadata.name.clone().unwrap_or_default(),
        uid: set.metadata.uid.clone().unwrap_or_default(),
    }
}

fn variant_ref(pv: &PackageVariant) -> ObjectRef {
    ObjectRef {
        api_version: "config.porch.kpt.dev/v1alpha1".into(),
        kind: "PackageVariant".into(),
        namespace: pv.metadata.namespace.clone().unwrap_or_default(),
        name: pv.metadata.name.clone().unwrap_or_default(),
        uid: pv.metadata.uid.clone().unwrap_or_default(),
    }
}

/// The status patch, when the conditions say something new.
fn status_patch(set: &PackageVariantSet, mut conditions: Vec<Condition>) -> Option<ObjectPatch> {
    let known = set.status.clone().unwrap_or_default();
    let same = crate::status::settle_conditions(&known.conditions, &mut conditions);
    (!same).then(|| {
        ObjectPatch::guarded(
            set_ref(set),
            Subresource::Status,
            set.metadata.resource_version.as_deref().unwrap_or(""),
            vec![PatchOperation::Add(AddOperation {
                path: path("/status"),
                value: serde_json::to_value(PackageVariantSetStatus { conditions })
                    .unwrap_or_default(),
            })],
        )
    })
}

/// Generates a set's variants.
///
/// # Errors
/// An Invocation that is not a variant set's (not retryable).
pub fn reconcile(invocation: &Invocation, now: &Time) -> Result<Outcome, HandlerError> {
    if invocation.operation != Operation::VariantSet {
        return Err(HandlerError::Invalid(format!(
            "the variant-set handler got a {} invocation",
            invocation.operation.as_str()
        )));
    }
    let set = invocation.package_variant_set.as_ref().ok_or_else(|| {
        HandlerError::Invalid("a variant-set Invocation needs its PackageVariantSet".into())
    })?;
    let uid = set
        .metadata
        .uid
        .clone()
        .ok_or_else(|| HandlerError::Invalid("the PackageVariantSet has no uid".into()))?;
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let namespace = set.metadata.namespace.clone().unwrap_or_default();
    let version = set.metadata.resource_version.clone().unwrap_or_default();
    let finalizers = set.metadata.finalizers.clone().unwrap_or_default();
    let mut out = Outcome::default();
    let existing: Vec<&PackageVariant> = invocation
        .variants
        .iter()
        .filter(|pv| {
            pv.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(PACKAGE_VARIANT_SET_LABEL))
                == Some(&uid)
        })
        .collect();

    if set.metadata.deletion_timestamp.is_some() {
        for pv in &existing {
            if pv.metadata.deletion_timestamp.is_none() {
                out.delete.push(variant_ref(pv));
            }
        }
        if existing.is_empty() {
            if let Some(index) = finalizers
                .iter()
                .position(|f| f == PACKAGE_VARIANT_SET_FINALIZER)
            {
                out.patches.push(ObjectPatch::guarded(
                    set_ref(set),
                    Subresource::Main,
                    &version,
                    vec![PatchOperation::Remove(RemoveOperation {
                        path: path(&format!("/metadata/finalizers/{index}")),
                    })],
                ));
            }
        } else {
            out.requeue_after_seconds = Some(CLEANUP_REQUEUE_SECONDS);
        }
        return Ok(out);
    }
    if !finalizers
        .iter()
        .any(|f| f == PACKAGE_VARIANT_SET_FINALIZER)
    {
        out.patches.push(ObjectPatch::guarded(
            set_ref(set),
            Subresource::Main,
            &version,
            vec![if set.metadata.finalizers.is_none() {
                PatchOperation::Add(AddOperation {
                    path: path("/metadata/finalizers"),
                    value: json!([PACKAGE_VARIANT_SET_FINALIZER]),
                })
            } else {
                PatchOperation::Add(AddOperation {
                    path: path("/metadata/finalizers/-"),
                    value: json!(PACKAGE_VARIANT_SET_FINALIZER),
                })
            }],
        ));
    }
    let stall = |out: &mut Outcome, reason: &str, message: &str| {
        out.patches.extend(status_patch(
            set,
            vec![
                condition("Stalled", true, reason, message, now),
                condition("Ready", false, reason, message, now),
            ],
        ));
    };
    if let Err(errors) = set.spec.validate() {
        stall(&mut out, "ValidationError", &errors.to_string());
        return Ok(out);
    }
    let upstream = set.spec.upstream.clone().unwrap_or_default();
    let Some(upstream_pr) = invocation.related.iter().find(|p| {
        let revision = p.status.as_ref().and_then(|s| s.revision).unwrap_or(0);
        p.spec.repository == upstream.repo
            && p.spec.package_name == upstream.package
            && ((upstream.revision.is_some_and(|r| r != 0) && upstream.revision == Some(revision))
                || (!upstream.workspace_name.is_empty()
                    && p.spec.workspace_name == upstream.workspace_name))
    }) else {
        let wanted = if upstream.workspace_name.is_empty() {
            upstream.revision.unwrap_or(0).to_string()
        } else {
            upstream.workspace_name.clone()
        };
        stall(
            &mut out,
            "UpstreamNotFound",
            &format!(
                "could not find upstream package revision '{}/{wanted}' in repo '{}'",
                upstream.package, upstream.repo
            ),
        );
        return Ok(out);
    };
    let repositories: Vec<Repository> = invocation
        .repositories
        .iter()
        .filter(|r| r.metadata.namespace.as_deref().unwrap_or("") == namespace)
        .cloned()
        .collect();
    let (contexts, empty) = unroll(set, &repositories, &invocation.cluster_objects);
    // every spec first: an error writes nothing
    let mut desired: Vec<(String, PackageVariantSpec)> = Vec::new();
    for context in &contexts {
        let spec = match render(set, upstream_pr, &repositories, context) {
            Ok(spec) => spec,
            Err(message) => {
                stall(&mut out, "UnexpectedError", &message);
                return Ok(out);
            }
        };
        let key = package_variant_key(
            &set_name,
            spec.downstream.as_ref().unwrap_or(&Downstream::default()),
        );
        desired.retain(|(k, _)| *k != key);
        desired.push((key, spec));
    }
    let key_of = |pv: &PackageVariant| {
        package_variant_key(
            &set_name,
            pv.spec
                .downstream
                .as_ref()
                .unwrap_or(&Downstream::default()),
        )
    };
    for (key, spec) in &desired {
        let current = existing.iter().find(|pv| key_of(pv) == *key);
        if current.is_some_and(|pv| pv.spec == *spec) {
            continue;
        }
        let name = current
            .and_then(|pv| pv.metadata.name.clone())
            .unwrap_or_else(|| package_variant_name(key));
        out.apply.push(Apply {
            field_manager: SET_MANAGER.into(),
            force: true,
            subresource: Subresource::Main,
            object: json!({
                "apiVersion": "config.porch.kpt.dev/v1alpha1",
                "kind": "PackageVariant",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {PACKAGE_VARIANT_SET_LABEL: uid},
                    "finalizers": [PACKAGE_VARIANT_FINALIZER],
                    "ownerReferences": [{
                        "apiVersion": "config.porch.kpt.dev/v1alpha2",
                        "kind": "PackageVariantSet",
                        "name": set_name,
                        "uid": uid,
                        "controller": true,
                    }],
                },
                "spec": spec,
            }),
        });
    }
    // stale variants go, unless a selector matched nothing: then nothing
    // is removed and Ready says which target
    if empty.is_empty() {
        for pv in &existing {
            if pv.metadata.deletion_timestamp.is_none()
                && !desired.iter().any(|(k, _)| *k == key_of(pv))
            {
                out.delete.push(variant_ref(pv));
            }
        }
    }
    let ready = if empty.is_empty() {
        condition(
            "Ready",
            true,
            "Reconciled",
            "package variants successfully reconciled",
            now,
        )
    } else {
        let which: Vec<String> = empty.iter().map(|i| format!("spec.targets[{i}]")).collect();
        condition(
            "Ready",
            false,
            "NoMatchingTargets",
            &format!(
                "{} selected nothing; no PackageVariant was removed",
                which.join(", ")
            ),
            now,
        )
    };
    out.patches.extend(status_patch(
        set,
        vec![
            condition(
                "Stalled",
                false,
                "Valid",
                "all validation checks passed",
                now,
            ),
            ready,
        ],
    ));
    Ok(out)
}
