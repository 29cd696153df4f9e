//! `/validate` for PackageVariant (`config.porch.kpt.dev/v1alpha1`) and
//! PackageVariantSet (`config.porch.kpt.dev/v1alpha2`). The object is decoded
//! strictly and its spec checked by [`porch_api::variant`] (packagevariants
//! spec §1.4, §3.3), so what the reference's controllers would only mark
//! `Stalled` is refused when it is written, with the same message.
//!
//! On update only a changed spec is checked: an object stored before a rule
//! existed can still get and lose finalizers, labels and annotations, so its
//! deletion never hangs on admission.

use super::Verdict;
use crate::decode::decode_raw;
use crate::review::AdmissionInput;
use kube::Resource;
use kube::core::admission::Operation;
use kube::core::object::HasSpec;
use porch_api::variant::{
    PackageVariant, PackageVariantSet, ValidationErrors, validate_package_variant_name,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Decides a PackageVariant request.
pub fn package_variant(input: &AdmissionInput<'_>) -> Verdict {
    decide(input, "PackageVariant", |new: &PackageVariant, create| {
        let mut errors = new.spec.validate().err().map(|e| e.0).unwrap_or_default();
        if create
            && let Some(name) = new.metadata.name.as_deref()
            && let Err(e) = validate_package_variant_name(name)
        {
            errors.push(e);
        }
        errors
    })
}

/// Decides a PackageVariantSet request.
pub fn package_variant_set(input: &AdmissionInput<'_>) -> Verdict {
    decide(input, "PackageVariantSet", |new: &PackageVariantSet, _| {
        new.spec.validate().err().map(|e| e.0).unwrap_or_default()
    })
}

/// `apiVersion` and `kind` of an object, which the typed decode skips.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeHead {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
}

/// Decodes the request's object strictly and its stored object leniently
/// (the apiserver pruned it), then asks `check` for the problems of the new
/// object (`true` on create). `what` is the kind, for messages.
fn decide<R>(
    input: &AdmissionInput<'_>,
    what: &'static str,
    check: impl FnOnce(&R, bool) -> Vec<String>,
) -> Verdict
where
    R: Resource<DynamicType = ()> + HasSpec + DeserializeOwned,
    R::Spec: PartialEq,
{
    if input.sub_resource.is_some()
        || matches!(input.operation, Operation::Delete | Operation::Connect)
    {
        return Verdict::Allow;
    }
    let Some(raw) = input.object else {
        return Verdict::Deny("the request has no object".to_owned());
    };
    let head: TypeHead = match serde_json::from_str(raw.get()) {
        Ok(head) => head,
        Err(e) => return Verdict::Deny(format!("invalid {what}: {e}")),
    };
    let api_version = R::api_version(&());
    if head.api_version != api_version || head.kind != what {
        return Verdict::Deny(format!(
            "the object is {:?} {:?}, but the request is for {api_version} {what}",
            head.api_version, head.kind
        ));
    }
    let new: R = match decode_raw(raw, what) {
        Ok(new) => new,
        Err(e) => return e.into(),
    };
    let create = match input.operation {
        Operation::Update => {
            let Some(raw_old) = input.old_object else {
                return Verdict::Deny("the request has no oldObject".to_owned());
            };
            // an old object that no longer decodes is treated as changed
            if serde_json::from_str::<R>(raw_old.get()).is_ok_and(|old| old.spec() == new.spec()) {
                return Verdict::Allow;
            }
            false
        }
        _ => true,
    };
    let errors = check(&new, create);
    if errors.is_empty() {
        Verdict::Allow
    } else {
        Verdict::Deny(ValidationErrors(errors).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::parse;
    use serde_json::{Value, json};

    fn body(operation: &str, object: Value, old: Value, sub_resource: Option<&str>) -> Vec<u8> {
        let gvk = json!({"group": "config.porch.kpt.dev", "version": "v1alpha1", "kind": "PackageVariant"});
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u1",
                "kind": gvk,
                "resource": {"group": "config.porch.kpt.dev", "version": "v1alpha1", "resource": "packagevariants"},
                "subResource": sub_resource,
                "name": "pv",
                "namespace": "ns",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": object,
                "oldObject": old,
            }
        }))
        .expect("json")
    }

    fn variant(spec: Value) -> Value {
        json!({
            "apiVersion": "config.porch.kpt.dev/v1alpha1",
            "kind": "PackageVariant",
            "metadata": {"name": "pv", "namespace": "ns"},
            "spec": spec,
        })
    }

    fn decide_on(body: &[u8]) -> Verdict {
        package_variant(&parse(body).expect("a review"))
    }

    #[test]
    fn only_changed_specs_are_checked_on_update() {
        let invalid = variant(json!({"upstream": {}}));
        assert_eq!(
            decide_on(&body("UPDATE", invalid.clone(), invalid.clone(), None)),
            Verdict::Allow
        );
        // an old object that does not decode counts as changed
        let legacy = variant(json!({"upstream": {"revision": "v3"}}));
        assert_eq!(
            decide_on(&body("UPDATE", invalid.clone(), legacy, None)),
            Verdict::Deny(
                "missing required field spec.upstream.repo; missing required field spec.upstream.package; missing required field spec.downstream"
                    .into()
            )
        );
        assert_eq!(
            decide_on(&body("UPDATE", invalid.clone(), Value::Null, None)),
            Verdict::Deny("the request has no oldObject".into())
        );
    }

    #[test]
    fn subresources_and_deletes_pass() {
        let invalid = variant(json!({}));
        for (operation, sub) in [("UPDATE", Some("status")), ("DELETE", None)] {
            assert_eq!(
                decide_on(&body(operation, invalid.clone(), invalid.clone(), sub)),
                Verdict::Allow,
                "{operation}"
            );
        }
        assert_eq!(
            decide_on(&body("CREATE", Value::Null, Value::Null, None)),
            Verdict::Deny("the request has no object".into())
        );
    }

    #[test]
    fn the_object_must_be_the_requested_kind() {
        let mut other = variant(json!({}));
        other["kind"] = json!("PackageVariantSet");
        let Verdict::Deny(message) = decide_on(&body("CREATE", other, Value::Null, None)) else {
            panic!("allowed");
        };
        assert!(
            message.starts_with(
                r#"the object is "config.porch.kpt.dev/v1alpha1" "PackageVariantSet""#
            ),
            "{message}"
        );
    }
}
