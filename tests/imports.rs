//! No import circles between the files of a crate (issue 33): a file that imports a
//! second must not be imported by it, nor by anything the second imports. A circle
//! makes files that cannot be read, changed or moved one at a time.
//!
//! Read as text, per crate (`crates/*/src`, and the facade's `src`): an arrow goes from
//! a file to the file of the module a path of its code names (`use crate::a::b::C`,
//! `super::d::E`, `crate::a::f(…)` in an expression, `$crate::…` in a macro), the
//! longest prefix of the path that is a module with a file of its own. Comments (doc
//! comments included), `mod` declarations, re-exports (`pub use`, `pub(crate) use`)
//! and test files are no arrows. What ties a circle is printed: break it by moving what
//! both sides need into a file below them (see ARCHITECTURE.md, "Crate map").

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate's files: module path (`crate::store::tx`) to file.
type Modules = BTreeMap<String, PathBuf>;

/// The `.rs` files under `src`, by module path, test files left out.
fn modules(src: &Path) -> Modules {
    let mut out = Modules::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source folder") {
            let path = entry.expect("a directory entry").path();
            let rel = path.strip_prefix(src).expect("under src").to_path_buf();
            let test = rel
                .components()
                .any(|c| c.as_os_str() == "tests" || c.as_os_str() == "tests.rs");
            if test {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let mut parts: Vec<String> = rel
                    .with_extension("")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if parts == ["lib"] || parts == ["main"] {
                    parts.clear();
                } else if parts.last().is_some_and(|l| l == "mod") {
                    parts.pop();
                }
                let module = std::iter::once("crate".to_owned())
                    .chain(parts)
                    .collect::<Vec<_>>()
                    .join("::");
                out.insert(module, path);
            }
        }
    }
    out
}

/// The code of `text` without its comments (line comments, doc comments, blocks).
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_block = 0usize;
    for line in text.lines() {
        let mut rest = line;
        loop {
            if in_block > 0 {
                match rest.find("*/") {
                    Some(i) => {
                        in_block -= 1;
                        rest = &rest[i + 2..];
                    }
                    None => break,
                }
            } else {
                let comment = rest.find("//");
                let block = rest.find("/*");
                match (comment, block) {
                    (Some(c), b) if b.is_none_or(|b| c < b) => {
                        out.push_str(&rest[..c]);
                        break;
                    }
                    (_, Some(b)) => {
                        out.push_str(&rest[..b]);
                        in_block += 1;
                        rest = &rest[b + 2..];
                    }
                    _ => {
                        out.push_str(rest);
                        break;
                    }
                }
            }
        }
        out.push('\n');
    }
    out
}

