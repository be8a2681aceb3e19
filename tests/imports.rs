//! No import circles between the files of a crate (issue 33): a file that imports a
//! second must not be imported by it, nor by anything the second imports. A circle
//! makes files that cannot be read, changed or moved one at a time.
//!
//! Read as text, per crate (`crates/*/src`, and the facade's `src`). An arrow goes from
//! a file to the file that declares what a path of its code names: `use crate::a::B`,
//! `super::c::D`, `self::e::f(…)`, a child module's `g::h(…)`, `$crate::…` in a macro,
//! `super::*`. A path is resolved to the longest module with a file of its own, then
//! through that file's re-exports (`pub use`, `pub(crate) use`) to the file that
//! declares the name, so `crate::Error` leads to `error.rs`, not to `lib.rs`. Comments,
//! string and character literals, `mod` declarations, re-exports themselves, inline
//! `#[cfg(test)]` modules and test files draw no arrow. What ties a circle is printed:
//! break it by moving what both sides need into a file below them (ARCHITECTURE.md,
//! "Crate map").

mod imports {
    pub(crate) mod graph;
    pub(crate) mod text;
}

use std::path::{Path, PathBuf};

use imports::graph::{arrows, circles};

/// Every crate's `src` folder.
fn crate_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = vec![root.join("src")];
    for entry in std::fs::read_dir(root.join("crates")).expect("crates/") {
        let src = entry.expect("a directory entry").path().join("src");
        if src.is_dir() {
            out.push(src);
        }
    }
    out.sort();
    out
}

/// The circles left, each with all its files: none. The last ones, in the benches'
/// binary (a bench's module and the parts it was split into, each part taking the
/// module's items with `use super::*`), were broken by moving what the parts share into
/// a file below them (`relay/setup.rs`, `saga/drive.rs`, …). The list is exact: a new
/// circle fails the test, and so does one listed here that is gone.
const KNOWN: &[&[&str]] = &[];

#[test]
fn no_file_imports_a_file_that_imports_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let name = |p: &PathBuf| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let mut problems = Vec::new();
    let mut left: Vec<Vec<String>> = Vec::new();
    for src in crate_sources() {
        let graph = arrows(&src);
        for circle in circles(&graph) {
            let mut files: Vec<String> = circle.iter().map(name).collect();
            files.sort();
            if KNOWN
                .iter()
                .any(|k| k.iter().copied().eq(files.iter().map(String::as_str)))
            {
                left.push(files);
                continue;
            }
            let ties: Vec<String> = circle
                .iter()
                .flat_map(|a| {
                    graph[a]
                        .iter()
                        .filter(|b| circle.contains(b))
                        .map(move |b| format!("    {} -> {}", name(a), name(b)))
                })
                .collect();
            problems.push(format!(
                "a circle of {} files:\n{}",
                circle.len(),
                ties.join("\n")
            ));
        }
    }
    for known in KNOWN {
        if !left
            .iter()
            .any(|f| known.iter().copied().eq(f.iter().map(String::as_str)))
        {
            problems.push(format!(
                "the known circle of {} files ({}, …) is gone or changed: update KNOWN",
                known.len(),
                known[0]
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "import circles:\n{}",
        problems.join("\n")
    );
}

/// The reading itself: a circle made on purpose is found, through a re-export of the
/// crate's root; a child module's path draws an arrow; a comment, a string and a
/// re-export draw none.
#[test]
fn a_circle_is_found_and_comments_draw_no_arrow() {
    let dir = std::env::temp_dir().join(format!("agentsaga-imports-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    let files = [
        ("lib.rs", "mod a;\nmod b;\nmod c;\npub use a::X;\n"),
        (
            "a.rs",
            "mod inner;\nuse crate::b::{Y, c_fn};\npub struct X;\nfn g() { inner::h(); }\n",
        ),
        (
            "a/inner.rs",
            "// use crate::c::Z;\npub(crate) use crate::c::Z;\npub fn h() { let _ = \"crate::c::Z\"; }\n",
        ),
        ("b.rs", "pub struct Y;\nfn f() { crate::X; }\n"),
        ("c.rs", "/// [`crate::a::X`]\npub struct Z;\n"),
    ];
    for (name, text) in files {
        std::fs::write(src.join(name), text).unwrap();
    }
    let graph = arrows(&src);
    let found = circles(&graph);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, vec![vec![src.join("a.rs"), src.join("b.rs")]]);
    assert!(
        graph[&src.join("a.rs")].contains(&src.join("a/inner.rs")),
        "{graph:?}"
    );
    assert!(graph[&src.join("a/inner.rs")].is_empty(), "{graph:?}");
    assert!(graph[&src.join("c.rs")].is_empty(), "{graph:?}");
}
