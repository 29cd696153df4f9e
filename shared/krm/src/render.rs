//! `kpt fn render` (spec §3): run every package's pipeline over its
//! resources and its subpackages', then write the result back.
//!
//! Order is kpt's: subpackages before their parent (depth-first post-order),
//! or parent first with `kpt.dev/bfs-rendering: "true"` on the root Kptfile.
//! A package's input is its own resources followed by its subpackages'
//! rendered output. Mutators run in order, then validators on a copy. The
//! first failing function stops the render; nothing is written unless the
//! root Kptfile asks for `kpt.dev/save-on-render-failure`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use porch_api::common::{ConditionStatus, PackageCondition};
use porch_api::kptfile::{
    BFS_RENDERING_ANNOTATION, Function, KptRenderStatus, Kptfile, PipelineStepResult,
    SAVE_ON_RENDER_FAILURE_ANNOTATION, Selector, StepField, StepResultItem,
};

use crate::package::{self, Files, PackageError};
use crate::resource::{Origin, Resource};
use crate::resourcelist::{Decoded, ResultItem, Results, strip_wire_annotations};
use crate::runtime::{Call, FunctionError, FunctionOutput, FunctionRef, FunctionRuntime};
use crate::yaml::{self, Node, SeqIndent, Style, Value};

/// The condition type render sets on the root Kptfile.
pub const RENDERED_CONDITION: &str = "Rendered";

/// How to render.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    /// Registry prefix for short image names.
    pub image_prefix: String,
    /// Record the `Rendered` condition and `renderStatus` in the root Kptfile,
    /// as the kpt Porch uses does (kpt before 1.0.0-beta.6x does not).
    pub record_status: bool,
    /// The value render adds to `cnrm.cloud.google.com/blueprint` on Config
    /// Connector objects (kpt's attribution; `None` turns it off, as
    /// `KRM_DISABLE_ATTRIBUTION` does). kpt 1.0.0-beta.56 writes `kpt-fn`.
    pub attribution: Option<String>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            image_prefix: crate::runtime::DEFAULT_IMAGE_PREFIX.to_owned(),
            record_status: true,
            attribution: Some("krm-fn".to_owned()),
        }
    }
}

/// Why a render failed.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum RenderError {
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error("Kptfile {path} is invalid: {reason}")]
    Kptfile { path: String, reason: String },
    #[error("input resource list must contain only KRM resources: {path}: {reason}")]
    NotKrm { path: String, reason: String },
    #[error("pkg {package}: {function}: {reason}")]
    Function {
        package: String,
        function: String,
        reason: String,
    },
}

/// One executed (or attempted) step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepRecord {
    pub package: String,
    pub name: String,
    pub function: String,
    pub exec: bool,
    pub validator: bool,
    pub results: Vec<ResultItem>,
    pub stderr: String,
    pub exit_code: i32,
    pub execution_error: String,
}

/// The outcome of a render: callers decide whether to keep `files`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The package after render, or (on failure) the package as kpt leaves it:
    /// unchanged except for the root Kptfile's status, or partially rendered
    /// with `save-on-render-failure`.
    pub files: Files,
    pub steps: Vec<StepRecord>,
    pub error: Option<RenderError>,
    /// Whether there was a Kptfile to render at all.
    pub rendered: bool,
}

impl Rendered {
    pub fn is_success(&self) -> bool {
        self.error.is_none()
    }
}

struct PackageInfo {
    dir: String,
    kptfile: Kptfile,
}

/// Renders a package tree.
pub fn render(files: &Files, runtime: &dyn FunctionRuntime, options: &RenderOptions) -> Rendered {
    if !files.contains_key("Kptfile") {
        return Rendered {
            files: files.clone(),
            steps: Vec::new(),
            error: None,
            rendered: false,
        };
    }
    let mut run = Run {
        runtime,
        options,
        steps: Vec::new(),
        packages: Vec::new(),
        save_partial: false,
    };
    let result = run.render(files);
    let steps = std::mem::take(&mut run.steps);
    let save_partial = run.packages.first().is_some_and(|p| {
        p.kptfile
            .annotation_is_true(SAVE_ON_RENDER_FAILURE_ANNOTATION)
    });
    let (mut out, error) = match result {
        Ok(out) => (out, None),
        Err((error, partial)) => {
            let files = match partial {
                Some(partial) if save_partial => partial,
                _ => files.clone(),
            };
            (files, Some(error))
        }
    };
    if options.record_status
        && let Err(e) = record_status(&mut out, &steps, error.as_ref())
    {
        return Rendered {
            files: files.clone(),
            steps,
            error: Some(error.unwrap_or(e)),
            rendered: true,
        };
    }
    Rendered {
        files: out,
        steps,
        error,
        rendered: true,
    }
}

