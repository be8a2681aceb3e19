//! The text of a source file as the import check reads it: its code without comments
//! and literals, and the paths it names.

use std::collections::BTreeSet;

/// `text` with comments removed and the insides of string and character literals
/// blanked (newlines kept).
pub(crate) fn code(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push(b'\n');
                    }
                    i += 1;
                }
            }
        } else if rest.starts_with(b"r\"") || rest.starts_with(b"r#") {
            // A raw string: r"…", r#"…"#, …
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(1 + hashes) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let end: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            i += 2 + hashes;
            while i < b.len() && !b[i..].starts_with(&end) {
                if b[i] == b'\n' {
                    out.push(b'\n');
                }
                i += 1;
            }
            i += end.len();
            out.extend_from_slice(b"\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                if i < b.len() && b[i] == b'\n' {
                    out.push(b'\n');
                }
                i += 1;
            }
            i += 1;
            out.extend_from_slice(b"\"\"");
        } else if b[i] == b'\'' {
            // A character literal ('x', '\n', '\u{1F600}'), or a lifetime ('a).
            let len = if rest.get(1) == Some(&b'\\') {
                rest.iter().skip(2).position(|&c| c == b'\'').map(|p| p + 3)
            } else {
                let ch = std::str::from_utf8(&rest[1..rest.len().min(5)])
                    .ok()
                    .or_else(|| std::str::from_utf8(&rest[1..2]).ok())
                    .and_then(|s| s.chars().next())
                    .map_or(1, char::len_utf8);
                (rest.get(1 + ch) == Some(&b'\'')).then_some(ch + 2)
            };
            match len {
                Some(n) => {
                    out.extend_from_slice(b"' '");
                    i += n;
                }
                None => {
                    out.push(b'\'');
                    i += 1;
                }
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `b` may be part of an identifier.
pub(crate) fn ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The path that starts at `i` in `code`, braces included.
pub(crate) fn path_at(code: &str, i: usize) -> &str {
    let b = code.as_bytes();
    let mut j = i;
    let mut depth = 0i32;
    while j < b.len() {
        match b[j] {
            b'{' => depth += 1,
            b'}' if depth == 0 => break,
            b'}' => depth -= 1,
            c if depth == 0 && !(ident(c) || c == b':' || c == b'*') => break,
            _ => {}
        }
        j += 1;
    }
    &code[i..j]
}

/// `a::{b, c::{d, e as f}}` as `a::b`, `a::c::d`, `a::c::e` (with their names: `b`,
/// `d`, `f`).
pub(crate) fn expand(path: &str) -> Vec<(String, String)> {
    let path: String = path
        .replace(" as ", "@")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let Some(open) = path.find('{') else {
        let mut parts = path.split('@');
        let p = parts.next().unwrap_or_default().trim_end_matches("::");
        let name = parts
            .next()
            .unwrap_or_else(|| p.rsplit("::").next().unwrap_or(p));
        return vec![(p.to_owned(), name.to_owned())];
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
            let p = if p == "self" { "" } else { p };
            expand(&format!("{prefix}{p}"))
        })
        .collect()
}

/// `path` as segments from `crate`, read in `module` (whose child modules are
/// `children`); `None` for a path outside the crate.
pub(crate) fn absolute(
    path: &str,
    module: &str,
    children: &BTreeSet<String>,
) -> Option<Vec<String>> {
    let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<String> = module.split("::").map(str::to_owned).collect();
    match segs.first().copied() {
        Some("crate") => {
            base.truncate(1);
            segs.remove(0);
        }
        Some("self") => {
            segs.remove(0);
        }
        Some("super") => {
            while segs.first() == Some(&"super") {
                base.pop();
                segs.remove(0);
            }
        }
        Some(first) if children.contains(first) => {}
        _ => return None,
    }
    base.extend(segs.into_iter().map(str::to_owned));
    Some(base)
}
