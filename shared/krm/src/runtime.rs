//! Where functions run (spec §1.3–§1.5): builtins in-process first, then the
//! function runner over gRPC, then allow-listed executables.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::resource::Resource;
use crate::resourcelist::{self, ResultItem};
use crate::yaml::Node;

/// The default registry prefix for short image names, as Porch uses it.
pub const DEFAULT_IMAGE_PREFIX: &str = "ghcr.io/kptdev/krm-functions-catalog";

/// The function a pipeline step names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FunctionRef {
    /// A normalised image name (see [`normalize_image`]).
    Image(String),
    /// A local executable path.
    Exec(String),
}

impl FunctionRef {
    pub fn display(&self) -> &str {
        match self {
            FunctionRef::Image(s) | FunctionRef::Exec(s) => s,
        }
    }
}

/// kpt/Porch image resolution: a name without `/` gets the prefix; a name
/// without tag or digest gets `:latest`.
pub fn normalize_image(image: &str, prefix: &str) -> String {
    let prefix = prefix.trim_end_matches('/');
    let mut image = if image.contains('/') || prefix.is_empty() {
        image.to_owned()
    } else {
        format!("{prefix}/{image}")
    };
    let last = image.rsplit('/').next().unwrap_or("");
    if !last.contains(':') && !image.contains('@') {
        image.push_str(":latest");
    }
    image
}

/// What a function produced.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FunctionOutput {
    pub items: Vec<Resource>,
    pub results: Vec<ResultItem>,
    pub stderr: String,
}

/// Why a function did not produce output.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum FunctionError {
    /// This runtime does not have the function: try the next one.
    #[error("function {0:?} not found")]
    NotFound(String),
    /// The function ran and failed (exit code or `success: false`); its
    /// results are kept.
    #[error("function failure{}", if .message.is_empty() { String::new() } else { format!(": {}", .message) })]
    Failed {
        message: String,
        results: Vec<ResultItem>,
        stderr: String,
        exit_code: i32,
    },
    /// The function could not be started, timed out or broke the protocol.
    #[error("{0}")]
    Runtime(String),
}

/// One function call.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    pub function: &'a FunctionRef,
    pub items: Vec<Resource>,
    pub config: Option<&'a Node>,
    /// The package whose pipeline runs (relative to the root package):
    /// objects a function returns without a package belong to it.
    pub package: &'a str,
}

/// One place functions can run.
pub trait FunctionRuntime: Send + Sync + std::fmt::Debug {
    /// Runs a function over items with an optional functionConfig.
    ///
    /// # Errors
    /// [`FunctionError::NotFound`] when this runtime does not have it.
    fn run(&self, call: Call<'_>) -> Result<FunctionOutput, FunctionError>;

    /// Whether this runtime has the function (`run` may still answer
    /// `NotFound`). Lets [`Runtimes`] pick one without copying the items.
    fn handles(&self, _function: &FunctionRef) -> bool {
        true
    }
}

/// Tries runtimes in order; the first that does not answer `NotFound` wins.
#[derive(Debug, Clone, Default)]
pub struct Runtimes {
    runtimes: Vec<Arc<dyn FunctionRuntime>>,
}

impl Runtimes {
    pub fn new() -> Self {
        Runtimes::default()
    }

    #[must_use]
    pub fn with(mut self, runtime: Arc<dyn FunctionRuntime>) -> Self {
        self.runtimes.push(runtime);
        self
    }
}

impl FunctionRuntime for Runtimes {
    fn run(&self, call: Call<'_>) -> Result<FunctionOutput, FunctionError> {
        let function = call.function;
        let candidates: Vec<&Arc<dyn FunctionRuntime>> = self
            .runtimes
            .iter()
            .filter(|r| r.handles(function))
            .collect();
        let mut pending = Some(call);
        for (i, runtime) in candidates.iter().enumerate() {
            let Some(call) = pending.take() else {
                break;
            };
            // Items are copied only when another runtime may still need them.
            if i + 1 < candidates.len() {
                pending = Some(call.clone());
            }
            match runtime.run(call) {
                Err(FunctionError::NotFound(_)) => continue,
                other => return other,
            }
        }
        Err(match function {
            FunctionRef::Exec(_) => FunctionError::Runtime(
                "must run with `--allow-exec` option to allow running function binaries".into(),
            ),
            FunctionRef::Image(image) => FunctionError::NotFound(image.clone()),
        })
    }
}

/// Limits for executables.
#[derive(Debug, Clone)]
pub struct ExecLimits {
    pub timeout: Duration,
    /// Largest stdout accepted.
    pub max_output: usize,
}

impl Default for ExecLimits {
    fn default() -> Self {
        ExecLimits {
            timeout: Duration::from_secs(60),
            max_output: 64 << 20,
        }
    }
}

/// Runs local executables that read a ResourceList on stdin and write one on
/// stdout. Only allow-listed paths run; images can be mapped to executables.
#[derive(Debug, Clone, Default)]
pub struct ExecRuntime {
    allowed: Vec<PathBuf>,
    images: Vec<(String, PathBuf, Vec<String>)>,
    limits: ExecLimits,
}

impl ExecRuntime {
    pub fn new(limits: ExecLimits) -> Self {
        ExecRuntime {
            limits,
            ..Default::default()
        }
    }

    /// Allows `exec:` functions with this path.
    #[must_use]
    pub fn allow(mut self, path: impl Into<PathBuf>) -> Self {
        self.allowed.push(path.into());
        self
    }

    /// Runs `image` with this executable and arguments.
    #[must_use]
    pub fn image(mut self, image: &str, program: impl Into<PathBuf>, args: &[&str]) -> Self {
        self.images.push((
            image.to_owned(),
            program.into(),
            args.iter().map(|s| (*s).to_owned()).collect(),
        ));
        self
    }

