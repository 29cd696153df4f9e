//! Who may approve: a SubjectAccessReview against the Kubernetes API.

use crate::config::ApprovalPolicy;
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use std::future::Future;
use std::pin::Pin;

/// Longest wait for a SubjectAccessReview.
pub const SAR_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1500);

/// The answer to "may this user approve this revision?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    Denied { reason: String },
}

/// The question asked of an [`Authorizer`].
#[derive(Debug, Clone)]
pub struct ApprovalRequest<'a> {
    pub user: &'a UserInfo,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// Why the right could not be checked; the webhook denies with this message.
#[derive(Debug, thiserror::Error)]
pub enum AuthzError {
    #[error("failed to create SubjectAccessReview")]
    Kube(#[source] kube::Error),
    #[error("no Kubernetes client is configured: {0}")]
    NoClient(String),
    #[error("the SubjectAccessReview took longer than {0:?}")]
    Timeout(std::time::Duration),
}

/// A boxed future, so authorizers can live behind `dyn`.
pub type AuthzFuture<'a> = Pin<Box<dyn Future<Output = Result<Decision, AuthzError>> + Send + 'a>>;

/// Decides whether a user may approve.
pub trait Authorizer: Send + Sync + std::fmt::Debug {
    /// Checks the approval right of `request.user`.
    fn can_approve<'a>(&'a self, request: ApprovalRequest<'a>) -> AuthzFuture<'a>;
}

/// Asks the apiserver with a SubjectAccessReview.
#[derive(Clone)]
pub struct SubjectAccessReviewAuthorizer {
    client: kube::Client,
    policy: ApprovalPolicy,
}

impl std::fmt::Debug for SubjectAccessReviewAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectAccessReviewAuthorizer")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl SubjectAccessReviewAuthorizer {
    pub fn new(client: kube::Client, policy: ApprovalPolicy) -> Self {
        Self { client, policy }
    }

    /// The review sent for a request: the user's name, uid, groups and extra,
    /// and the configured verb on the revision.
    pub fn review(&self, request: &ApprovalRequest<'_>) -> SubjectAccessReview {
        SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: request.user.username.clone(),
                uid: request.user.uid.clone(),
                groups: request.user.groups.clone(),
                extra: request.user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(self.policy.group.clone()),
                    resource: Some(self.policy.resource.clone()),
                    verb: Some(self.policy.verb.clone()),
                    namespace: Some(request.namespace.to_owned()),
                    name: Some(request.name.to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        }
    }
}

impl Authorizer for SubjectAccessReviewAuthorizer {
    fn can_approve<'a>(&'a self, request: ApprovalRequest<'a>) -> AuthzFuture<'a> {
        Box::pin(async move {
            let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
            // the apiserver gives the whole webhook 2 s: answer within them
            let answer = tokio::time::timeout(
                SAR_TIMEOUT,
                api.create(&PostParams::default(), &self.review(&request)),
            )
            .await
            .map_err(|_| AuthzError::Timeout(SAR_TIMEOUT))?
            .map_err(AuthzError::Kube)?;
            let status = answer.status.unwrap_or_default();
            if status.allowed && status.denied != Some(true) {
                return Ok(Decision::Allowed);
            }
            let mut reason = format!(
                "user {:?} may not {} {}.{} in namespace {:?}",
                request.user.username.as_deref().unwrap_or(""),
                self.policy.verb,
                self.policy.resource,
                self.policy.group,
                request.namespace
            );
            if let Some(why) = status.reason.filter(|r| !r.is_empty()) {
                reason.push_str(": ");
                reason.push_str(&why);
            }
            Ok(Decision::Denied { reason })
        })
    }
}

/// A fixed answer: for local runs with no cluster and for tests.
#[derive(Debug, Clone)]
pub enum StaticAuthorizer {
    AllowAll,
    DenyAll,
    /// No client could be built; every check fails with this message.
    Unavailable(String),
}

impl Authorizer for StaticAuthorizer {
    fn can_approve<'a>(&'a self, _request: ApprovalRequest<'a>) -> AuthzFuture<'a> {
        Box::pin(async move {
            match self {
                StaticAuthorizer::AllowAll => Ok(Decision::Allowed),
                StaticAuthorizer::DenyAll => Ok(Decision::Denied {
                    reason: "approvals are disabled on this webhook".to_owned(),
                }),
                StaticAuthorizer::Unavailable(why) => Err(AuthzError::NoClient(why.clone())),
            }
        })
    }
}
