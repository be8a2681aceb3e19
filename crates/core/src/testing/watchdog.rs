//! The watchdog: a detached shell that cleans up after the test process once it has
//! gone, however it ended (Rust runs no static destructors, and a killed test process
//! runs nothing at all).

use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// Spawns a detached `sh` that waits until this process has gone, then runs `cleanup`
/// (a shell command line; quote paths with [`shell_quote`]).
///
/// # Errors
/// If `sh` cannot be spawned.
#[allow(
    clippy::zombie_processes,
    reason = "the watchdog must outlive this process; it is never waited for"
)]
pub(super) fn spawn(cleanup: &str) -> io::Result<()> {
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {cleanup}",
        pid = std::process::id(),
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Own process group: a Ctrl-C to the test's group must not kill it.
        .process_group(0)
        .spawn()?;
    Ok(())
}

/// `path` as a single-quoted POSIX shell word.
pub(super) fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}
