//! PackageVariant (`config.porch.kpt.dev/v1alpha1`) and PackageVariantSet
//! (`config.porch.kpt.dev/v1alpha2`): the types (packagevariants spec §1,
//! §3), their validation (§1.4, §3.3) and how a set names its variants
//! (§3.7).

mod validate;

pub use validate::{
    MAX_SHOWN_ERRORS, RESERVED_PACKAGE_CONTEXT_KEYS, ValidationErrors,
    validate_package_variant_name,
};

use crate::kptfile::Function;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, LabelSelectorRequirement,
};
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{DeserializeOwned, IntoDeserializer};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha1::{Digest, Sha1};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Finalizer put on PackageVariants.
pub const PACKAGE_VARIANT_FINALIZER: &str = "config.porch.kpt.dev/packagevariants";
/// Label on PackageVariants made by a PackageVariantSet (value: the set's uid).
pub const PACKAGE_VARIANT_SET_LABEL: &str = "config.porch.kpt.dev/packagevariantset";

/// One downstream package kept in step with an upstream.
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "config.porch.kpt.dev",
    version = "v1alpha1",
    kind = "PackageVariant",
    plural = "packagevariants",
    singular = "packagevariant",
    category = "porch",
    namespaced,
    status = "PackageVariantStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Keeps one downstream package revision in step with an upstream package."
)]
#[serde(rename_all = "camelCase")]
pub struct PackageVariantSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Upstream>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downstream: Option<Downstream>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adoption_policy: Option<Policy<AdoptionPolicy>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<Policy<DeletionPolicy>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_context: Option<PackageContext>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<crate::kptfile::Pipeline>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injectors: Vec<InjectionSelector>,
}

/// The upstream of a variant (shared with PackageVariantSet).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Upstream {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repo: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub package: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub workspace_name: String,
}

/// The downstream of a variant.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
pub struct Downstream {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repo: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub package: String,
}

/// Whether existing downstream revisions are adopted.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AdoptionPolicy {
    #[default]
    #[serde(rename = "adoptNone")]
    AdoptNone,
    #[serde(rename = "adoptExisting")]
    AdoptExisting,
}

/// What happens to downstream revisions when the variant goes away.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeletionPolicy {
    #[default]
    Delete,
    Orphan,
}

/// A policy as written. The reference takes any text here and reports an
/// unknown value when it validates (spec §1.4, §3.3), so an unknown value is
/// kept for validation to report in the reference's words; the CRD schema
/// still lists only the known values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Policy<T> {
    Known(T),
    Unknown(String),
}

impl<T: Copy> Policy<T> {
    /// The value, if it is one of the known ones.
    pub fn known(&self) -> Option<T> {
        match self {
            Policy::Known(value) => Some(*value),
            Policy::Unknown(_) => None,
        }
    }
}

impl<T> From<T> for Policy<T> {
    fn from(value: T) -> Self {
        Policy::Known(value)
    }
}

impl<T: Serialize> Serialize for Policy<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Policy::Known(value) => value.serialize(serializer),
            Policy::Unknown(text) => serializer.serialize_str(text),
        }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Policy<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let known: Result<T, serde::de::value::Error> =
            T::deserialize(text.as_str().into_deserializer());
        Ok(known.map_or(Policy::Unknown(text), Policy::Known))
    }
}

impl<T: JsonSchema> JsonSchema for Policy<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }
    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }
    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}

/// Keys to set in and remove from `package-context.yaml`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PackageContext {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove_keys: Vec<String>,
}

/// An in-cluster object that may be injected into the package.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
pub struct InjectionSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
}

/// `status` of a PackageVariant.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PackageVariantStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub downstream_targets: Vec<DownstreamTarget>,
}

/// A PackageRevision the variant manages.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DownstreamTarget {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub render_status: Option<crate::v1alpha1::RenderStatus>,
}

/// Fan-out of one upstream to many downstream variants.
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "config.porch.kpt.dev",
    version = "v1alpha2",
    kind = "PackageVariantSet",
    plural = "packagevariantsets",
    singular = "packagevariantset",
    category = "porch",
    namespaced,
    status = "PackageVariantSetStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Generates PackageVariants from one upstream for many targets."
)]
#[serde(rename_all = "camelCase")]
pub struct PackageVariantSetSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Upstream>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<Target>,
}

