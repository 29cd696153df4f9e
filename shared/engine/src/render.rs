//! The render handler (spec §5): render a draft's package, write it back to
//! the draft branch when it changed (or when the pipeline failed and the
//! revision asks for `porch.kpt.dev/push-on-render-failure`), and report
//! `Rendered`, `Ready` and the Kptfile's conditions in the status.
//!
//! Idempotent: a repeated render reads back what the first one wrote, finds
//! nothing to change, and gives the same Outcome.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use porch_api::common::PackageCondition;
use porch_api::invocation::{Invocation, Operation, Outcome};
use porch_api::kptfile::Kptfile;
use porch_api::planner::{self, READY_CONDITION, RENDERED_CONDITION};
use porch_api::{PUSH_ON_RENDER_FAILURE_ANNOTATION, RENDER_REQUEST_ANNOTATION};
use porch_git::mirror::Mirror;
use porch_git::operations::Actor;
use porch_git::remote::Remote;
use porch_git::repo::GitRepo;
use porch_krm::render::{RenderOptions, render as render_package};
use porch_krm::runtime::FunctionRuntime;

use crate::HandlerError;
use crate::repository::layout;
use crate::status::{set_condition, status_patch};

/// What the render handler needs besides the Invocation.
#[derive(Debug, Clone)]
pub struct RenderContext {
    pub functions: Arc<dyn FunctionRuntime>,
    pub options: RenderOptions,
    /// The time written on changed conditions and commits.
    pub now: Time,
}

/// Renders of a draft that moves while it renders, before the handler
/// gives up (retryable: the relay delivers it again).
const MAX_RENDER_ROUNDS: u32 = 5;

/// Renders the draft of the Invocation's PackageRevision.
///
/// # Errors
/// A malformed Invocation (not retryable); git failures (retryable).
pub async fn render<R: Remote + 'static>(
    invocation: &Invocation,
    mirror: &Mirror<R>,
    context: &RenderContext,
) -> Result<Outcome, HandlerError> {
    let pr = crate::revision_of(invocation, Operation::Render)?;
    if !planner::is_due(Operation::Render, pr, &invocation.repository) {
        return Ok(Outcome::none());
    }
    let (package, workspace) = (pr.spec.package_name.clone(), pr.spec.workspace_name.clone());
    let layout = layout(invocation);
    let draft = layout
        .draft_ref(&package, &workspace)
        .map_err(|e| HandlerError::Invalid(e.to_string()))?;

    // Render the draft as the remote has it now, and write the result only
    // onto the commit it was rendered from: a push that lands meanwhile is
    // rendered on the next round, never overwritten by an older render.
    let annotations = pr.metadata.annotations.clone().unwrap_or_default();
    let push_anyway = annotations
        .get(PUSH_ON_RENDER_FAILURE_ANNOTATION)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let full_path = layout.full_path(&package);
    let mut rounds = 0;
    let (rendered, files) = loop {
        rounds += 1;
        mirror.fetch().await?;
        let path = mirror.path().to_owned();
        let (draft, full_path) = (draft.clone(), full_path.clone());
        let (head, files) = tokio::task::spawn_blocking(move || -> Result<_, HandlerError> {
            let repo = GitRepo::open(&path)?;
            let head = repo.ref_id(&draft)?.ok_or_else(|| {
                HandlerError::Invalid(format!("the draft {draft} does not exist in git"))
            })?;
            Ok((head.to_string(), repo.read_files(head, &full_path)?))
        })
        .await
        .map_err(|e| HandlerError::Internal(e.to_string()))??;

        let functions = Arc::clone(&context.functions);
        let options = context.options.clone();
        let input = files.clone();
        let rendered = tokio::task::spawn_blocking(move || {
            render_package(&input, functions.as_ref(), &options)
        })
        .await
        .map_err(|e| HandlerError::Internal(e.to_string()))?;
        if !(rendered.rendered && rendered.files != files && (rendered.is_success() || push_anyway))
        {
            break (rendered, files);
        }
        let actor = Actor {
            uid: pr.metadata.uid.clone().unwrap_or_default(),
            generation: pr.metadata.generation.unwrap_or(0),
            author: porch_git::identity::orchestrator(),
            time: context.now.0.as_second(),
        };
        let written = crate::content::replace_rendered(
            mirror,
            layout.clone(),
            package.clone(),
            workspace.clone(),
            rendered.files.clone(),
            actor,
            head,
        )
        .await?;
        if written.is_some() {
            break (rendered, files);
        }
        if rounds >= MAX_RENDER_ROUNDS {
            return Err(HandlerError::Internal(format!(
                "the draft {package}/{workspace} moved during each of {rounds} renders"
            )));
        }
    };

    // The status: Rendered, Ready, what was observed, the Kptfile conditions.
    let mut status = pr.status.clone().unwrap_or_default();
    let generation = pr.metadata.generation;
    let now = &context.now;
    match &rendered.error {
        None => set_condition(
            &mut status.conditions,
            RENDERED_CONDITION,
            "True",
            "Rendered",
            "",
            generation,
            now,
        ),
        Some(error) => {
            let message = error.to_string();
            set_condition(
                &mut status.conditions,
                RENDERED_CONDITION,
                "False",
                "RenderFailed",
                &message,
                generation,
                now,
            );
            set_condition(
                &mut status.conditions,
                READY_CONDITION,
                "False",
                "RenderFailed",
                "render failed",
                generation,
                now,
            );
        }
    }
    if let Some(requested) = annotations.get(RENDER_REQUEST_ANNOTATION) {
        status.observed_prr_resource_version = requested.clone();
    }
    status.rendering_prr_resource_version.clear();
    let kept = if rendered.is_success() || push_anyway {
        &rendered.files
    } else {
        &files
    };
    if let Some(conditions) = kptfile_conditions(kept) {
        status.package_conditions = conditions;
    }
    Ok(Outcome {
        patches: vec![status_patch(pr, status)],
        ..Outcome::default()
    })
}

/// The root Kptfile's `status.conditions`, if it has any.
fn kptfile_conditions(files: &porch_krm::package::Files) -> Option<Vec<PackageCondition>> {
    let text = std::str::from_utf8(files.get("Kptfile")?).ok()?;
    let kptfile = Kptfile::from_yaml(text).ok()?;
    let conditions = kptfile.status?.conditions;
    (!conditions.is_empty()).then_some(conditions)
}
