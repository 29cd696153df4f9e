//! The rules a PackageVariant and a PackageVariantSet must follow
//! (packagevariants spec §1.4, §3.3).
//!
//! Each `validate` reports every problem: first the reference's, with its
//! messages and in its order, then this project's own (names and paths,
//! function names, expression entries the reference leaves unchecked; see
//! `docs/differences.md`). A spec the reference finds valid therefore gets
//! only this project's messages, and one it rejects starts with the
//! reference's message.

use super::{
    Downstream, DownstreamTemplate, FunctionTemplate, MapExpr, PackageVariantSetSpec,
    PackageVariantSpec, PackageVariantTemplate, Policy, Target, Upstream,
};
use crate::kptfile::Pipeline;
use crate::naming::{validate_label, validate_package_path};
use std::fmt;

/// Keys of `package-context.yaml` a variant may neither set nor remove.
pub const RESERVED_PACKAGE_CONTEXT_KEYS: [&str; 2] = ["name", "package-path"];

/// Most problems spelled out; the rest are counted. Keeps the text within
/// what a status condition's message may hold (32 KiB).
pub const MAX_SHOWN_ERRORS: usize = 50;

/// Longest JSON rendering of a value shown in a message.
const MAX_SHOWN_VALUE: usize = 512;

/// Every problem found in a spec, in order. Shown joined with `"; "`, as the
/// reference writes them into the `Stalled` condition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<String>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.0.len().min(MAX_SHOWN_ERRORS);
        f.write_str(&self.0[..shown].join("; "))?;
        if self.0.len() > shown {
            write!(f, "; and {} more", self.0.len() - shown)?;
        }
        Ok(())
    }
}

fn finish(errors: Vec<String>) -> Result<(), ValidationErrors> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errors))
    }
}

impl PackageVariantSpec {
    /// Checks the spec of a PackageVariant (spec §1.4), then this project's
    /// rules: repository names are DNS-1123 labels, package names safe
    /// relative paths, and pipeline function names have no `.` (the variant
    /// adds them as `PackageVariant.<variant>.<function>.<index>` and finds
    /// its own by splitting on `.`).
    ///
    /// # Errors
    /// Every problem found.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errors = Vec::new();
        match &self.upstream {
            None => errors.push("missing required field spec.upstream".to_owned()),
            Some(upstream) => {
                if upstream.repo.is_empty() {
                    errors.push("missing required field spec.upstream.repo".to_owned());
                }
                if upstream.package.is_empty() {
                    errors.push("missing required field spec.upstream.package".to_owned());
                }
            }
        }
        match &self.downstream {
            None => errors.push("missing required field spec.downstream".to_owned()),
            Some(downstream) => {
                if downstream.repo.is_empty() {
                    errors.push("missing required field spec.downstream.repo".to_owned());
                }
                if downstream.package.is_empty() {
                    errors.push("missing required field spec.downstream.package".to_owned());
                }
            }
        }
        // an empty policy is the default, as in the reference
        if matches!(&self.adoption_policy, Some(Policy::Unknown(text)) if !text.is_empty()) {
            errors.push(
                r#"spec.adoptionPolicy field can only be "adoptNone" or "adoptExisting""#
                    .to_owned(),
            );
        }
        if matches!(&self.deletion_policy, Some(Policy::Unknown(text)) if !text.is_empty()) {
            errors.push(r#"spec.deletionPolicy can only be "orphan" or "delete""#.to_owned());
        }
        if let Some(context) = &self.package_context {
            for key in RESERVED_PACKAGE_CONTEXT_KEYS {
                if context.data.contains_key(key) {
                    errors.push(invalid_value(
                        "spec.packageContext.data",
                        &context.data,
                        key,
                    ));
                }
                for _ in context.remove_keys.iter().filter(|k| *k == key) {
                    errors.push(invalid_value(
                        "spec.packageContext.removeKeys",
                        &context.remove_keys,
                        key,
                    ));
                }
            }
        }
        for (i, injector) in self.injectors.iter().enumerate() {
            if injector.name.is_empty() {
                errors.push(format!("spec.injectors[{i}].name must not be empty"));
            }
        }

        if let Some(upstream) = &self.upstream {
            check_upstream_names(upstream, &mut errors);
        }
        if let Some(Downstream { repo, package }) = &self.downstream {
            check_repo("spec.downstream.repo", repo, &mut errors);
            check_package("spec.downstream.package", package, &mut errors);
        }
        if let Some(pipeline) = &self.pipeline {
            check_function_names(pipeline, &mut errors);
        }
        finish(errors)
    }
}