    fn resolve(&self, function: &FunctionRef) -> Option<(PathBuf, Vec<String>)> {
        match function {
            FunctionRef::Exec(path) => {
                let mut parts = path.split_whitespace();
                let program = PathBuf::from(parts.next()?);
                self.allowed
                    .iter()
                    .any(|a| a == &program)
                    .then(|| (program, parts.map(str::to_owned).collect()))
            }
            FunctionRef::Image(image) => self
                .images
                .iter()
                .find(|(i, _, _)| i == image)
                .map(|(_, p, a)| (p.clone(), a.clone())),
        }
    }
}

impl ExecRuntime {
    /// Runs a function on a ResourceList text as it is and returns its
    /// stdout and stderr (the function runner's pass-through). A caller's
    /// deadline shortens the timeout, so nothing runs for a caller that has
    /// given up. A caller's
    /// deadline shortens the timeout, so nothing runs for a caller that has
    /// given up.
    ///
    /// # Errors
    /// Not allowed, failed to start, timed out, non-zero exit (with results).
    pub fn run_raw(
        &self,
        function: &FunctionRef,
        input: &[u8],
        deadline: Option<Duration>,
    ) -> Result<(String, String), FunctionError> {
        let Some((program, args)) = self.resolve(function) else {
            return Err(FunctionError::NotFound(function.display().to_owned()));
        };
        let mut limits = self.limits.clone();
        if let Some(deadline) = deadline {
            limits.timeout = limits.timeout.min(deadline);
        }
        let (status, stdout, stderr) = run_process(&program, &args, input, &limits)?;
        let stderr = String::from_utf8_lossy(&stderr).into_owned();
        let stdout = String::from_utf8(stdout)
            .map_err(|_| FunctionError::Runtime("function output is not UTF-8".into()))?;
        if !status.success() {
            let results = resourcelist::decode(&stdout)
                .map(|d| d.results)
                .unwrap_or_default();
            return Err(FunctionError::Failed {
                message: String::new(),
                results,
                stderr,
                exit_code: status.code().unwrap_or(1),
            });
        }
        Ok((stdout, stderr))
    }
}

impl FunctionRuntime for ExecRuntime {
    fn handles(&self, function: &FunctionRef) -> bool {
        self.resolve(function).is_some()
    }

    fn run(&self, call: Call<'_>) -> Result<FunctionOutput, FunctionError> {
        let input = resourcelist::encode(&call.items, call.config);
        let (stdout, stderr) = self.run_raw(call.function, input.as_bytes(), None)?;
        let decoded =
            resourcelist::decode(&stdout).map_err(|e| FunctionError::Runtime(e.to_string()))?;
        crate::render::from_wire_output(&call.items, decoded, call.package, stderr)
    }
}

/// Runs a process with input, a timeout and an output cap.
fn run_process(
    program: &Path,
    args: &[String],
    input: &[u8],
    limits: &ExecLimits,
) -> Result<(std::process::ExitStatus, Vec<u8>, Vec<u8>), FunctionError> {
    let mut child = Command::new(program)
        .args(args)
        // Its own process group, so a timeout stops what it started too.
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            FunctionError::Runtime(format!("failed to start {}: {e}", program.display()))
        })?;
    let mut stdin = child.stdin.take();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        if let Some(stdin) = stdin.as_mut() {
            // A function may exit without reading everything; that is its answer.
            let _ = stdin.write_all(&input);
        }
    });
    let max = limits.max_output;
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || -> Result<Vec<u8>, String> {
        let mut buf = Vec::new();
        if let Some(out) = stdout.as_mut() {
            out.take(max as u64 + 1)
                .read_to_end(&mut buf)
                .map_err(|e| e.to_string())?;
        }
        Ok(buf)
    });
    let mut stderr = child.stderr.take();
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(err) = stderr.as_mut() {
            let _ = err.take(1 << 20).read_to_end(&mut buf);
        }
        buf
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > limits.timeout => {
                if let Ok(pid) = i32::try_from(child.id()) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                let _ = child.kill();
                let _ = child.wait();
                return Err(FunctionError::Runtime(format!(
                    "function {} timed out after {:?}",
                    program.display(),
                    limits.timeout
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(FunctionError::Runtime(format!("failed to wait: {e}"))),
        }
    };
    let _ = writer.join();
    let stdout = reader
        .join()
        .map_err(|_| FunctionError::Runtime("output reader panicked".into()))?
        .map_err(|e| FunctionError::Runtime(format!("failed to read function output: {e}")))?;
    if stdout.len() > max {
        return Err(FunctionError::Runtime(format!(
            "function output is larger than the limit of {max} bytes"
        )));
    }
    let stderr = err_reader.join().unwrap_or_default();
    Ok((status, stdout, stderr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_normalised_like_porch() {
        assert_eq!(
            normalize_image("set-namespace:v0.4", DEFAULT_IMAGE_PREFIX),
            "ghcr.io/kptdev/krm-functions-catalog/set-namespace:v0.4"
        );
        assert_eq!(
            normalize_image("set-namespace", DEFAULT_IMAGE_PREFIX),
            "ghcr.io/kptdev/krm-functions-catalog/set-namespace:latest"
        );
        assert_eq!(
            normalize_image("gcr.io/kpt-fn/x@sha256:abc", DEFAULT_IMAGE_PREFIX),
            "gcr.io/kpt-fn/x@sha256:abc"
        );
        assert_eq!(
            normalize_image("localhost:5000/x", DEFAULT_IMAGE_PREFIX),
            "localhost:5000/x:latest"
        );
    }
}
