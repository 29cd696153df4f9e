//! Settings of the webhook router, shared by every host.

/// Default request body limit: 3 MiB, the apiserver's own default for webhooks.
pub const DEFAULT_MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Identity a controller acts as; such users may create revisions without a
/// source, seed any lifecycle on create, and manage the latest-revision label.
pub const DEFAULT_CONTROLLER_USER: &str = "system:serviceaccount:porch-system:porch-relay";

/// Kubernetes' garbage collector: it deletes the revisions of a deleted
/// Repository, Published ones included.
pub const GARBAGE_COLLECTOR_USER: &str =
    "system:serviceaccount:kube-system:generic-garbage-collector";

/// Default number of requests handled at once; more wait. With the 3 MiB body
/// limit this bounds buffered bodies to about 100 MiB.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

/// What the router needs to decide.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Bodies larger than this get HTTP 413.
    pub max_body_bytes: usize,
    /// Requests handled at once; the rest wait their turn.
    pub max_in_flight: usize,
    /// Users (exact usernames) treated as controllers.
    pub controller_users: Vec<String>,
    /// Users besides the controllers that may delete Published revisions.
    pub delete_published_users: Vec<String>,
    /// How approvals are authorised.
    pub approval: ApprovalPolicy,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            controller_users: vec![DEFAULT_CONTROLLER_USER.to_owned()],
            delete_published_users: vec![GARBAGE_COLLECTOR_USER.to_owned()],
            approval: ApprovalPolicy::default(),
        }
    }
}

impl WebhookConfig {
    /// Whether `username` is one of the controllers.
    pub fn is_controller(&self, username: Option<&str>) -> bool {
        username.is_some_and(|u| self.controller_users.iter().any(|c| c == u))
    }

    /// Whether `username` may delete a Published revision outright.
    pub fn may_delete_published(&self, username: Option<&str>) -> bool {
        self.is_controller(username)
            || username.is_some_and(|u| self.delete_published_users.iter().any(|c| c == u))
    }
}

/// The SubjectAccessReview that approving (Proposed → Published) requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalPolicy {
    pub verb: String,
    pub group: String,
    pub resource: String,
    /// Deny approval by the user who proposed the revision.
    pub deny_self_approval: bool,
}

impl Default for ApprovalPolicy {
    fn default() -> Self {
        Self {
            verb: "approve".to_owned(),
            group: porch_api::GROUP.to_owned(),
            resource: "packagerevisions".to_owned(),
            deny_self_approval: false,
        }
    }
}

/// Command-line and environment settings shared by the HTTPS and Lambda hosts.
#[derive(clap::Parser, Debug, Clone)]
pub struct WebhookArgs {
    /// Largest request body accepted, in bytes (larger gets HTTP 413).
    #[arg(long, env = "PORCH_WEBHOOKS_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Requests handled at once; more wait their turn.
    #[arg(long, env = "PORCH_WEBHOOKS_MAX_IN_FLIGHT", default_value_t = DEFAULT_MAX_IN_FLIGHT, value_parser = parse_in_flight)]
    pub max_in_flight: usize,
    /// Usernames of controllers (comma-separated), allowed to create
    /// revisions without a source and to manage the latest-revision label.
    #[arg(long, env = "PORCH_WEBHOOKS_CONTROLLER_USERS", value_delimiter = ',', default_value = DEFAULT_CONTROLLER_USER)]
    pub controller_users: Vec<String>,
    /// Users besides the controllers that may delete Published revisions
    /// (comma-separated; the garbage collector, so deleting a Repository
    /// removes its revisions).
    #[arg(long, env = "PORCH_WEBHOOKS_DELETE_PUBLISHED_USERS", value_delimiter = ',', default_value = GARBAGE_COLLECTOR_USER)]
    pub delete_published_users: Vec<String>,
    /// How approvals are checked: a SubjectAccessReview (needs a cluster),
    /// or a fixed answer for local runs.
    #[arg(
        long,
        env = "PORCH_WEBHOOKS_APPROVAL_CHECK",
        value_enum,
        default_value = "subject-access-review"
    )]
    pub approval_check: ApprovalCheck,
    /// Verb the SubjectAccessReview asks for.
    #[arg(long, env = "PORCH_WEBHOOKS_APPROVE_VERB", default_value = "approve")]
    pub approve_verb: String,
    /// API group of the SubjectAccessReview resource.
    #[arg(long, env = "PORCH_WEBHOOKS_APPROVE_GROUP", default_value = porch_api::GROUP)]
    pub approve_group: String,
    /// Resource of the SubjectAccessReview.
    #[arg(
        long,
        env = "PORCH_WEBHOOKS_APPROVE_RESOURCE",
        default_value = "packagerevisions"
    )]
    pub approve_resource: String,
    /// Deny approval by the user who proposed the revision.
    #[arg(long, env = "PORCH_WEBHOOKS_DENY_SELF_APPROVAL")]
    pub deny_self_approval: bool,
}

/// How the approval right is checked.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalCheck {
    SubjectAccessReview,
    AllowAll,
    DenyAll,
}

impl WebhookArgs {
    /// The router settings and the authorizer. Without a reachable cluster
    /// configuration, SubjectAccessReview checks fail closed with the reason.
    pub async fn build(&self) -> (WebhookConfig, std::sync::Arc<dyn crate::authz::Authorizer>) {
        use crate::authz::{StaticAuthorizer, SubjectAccessReviewAuthorizer};
        let config = WebhookConfig {
            max_body_bytes: self.max_body_bytes,
            max_in_flight: self.max_in_flight,
            controller_users: self.controller_users.clone(),
            delete_published_users: self.delete_published_users.clone(),
            approval: ApprovalPolicy {
                verb: self.approve_verb.clone(),
                group: self.approve_group.clone(),
                resource: self.approve_resource.clone(),
                deny_self_approval: self.deny_self_approval,
            },
        };
        let authorizer: std::sync::Arc<dyn crate::authz::Authorizer> = match self.approval_check {
            ApprovalCheck::AllowAll => std::sync::Arc::new(StaticAuthorizer::AllowAll),
            ApprovalCheck::DenyAll => std::sync::Arc::new(StaticAuthorizer::DenyAll),
            ApprovalCheck::SubjectAccessReview => match kube::Client::try_default().await {
                Ok(client) => std::sync::Arc::new(SubjectAccessReviewAuthorizer::new(
                    client,
                    config.approval.clone(),
                )),
                Err(e) => {
                    tracing::warn!(error = %e, "no Kubernetes client: approvals will be denied");
                    std::sync::Arc::new(StaticAuthorizer::Unavailable(e.to_string()))
                }
            },
        };
        (config, authorizer)
    }
}

fn parse_in_flight(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=4096).contains(&n) => Ok(n),
        _ => Err(format!("{text:?} is not a number from 1 to 4096")),
    }
}