type Failure = (RenderError, Option<Files>);

struct Run<'a> {
    runtime: &'a dyn FunctionRuntime,
    options: &'a RenderOptions,
    steps: Vec<StepRecord>,
    packages: Vec<PackageInfo>,
    save_partial: bool,
}

impl Run<'_> {
    fn render(&mut self, files: &Files) -> Result<Files, Failure> {
        let fail = |e: RenderError| (e, None);
        let resources = package::read_resources(files).map_err(|e| fail(e.into()))?;
        for dir in package::package_dirs(files) {
            let path = if dir.is_empty() {
                "Kptfile".to_owned()
            } else {
                format!("{dir}/Kptfile")
            };
            let text = std::str::from_utf8(&files[&path]).unwrap_or("");
            let kptfile = Kptfile::from_yaml(text).map_err(|e| {
                fail(RenderError::Kptfile {
                    path: path.clone(),
                    reason: e.to_string(),
                })
            })?;
            validate_pipeline(&kptfile, &path, &dir, &resources).map_err(fail)?;
            if dir.is_empty() {
                self.save_partial = kptfile.annotation_is_true(SAVE_ON_RENDER_FAILURE_ANNOTATION);
            }
            self.packages.push(PackageInfo { dir, kptfile });
        }
        for r in &resources {
            if let Some(reason) = r.krm_problem()
                && !r.is_kustomization()
            {
                return Err(fail(RenderError::NotKrm {
                    path: r.origin.root_path(),
                    reason: reason.to_owned(),
                }));
            }
        }
        let previous = package::resource_files(&resources);
        let mut by_package: BTreeMap<String, Vec<Resource>> = BTreeMap::new();
        for r in resources {
            by_package
                .entry(r.origin.package.clone())
                .or_default()
                .push(r);
        }
        let bfs = self.packages[0]
            .kptfile
            .annotation_is_true(BFS_RENDERING_ANNOTATION);
        let outcome = if bfs {
            self.render_bfs(&mut by_package)
        } else {
            self.hydrate("", &mut by_package).map(|out| {
                by_package.clear();
                by_package.insert(String::new(), out);
            })
        };
        let all: Vec<Resource> = by_package.into_values().flatten().collect();
        match outcome {
            Ok(()) => {
                let mut all = assign_generated_paths(all);
                if let Some(value) = &self.options.attribution {
                    all.iter_mut().for_each(|r| attribute(r, value));
                }
                package::write_resources(files, all, &previous).map_err(|e| fail(e.into()))
            }
            Err(error) => {
                // Partial output for save-on-render-failure: no pruning.
                let partial =
                    package::write_resources(files, assign_generated_paths(all), &BTreeSet::new())
                        .ok();
                Err((error, partial))
            }
        }
    }

    fn direct_subpackages(&self, dir: &str) -> Vec<String> {
        let dirs: Vec<&String> = self.packages.iter().map(|p| &p.dir).collect();
        dirs.iter()
            .filter(|d| is_strict_descendant(d, dir))
            .filter(|d| {
                // No other package between `dir` and `d`.
                !dirs
                    .iter()
                    .any(|m| is_strict_descendant(m, dir) && is_strict_descendant(d, m))
            })
            .map(|d| (*d).clone())
            .collect()
    }

    /// Depth-first: own resources, then each subpackage's rendered output,
    /// then this package's pipeline.
    fn hydrate(
        &mut self,
        dir: &str,
        by_package: &mut BTreeMap<String, Vec<Resource>>,
    ) -> Result<Vec<Resource>, RenderError> {
        let mut input = by_package.remove(dir).unwrap_or_default();
        for sub in self.direct_subpackages(dir) {
            match self.hydrate(&sub, by_package) {
                Ok(out) => input.extend(out),
                Err(e) => {
                    by_package.insert(dir.to_owned(), input);
                    return Err(e);
                }
            }
        }
        match self.run_pipeline(dir, input) {
            Ok(out) => Ok(out),
            Err((e, partial)) => {
                by_package.insert(dir.to_owned(), partial);
                Err(e)
            }
        }
    }

    /// Breadth-first: parents first; each package sees its own and all
    /// descendants' current resources; output goes back by package.
    fn render_bfs(
        &mut self,
        by_package: &mut BTreeMap<String, Vec<Resource>>,
    ) -> Result<(), RenderError> {
        let mut order = vec![String::new()];
        let mut i = 0;
        while i < order.len() {
            let subs = self.direct_subpackages(&order[i]);
            order.extend(subs);
            i += 1;
        }
        for dir in order {
            let members: Vec<String> = by_package
                .keys()
                .filter(|p| *p == &dir || is_strict_descendant(p, &dir))
                .cloned()
                .collect();
            let mut input = Vec::new();
            for m in &members {
                input.extend(by_package.remove(m).unwrap_or_default());
            }
            let (output, error) = match self.run_pipeline(&dir, input) {
                Ok(out) => (out, None),
                Err((e, partial)) => (partial, Some(e)),
            };
            for r in output {
                by_package
                    .entry(r.origin.package.clone())
                    .or_default()
                    .push(r);
            }
            if let Some(e) = error {
                return Err(e);
            }
        }
        Ok(())
    }

    fn kptfile(&self, dir: &str) -> Option<&Kptfile> {
        self.packages
            .iter()
            .find(|p| p.dir == dir)
            .map(|p| &p.kptfile)
    }

    /// One package's pipeline. On failure, returns the input as it was
    /// before the failing step.
    fn run_pipeline(
        &mut self,
        dir: &str,
        mut items: Vec<Resource>,
    ) -> Result<Vec<Resource>, (RenderError, Vec<Resource>)> {
        let Some(pipeline) = self.kptfile(dir).and_then(|k| k.pipeline.clone()) else {
            return Ok(items);
        };
        for function in &pipeline.mutators {
            // The input survives a failure only when it will be saved.
            let backup = self.save_partial.then(|| items.clone());
            match self.run_step(dir, function, items, false) {
                Ok(out) => items = out,
                Err(e) => return Err((e, backup.unwrap_or_default())),
            }
        }
        for function in &pipeline.validators {
            // Validators run on a copy; their output is ignored.
            if let Err(e) = self.run_step(dir, function, items.clone(), true) {
                return Err((e, items));
            }
        }
        Ok(items)
    }

    fn run_step(
        &mut self,
        dir: &str,
        function: &Function,
        items: Vec<Resource>,
        validator: bool,
    ) -> Result<Vec<Resource>, RenderError> {
        let fref = if function.exec.is_empty() {
            FunctionRef::Image(crate::runtime::normalize_image(
                &function.image,
                &self.options.image_prefix,
            ))
        } else {
            FunctionRef::Exec(function.exec.clone())
        };
        let mut record = StepRecord {
            package: dir.to_owned(),
            name: function.name.clone(),
            function: fref.display().to_owned(),
            exec: matches!(fref, FunctionRef::Exec(_)),
            validator,
            ..Default::default()
        };
        let fail = |record: &mut StepRecord, reason: String| RenderError::Function {
            package: if dir.is_empty() {
                ".".into()
            } else {
                dir.to_owned()
            },
            function: record.function.clone(),
            reason,
        };
        let config = match function_config(function, dir, &items) {
            Ok(c) => c,
            Err(reason) => {
                record.exit_code = 1;
                record.execution_error = reason.clone();
                let e = fail(&mut record, reason);
                self.steps.push(record);
                return Err(e);
            }
        };
        let selected = select(&items, &function.selectors, &function.exclude);
        let everything = selected.len() == items.len();
        let (input, rest) = if everything {
            (items, Vec::new())
        } else {
            (selected.iter().map(|&i| items[i].clone()).collect(), items)
        };
        let call = Call {
            function: &fref,
            items: input,
            config: config.as_ref(),
            package: dir,
        };
        let output = match self.runtime.run(call) {
            Ok(output) => output,
            Err(error) => {
                let reason = match &error {
                    FunctionError::Failed {
                        results,
                        stderr,
                        exit_code,
                        ..
                    } => {
                        record.results = results.clone();
                        record.stderr = stderr.clone();
                        record.exit_code = *exit_code;
                        error.to_string()
                    }
                    other => {
                        record.exit_code = 1;
                        record.execution_error = other.to_string();
                        other.to_string()
                    }
                };
                let e = fail(&mut record, reason);
                self.steps.push(record);
                return Err(e);
            }
        };
        let FunctionOutput {
            items: out,
            results,
            stderr,
        } = output;
        record.results = results;
        record.stderr = stderr;
        if validator {
            self.steps.push(record);
            return Ok(Vec::new());
        }
        let merged = if everything {
            out
        } else {
            merge_selected(&rest, &selected, out)
        };
        if let Err(reason) = check_output(&merged) {
            record.exit_code = 1;
            record.execution_error = reason.clone();
            let e = fail(&mut record, reason);
            self.steps.push(record);
            return Err(e);
        }
        self.steps.push(record);
        Ok(merged)
    }
}

