//! `fn-runner exec <function>`: runs a builtin KRM function as an executable
//! (ResourceList on stdin, ResourceList on stdout), so kpt and Porch's exec
//! evaluator can run it. Invoked through a link named after a function, it
//! runs that function.

use std::io::{Read, Write};
use std::process::ExitCode;

use porch_krm::builtins::{BuiltinRuntime, process_resource_list};

fn usage(runtime: &BuiltinRuntime) -> ExitCode {
    eprintln!(
        "usage: fn-runner exec <function>\nfunctions: {}",
        runtime.names().join(", ")
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let runtime = BuiltinRuntime::catalog();
    let args: Vec<String> = std::env::args().collect();
    let invoked = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("fn-runner")
        .to_owned();
    let name = if runtime.names().contains(&invoked.as_str()) {
        invoked
    } else {
        match (args.get(1).map(String::as_str), args.get(2)) {
            (Some("exec"), Some(name)) => name.clone(),
            _ => return usage(&runtime),
        }
    };
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("failed to read the ResourceList from stdin: {e}");
        return ExitCode::FAILURE;
    }
    match process_resource_list(&runtime, &name, &input) {
        Ok((output, ok)) => {
            if let Err(e) = std::io::stdout().write_all(output.as_bytes()) {
                eprintln!("failed to write the ResourceList: {e}");
                return ExitCode::FAILURE;
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