/// One target: exactly one of `repositories`, `repositorySelector`, `objectSelector`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repositories: Option<Vec<RepositoryTarget>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_selector: Option<ObjectSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PackageVariantTemplate>,
}

/// `targets[].repositories[]`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RepositoryTarget {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub package_names: Vec<String>,
}

/// `targets[].objectSelector`: a label selector over objects of one kind.
// The selector's fields are spelled out, not a flattened `LabelSelector`: a
// flattened struct hides unknown fields from a strict decode.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObjectSelector {
    /// Labels the objects must have (ANDed with `matchExpressions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
    /// Label requirements the objects must meet (ANDed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ObjectSelector {
    /// The label selector part.
    pub fn label_selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: self.match_labels.clone(),
            match_expressions: self.match_expressions.clone(),
        }
    }
}

/// How each generated PackageVariant is shaped.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PackageVariantTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downstream: Option<DownstreamTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adoption_policy: Option<Policy<AdoptionPolicy>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<Policy<DeletionPolicy>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub label_exprs: Vec<MapExpr>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotation_exprs: Vec<MapExpr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_context: Option<PackageContextTemplate>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injectors: Vec<InjectionSelectorTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<PipelineTemplate>,
}

/// `template.downstream`: a value or a CEL expression for each field.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DownstreamTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_expr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_expr: Option<String>,
}

/// A map entry given by values or CEL expressions.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MapExpr {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_expr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_expr: Option<String>,
}

/// `template.packageContext`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PackageContextTemplate {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_exprs: Vec<MapExpr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove_keys: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove_key_exprs: Vec<String>,
}

/// `template.injectors[]`: exactly one of `name` and `nameExpr`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct InjectionSelectorTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_expr: Option<String>,
}

/// `template.pipeline`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PipelineTemplate {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validators: Vec<FunctionTemplate>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mutators: Vec<FunctionTemplate>,
}

/// A kpt function plus expressions overlaid onto its `configMap`. The fields
/// are the Kptfile `Function`'s, spelled out because that type decodes strictly
/// and so cannot be flattened.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FunctionTemplate {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub exec: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub config_path: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config_map: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tag: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<crate::kptfile::Selector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<crate::kptfile::Selector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_map_exprs: Vec<MapExpr>,
}

impl FunctionTemplate {
    /// The function without its expressions.
    pub fn function(&self) -> Function {
        Function {
            image: self.image.clone(),
            exec: self.exec.clone(),
            config_path: self.config_path.clone(),
            config_map: self.config_map.clone(),
            name: self.name.clone(),
            tag: self.tag.clone(),
            selectors: self.selectors.clone(),
            exclude: self.exclude.clone(),
        }
    }
}

/// `status` of a PackageVariantSet.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PackageVariantSetStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The key of the variant a PackageVariantSet makes for one downstream
/// (spec §3.7): `<set name>-<repo>-<package>`. Existing variants are matched
/// by the key computed from their spec, not by their name.
pub fn package_variant_key(set_name: &str, downstream: &Downstream) -> String {
    format!("{set_name}-{}-{}", downstream.repo, downstream.package)
}

/// Longest variant name, and how much of the key a shortened name keeps.
const MAX_VARIANT_NAME: usize = crate::naming::MAX_LABEL_LEN;
const KEPT_KEY_PREFIX: usize = 54;