impl PackageVariantSetSpec {
    /// Checks the spec of a PackageVariantSet (spec §3.3), then this
    /// project's rules: repository names are DNS-1123 labels and package
    /// names safe relative paths wherever they are given as values, every
    /// expression entry has a key, and `configMapExprs` entries set at most
    /// one of each value and expression, like the other entries.
    ///
    /// # Errors
    /// Every problem found.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errors = Vec::new();
        match &self.upstream {
            None => errors.push("spec.upstream is a required field".to_owned()),
            Some(upstream) => {
                if upstream.package.is_empty() {
                    errors.push("spec.upstream.package is a required field".to_owned());
                }
                if upstream.repo.is_empty() {
                    errors.push("spec.upstream.repo is a required field".to_owned());
                }
                if upstream.revision.unwrap_or(0) == 0 && upstream.workspace_name.is_empty() {
                    errors.push(
                        "either spec.upstream.revision or spec.upstream.workspaceName must be specified"
                            .to_owned(),
                    );
                }
            }
        }
        if self.targets.is_empty() {
            errors.push("must specify at least one item in spec.targets".to_owned());
        }
        for (i, target) in self.targets.iter().enumerate() {
            check_target(i, target, &mut errors);
        }

        if let Some(upstream) = &self.upstream {
            check_upstream_names(upstream, &mut errors);
        }
        for (i, target) in self.targets.iter().enumerate() {
            for (j, repository) in target.repositories.iter().flatten().enumerate() {
                let field = format!("spec.targets[{i}].repositories[{j}]");
                check_repo(&format!("{field}.name"), &repository.name, &mut errors);
                for (k, package) in repository.package_names.iter().enumerate() {
                    check_package(&format!("{field}.packageNames[{k}]"), package, &mut errors);
                }
            }
            if let Some(template) = &target.template {
                check_template_extras(
                    template,
                    &format!("spec.targets[{i}].template"),
                    &mut errors,
                );
            }
        }
        finish(errors)
    }
}

/// The checked name of a PackageVariant: a `.` would split the names of the
/// functions it adds (`PackageVariant.<name>.<function>.<index>`) wrongly, so
/// the variant would not recognise them and add them again on every pass.
///
/// # Errors
/// The message, naming `metadata.name`.
pub fn validate_package_variant_name(name: &str) -> Result<(), String> {
    if name.contains('.') {
        return Err(format!(
            "metadata.name {name:?} must not contain '.': it is part of the names of the pipeline functions the variant adds (PackageVariant.<name>.<function>.<index>)"
        ));
    }
    Ok(())
}

fn check_target(i: usize, target: &Target, errors: &mut Vec<String>) {
    let mut selectors = 0;
    if let Some(repositories) = &target.repositories {
        selectors += 1;
        if repositories.is_empty() {
            errors.push(format!(
                "spec.targets[{i}].repositories must not be an empty list if specified"
            ));
        }
        for (j, repository) in repositories.iter().enumerate() {
            if repository.name.is_empty() {
                errors.push(format!(
                    "spec.targets[{i}].repositories[{j}].name cannot be empty"
                ));
            }
            for (k, package) in repository.package_names.iter().enumerate() {
                if package.is_empty() {
                    errors.push(format!(
                        "spec.targets[{i}].repositories[{j}].packageNames[{k}] cannot be empty"
                    ));
                }
            }
        }
    }
    if target.repository_selector.is_some() {
        selectors += 1;
    }
    if let Some(selector) = &target.object_selector {
        selectors += 1;
        if selector.api_version.is_empty() {
            errors.push(format!(
                "spec.targets[{i}].objectselector.apiVersion cannot be empty"
            ));
        }
        if selector.kind.is_empty() {
            errors.push(format!(
                "spec.targets[{i}].objectselector.kind cannot be empty"
            ));
        }
    }
    if selectors != 1 {
        errors.push(format!(
            "spec.targets[{i}] must specify one of `repositories`, `repositorySelector`, or `objectSelector`"
        ));
    }
    if let Some(template) = &target.template {
        check_template(template, &format!("spec.targets[{i}].template"), errors);
    }
}

