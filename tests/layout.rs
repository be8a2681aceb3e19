//! The size limit of source files: no Rust source file of the repository (crates,
//! the facade, examples, tests) is over [`LIMIT`] lines, so that a file holds one
//! concept a newcomer can read at once (issue 33).
//!
//! A file over the limit fails the test: split it by concept. [`OVER`] may list a
//! file over it with a ceiling (it may shrink, not grow, and leaves the list once it is
//! under the limit: the test says so, so the list stays exact); since 2026-11-27 the
//! list is empty: every file is within the limit.

use std::path::{Path, PathBuf};

/// Lines a source file may have.
const LIMIT: usize = 450;

/// Files over the limit, each with the most lines it may have.
const OVER: &[(&str, usize)] = &[];

/// Every `.rs` file under the repository's source folders.
fn sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = ["crates", "src", "examples", "tests"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn no_source_file_is_over_the_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for path in sources() {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let lines = text.lines().count();
        let name = path
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .replace('\\', "/");
        match OVER.iter().find(|(p, _)| *p == name) {
            Some(&(_, ceiling)) => {
                seen.push(name.clone());
                if lines > ceiling {
                    problems.push(format!(
                        "{name}: {lines} lines, more than its {ceiling} when the limit came: \
                         split it by concept rather than let it grow"
                    ));
                } else if lines <= LIMIT {
                    problems.push(format!(
                        "{name}: {lines} lines, now within the limit: remove it from OVER"
                    ));
                }
            }
            None if lines > LIMIT => problems.push(format!(
                "{name}: {lines} lines, over the limit of {LIMIT}: split it by concept"
            )),
            None => {}
        }
    }
    for (name, _) in OVER {
        if !seen.iter().any(|s| s == name) {
            problems.push(format!(
                "{name}: listed in OVER but gone: remove it from OVER"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "tests/layout.rs:\n{}",
        problems.join("\n")
    );
}
