//! Who authors and commits (spec §4.2).
//!
//! The author is the Repository's `spec.git.author`/`email` when either is
//! set (one alone serves as both), else the user the operation acts for,
//! else the orchestrator. The committer is always the orchestrator.

/// A git identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub email: String,
}

/// The orchestrator's own identity.
pub fn orchestrator() -> Identity {
    Identity {
        name: "Package Orchestration Service".to_owned(),
        email: "porch@kpt.dev".to_owned(),
    }
}

impl Identity {
    /// A Kubernetes user as a git identity: the username serves as both.
    pub fn of_user(username: &str) -> Self {
        Identity {
            name: username.to_owned(),
            email: username.to_owned(),
        }
    }
}

/// The author of a commit.
pub fn author(repo_author: &str, repo_email: &str, user: Option<&Identity>) -> Identity {
    match (repo_author.is_empty(), repo_email.is_empty()) {
        (false, false) => Identity {
            name: repo_author.to_owned(),
            email: repo_email.to_owned(),
        },
        (false, true) => Identity::of_user(repo_author),
        (true, false) => Identity::of_user(repo_email),
        (true, true) => user.cloned().unwrap_or_else(orchestrator),
    }
}

/// The committer of every commit.
pub fn committer() -> Identity {
    orchestrator()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn author_rules() {
        let alice = Identity::of_user("alice@example.com");
        assert_eq!(
            author("Bot", "bot@example.com", Some(&alice)),
            Identity {
                name: "Bot".into(),
                email: "bot@example.com".into()
            }
        );
        assert_eq!(author("Bot", "", Some(&alice)), Identity::of_user("Bot"));
        assert_eq!(
            author("", "bot@example.com", None),
            Identity::of_user("bot@example.com")
        );
        assert_eq!(author("", "", Some(&alice)), alice);
        assert_eq!(author("", "", None), orchestrator());
        assert_eq!(committer().email, "porch@kpt.dev");
    }
}