/// Annotation kpt extends on Config Connector objects.
const BLUEPRINT_ANNOTATION: &str = "cnrm.cloud.google.com/blueprint";

/// kpt's attribution: Config Connector objects (`*.cnrm.*` API groups) get
/// `value` in their blueprint annotation, appended to what is there.
fn attribute(r: &mut Resource, value: &str) {
    if !r.api_version().contains(".cnrm.") {
        return;
    }
    match r.annotation(BLUEPRINT_ANNOTATION).map(str::to_owned) {
        Some(current) if current.split(',').any(|v| v.trim() == value) => {}
        Some(current) => {
            if let Some(slot) =
                r.object
                    .lookup_mut(&["metadata", "annotations", BLUEPRINT_ANNOTATION])
            {
                slot.value = Value::Scalar(format!("{current},{value}"));
            }
        }
        None => {
            r.set_annotation(BLUEPRINT_ANNOTATION, value);
            if let Some(slot) =
                r.object
                    .lookup_mut(&["metadata", "annotations", BLUEPRINT_ANNOTATION])
            {
                slot.style = Style::SingleQuoted;
            }
        }
    }
}

fn is_strict_descendant(d: &str, ancestor: &str) -> bool {
    if ancestor.is_empty() {
        !d.is_empty()
    } else {
        d.len() > ancestor.len() && d.starts_with(ancestor) && d.as_bytes()[ancestor.len()] == b'/'
    }
}

