//! starlark, v0.4 and v0.5 series (spec §5.8): a Starlark script changes
//! `ctx.resource_list["items"]`.
//!
//! The script sees `ctx.resource_list` (`items` and `functionConfig` as
//! dicts and lists), `ctx.environment` and `ctx.open_api` (empty), and the
//! `json` module, `struct`, `set` and the extended dialect (top-level `if`
//! and `for`). `print` goes to stderr. `load()` of starlib modules is not
//! available. Objects the script keeps get their comments, key order and
//! scalar styles back; objects it creates are written in block style.

use std::cell::RefCell;

use serde::Deserialize;
use starlark::environment::{GlobalsBuilder, LibraryExtension, Module};
use starlark::eval::Evaluator;
use starlark::syntax::{AstModule, Dialect};
use starlark::values::structs::AllocStruct;

use super::{Builtin, Failure, config_data, config_kind, typed_config};
use crate::resource::{ID_ANNOTATION, Origin, Resource};
use crate::resourcelist::{ResultItem, Results};
use crate::yaml::{self, Node, Value};

pub(crate) struct Starlark;

#[derive(Deserialize)]
struct Run {
    #[serde(default)]
    source: String,
}

fn source(config: Option<&Node>) -> Result<String, Failure> {
    let Some(config) = config else {
        return Err(Failure::new(
            "`functionConfig` is not given; expected a ConfigMap or StarlarkRun with `source`",
        ));
    };
    let source = match config_kind(config) {
        ("v1", "ConfigMap") => config_data(config).remove("source").unwrap_or_default(),
        (_, "StarlarkRun") => typed_config::<Run>(config)?.source,
        (api, kind) => {
            return Err(Failure::new(format!(
                "`functionConfig` must be a `ConfigMap` or `StarlarkRun`, got {kind} {api}"
            )));
        }
    };
    if source.trim().is_empty() {
        return Err(Failure::new("`source` must not be empty"));
    }
    Ok(source)
}

struct Collect(RefCell<String>);

impl starlark::PrintHandler for Collect {
    fn println(&self, text: &str) -> starlark::Result<()> {
        let mut out = self.0.borrow_mut();
        out.push_str(text);
        out.push('\n');
        Ok(())
    }
}

/// Copies scalar and collection styles from the input where the output has
/// the same value, after comments and order were synced.
fn restore_styles(input: &Node, output: &mut Node) {
    match (&input.value, &mut output.value) {
        (Value::Scalar(a), Value::Scalar(b)) if a == b => {
            output.style = input.style;
            output.tag.clone_from(&input.tag);
            output.explicit_tag = input.explicit_tag;
        }
        (Value::Mapping(before), Value::Mapping(after)) => {
            output.style = input.style;
            for (k, v) in after.iter_mut() {
                if let Some((in_k, in_v)) = before.iter().find(|(bk, _)| bk.as_str() == k.as_str())
                {
                    restore_styles(in_k, k);
                    restore_styles(in_v, v);
                }
            }
        }
        (Value::Sequence(before), Value::Sequence(after)) => {
            output.style = input.style;
            for (a, b) in before.iter().zip(after.iter_mut()) {
                restore_styles(a, b);
            }
        }
        _ => {}
    }
}

impl Builtin for Starlark {
    fn name(&self) -> &'static str {
        "starlark"
    }

    fn series(&self) -> &'static [&'static str] {
        &["v0.4", "v0.5"]
    }

    fn run(
        &self,
        items: &mut Vec<Resource>,
        config: Option<&Node>,
    ) -> Result<Vec<ResultItem>, Failure> {
        let script = source(config)?;
        // Ids let objects the script keeps find their origin again.
        let mut json_items = Vec::with_capacity(items.len());
        for (i, r) in items.iter().enumerate() {
            let mut tagged = r.clone();
            tagged.set_annotation(ID_ANNOTATION, &i.to_string());
            json_items
                .push(yaml::to_json(&tagged.object).map_err(|e| Failure::new(e.to_string()))?);
        }
        let function_config = match config {
            Some(c) => yaml::to_json(c).map_err(|e| Failure::new(e.to_string()))?,
            None => serde_json::Value::Null,
        };
        let input = serde_json::json!({
            "apiVersion": crate::resourcelist::RESOURCE_LIST_API_VERSION,
            "kind": "ResourceList",
            "items": json_items,
            "functionConfig": function_config,
        });
        let ast = AstModule::parse("starlark.star", script, &Dialect::Extended)
            .map_err(|e| Failure::new(format!("failed to parse the starlark script: {e}")))?;
        let globals = GlobalsBuilder::extended_by(&[
            LibraryExtension::StructType,
            LibraryExtension::Json,
            LibraryExtension::Print,
            LibraryExtension::SetType,
            LibraryExtension::Map,
            LibraryExtension::Filter,
        ])
        .build();
        let printed = Collect(RefCell::new(String::new()));
        let output: Result<serde_json::Value, String> = Module::with_temp_heap(|module| {
            let heap = module.heap();
            let resource_list = heap.alloc(input);
            let empty = heap.alloc(serde_json::json!({}));
            let ctx = heap.alloc(AllocStruct([
                ("resource_list", resource_list),
                ("environment", empty),
                ("open_api", heap.alloc(serde_json::json!({}))),
            ]));
            module.set("ctx", ctx);
            let mut eval = Evaluator::new(&module);
            eval.set_print_handler(&printed);
            eval.eval_module(ast, &globals)
                .map_err(|e| format!("starlark script failed: {e}"))?;
            resource_list
                .to_json_value()
                .map_err(|e| format!("ctx.resource_list cannot be read back: {e}"))
        });
        let stderr = printed.0.into_inner();
        let output = output.map_err(|e| {
            let mut failure = Failure::new(e);
            if !stderr.is_empty() {
                failure.results.push(ResultItem::info(stderr.clone()));
            }
            failure
        })?;
        let Some(out_items) = output.get("items").and_then(serde_json::Value::as_array) else {
            return Err(Failure::new("ctx.resource_list[\"items\"] must be a list"));
        };
        let mut result = Vec::with_capacity(out_items.len());
        for value in out_items {
            let mut object = yaml::from_json(value);
            let id = object
                .lookup_mut(&["metadata", "annotations"])
                .and_then(|a| a.remove(ID_ANNOTATION))
                .and_then(|n| n.as_str().and_then(|v| v.parse::<usize>().ok()));
            let origin = match id.and_then(|i| items.get(i)) {
                Some(before) => {
                    // The annotations map the id needed goes again if it was not there.
                    if before.object.lookup(&["metadata", "annotations"]).is_none()
                        && let Some(metadata) = object.get_mut("metadata")
                        && metadata
                            .get("annotations")
                            .is_some_and(|a| a.as_mapping().is_some_and(Vec::is_empty))
                    {
                        metadata.remove("annotations");
                    }
                    yaml::sync_comments_and_order(&before.object, &mut object);
                    restore_styles(&before.object, &mut object);
                    before.origin.clone()
                }
                None => Origin::default(),
            };
            result.push(Resource::new(object, origin));
        }
        *items = result;
        Ok(if stderr.is_empty() {
            Vec::new()
        } else {
            vec![ResultItem::info(stderr)]
        })
    }
}