/// The code with its re-exports, `mod` declarations and inline test module (from a
/// `#[cfg(test)]` before a `mod … {` to the end) taken out.
fn without_reexports(code: &str) -> String {
    let code = match code.find("#[cfg(test)]\nmod ") {
        Some(i)
            if code[i..]
                .lines()
                .nth(1)
                .is_some_and(|l| l.trim_end().ends_with('{')) =>
        {
            &code[..i]
        }
        _ => code,
    };
    let mut out = String::with_capacity(code.len());
    let mut skipping = false;
    for line in code.lines() {
        let t = line.trim_start();
        if !skipping
            && (t.starts_with("pub use ")
                || t.starts_with("pub(crate) use ")
                || t.starts_with("pub(super) use ")
                || t.starts_with("mod ")
                || t.starts_with("pub mod ")
                || t.starts_with("pub(crate) mod "))
        {
            skipping = true;
        }
        if skipping {
            if t.contains(';') || t.ends_with('{') {
                skipping = false;
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Every path the code names from `crate`, `super` or `self` (braces expanded), made
/// absolute from `module`.
fn paths(code: &str, module: &str) -> Vec<Vec<String>> {
    let code = code.replace("$crate", "crate");
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .find(|s| bytes[i..].starts_with(s.as_bytes()));
        let Some(start) = starts else {
            i += 1;
            continue;
        };
        if i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == b':') {
            i += start.len();
            continue;
        }
        // The path up to its end, braces included.
        let mut j = i;
        let mut depth = 0i32;
        while j < bytes.len() {
            let b = bytes[j];
            if b == b'{' {
                depth += 1;
            } else if b == b'}' {
                if depth == 0 {
                    break;
                }
                depth -= 1;
            } else if depth == 0 && !(ident(b) || b == b':') {
                break;
            }
            j += 1;
        }
        for p in expand(&code[i..j]) {
            out.push(absolute(&p, module));
        }
        i = j.max(i + 1);
    }
    out
}

/// `a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e`.
fn expand(path: &str) -> Vec<String> {
    let path: String = path
        .replace(" as ", "@")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let Some(open) = path.find('{') else {
        let path = path.split('@').next().unwrap_or(&path);
        return vec![path.trim_end_matches("::").to_owned()];
    };
    let prefix = &path[..open];
    let inner = path[open + 1..]
        .strip_suffix('}')
        .unwrap_or(&path[open + 1..]);
    let mut parts = Vec::new();
    let (mut depth, mut last) = (0, 0);
    for (k, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[last..k]);
                last = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[last..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| {
            let p = p.split('@').next().unwrap_or(p);
            expand(&format!("{prefix}{p}"))
        })
        .collect()
}

/// `path` (from `crate`, `super` or `self`) as segments from `crate`.
fn absolute(path: &str, module: &str) -> Vec<String> {
    let mut base: Vec<String> = module.split("::").map(str::to_owned).collect();
    let mut segs = path.split("::").filter(|s| !s.is_empty()).peekable();
    match segs.peek().copied() {
        Some("crate") => {
            base = vec!["crate".to_owned()];
            segs.next();
        }
        Some("self") => {
            segs.next();
        }
        _ => {
            while segs.peek() == Some(&"super") {
                base.pop();
                segs.next();
            }
        }
    }
    base.extend(segs.map(str::to_owned));
    base
}

/// The files each file of the crate at `src` imports.
fn arrows(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let modules = modules(src);
    let mut out = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).expect("a source file");
        let code = without_reexports(&code(&text));
        let mut to = BTreeSet::new();
        for path in paths(&code, module) {
            let target = (1..=path.len())
                .rev()
                .map(|n| path[..n].join("::"))
                .find_map(|m| modules.get(&m));
            if let Some(target) = target
                && target != file
            {
                to.insert(target.clone());
            }
        }
        out.insert(file.clone(), to);
    }
    out
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'g> {
        graph: &'g BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'g PathBuf, (usize, usize)>,
        stack: Vec<&'g PathBuf>,
        on_stack: BTreeSet<&'g PathBuf>,
        next: usize,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g PathBuf) {
        s.index.insert(v, (s.next, s.next));
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.index[w].1.min(s.index[v].1);
                s.index.get_mut(v).expect("visited").1 = low;
            } else if s.on_stack.contains(w) {
                let low = s.index[w].0.min(s.index[v].1);
                s.index.get_mut(v).expect("visited").1 = low;
            }
        }
        if s.index[v].0 == s.index[v].1 {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

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

#[test]
fn no_file_imports_a_file_that_imports_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let name = |p: &PathBuf| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let mut problems = Vec::new();
    for src in crate_sources() {
        let graph = arrows(&src);
        for circle in circles(&graph) {
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
    assert!(
        problems.is_empty(),
        "import circles:\n{}",
        problems.join("\n")
    );
}

/// The reading itself: a circle made on purpose is found, an arrow that only a
/// comment or a re-export draws is not.
#[test]
fn a_circle_is_found_and_comments_draw_no_arrow() {
    let dir = std::env::temp_dir().join(format!("agentsaga-imports-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "mod a;\nmod b;\nmod c;\npub use a::X;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("a.rs"),
        "mod inner;\nuse crate::b::{Y, c_fn};\npub struct X;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("a/inner.rs"),
        "// use crate::c::Z;\npub(crate) use crate::c::Z;\n",
    )
    .unwrap();
    std::fs::write(src.join("b.rs"), "pub struct Y;\nfn f() { super::a::X; }\n").unwrap();
    std::fs::write(src.join("c.rs"), "/// [`crate::a::X`]\npub struct Z;\n").unwrap();
    let graph = arrows(&src);
    let found = circles(&graph);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, vec![vec![src.join("a.rs"), src.join("b.rs")]]);
    assert!(graph[&src.join("a/inner.rs")].is_empty(), "{graph:?}");
    assert!(graph[&src.join("c.rs")].is_empty(), "{graph:?}");
}