/// Which inputs a function sees (spec §3.3), as indexes. A resource matched
/// by several selectors is sent once (kpt sends it once per selector and
/// then fails on the duplicate).
fn select(items: &[Resource], selectors: &[Selector], exclude: &[Selector]) -> Vec<usize> {
    (0..items.len())
        .filter(|&i| selectors.is_empty() || selectors.iter().any(|s| matches(&items[i], s)))
        .filter(|&i| {
            !exclude
                .iter()
                .any(|s| !is_empty_selector(s) && matches(&items[i], s))
        })
        .collect()
}

fn is_empty_selector(s: &Selector) -> bool {
    s.api_version.is_empty()
        && s.kind.is_empty()
        && s.name.is_empty()
        && s.namespace.is_empty()
        && s.labels.is_empty()
        && s.annotations.is_empty()
}

fn matches(r: &Resource, s: &Selector) -> bool {
    (s.name.is_empty() || r.name() == s.name)
        && (s.namespace.is_empty() || r.namespace() == s.namespace)
        && (s.kind.is_empty() || r.kind() == s.kind)
        && (s.api_version.is_empty() || r.api_version() == s.api_version)
        && s.labels.iter().all(|(k, v)| r.label(k) == Some(v))
        && s.annotations
            .iter()
            .all(|(k, v)| r.annotation(k) == Some(v))
}

