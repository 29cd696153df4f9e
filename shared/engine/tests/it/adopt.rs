//! The adopt handler.

use porch_api::invocation::Outcome;
use porch_engine::adopt::adopt;
use pretty_assertions::assert_eq;

use crate::support::invocation;

#[test]
fn missing_finalizer_and_owner_are_added_once() -> anyhow::Result<()> {
    let mut inv = invocation("adopt", serde_json::json!({}));
    if let Some(pr) = inv.package_revision.as_mut() {
        pr.metadata.finalizers = Some(vec!["other/finalizer".into()]);
        pr.metadata.owner_references = None;
    }
    let outcome = adopt(&inv)?;
    let patch = serde_json::to_value(&outcome.patches[0].patch)?;
    assert_eq!(patch[0]["op"], "test");
    assert_eq!(patch[1]["path"], "/metadata/finalizers");
    assert_eq!(
        patch[1]["value"],
        serde_json::json!(["other/finalizer", "porch.kpt.dev/packagerevisions"])
    );
    assert_eq!(patch[2]["path"], "/metadata/ownerReferences");
    assert_eq!(patch[2]["value"][0]["uid"], "repo-uid");

    // Already adopted (the support invocation is): nothing to do.
    assert_eq!(
        adopt(&invocation("adopt", serde_json::json!({})))?,
        Outcome::none()
    );
    Ok(())
}
