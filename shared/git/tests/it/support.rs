//! The git CLI, isolated from user and system configuration (tests only).

use std::path::Path;
use std::process::Command;

/// `git` with no system or global configuration and a fixed identity.
pub(crate) fn git_command() -> Command {
    let mut command = Command::new("git");
    command
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "fixture")
        .env("GIT_AUTHOR_EMAIL", "fixture@example.com")
        .env("GIT_COMMITTER_NAME", "fixture")
        .env("GIT_COMMITTER_EMAIL", "fixture@example.com");
    command
}

/// Runs `command` and returns its stdout, failing the test on an error.
pub(crate) fn run(mut command: Command) -> String {
    let out = command.output().expect("git runs");
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8")
}

/// `git --git-dir <dir> <args>`.
pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let mut command = git_command();
    command.arg("--git-dir").arg(dir).args(args);
    run(command)
}