/// Puts a function's output over the full input: unselected items stay,
/// selected ones are replaced by their output (dropped if absent), new
/// objects go at the end. Outputs are matched to inputs by position of
/// identity (the runtimes keep the input's origin on objects they return).
fn merge_selected(items: &[Resource], selected: &[usize], out: Vec<Resource>) -> Vec<Resource> {
    let key = |r: &Resource| {
        (
            r.origin.package.clone(),
            r.origin.path.clone(),
            r.origin.index,
        )
    };
    let mut by_origin: HashMap<_, Resource> = HashMap::new();
    let mut fresh = Vec::new();
    let selected_keys: BTreeSet<_> = selected.iter().map(|&i| key(&items[i])).collect();
    for r in out {
        if !r.origin.path.is_empty()
            && selected_keys.contains(&key(&r))
            && !by_origin.contains_key(&key(&r))
        {
            by_origin.insert(key(&r), r);
        } else {
            fresh.push(r);
        }
    }
    let selected_set: BTreeSet<usize> = selected.iter().copied().collect();
    let mut merged = Vec::with_capacity(items.len() + fresh.len());
    for (i, item) in items.iter().enumerate() {
        if selected_set.contains(&i) {
            if let Some(r) = by_origin.remove(&key(item)) {
                merged.push(r);
            }
        } else {
            merged.push(item.clone());
        }
    }
    merged.extend(fresh);
    merged
}

/// kpt's checks on a function's output (spec §2.3).
fn check_output(items: &[Resource]) -> Result<(), String> {
    let mut seen: std::collections::HashSet<(&str, &str, usize)> =
        std::collections::HashSet::with_capacity(items.len());
    for r in items {
        if let Some(reason) = r.krm_problem()
            && !r.is_kustomization()
        {
            return Err(format!(
                "output resource list must contain only KRM resources: {}: {reason}",
                r.origin.root_path()
            ));
        }
        if r.origin.path.is_empty() {
            continue;
        }
        if r.origin.path.starts_with('/')
            || r.origin.path.split('/').any(|s| s == "..")
            || package::check_path(&r.origin.root_path()).is_err()
        {
            return Err(format!(
                "function must not modify resources outside of package: resource has path {}",
                r.origin.path
            ));
        }
        let index = r.origin.index.unwrap_or(0);
        if !seen.insert((&r.origin.package, &r.origin.path, index)) {
            return Err(format!(
                "resource at path {:?} and index \"{index}\" already exists",
                r.origin.path
            ));
        }
    }
    Ok(())
}

/// Gives objects created without a path kpt's default file and index.
fn assign_generated_paths(items: Vec<Resource>) -> Vec<Resource> {
    let mut next: BTreeMap<String, usize> = BTreeMap::new();
    for r in &items {
        if !r.origin.path.is_empty() {
            let n = next.entry(r.origin.root_path()).or_default();
            *n = (*n).max(r.origin.index.unwrap_or(0) + 1);
        }
    }
    items
        .into_iter()
        .map(|mut r| {
            if r.origin.path.is_empty() {
                r.origin.path = package::default_path(&r);
                let n = next.entry(r.origin.root_path()).or_default();
                r.origin.index = Some(*n);
                *n += 1;
            }
            r
        })
        .collect()
}

/// The functionConfig of a step: the package's own object at `configPath`,
/// or a `function-input` ConfigMap of `configMap`.
fn function_config(
    function: &Function,
    dir: &str,
    items: &[Resource],
) -> Result<Option<Node>, String> {
    if !function.config_path.is_empty() {
        let found = items
            .iter()
            .find(|r| r.origin.package == dir && r.origin.path == function.config_path);
        return match found {
            Some(r) => Ok(Some(r.object.clone())),
            None => Err(format!(
                "functionConfig {:?} is not a resource of this package",
                function.config_path
            )),
        };
    }
    if function.config_map.is_empty() {
        return Ok(None);
    }
    let mut config = Node::mapping();
    config.set("apiVersion", Node::plain("v1"));
    config.set("kind", Node::plain("ConfigMap"));
    let mut metadata = Node::mapping();
    metadata.set("name", Node::plain("function-input"));
    config.set("metadata", metadata);
    let mut data = Node::mapping();
    data.style = Style::Flow;
    data.value = Value::Mapping(
        function
            .config_map
            .iter()
            .map(|(k, v)| (Node::plain(k.clone()), Node::string(v.clone())))
            .collect(),
    );
    config.set("data", data);
    Ok(Some(config))
}

