//! Output helpers: aligned tables, RFC 3339 timestamps, durations.

use std::fmt::Write as _;
use std::time::Duration;

/// Column alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    Right,
}

/// A plain-text table: a header row and data rows, columns padded to their widest
/// cell, two spaces apart. Cells are single lines (newlines become spaces).
#[derive(Debug)]
pub(crate) struct Table {
    headers: Vec<&'static str>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns, all left-aligned.
    pub(crate) fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.to_vec(),
            align: vec![Align::Left; headers.len()],
            rows: Vec::new(),
        }
    }

    /// Right-align the given columns (numbers).
    pub(crate) fn right(mut self, columns: &[usize]) -> Self {
        for &c in columns {
            if let Some(a) = self.align.get_mut(c) {
                *a = Align::Right;
            }
        }
        self
    }

    /// Adds a row; missing cells are blank, extra ones ignored.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        let mut cells: Vec<String> = cells.into_iter().map(|c| one_line(&c)).collect();
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// True if no row was added.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, ending with a newline.
    pub(crate) fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let headers: Vec<String> = self.headers.iter().map(|h| (*h).to_owned()).collect();
        for row in std::iter::once(&headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths[i].saturating_sub(cell.chars().count());
                match self.align[i] {
                    Align::Left => {
                        line.push_str(cell);
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(cell);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `text` on one line: line breaks and tabs become spaces.
pub(crate) fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `text` cut to at most `max` characters, with `…` marking the cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// An optional text, or `-`.
pub(crate) fn or_dash(text: Option<&str>) -> String {
    match text {
        Some(t) if !t.is_empty() => t.to_owned(),
        _ => "-".to_owned(),
    }
}

pub(crate) use agentsaga_console::time::rfc3339;

/// An optional timestamp, or `-`.
pub(crate) fn ts_or_dash(unix_ms: Option<i64>) -> String {
    unix_ms.map_or_else(|| "-".to_owned(), rfc3339)
}

pub(crate) use agentsaga_console::time::parse_duration;

/// A duration as `--older-than` takes it: the largest unit that divides it exactly
/// (`7d`, `90m`, `500ms`).
pub(crate) fn compact_duration(d: Duration) -> String {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms > 0 && ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// A duration for people: `850ms`, `12.3s`, `4m 05s`, `2h 10m`, `3d 4h`.
pub(crate) fn human_duration(ms: u64) -> String {
    let mut out = String::new();
    let (s, m, h, d) = (ms / 1000, ms / 60_000, ms / 3_600_000, ms / 86_400_000);
    let _ = match () {
        () if ms < 1000 => write!(out, "{ms}ms"),
        () if s < 60 => write!(out, "{}.{}s", s, ms % 1000 / 100),
        () if m < 60 => write!(out, "{m}m {:02}s", s % 60),
        () if h < 24 => write!(out, "{h}h {:02}m", m % 60),
        () => write!(out, "{d}d {}h", h % 24),
    };
    out
}

/// Prints `value` as one pretty JSON document.
pub(crate) fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["", "x", "7", "d", "7 d", "-1s", "1.5h", "7w", "s7"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("expected a number and a unit"), "{bad}: {e}");
        }
        assert!(parse_duration("99999999999999999999d").is_err());
        assert_eq!(compact_duration(Duration::from_secs(604_800)), "7d");
        assert_eq!(compact_duration(Duration::from_secs(5400)), "90m");
        assert_eq!(compact_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(compact_duration(Duration::ZERO), "0ms");
        assert_eq!(human_duration(850), "850ms");
        assert_eq!(human_duration(12_345), "12.3s");
        assert_eq!(human_duration(245_000), "4m 05s");
        assert_eq!(human_duration(7_800_000), "2h 10m");
        assert_eq!(human_duration(273_600_000), "3d 4h");
    }

    #[test]
    fn tables_align() {
        let mut t = Table::new(&["NAME", "N"]).right(&[1]);
        t.row(vec!["a".into(), "10".into()]);
        t.row(vec!["long\nname".into(), "2".into()]);
        assert_eq!(t.render(), "NAME        N\na          10\nlong name   2\n");
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
    }
}