/// The reference's template rules. Unlike a variant's, a template's policy
/// has no default: an empty one is refused too.
fn check_template(template: &PackageVariantTemplate, field: &str, errors: &mut Vec<String>) {
    if matches!(template.adoption_policy, Some(Policy::Unknown(_))) {
        errors.push(format!(
            r#"{field}.adoptionPolicy can only be "adoptNone" or "adoptExisting""#
        ));
    }
    if matches!(template.deletion_policy, Some(Policy::Unknown(_))) {
        errors.push(format!(
            r#"{field}.deletionPolicy can only be "orphan" or "delete""#
        ));
    }
    if let Some(downstream) = &template.downstream {
        if downstream.repo.is_some() && downstream.repo_expr.is_some() {
            errors.push(format!(
                "{field} may specify only one of `downstream.repo` and `downstream.repoExpr`"
            ));
        }
        if downstream.package.is_some() && downstream.package_expr.is_some() {
            errors.push(format!(
                "{field} may specify only one of `downstream.package` and `downstream.packageExpr`"
            ));
        }
    }
    check_map_exprs(
        &template.label_exprs,
        &format!("{field}.labelExprs"),
        errors,
    );
    check_map_exprs(
        &template.annotation_exprs,
        &format!("{field}.annotationExprs"),
        errors,
    );
    if let Some(context) = &template.package_context {
        check_map_exprs(
            &context.data_exprs,
            &format!("{field}.packageContext.dataExprs"),
            errors,
        );
    }
    for (i, injector) in template.injectors.iter().enumerate() {
        if injector.name.is_some() && injector.name_expr.is_some() {
            errors.push(format!(
                "{field}.injectors[{i}] may specify only one of `name` and `nameExpr`"
            ));
        }
        if injector.name.is_none() && injector.name_expr.is_none() {
            errors.push(format!(
                "{field}.injectors[{i}] must specify either `name` or `nameExpr`"
            ));
        }
    }
    if let Some(pipeline) = &template.pipeline {
        for (list, functions) in [
            ("validators", &pipeline.validators),
            ("mutators", &pipeline.mutators),
        ] {
            for (i, function) in functions.iter().enumerate() {
                if function.image.is_empty() {
                    errors.push(format!(
                        "{field}.pipeline.{list}[{i}].image must not be empty"
                    ));
                }
                if function.name.contains('.') {
                    errors.push(format!(
                        "{field}.pipeline.{list}[{i}].name must not contain '.'"
                    ));
                }
            }
        }
    }
}

fn check_map_exprs(entries: &[MapExpr], field: &str, errors: &mut Vec<String>) {
    for (j, entry) in entries.iter().enumerate() {
        if entry.key.is_some() && entry.key_expr.is_some() {
            errors.push(format!(
                "{field}[{j}] may specify only one of `key` and `keyExpr`"
            ));
        }
        if entry.value.is_some() && entry.value_expr.is_some() {
            errors.push(format!(
                "{field}[{j}] may specify only one of `value` and `valueExpr`"
            ));
        }
    }
}

/// This project's template rules, after all of the reference's.
fn check_template_extras(template: &PackageVariantTemplate, field: &str, errors: &mut Vec<String>) {
    if let Some(DownstreamTemplate { repo, package, .. }) = &template.downstream {
        // an empty value falls back to the target's default
        if let Some(repo) = repo {
            check_repo(&format!("{field}.downstream.repo"), repo, errors);
        }
        if let Some(package) = package {
            check_package(&format!("{field}.downstream.package"), package, errors);
        }
    }
    let mut keyed = vec![
        (format!("{field}.labelExprs"), &template.label_exprs),
        (
            format!("{field}.annotationExprs"),
            &template.annotation_exprs,
        ),
    ];
    if let Some(context) = &template.package_context {
        keyed.push((
            format!("{field}.packageContext.dataExprs"),
            &context.data_exprs,
        ));
    }
    if let Some(pipeline) = &template.pipeline {
        for (list, functions) in [
            ("validators", &pipeline.validators),
            ("mutators", &pipeline.mutators),
        ] {
            for (
                i,
                FunctionTemplate {
                    config_map_exprs, ..
                },
            ) in functions.iter().enumerate()
            {
                let exprs = format!("{field}.pipeline.{list}[{i}].configMapExprs");
                check_map_exprs(config_map_exprs, &exprs, errors);
                keyed.push((exprs, config_map_exprs));
            }
        }
    }
    for (exprs, entries) in keyed {
        for (j, entry) in entries.iter().enumerate() {
            if entry.key.is_none() && entry.key_expr.is_none() {
                errors.push(format!(
                    "{exprs}[{j}] must specify either `key` or `keyExpr`"
                ));
            }
        }
    }
}

