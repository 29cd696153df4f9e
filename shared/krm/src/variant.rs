//! placeholder until the mutations land
use crate::package::Files;
#[derive(Debug)]
pub struct Mutated {
    pub files: Files,
    pub changed: bool,
}
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct VariantError(pub String);
pub fn mutate_package(
    _pv: &str,
    _spec: &porch_api::variant::PackageVariantSpec,
    files: &Files,
    _cluster: &[serde_json::Value],
) -> Result<Mutated, VariantError> {
    Ok(Mutated {
        files: files.clone(),
        changed: false,
    })
}
