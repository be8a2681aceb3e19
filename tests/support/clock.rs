//! The test hook that steps a child process's clock (`agentsaga::core::clock::step`).

use std::path::PathBuf;

/// The clock-offset file of the SQLite database at `url` (beside it): a process started
/// with `AGENTSAGA_TEST_CLOCK_OFFSET_FILE` naming it reads its clock's offset there.
pub fn clock_file(url: &str) -> PathBuf {
    PathBuf::from(url.trim_start_matches("sqlite://"))
        .parent()
        .unwrap()
        .join("clock-offset-ms")
}

/// Steps the clock of the processes started with `AGENTSAGA_TEST_CLOCK_OFFSET_FILE` set
/// to `file` to `offset_ms` past the real clock (`agentsaga::core::clock::step`).
pub fn step_clock(file: &std::path::Path, offset_ms: i64) {
    let next = file.with_extension("next");
    std::fs::write(&next, offset_ms.to_string()).unwrap();
    std::fs::rename(&next, file).unwrap();
}