/// The Kptfile checks kpt makes before running a package (spec §3.1).
fn validate_pipeline(
    kptfile: &Kptfile,
    path: &str,
    dir: &str,
    resources: &[Resource],
) -> Result<(), RenderError> {
    let bad = |reason: String| RenderError::Kptfile {
        path: path.to_owned(),
        reason,
    };
    let Some(pipeline) = &kptfile.pipeline else {
        return Ok(());
    };
    for f in pipeline.mutators.iter().chain(&pipeline.validators) {
        match (f.image.is_empty(), f.exec.is_empty()) {
            (true, true) => return Err(bad("function must have `image` or `exec`".into())),
            (false, false) => {
                return Err(bad("function must not have both `image` and `exec`".into()));
            }
            _ => {}
        }
        if !f.image.is_empty() && !valid_image(&f.image) {
            return Err(bad(format!(
                "function image {:?} is not a valid image reference",
                f.image
            )));
        }
        if !f.config_path.is_empty() && !f.config_map.is_empty() {
            return Err(bad(
                "function must not have both `configMap` and `configPath`".into(),
            ));
        }
        if !f.config_path.is_empty() {
            let p = &f.config_path;
            if p.starts_with('/') || p.split('/').any(|s| s == ".." || s.is_empty()) {
                return Err(bad(format!(
                    "functionConfig path {p:?} must be a relative path inside the package"
                )));
            }
            let count = resources
                .iter()
                .filter(|r| r.origin.package == dir && &r.origin.path == p)
                .count();
            if count != 1 {
                return Err(bad(format!(
                    "functionConfig {p:?} must exist in the package and hold exactly one object (found {count})"
                )));
            }
        }
    }
    Ok(())
}

/// The Docker reference grammar, simplified: lowercase path components,
/// optional `host[:port]/`, optional `:tag` and/or `@sha256:<hex>`.
fn valid_image(image: &str) -> bool {
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        let Some(hex) = d.strip_prefix("sha256:") else {
            return false;
        };
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
    }
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].split_once(':') {
        Some((n, t)) => (&rest[..last_slash + n.len()], Some(t)),
        None => (rest, None),
    };
    if let Some(t) = tag
        && (t.is_empty()
            || t.len() > 128
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
            || !(t.as_bytes()[0].is_ascii_alphanumeric() || t.as_bytes()[0] == b'_'))
    {
        return false;
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    if parts.len() > 1
        && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost")
    {
        let host = parts.remove(0);
        if host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'))
        {
            return false;
        }
    }
    !parts.is_empty()
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
                })
                && p.as_bytes()[0].is_ascii_alphanumeric()
        })
}

/// Maps a wire output back to resources: ids give back the input's origin,
/// annotations give the rest.
///
/// # Errors
/// Legacy and new annotations that disagree.
pub fn from_wire_output(
    input: &[Resource],
    decoded: Decoded,
    package: &str,
    stderr: String,
) -> Result<FunctionOutput, FunctionError> {
    let mut items = Vec::with_capacity(decoded.items.len());
    for mut object in decoded.items {
        let wire = strip_wire_annotations(&mut object);
        let before = wire
            .id
            .and_then(|id| id.checked_sub(1))
            .and_then(|i| input.get(i));
        let origin = wire
            .origin(before.map(|r| &r.origin), package)
            .map_err(FunctionError::Runtime)?;
        let origin = Origin {
            package: if wire.package_path.is_none() {
                before.map_or_else(|| package.to_owned(), |b| b.origin.package.clone())
            } else {
                origin.package
            },
            ..origin
        };
        if let Some(before) = before {
            yaml::sync_comments_and_order(&before.object, &mut object);
        }
        items.push(Resource::new(object, origin));
    }
    Ok(FunctionOutput {
        items,
        results: decoded.results,
        stderr,
    })
}

