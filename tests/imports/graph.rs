//! A crate's files and the arrows between them: each file's imports resolved to the
//! file that declares what they name, and the circles they make.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::text::{absolute, code, expand, ident, path_at};

/// One file of a crate, as read.
pub(crate) struct File {
    path: PathBuf,
    /// Its code, comments and literals blanked, inline test modules and re-exports
    /// and `mod` declarations taken out.
    code: String,
    /// The modules it declares (`mod x;`), by name.
    children: BTreeSet<String>,
    /// Its re-export statements (`a::{b, c}` of `pub use a::{b, c};`).
    reexport_bodies: Vec<String>,
    /// What it re-exports: name to the absolute path it stands for.
    reexports: BTreeMap<String, Vec<String>>,
}

/// A crate's files, by module path (`crate::store::tx`).
pub(crate) type Crate = BTreeMap<String, File>;

/// The module path of `rel` (a file's path under `src`).
pub(crate) fn module_of(rel: &Path) -> String {
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
    std::iter::once("crate".to_owned())
        .chain(parts)
        .collect::<Vec<_>>()
        .join("::")
}

/// Reads the crate at `src`.
pub(crate) fn read(src: &Path) -> Crate {
    let mut krate = Crate::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source folder") {
            let path = entry.expect("a directory entry").path();
            let rel = path.strip_prefix(src).expect("under src").to_path_buf();
            if rel
                .components()
                .any(|c| c.as_os_str() == "tests" || c.as_os_str() == "tests.rs")
            {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file");
                krate.insert(module_of(&rel), parse(path, &text));
            }
        }
    }
    let modules: Vec<String> = krate.keys().cloned().collect();
    for module in modules {
        let file = &krate[&module];
        let mut reexports = BTreeMap::new();
        for body in &file.reexport_bodies {
            for (path, name) in expand(body) {
                if let Some(target) = absolute(&path, &module, &file.children) {
                    reexports.insert(name, target);
                }
            }
        }
        krate.get_mut(&module).expect("a module").reexports = reexports;
    }
    krate
}

/// One file's code, child modules and re-exports.
pub(crate) fn parse(path: PathBuf, text: &str) -> File {
    let mut kept = String::new();
    let mut children = BTreeSet::new();
    let mut reexport_bodies = Vec::new();
    let mut statement: Option<(bool, String)> = None; // (a re-export?, its text so far)
    let mut skip_depth: Option<i32> = None;
    let code = code(text);
    let mut lines = code.lines().peekable();
    let braces = |l: &str| l.matches('{').count() as i32 - l.matches('}').count() as i32;
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        // An inline test module, skipped to its closing brace.
        if let Some(depth) = skip_depth.as_mut() {
            *depth += braces(line);
            if *depth <= 0 {
                skip_depth = None;
            }
            continue;
        }
        if t.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod ") && n.contains('{'))
        {
            let depth = braces(lines.next().unwrap_or_default());
            skip_depth = (depth > 0).then_some(depth);
            continue;
        }
        let bare = t
            .strip_prefix("pub(crate) ")
            .or_else(|| t.strip_prefix("pub(super) "))
            .or_else(|| t.strip_prefix("pub "))
            .unwrap_or(t);
        if let Some(name) = bare.strip_prefix("mod ").and_then(|n| n.strip_suffix(';')) {
            children.insert(name.trim().to_owned());
            continue;
        }
        if statement.is_none() && bare.starts_with("use ") {
            statement = Some((bare.len() != t.len(), String::new()));
        }
        let Some((reexport, so_far)) = statement.as_mut() else {
            kept.push_str(line);
            kept.push('\n');
            continue;
        };
        so_far.push_str(line);
        so_far.push(' ');
        if line.contains(';') {
            if *reexport {
                let body = &so_far[so_far.find("use ").unwrap_or(0) + 4..];
                reexport_bodies.push(body.split(';').next().unwrap_or_default().to_owned());
            } else {
                kept.push_str(so_far);
                kept.push('\n');
            }
            statement = None;
        }
    }
    File {
        path,
        code: kept.replace("$crate", "crate"),
        children,
        reexport_bodies,
        reexports: BTreeMap::new(),
    }
}

/// The file that declares what `path` (absolute) names: the longest module of it with a
/// file, then through that file's re-exports while they lead on.
pub(crate) fn target<'k>(krate: &'k Crate, path: &[String]) -> Option<&'k File> {
    let mut path = path.to_vec();
    for _ in 0..16 {
        let n = (1..=path.len())
            .rev()
            .find(|&n| krate.contains_key(&path[..n].join("::")))?;
        let file = &krate[&path[..n].join("::")];
        let Some(next) = path.get(n) else {
            return Some(file);
        };
        let Some(to) = file.reexports.get(next) else {
            return Some(file);
        };
        let mut followed = to.clone();
        followed.extend(path[n + 1..].iter().cloned());
        if followed == path {
            return Some(file);
        }
        path = followed;
    }
    None
}

/// The files each file of the crate at `src` imports.
pub(crate) fn arrows(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let krate = read(src);
    let mut out = BTreeMap::new();
    for (module, file) in &krate {
        let code = &file.code;
        let b = code.as_bytes();
        let mut to = BTreeSet::new();
        let mut i = 0;
        while i < b.len() {
            let starts_path =
                (i == 0 || !(ident(b[i - 1]) || b[i - 1] == b':')) && ident(b[i]) && {
                    let word_end = i + b[i..].iter().take_while(|&&c| ident(c)).count();
                    b[word_end..].starts_with(b"::")
                        && matches!(&code[i..word_end], "crate" | "super" | "self")
                        || b[word_end..].starts_with(b"::")
                            && file.children.contains(&code[i..word_end])
                };
            if !starts_path {
                i += 1;
                continue;
            }
            let path = path_at(code, i);
            for (p, _) in expand(path) {
                let p = p.trim_end_matches("::*").trim_end_matches('*');
                if let Some(abs) = absolute(p, module, &file.children)
                    && let Some(t) = target(&krate, &abs)
                    && t.path != file.path
                {
                    to.insert(t.path.clone());
                }
            }
            i += path.len().max(1);
        }
        out.insert(file.path.clone(), to);
    }
    out
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
pub(crate) fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
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
