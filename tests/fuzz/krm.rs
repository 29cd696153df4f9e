//! Kptfiles, ResourceLists and packages: what parses writes back and parses
//! again to the same thing.

use porch_api::kptfile::Kptfile;
use porch_krm::package::{self, Files};
use porch_krm::resource::{Origin, Resource};
use porch_krm::resourcelist;
use porch_krm::yaml::{self, Node};

/// A Kptfile that decodes encodes, and decodes again to the same value.
pub fn kptfile(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(kptfile) = Kptfile::from_yaml(text) else {
        return;
    };
    let written = serde_saphyr::to_string(&kptfile)
        .unwrap_or_else(|e| panic!("a decoded Kptfile does not encode: {e}"));
    let again = Kptfile::from_yaml(&written)
        .unwrap_or_else(|e| panic!("an encoded Kptfile does not decode ({e}):\n{written}"));
    assert_eq!(
        again, kptfile,
        "the Kptfile changed on a round trip:\n{written}"
    );
}

/// An object as JSON without kpt's wire annotations, or `None` when it has
/// no JSON form (aliases, non-scalar keys). A null `metadata` or
/// `metadata.annotations` counts as absent, as it does for Kubernetes.
fn plain(object: &Node) -> Option<serde_json::Value> {
    let mut object = object.clone();
    if object.get("metadata").is_some_and(Node::is_null) {
        object.remove("metadata");
    }
    if let Some(metadata) = object.get_mut("metadata")
        && metadata.get("annotations").is_some_and(Node::is_null)
    {
        metadata.remove("annotations");
    }
    resourcelist::strip_wire_annotations(&mut object);
    package::tidy_metadata(&mut object);
    yaml::to_json(&object).ok()
}

/// A ResourceList that decodes encodes, and decodes again to the same items
/// and function config.
pub fn resourcelist(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(decoded) = resourcelist::decode(text) else {
        return;
    };
    let resources: Vec<Resource> = decoded
        .items
        .iter()
        .map(|item| Resource::new(item.clone(), Origin::default()))
        .collect();
    let written = resourcelist::encode(&resources, decoded.function_config.as_ref());
    let again = resourcelist::decode(&written)
        .unwrap_or_else(|e| panic!("an encoded ResourceList does not decode ({e}):\n{written}"));
    assert_eq!(again.items.len(), decoded.items.len(), "{written}");
    assert_eq!(
        again.function_config.is_some(),
        decoded.function_config.is_some(),
        "{written}"
    );
    for (i, (before, after)) in decoded.items.iter().zip(&again.items).enumerate() {
        if let Some(before_json) = plain(before) {
            assert_eq!(
                plain(after).as_ref(),
                Some(&before_json),
                "item {i} changed on a round trip:\n{written}"
            );
        }
    }
}

/// Reads a package given as a txtar-like archive: `-- <path> --` lines start
/// each file; text before the first one is a comment.
fn archive(data: &[u8]) -> Files {
    let mut files = Files::new();
    let mut current: Option<String> = None;
    for line in data.split_inclusive(|b| *b == b'\n') {
        let header = std::str::from_utf8(line)
            .ok()
            .map(|l| l.trim_end_matches('\n'))
            .and_then(|l| l.strip_prefix("-- "))
            .and_then(|l| l.strip_suffix(" --"));
        if let Some(name) = header {
            files.entry(name.to_owned()).or_default();
            current = Some(name.to_owned());
        } else if let Some(name) = &current {
            files
                .entry(name.clone())
                .or_default()
                .extend_from_slice(line);
        }
    }
    files
}

/// Splits a package into resources and joins them back: what was read writes
/// back, what was written reads to the same resources in the same places,
/// and writing again changes nothing.
pub fn package_split_join(data: &[u8]) {
    let files = archive(data);
    let Ok(read) = package::read_resources(&files) else {
        return;
    };
    let Ok(written) =
        package::write_resources(&files, read.clone(), &package::resource_files(&read))
    else {
        return;
    };
    let reread = package::read_resources(&written)
        .unwrap_or_else(|e| panic!("a written package does not read back: {e}"));
    assert_eq!(reread.len(), read.len(), "resources lost or gained");
    for (before, after) in read.iter().zip(&reread) {
        assert_eq!(before.origin.package, after.origin.package);
        assert_eq!(before.origin.path, after.origin.path);
        assert_eq!(before.origin.index, after.origin.index);
        if let Some(before_json) = plain(&before.object) {
            assert_eq!(
                plain(&after.object).as_ref(),
                Some(&before_json),
                "{} changed on a round trip",
                before.origin.root_path()
            );
        }
    }
    let rewritten =
        package::write_resources(&written, reread.clone(), &package::resource_files(&reread))
            .unwrap_or_else(|e| panic!("a written package does not write again: {e}"));
    assert!(rewritten == written, "writing a package twice changed it");
}
