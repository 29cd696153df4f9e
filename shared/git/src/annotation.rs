//! Commit messages and the `kpt:` annotation (spec §4.2).
//!
//! A draft write is `<title>\n` followed by `\n\nkpt:<json>\n`, the title
//! naming the real task (the reference writes `edit` for every v1alpha2 write:
//! spec §9 item 16). Besides Porch's keys (`package`, `workspaceName`,
//! `revision`, `task`) the annotation carries the PackageRevision `uid` and
//! `generation`, so an operation delivered twice recognises its own commit.
//! Porch ignores keys it does not know, so it still reads these commits.

use porch_api::v1alpha1::{Task, TaskType};
use serde::{Deserialize, Serialize};

/// The prefix of an annotation line.
pub const ANNOTATION_PREFIX: &str = "kpt:";
/// Message of the first commit of a branch created by the orchestrator.
pub const INITIAL_BRANCH_MESSAGE: &str = "Initial commit: Creating main branch";
/// Content of the README of such a branch.
pub const INITIAL_BRANCH_README: &str = "Created by porch";

/// The structured part of a commit message.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Annotation {
    /// Full path of the package (repository directory included).
    #[serde(rename = "package", default, skip_serializing_if = "String::is_empty")]
    pub package_path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub workspace_name: String,
    /// Decimal revision: "0" for drafts.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub revision: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<Task>,
    /// uid of the PackageRevision whose operation made the commit.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// generation of that PackageRevision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

impl Annotation {
    /// Whether the commit was made for this PackageRevision at this generation.
    pub fn made_for(&self, uid: &str, generation: i64) -> bool {
        !uid.is_empty() && self.uid == uid && self.generation == Some(generation)
    }

    /// Whether the commit belongs to this package revision.
    pub fn belongs_to(&self, package_path: &str, workspace: &str) -> bool {
        self.package_path == package_path && self.workspace_name == workspace
    }
}

/// An annotation line that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("failed to read commit annotation {line:?}")]
pub struct AnnotationError {
    pub line: String,
    #[source]
    pub source: serde_json::Error,
}

/// The title of a content write made by `task`.
pub fn title(task: Option<TaskType>) -> String {
    match task {
        Some(TaskType::Init) => "Creating new empty revision".to_owned(),
        Some(TaskType::Clone) => "Creating new revision by cloning".to_owned(),
        Some(TaskType::Edit) => "Creating new revision by copying previous revision".to_owned(),
        Some(TaskType::Upgrade) => "Upgrading revision".to_owned(),
        Some(TaskType::Render) => "Rendering package".to_owned(),
        None | Some(TaskType::Unspecified) => "Intermediate commit".to_owned(),
        Some(TaskType::Push) => "Intermediate commit: push".to_owned(),
    }
}

fn annotate(mut message: String, annotation: &Annotation) -> String {
    // a struct of strings, an optional typed task and an integer always encodes
    let json = serde_json::to_string(annotation).unwrap_or_else(|_| "{}".to_owned());
    message.push_str("\n\n");
    message.push_str(ANNOTATION_PREFIX);
    message.push_str(&json);
    message.push('\n');
    message
}

/// The message of a write to a draft: the task's title and the annotation.
pub fn draft_message(annotation: &Annotation) -> String {
    let task = annotation.task.as_ref().map(|t| t.type_);
    annotate(format!("{}\n", title(task)), annotation)
}

/// The message of the approval merge commit on the branch.
pub fn approval_message(annotation: &Annotation) -> String {
    annotate(
        format!(
            "Approving package revision {}/{}",
            annotation.package_path, annotation.revision
        ),
        annotation,
    )
}

/// The message of a commit removing a package from the branch.
pub fn delete_message(package_path: &str) -> String {
    format!("Delete {package_path}")
}

