//! Starts a test server script that binds a port the system picks and
//! prints it as its first line (`git_http_server.py`, `moto_serial.py` with
//! PORT 0). Choosing a free port first and handing it over would leave a
//! window in which another test's server takes it: the script would then
//! fail to bind while the test talked to the other server.
//!
//! Shared by the test crates with `#[path]`, as it is not product code.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Spawns `command` (whose port argument is 0) and returns the process
/// and the port it listens on, once it listens.
pub(crate) fn spawn_announcing(mut command: Command) -> (Child, u16) {
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs the test server");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout);
    let mut first = String::new();
    let read = lines.read_line(&mut first);
    let Some(port) = read.ok().and_then(|_| first.trim().parse::<u16>().ok()) else {
        let _ = child.kill();
        let status = child.wait();
        panic!("the test server announced no port ({first:?}, {status:?})");
    };
    // whatever else it prints is read and dropped, so it never blocks on
    // a full pipe nor fails on a closed one
    std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
    (child, port)
}
