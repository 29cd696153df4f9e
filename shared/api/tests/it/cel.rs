//! The CEL rules in the generated CRDs, evaluated client-side with the same
//! schema the apiserver gets (kube's `cel` feature): they parse, and they
//! accept and refuse what they should.

use kube::core::cel::{validate_cel, validate_cel_update};
use porch_api::common::{NameRef, RepositoryType};
use porch_api::repository::{GitRepository, Repository, RepositorySpec};
use porch_api::v1alpha2::{InitSpec, PackageRevision, PackageRevisionSpec, PackageSource};

fn revision(source: PackageSource) -> PackageRevision {
    PackageRevision::new(
        "blueprints.basens.ws",
        PackageRevisionSpec {
            package_name: "basens".into(),
            repository: "blueprints".into(),
            workspace_name: "ws".into(),
            source: Some(source),
            ..Default::default()
        },
    )
}

#[test]
fn exactly_one_source() {
    let init = || Some(InitSpec::default());
    validate_cel(&revision(PackageSource {
        init: init(),
        ..Default::default()
    }))
    .expect("one member");
    validate_cel(&revision(PackageSource {
        copy_from: Some(NameRef {
            name: "blueprints.basens.v1".into(),
        }),
        ..Default::default()
    }))
    .expect("one member");
    for bad in [
        PackageSource::default(),
        PackageSource {
            init: init(),
            copy_from: Some(NameRef { name: "x".into() }),
            ..Default::default()
        },
    ] {
        let err = validate_cel(&revision(bad)).expect_err("not exactly one");
        assert!(
            err.to_string()
                .contains("exactly one of init, cloneFrom, copyFrom, or upgrade must be set"),
            "{err}"
        );
    }
}

fn repository(name: &str, url: &str, branch: &str, directory: &str) -> Repository {
    Repository::new(
        name,
        RepositorySpec {
            type_: Some(RepositoryType::Git),
            git: Some(GitRepository {
                repo: url.into(),
                branch: branch.into(),
                directory: directory.into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
}

#[test]
fn repository_identity_is_immutable() {
    let old = repository("blueprints", "https://example.com/a.git", "main", "pkgs");
    validate_cel(&old).expect("valid");
    validate_cel_update(&old, &old).expect("unchanged");
    let mut described = old.clone();
    described.spec.description = "new text".into();
    validate_cel_update(&described, &old).expect("description is mutable");
    for (new, message) in [
        (
            repository("blueprints", "https://example.com/b.git", "main", "pkgs"),
            "spec.git.repo is immutable",
        ),
        (
            repository("blueprints", "https://example.com/a.git", "dev", "pkgs"),
            "spec.git.branch is immutable",
        ),
        (
            repository("blueprints", "https://example.com/a.git", "main", "other"),
            "spec.git.directory is immutable",
        ),
    ] {
        let err = validate_cel_update(&new, &old).expect_err(message);
        assert!(err.to_string().contains(message), "{err}");
    }
    let mut oci = old.clone();
    oci.spec.type_ = Some(RepositoryType::Oci);
    let err = validate_cel_update(&oci, &old).expect_err("type");
    assert!(err.to_string().contains("spec.type is immutable"), "{err}");
}

#[test]
fn repository_names_are_labels() {
    let err = validate_cel(&repository(
        "Bad_Name",
        "https://example.com/a.git",
        "main",
        "",
    ))
    .expect_err("not a label");
    assert!(err.to_string().contains("DNS-1123 label"), "{err}");
    let mut content = repository("ok", "https://example.com/a.git", "main", "");
    content.spec.content = Some("Function".into());
    let err = validate_cel(&content).expect_err("content");
    assert!(
        err.to_string().contains("spec.content must be Package"),
        "{err}"
    );
}
