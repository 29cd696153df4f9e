//! set-image, v0.1 series (spec §5.9): container images matching a name get
//! a new name, tag or digest.
//!
//! Differences from the catalog: init containers are updated (the catalog
//! looks them up under a misspelled key and never does), and so are the pod
//! templates of Jobs and CronJobs.

use serde::Deserialize;

use super::{Builtin, Failure, FieldSpec, config_data, config_kind, is_gvk, typed_config};
use crate::resource::Resource;
use crate::resourcelist::{ResultItem, Results};
use crate::yaml::Node;

pub(crate) struct SetImage;

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(rename_all = "camelCase")]
struct Image {
    #[serde(default)]
    name: String,
    #[serde(default)]
    new_name: String,
    #[serde(default)]
    new_tag: String,
    #[serde(default)]
    digest: String,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct TypedConfig {
    #[serde(default)]
    image: Image,
    #[serde(default)]
    additional_image_fields: Vec<FieldSpec>,
}

fn read_config(config: Option<&Node>) -> Result<(Image, Vec<FieldSpec>), Failure> {
    let Some(config) = config else {
        return Err(Failure::new("`functionConfig` is not given"));
    };
    let (image, fields) = match config_kind(config) {
        ("v1", "ConfigMap") => {
            let data = config_data(config);
            if let Some(key) = data
                .keys()
                .find(|k| !matches!(k.as_str(), "name" | "newName" | "newTag" | "digest"))
            {
                return Err(Failure::new(format!(
                    "ConfigMap data key {key:?} is not one of name, newName, newTag, digest"
                )));
            }
            let get = |k: &str| data.get(k).cloned().unwrap_or_default();
            (
                Image {
                    name: get("name"),
                    new_name: get("newName"),
                    new_tag: get("newTag"),
                    digest: get("digest"),
                },
                Vec::new(),
            )
        }
        ("fn.kpt.dev/v1alpha1", "SetImage") => {
            let typed: TypedConfig = typed_config(config)?;
            (typed.image, typed.additional_image_fields)
        }
        (api, kind) => {
            return Err(Failure::new(format!(
                "`functionConfig` must be a `ConfigMap` or `SetImage`, got {kind} {api}"
            )));
        }
    };
    if image.name.is_empty() {
        return Err(Failure::new("must specify image name"));
    }
    if image.new_name.is_empty() && image.new_tag.is_empty() && image.digest.is_empty() {
        return Err(Failure::new(
            "must specify one of newName, newTag, or digest",
        ));
    }
    Ok((image, fields))
}

/// `name[:tag][@digest]` → (name, tag, digest); a `:` before the last `/` is
/// a registry port.
fn split(image: &str) -> (&str, Option<&str>, Option<&str>) {
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (image, None),
    };
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    match rest[slash..].rfind(':') {
        Some(i) => (&rest[..slash + i], Some(&rest[slash + i + 1..]), digest),
        None => (rest, None, digest),
    }
}

fn rewrite(current: &str, image: &Image) -> Option<String> {
    let (name, tag, digest) = split(current);
    if name != image.name {
        return None;
    }
    let new_name = if image.new_name.is_empty() {
        name
    } else {
        &image.new_name
    };
    let suffix = if !image.digest.is_empty() {
        format!("@{}", image.digest)
    } else if !image.new_tag.is_empty() {
        format!(":{}", image.new_tag)
    } else {
        match (tag, digest) {
            (Some(t), Some(d)) => format!(":{t}@{d}"),
            (Some(t), None) => format!(":{t}"),
            (None, Some(d)) => format!("@{d}"),
            (None, None) => String::new(),
        }
    };
    let updated = format!("{new_name}{suffix}");
    (updated != current).then_some(updated)
}

fn containers(spec: &mut Node, image: &Image, count: &mut usize) {
    for key in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(list) = spec.get_mut(key).and_then(Node::as_sequence_mut) {
            for container in list {
                if let Some(slot) = container.get_mut("image")
                    && let Some(current) = slot.as_str()
                    && let Some(new) = rewrite(current, image)
                {
                    slot.set_string(&new);
                    *count += 1;
                }
            }
        }
    }
}

impl Builtin for SetImage {
    fn name(&self) -> &'static str {
        "set-image"
    }

    fn series(&self) -> &'static [&'static str] {
        &["v0.1"]
    }

    fn run(
        &self,
        items: &mut Vec<Resource>,
        config: Option<&Node>,
    ) -> Result<Vec<ResultItem>, Failure> {
        let (image, fields) = read_config(config)?;
        let mut count = 0usize;
        for r in items.iter_mut() {
            let spec_path: Option<&[&str]> = if is_gvk(r, "", "v1", "Pod") {
                Some(&["spec"])
            } else if [
                "Deployment",
                "StatefulSet",
                "ReplicaSet",
                "DaemonSet",
                "Job",
            ]
            .iter()
            .any(|k| is_gvk(r, "", "", k))
            {
                Some(&["spec", "template", "spec"])
            } else if is_gvk(r, "", "v1", "PodTemplate") {
                Some(&["template", "spec"])
            } else if is_gvk(r, "batch", "", "CronJob") {
                Some(&["spec", "jobTemplate", "spec", "template", "spec"])
            } else {
                None
            };
            if let Some(path) = spec_path
                && let Some(spec) = r.object.lookup_mut(path)
            {
                containers(spec, &image, &mut count);
            }
            for field in &fields {
                let Some(path) = field.segments_for(r) else {
                    continue;
                };
                if let Some(slot) = r.object.lookup_mut(&path)
                    && let Some(current) = slot.as_str()
                    && let Some(new) = rewrite(current, &image)
                {
                    slot.set_string(&new);
                    count += 1;
                }
            }
        }
        Ok(vec![ResultItem::info(format!(
            "summary: updated a total of {count} image(s)"
        ))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_split_and_rewritten() {
        assert_eq!(split("nginx"), ("nginx", None, None));
        assert_eq!(
            split("localhost:5000/app:1.2"),
            ("localhost:5000/app", Some("1.2"), None)
        );
        assert_eq!(split("app@sha256:abc"), ("app", None, Some("sha256:abc")));
        let image = Image {
            name: "nginx".into(),
            new_tag: "1.27".into(),
            ..Image::default()
        };
        assert_eq!(rewrite("nginx:1.25", &image).as_deref(), Some("nginx:1.27"));
        assert_eq!(rewrite("nginx-other:1.25", &image), None);
        let digest = Image {
            name: "nginx".into(),
            new_name: "mirror/nginx".into(),
            new_tag: "ignored".into(),
            digest: "sha256:def".into(),
        };
        assert_eq!(
            rewrite("nginx:1.25", &digest).as_deref(),
            Some("mirror/nginx@sha256:def")
        );
    }
}