/// Writes the `Rendered` condition and `renderStatus` into the root Kptfile,
/// re-encoding it from its typed form as kpt does.
fn record_status(
    files: &mut Files,
    steps: &[StepRecord],
    error: Option<&RenderError>,
) -> Result<(), RenderError> {
    let Some(bytes) = files.get("Kptfile") else {
        return Ok(());
    };
    let text = std::str::from_utf8(bytes).unwrap_or("");
    let mut kptfile = Kptfile::from_yaml(text).map_err(|e| RenderError::Kptfile {
        path: "Kptfile".into(),
        reason: e.to_string(),
    })?;
    let mut status = kptfile.status.take().unwrap_or_default();
    status.conditions.retain(|c| c.type_ != RENDERED_CONDITION);
    status.conditions.push(match error {
        None => PackageCondition {
            type_: RENDERED_CONDITION.into(),
            status: ConditionStatus::True,
            reason: "RenderSuccess".into(),
            message: String::new(),
        },
        Some(e) => PackageCondition {
            type_: RENDERED_CONDITION.into(),
            status: ConditionStatus::False,
            reason: "RenderFailed".into(),
            message: e.to_string(),
        },
    });
    status.render_status = render_status(steps, error);
    kptfile.status = Some(status);
    let node = typed_to_node(&kptfile).map_err(|reason| RenderError::Kptfile {
        path: "Kptfile".into(),
        reason,
    })?;
    files.insert(
        "Kptfile".into(),
        yaml::emit_document(&node, SeqIndent::Wide).into_bytes(),
    );
    Ok(())
}

fn render_status(steps: &[StepRecord], error: Option<&RenderError>) -> Option<KptRenderStatus> {
    if steps.is_empty() {
        return None;
    }
    let convert = |s: &StepRecord| PipelineStepResult {
        name: s.name.clone(),
        image: if s.exec {
            String::new()
        } else {
            s.function.clone()
        },
        exec: if s.exec {
            s.function.clone()
        } else {
            String::new()
        },
        execution_error: s.execution_error.clone(),
        stderr: s.stderr.clone(),
        exit_code: i64::from(s.exit_code),
        results: s.results.iter().map(step_item).collect(),
        error_results: s
            .results
            .iter()
            .filter(|r| r.is_error())
            .map(step_item)
            .collect(),
    };
    let error_summary = if error.is_some() {
        steps
            .iter()
            .filter(|s| s.exit_code != 0)
            .map(|s| {
                let who = if s.name.is_empty() {
                    &s.function
                } else {
                    &s.name
                };
                if s.execution_error.is_empty() {
                    format!("{who}: exit code {}", s.exit_code)
                } else {
                    format!("{who}: {}", s.execution_error)
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        String::new()
    };
    Some(KptRenderStatus {
        mutation_steps: steps.iter().filter(|s| !s.validator).map(convert).collect(),
        validation_steps: steps.iter().filter(|s| s.validator).map(convert).collect(),
        error_summary,
    })
}

fn step_item(r: &ResultItem) -> StepResultItem {
    let stringify = |v: &Option<serde_json::Value>| match v {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    StepResultItem {
        message: r.message.clone(),
        severity: r.severity.clone(),
        resource_ref: r
            .resource_ref
            .as_ref()
            .map(|x| porch_api::v1alpha1::ResourceRef {
                api_version: x.api_version.clone(),
                kind: x.kind.clone(),
                name: x.name.clone(),
                namespace: x.namespace.clone(),
            }),
        field: r.field.as_ref().map(|f| StepField {
            path: f.path.clone(),
            current_value: stringify(&f.current_value),
            proposed_value: stringify(&f.proposed_value),
        }),
        file: r.file.clone(),
    }
}

/// A typed value as a block-style node with its fields in declaration order.
///
/// # Errors
/// Serialisation failures.
pub fn typed_to_node<T: serde::Serialize>(value: &T) -> Result<Node, String> {
    let json = serde_json::to_string(value).map_err(|e| e.to_string())?;
    let mut node = yaml::parse_document(&json)
        .map_err(|e| e.to_string())?
        .unwrap_or_else(Node::mapping);
    package::to_block_style(&mut node);
    Ok(node)
}