/// Every annotation in a message, and the lines that looked like one but
/// did not decode (the reference collects both the same way).
pub fn parse_annotations(message: &str) -> (Vec<Annotation>, Vec<AnnotationError>) {
    let mut found = Vec::new();
    let mut errors = Vec::new();
    for line in message.lines() {
        let line = line.trim();
        if let Some(json) = line.strip_prefix(ANNOTATION_PREFIX) {
            match serde_json::from_str(json) {
                Ok(a) => found.push(a),
                Err(source) => errors.push(AnnotationError {
                    line: line.chars().take(200).collect(),
                    source,
                }),
            }
        }
    }
    (found, errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use porch_api::v1alpha1::InitTaskSpec;
    use pretty_assertions::assert_eq;

    fn draft(task: Option<Task>) -> Annotation {
        Annotation {
            package_path: "blueprints/basens".into(),
            workspace_name: "ws1".into(),
            revision: "0".into(),
            task,
            uid: "8d0f4a4e".into(),
            generation: Some(2),
        }
    }

    #[test]
    fn draft_messages_name_the_real_task() {
        let init = Task {
            type_: TaskType::Init,
            init: Some(InitTaskSpec {
                description: "basens description".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            draft_message(&draft(Some(init))),
            "Creating new empty revision\n\n\nkpt:{\"package\":\"blueprints/basens\",\"workspaceName\":\"ws1\",\"revision\":\"0\",\"task\":{\"type\":\"init\",\"init\":{\"description\":\"basens description\"}},\"uid\":\"8d0f4a4e\",\"generation\":2}\n"
        );
        let titles = [
            (TaskType::Clone, "Creating new revision by cloning"),
            (
                TaskType::Edit,
                "Creating new revision by copying previous revision",
            ),
            (TaskType::Upgrade, "Upgrading revision"),
            (TaskType::Render, "Rendering package"),
            (TaskType::Unspecified, "Intermediate commit"),
            (TaskType::Push, "Intermediate commit: push"),
        ];
        for (task, want) in titles {
            assert_eq!(title(Some(task)), want);
        }
        assert_eq!(title(None), "Intermediate commit");
    }

    #[test]
    fn approval_and_delete_messages() {
        let a = Annotation {
            package_path: "net/basens".into(),
            workspace_name: "ws1".into(),
            revision: "3".into(),
            ..Default::default()
        };
        assert_eq!(
            approval_message(&a),
            "Approving package revision net/basens/3\n\nkpt:{\"package\":\"net/basens\",\"workspaceName\":\"ws1\",\"revision\":\"3\"}\n"
        );
        assert_eq!(delete_message("net/basens"), "Delete net/basens");
    }

    #[test]
    fn annotations_round_trip_and_porch_ones_read() {
        let original = draft(Some(Task {
            type_: TaskType::Render,
            ..Default::default()
        }));
        let (found, errors) = parse_annotations(&draft_message(&original));
        assert!(errors.is_empty());
        assert_eq!(found, vec![original.clone()]);
        assert!(found[0].made_for("8d0f4a4e", 2));
        assert!(!found[0].made_for("8d0f4a4e", 3));
        assert!(!found[0].made_for("", 2));
        assert!(found[0].belongs_to("blueprints/basens", "ws1"));

        // a commit written by the reference: no uid, no generation
        let porch = "Creating new revision by copying previous revision\n\nkpt:{\"package\":\"basens\",\"workspaceName\":\"ws\",\"revision\":\"0\",\"task\":{\"type\":\"edit\"}}\n";
        let (found, _) = parse_annotations(porch);
        assert_eq!(
            found[0].task.as_ref().map(|t| t.type_),
            Some(TaskType::Edit)
        );
        assert_eq!(found[0].generation, None);
    }

    #[test]
    fn bad_annotations_are_reported_not_fatal() {
        let message = "title\n\nkpt:{\"package\":\"a\"}\nkpt:{broken\n  kpt:[1,2]\nnot kpt: {}\n";
        let (found, errors) = parse_annotations(message);
        assert_eq!(found.len(), 1);
        assert_eq!(errors.len(), 2);
        assert!(
            errors[0].to_string().contains("kpt:{broken"),
            "{}",
            errors[0]
        );
    }
}