/// The name of the variant with this key (spec §3.7): the key itself when it
/// is a DNS-1123 label, otherwise its first 54 characters, `-` and the first
/// 8 hex digits of the key's SHA-1 (`my-pvs-dnrepo4-supersuper…-bec36506`).
///
/// The reference shortens only long keys, so a nested package (`a/b`) gave
/// an invalid name and a set name with `.` a variant that cannot recognise
/// its own functions; here any character a label cannot hold becomes `-` in
/// the kept part, and the hash keeps such names apart.
pub fn package_variant_name(key: &str) -> String {
    if crate::naming::is_dns1123_label(key) {
        return key.to_owned();
    }
    let kept: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(KEPT_KEY_PREFIX)
        .collect();
    let mut name = kept.trim_start_matches('-').to_owned();
    name.push('-');
    for byte in Sha1::digest(key.as_bytes()).iter().take(4) {
        let _ = write!(name, "{byte:02x}");
    }
    debug_assert!(name.len() <= MAX_VARIANT_NAME);
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn policies_keep_unknown_text_and_write_it_back() {
        let spec: PackageVariantSpec = serde_json::from_value(
            json!({"adoptionPolicy": "adoptExisting", "deletionPolicy": "Orphan"}),
        )
        .expect("decodes");
        assert_eq!(
            spec.adoption_policy,
            Some(Policy::Known(AdoptionPolicy::AdoptExisting))
        );
        assert_eq!(spec.deletion_policy, Some(Policy::Unknown("Orphan".into())));
        assert_eq!(
            spec.adoption_policy.as_ref().and_then(Policy::known),
            Some(AdoptionPolicy::AdoptExisting)
        );
        assert_eq!(spec.deletion_policy.as_ref().and_then(Policy::known), None);
        assert_eq!(
            serde_json::to_value(&spec).expect("encodes"),
            json!({"adoptionPolicy": "adoptExisting", "deletionPolicy": "Orphan"})
        );
        let wrong: Result<PackageVariantSpec, _> =
            serde_json::from_value(json!({"deletionPolicy": 3}));
        assert!(wrong.is_err(), "not text");
    }

    #[test]
    fn the_schema_of_a_policy_is_the_known_values() {
        let generator = &mut schemars::SchemaGenerator::default();
        assert_eq!(
            Policy::<DeletionPolicy>::json_schema(generator),
            DeletionPolicy::json_schema(generator)
        );
    }

    #[test]
    fn object_selector_converts_to_a_label_selector() {
        let selector: ObjectSelector = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "matchLabels": {"env": "edge"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}],
        }))
        .expect("decodes");
        let labels = selector.label_selector();
        assert_eq!(
            labels.match_labels,
            Some(BTreeMap::from([("env".to_owned(), "edge".to_owned())]))
        );
        assert_eq!(labels.match_expressions.map(|e| e.len()), Some(1));
    }

    fn downstream(repo: &str, package: &str) -> Downstream {
        Downstream {
            repo: repo.into(),
            package: package.into(),
        }
    }

    #[test]
    fn variant_names_follow_the_reference() {
        let key = package_variant_key("my-pvs", &downstream("dnrepo3", "dnpkg3"));
        assert_eq!(key, "my-pvs-dnrepo3-dnpkg3");
        assert_eq!(package_variant_name(&key), "my-pvs-dnrepo3-dnpkg3");
        // the reference's own example of a long key
        let long = package_variant_key(
            "my-pvs",
            &downstream(
                "dnrepo4",
                "supersupersuperloooooooooooooooooooooooooooooooooooooooooooooooooongpkgname",
            ),
        );
        assert_eq!(
            package_variant_name(&long),
            "my-pvs-dnrepo4-supersupersuperlooooooooooooooooooooooo-bec36506"
        );
        // 63 characters is still a name
        let edge = "a".repeat(63);
        assert_eq!(package_variant_name(&edge), edge);
        assert_eq!(package_variant_name(&"a".repeat(64)).len(), 63);
    }

    #[test]
    fn variant_names_are_labels_where_the_reference_gave_bad_ones() {
        let nested = package_variant_key("my-pvs", &downstream("edge", "net/basens"));
        let flat = package_variant_key("my-pvs", &downstream("edge", "net-basens"));
        let dotted = package_variant_key("my.pvs", &downstream("edge", "basens"));
        let names: Vec<String> = [&nested, &flat, &dotted]
            .into_iter()
            .map(|key| package_variant_name(key))
            .collect();
        for name in &names {
            assert!(crate::naming::is_dns1123_label(name), "{name}");
        }
        assert_eq!(names[1], "my-pvs-edge-net-basens");
        assert!(
            names[0].starts_with("my-pvs-edge-net-basens-"),
            "{}",
            names[0]
        );
        assert_ne!(names[0], names[1], "the hash keeps them apart");
        assert!(names[2].starts_with("my-pvs-edge-basens-"), "{}", names[2]);
        // the same key always gives the same name
        assert_eq!(package_variant_name(&nested), names[0]);
    }
}