fn check_upstream_names(upstream: &Upstream, errors: &mut Vec<String>) {
    check_repo("spec.upstream.repo", &upstream.repo, errors);
    check_package("spec.upstream.package", &upstream.package, errors);
    if !upstream.workspace_name.is_empty()
        && let Err(e) = validate_label("workspaceName", &upstream.workspace_name)
    {
        errors.push(format!("spec.upstream.workspaceName: {e}"));
    }
}

/// A Repository name, when given (an empty one is reported as missing).
fn check_repo(field: &str, value: &str, errors: &mut Vec<String>) {
    if !value.is_empty()
        && let Err(e) = validate_label("Repository name", value)
    {
        errors.push(format!("{field}: {e}"));
    }
}

/// A package name, when given (an empty one is reported as missing).
fn check_package(field: &str, value: &str, errors: &mut Vec<String>) {
    if !value.is_empty()
        && let Err(e) = validate_package_path(value)
    {
        errors.push(format!("{field}: {e}"));
    }
}

fn check_function_names(pipeline: &Pipeline, errors: &mut Vec<String>) {
    for (list, functions) in [
        ("validators", &pipeline.validators),
        ("mutators", &pipeline.mutators),
    ] {
        for (i, function) in functions.iter().enumerate() {
            if function.name.contains('.') {
                errors.push(format!(
                    "spec.pipeline.{list}[{i}].name must not contain '.'"
                ));
            }
        }
    }
}

/// A Kubernetes `field.Invalid` error as the reference renders it:
/// `<path>: Invalid value: <value as JSON>: must not contain the key "<key>"`.
fn invalid_value(path: &str, value: &impl serde::Serialize, key: &str) -> String {
    format!(
        "{path}: Invalid value: {}: must not contain the key \"{key}\"",
        go_json(value)
    )
}

