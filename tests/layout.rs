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

/// The Rust files under `dir` (relative to the repository), but tests: their code,
/// without comments.
fn files_under(dir: &str) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    sources()
        .into_iter()
        .filter_map(|path| {
            let name = path
                .strip_prefix(root)
                .expect("under the root")
                .to_string_lossy()
                .replace('\\', "/");
            let test = name.contains("/tests/") || name.ends_with("/tests.rs");
            (name.starts_with(dir) && !test).then(|| {
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                // Code only: comments (and doc comments' examples, which may run on
                // the database they name) are words.
                let code: Vec<&str> = text
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .collect();
                (name, code.join("\n"))
            })
        })
        .collect()
}

/// What names a driver in code: its feature, its folder, sqlx's types of it.
const DRIVER_NAMES: &[&str] = &[
    "feature = \"sqlite\"",
    "feature = \"postgres\"",
    "drivers::sqlite",
    "drivers::postgres",
    "sqlx::Sqlite",
    "sqlx::Postgres",
    "sqlx::sqlite",
    "sqlx::postgres",
    "SqliteConnection",
    "SqlitePool",
    "PgConnection",
    "PgPool",
];

// Each driver owns its backend (issue 46): outside the two driver folders, one file of
// core names a driver (`drivers.rs`, which chooses it), and the test support that starts
// a database of each (`testing.rs`, `testing/`).
#[test]
fn one_file_of_core_names_a_driver() {
    let named: Vec<String> = files_under("crates/core/src/")
        .into_iter()
        .filter(|(name, _)| {
            !name.starts_with("crates/core/src/drivers/")
                && !name.starts_with("crates/core/src/testing")
        })
        .filter(|(_, text)| DRIVER_NAMES.iter().any(|n| text.contains(n)))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        named,
        vec!["crates/core/src/drivers.rs".to_owned()],
        "files of core outside the driver folders that name a driver"
    );
}

// The engine states its reads as data (issue 46): the saga crate, the runtime and the
// CLI hold no SQL of one dialect and no backend's name: no driver named, no statement
// run through sqlx, no branch on the backend.
#[test]
fn the_engine_names_no_backend() {
    let mut problems = Vec::new();
    for dir in ["crates/saga/src/", "crates/runtime/src/", "crates/cli/src/"] {
        for (name, text) in files_under(dir) {
            for word in DRIVER_NAMES.iter().chain(&[
                "sqlx::query",
                "match_conn!",
                "with_conn!",
                "with_reader!",
                "backend() ==",
                "backend() !=",
                "starts_with(\"postgres",
                "starts_with(\"sqlite",
            ]) {
                if text.contains(word) {
                    problems.push(format!("{name}: {word}"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
