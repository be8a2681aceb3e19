//! The docs cite tests by name: each cited test must exist, so a renamed or deleted
//! test cannot leave a guarantee that nothing checks.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, skipping `target`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The names cited after `tests:` inside parentheses: backticked snake_case words
/// (paths such as `tests/x.rs` are skipped).
fn cited(doc: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = doc;
    while let Some(at) = rest.find("(tests:") {
        let group = &rest[at..];
        let end = group
            .find(')')
            .expect("a closing parenthesis after `(tests:`");
        for (i, part) in group[..end].split('`').enumerate() {
            let is_name = !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if i % 2 == 1 && is_name {
                names.push(part.to_owned());
            }
        }
        rest = &group[end..];
    }
    names
}

#[test]
fn every_test_the_guarantees_cite_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/guarantees.md")).unwrap();
    let names = cited(&doc);
    assert!(names.len() >= 10, "too few citations found: {names:?}");
    let mut files = Vec::new();
    for dir in ["crates", "tests", "src"] {
        rust_files(&root.join(dir), &mut files);
    }
    let sources: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| {
            // A test, or a promise of the suite run against each transport (generic).
            let (def, generic) = (format!("fn {name}("), format!("fn {name}<"));
            !sources
                .iter()
                .any(|s| s.contains(&def) || s.contains(&generic))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/guarantees.md cites tests that do not exist: {missing:?}"
    );
}

#[test]
fn citations_are_found_in_groups() {
    let doc = "a (tests: `tests/x.rs`: `one_test`, `two`; `Not_this`) b `outside`";
    assert_eq!(cited(doc), vec!["one_test", "two"]);
}