/// JSON as Go's `encoding/json` writes it (`<`, `>`, `&`, U+2028 and U+2029
/// escaped; maps in key order), cut after [`MAX_SHOWN_VALUE`] bytes.
fn go_json(value: &impl serde::Serialize) -> String {
    let json = serde_json::to_string(value).unwrap_or_default();
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    if out.len() > MAX_SHOWN_VALUE {
        let mut end = MAX_SHOWN_VALUE;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn variant(spec: serde_json::Value) -> PackageVariantSpec {
        serde_json::from_value(spec).expect("a PackageVariant spec")
    }

    fn set(spec: serde_json::Value) -> PackageVariantSetSpec {
        serde_json::from_value(spec).expect("a PackageVariantSet spec")
    }

    fn errors(result: Result<(), ValidationErrors>) -> Vec<String> {
        result.err().map(|e| e.0).unwrap_or_default()
    }

    fn valid_variant() -> serde_json::Value {
        json!({
            "upstream": {"repo": "blueprints", "package": "basens", "workspaceName": "v1"},
            "downstream": {"repo": "deployments", "package": "basens"},
        })
    }

    fn with(mut base: serde_json::Value, key: &str, value: serde_json::Value) -> serde_json::Value {
        base[key] = value;
        base
    }

    #[test]
    fn variant_missing_fields_in_the_reference_words() {
        let empty = variant(json!({}));
        assert_eq!(
            empty.validate().expect_err("empty").to_string(),
            "missing required field spec.upstream; missing required field spec.downstream"
        );
        let partial = variant(json!({
            "upstream": {"revision": 1, "repo": "blueprints"},
            "downstream": {"repo": "deployments"},
        }));
        assert_eq!(
            partial.validate().expect_err("no packages").to_string(),
            "missing required field spec.upstream.package; missing required field spec.downstream.package"
        );
        let bare = variant(json!({"upstream": {}, "downstream": {}}));
        assert_eq!(
            errors(bare.validate()),
            [
                "missing required field spec.upstream.repo",
                "missing required field spec.upstream.package",
                "missing required field spec.downstream.repo",
                "missing required field spec.downstream.package",
            ]
        );
        assert_eq!(variant(valid_variant()).validate(), Ok(()));
    }

    #[test]
    fn variant_policies() {
        let spec = variant(with(
            with(valid_variant(), "adoptionPolicy", json!("invalid")),
            "deletionPolicy",
            json!("invalid"),
        ));
        assert_eq!(
            spec.validate().expect_err("policies").to_string(),
            r#"spec.adoptionPolicy field can only be "adoptNone" or "adoptExisting"; spec.deletionPolicy can only be "orphan" or "delete""#
        );
        // empty means the default; known values are fine
        for (adoption, deletion) in [
            ("", ""),
            ("adoptExisting", "orphan"),
            ("adoptNone", "delete"),
        ] {
            let spec = variant(with(
                with(valid_variant(), "adoptionPolicy", json!(adoption)),
                "deletionPolicy",
                json!(deletion),
            ));
            assert_eq!(spec.validate(), Ok(()), "{adoption} {deletion}");
        }
        // values are case-sensitive, as in the reference
        let spec = variant(with(valid_variant(), "deletionPolicy", json!("Orphan")));
        assert_eq!(
            errors(spec.validate()),
            [r#"spec.deletionPolicy can only be "orphan" or "delete""#]
        );
    }

    #[test]
    fn variant_package_context_reserved_keys() {
        let spec = variant(with(
            valid_variant(),
            "packageContext",
            json!({"data": {"name": "test"}}),
        ));
        assert_eq!(
            errors(spec.validate()),
            [
                r#"spec.packageContext.data: Invalid value: {"name":"test"}: must not contain the key "name""#
            ]
        );
        let spec = variant(with(
            valid_variant(),
            "packageContext",
            json!({"removeKeys": ["package-path"]}),
        ));
        assert_eq!(
            errors(spec.validate()),
            [
                r#"spec.packageContext.removeKeys: Invalid value: ["package-path"]: must not contain the key "package-path""#
            ]
        );
        // each reserved key in turn: data, then removeKeys (once per entry)
        let spec = variant(with(
            valid_variant(),
            "packageContext",
            json!({
                "data": {"package-path": "x", "name": "<b>", "ok": "1"},
                "removeKeys": ["name", "package-path", "name"],
            }),
        ));
        let data = r#"{"name":"\u003cb\u003e","ok":"1","package-path":"x"}"#;
        let keys = r#"["name","package-path","name"]"#;
        assert_eq!(
            errors(spec.validate()),
            [
                format!(
                    "spec.packageContext.data: Invalid value: {data}: must not contain the key \"name\""
                ),
                format!(
                    "spec.packageContext.removeKeys: Invalid value: {keys}: must not contain the key \"name\""
                ),
                format!(
                    "spec.packageContext.removeKeys: Invalid value: {keys}: must not contain the key \"name\""
                ),
                format!(
                    "spec.packageContext.data: Invalid value: {data}: must not contain the key \"package-path\""
                ),
                format!(
                    "spec.packageContext.removeKeys: Invalid value: {keys}: must not contain the key \"package-path\""
                ),
            ]
        );
    }

    #[test]
    fn a_huge_value_is_cut_in_the_message() {
        let spec = variant(with(
            valid_variant(),
            "packageContext",
            json!({"data": {"name": "é".repeat(10_000)}}),
        ));
        let message = errors(spec.validate()).remove(0);
        assert!(message.len() < MAX_SHOWN_VALUE + 200, "{}", message.len());
        assert!(
            message.contains("…: must not contain the key \"name\""),
            "{message}"
        );
    }

    #[test]
    fn variant_injectors_need_names() {
        let spec = variant(with(
            valid_variant(),
            "injectors",
            json!([{"group": "g", "version": "v1", "kind": "K", "name": "foo"}, {"name": ""}]),
        ));
        assert_eq!(
            errors(spec.validate()),
            ["spec.injectors[1].name must not be empty"]
        );
    }

    #[test]
    fn variant_names_and_paths_after_the_reference_rules() {
        let spec = variant(json!({
            "upstream": {"repo": "Blueprints", "package": "../x", "workspaceName": "v1.2"},
            "downstream": {"repo": "deployments", "package": "/abs"},
            "adoptionPolicy": "sometimes",
        }));
        let found = errors(spec.validate());
        assert_eq!(
            found[0],
            r#"spec.adoptionPolicy field can only be "adoptNone" or "adoptExisting""#
        );
        assert!(
            found[1].starts_with(
                r#"spec.upstream.repo: Repository name "Blueprints" is not a DNS-1123 label"#
            ),
            "{found:?}"
        );
        assert!(
            found[2].starts_with(
                r#"spec.upstream.package: package name "../x" must be a relative path"#
            ),
            "{found:?}"
        );
        assert!(
            found[3].starts_with(
                r#"spec.upstream.workspaceName: workspaceName "v1.2" is not a DNS-1123 label"#
            ),
            "{found:?}"
        );
        assert!(found[4].starts_with(r#"spec.downstream.package: package name "/abs" must be a relative path: absolute paths"#), "{found:?}");
        assert_eq!(found.len(), 5);
        let spec = variant(json!({
            "upstream": {"repo": "blueprints", "package": "a//b"},
            "downstream": {"repo": "r".repeat(64), "package": "net/basens"},
        }));
        let found = errors(spec.validate());
        assert!(
            found[0].contains("empty path segments are not allowed"),
            "{found:?}"
        );
        assert!(
            found[1].contains("is longer than 63 characters"),
            "{found:?}"
        );
        assert_eq!(found.len(), 2);
    }

    #[test]
    fn variant_function_names_have_no_dot() {
        let spec = variant(with(
            valid_variant(),
            "pipeline",
            json!({
                "mutators": [{"image": "set-namespace:v0.4", "name": "set.ns"}, {"image": "x", "name": "ok"}],
                "validators": [{"image": "kubeval:v0.3", "name": "a.b"}],
            }),
        ));
        assert_eq!(
            errors(spec.validate()),
            [
                "spec.pipeline.validators[0].name must not contain '.'",
                "spec.pipeline.mutators[0].name must not contain '.'",
            ]
        );
    }

    #[test]
    fn variant_names() {
        assert_eq!(validate_package_variant_name("my-pv"), Ok(()));
        let err = validate_package_variant_name("my.pv").expect_err("dot");
        assert!(
            err.starts_with(r#"metadata.name "my.pv" must not contain '.'"#),
            "{err}"
        );
    }

    fn valid_set() -> serde_json::Value {
        json!({
            "upstream": {"repo": "blueprints", "package": "basens", "revision": 2},
            "targets": [{"repositories": [{"name": "edge-1"}]}],
        })
    }

    /// The reference's table (`validate_test.go`) at HEAD, upstream revision
    /// or workspace rule included.
    #[test]
    fn set_rules_in_the_reference_words() {
        let upstream = "spec.upstream is a required field";
        let no_targets = "must specify at least one item in spec.targets";
        let one_of = |i: usize| {
            format!(
                "spec.targets[{i}] must specify one of `repositories`, `repositorySelector`, or `objectSelector`"
            )
        };
        let cases: Vec<(serde_json::Value, Vec<String>)> = vec![
            (json!({}), vec![upstream.into(), no_targets.into()]),
            (
                json!({"upstream": {"repo": "foo", "revision": 1}}),
                vec!["spec.upstream.package is a required field".into(), no_targets.into()],
            ),
            (
                json!({"upstream": {"package": "foopkg", "revision": 3}}),
                vec!["spec.upstream.repo is a required field".into(), no_targets.into()],
            ),
            (
                json!({"upstream": {"repo": "foo", "package": "foopkg"}}),
                vec![
                    "either spec.upstream.revision or spec.upstream.workspaceName must be specified".into(),
                    no_targets.into(),
                ],
            ),
            (
                json!({"upstream": {"repo": "foo", "package": "foopkg", "revision": 0}}),
                vec![
                    "either spec.upstream.revision or spec.upstream.workspaceName must be specified".into(),
                    no_targets.into(),
                ],
            ),
            (
                json!({"targets": [
                    {"repositories": [{"name": ""}]},
                    {"repositories": [{"name": "bar"}], "repositorySelector": {"matchLabels": {"foo": "bar"}}},
                    {"repositories": [{"name": "bar", "packageNames": ["", "foo"]}]},
                    {"repositories": []},
                    {"objectSelector": {"apiVersion": "", "kind": ""}},
                ]}),
                vec![
                    upstream.into(),
                    "spec.targets[0].repositories[0].name cannot be empty".into(),
                    one_of(1),
                    "spec.targets[2].repositories[0].packageNames[0] cannot be empty".into(),
                    "spec.targets[3].repositories must not be an empty list if specified".into(),
                    "spec.targets[4].objectselector.apiVersion cannot be empty".into(),
                    "spec.targets[4].objectselector.kind cannot be empty".into(),
                ],
            ),
            (
                json!({"targets": [{"template": {"adoptionPolicy": "invalid", "deletionPolicy": "invalid"}}]}),
                vec![
                    upstream.into(),
                    one_of(0),
                    r#"spec.targets[0].template.adoptionPolicy can only be "adoptNone" or "adoptExisting""#.into(),
                    r#"spec.targets[0].template.deletionPolicy can only be "orphan" or "delete""#.into(),
                ],
            ),
            (
                // a template's empty policy is not defaulted
                json!({"targets": [{"repositories": [{"name": "r"}], "template": {"adoptionPolicy": "", "deletionPolicy": "orphan"}}]}),
                vec![
                    upstream.into(),
                    r#"spec.targets[0].template.adoptionPolicy can only be "adoptNone" or "adoptExisting""#.into(),
                ],
            ),
            (
                json!({"targets": [{"template": {"downstream": {
                    "repo": "foo", "repoExpr": "'bar'", "package": "p", "packageExpr": "'p'"
                }}}]}),
                vec![
                    upstream.into(),
                    one_of(0),
                    "spec.targets[0].template may specify only one of `downstream.repo` and `downstream.repoExpr`".into(),
                    "spec.targets[0].template may specify only one of `downstream.package` and `downstream.packageExpr`".into(),
                ],
            ),
            (
                json!({"targets": [{"template": {
                    "labelExprs": [
                        {"key": "foo", "keyExpr": "'bar'", "value": "bar"},
                        {"key": "foo", "value": "bar", "valueExpr": "'bar'"},
                    ],
                    "annotationExprs": [
                        {"key": "foo", "keyExpr": "'bar'", "value": "bar"},
                        {"key": "foo", "value": "bar", "valueExpr": "'bar'"},
                    ],
                    "packageContext": {"dataExprs": [
                        {"key": "foo", "keyExpr": "'bar'", "value": "bar"},
                        {"key": "foo", "value": "bar", "valueExpr": "'bar'"},
                    ]},
                }}]}),
                vec![
                    upstream.into(),
                    one_of(0),
                    "spec.targets[0].template.labelExprs[0] may specify only one of `key` and `keyExpr`".into(),
                    "spec.targets[0].template.labelExprs[1] may specify only one of `value` and `valueExpr`".into(),
                    "spec.targets[0].template.annotationExprs[0] may specify only one of `key` and `keyExpr`".into(),
                    "spec.targets[0].template.annotationExprs[1] may specify only one of `value` and `valueExpr`".into(),
                    "spec.targets[0].template.packageContext.dataExprs[0] may specify only one of `key` and `keyExpr`".into(),
                    "spec.targets[0].template.packageContext.dataExprs[1] may specify only one of `value` and `valueExpr`".into(),
                ],
            ),
            (
                json!({"targets": [{"repositories": [{"name": "bar"}], "template": {"injectors": [
                    {"name": "foo", "nameExpr": "bar"},
                    {"group": "foo"},
                ]}}]}),
                vec![
                    upstream.into(),
                    "spec.targets[0].template.injectors[0] may specify only one of `name` and `nameExpr`".into(),
                    "spec.targets[0].template.injectors[1] must specify either `name` or `nameExpr`".into(),
                ],
            ),
            (
                json!({"targets": [{"repositories": [{"name": "bar"}], "template": {"pipeline": {
                    "validators": [{"name": "foo"}, {"image": "foo", "name": "bar"}],
                    "mutators": [{"name": "foo.bar", "image": "bar"}],
                }}}]}),
                vec![
                    upstream.into(),
                    "spec.targets[0].template.pipeline.validators[0].image must not be empty".into(),
                    "spec.targets[0].template.pipeline.mutators[0].name must not contain '.'".into(),
                ],
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(errors(set(spec.clone()).validate()), want, "{spec}");
        }
        assert_eq!(set(valid_set()).validate(), Ok(()));
        let by_workspace = set(json!({
            "upstream": {"repo": "blueprints", "package": "basens", "workspaceName": "v1"},
            "targets": [{"repositorySelector": {"matchLabels": {"env": "edge"}}}],
        }));
        assert_eq!(by_workspace.validate(), Ok(()));
    }

    #[test]
    fn set_names_paths_and_expression_entries_after_the_reference_rules() {
        let spec = set(json!({
            "upstream": {"repo": "blueprints", "package": "basens", "revision": 1},
            "targets": [
                {"repositories": [{"name": "Edge_1", "packageNames": ["../x", "ok", ".git/hooks"]}]},
                {
                    "objectSelector": {"apiVersion": "v1", "kind": "ConfigMap"},
                    "template": {
                        "downstream": {"repo": "", "package": "a//b"},
                        "labelExprs": [{"valueExpr": "repoDefault"}],
                        "pipeline": {"mutators": [{"image": "set-labels:v0.2", "configMapExprs": [
                            {"key": "k", "keyExpr": "'k'", "value": "v", "valueExpr": "'v'"},
                            {"value": "v"},
                        ]}]},
                    },
                },
            ],
        }));
        let found = errors(spec.validate());
        let prefixes = [
            r#"spec.targets[0].repositories[0].name: Repository name "Edge_1" is not a DNS-1123 label"#,
            r#"spec.targets[0].repositories[0].packageNames[0]: package name "../x" must be a relative path"#,
            r#"spec.targets[0].repositories[0].packageNames[2]: package name ".git/hooks" must be a relative path: '.git' segments"#,
            r#"spec.targets[1].template.downstream.package: package name "a//b" must be a relative path: empty path segments"#,
            "spec.targets[1].template.pipeline.mutators[0].configMapExprs[0] may specify only one of `key` and `keyExpr`",
            "spec.targets[1].template.pipeline.mutators[0].configMapExprs[0] may specify only one of `value` and `valueExpr`",
            "spec.targets[1].template.labelExprs[0] must specify either `key` or `keyExpr`",
            "spec.targets[1].template.pipeline.mutators[0].configMapExprs[1] must specify either `key` or `keyExpr`",
        ];
        assert_eq!(found.len(), prefixes.len(), "{found:#?}");
        for (got, want) in found.iter().zip(prefixes) {
            assert!(
                got.starts_with(want),
                "{got}\n  does not start with\n{want}"
            );
        }
    }

    #[test]
    fn the_reference_messages_come_first() {
        let spec = set(json!({
            "upstream": {"repo": "UP", "package": "basens"},
            "targets": [{"repositories": [{"name": "Bad"}]}],
        }));
        let found = errors(spec.validate());
        assert_eq!(
            found[0],
            "either spec.upstream.revision or spec.upstream.workspaceName must be specified"
        );
        assert!(found[1].starts_with("spec.upstream.repo: "), "{found:?}");
        assert!(
            found[2].starts_with("spec.targets[0].repositories[0].name: "),
            "{found:?}"
        );
    }

    #[test]
    fn many_errors_are_counted_not_all_spelled_out() {
        let injectors: Vec<_> = (0..200).map(|_| json!({"name": ""})).collect();
        let spec = variant(with(valid_variant(), "injectors", json!(injectors)));
        let err = spec.validate().expect_err("empty names");
        assert_eq!(err.0.len(), 200);
        let text = err.to_string();
        assert!(
            text.ends_with("spec.injectors[49].name must not be empty; and 150 more"),
            "{text}"
        );
        assert!(text.len() < 32 * 1024);
    }
}
