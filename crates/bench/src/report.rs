//! Figures and how they are printed: a human table, then one JSON object per line.

use serde::Serialize;

/// The ratio every figure should reach against its floor (from the issue).
pub(crate) const TARGET_RATIO: f64 = 0.8;

/// One measured figure, serialized as one JSON line.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Figure {
    /// The bench (`outbox`, ...).
    pub(crate) bench: &'static str,
    /// `sqlite` or `postgres`.
    pub(crate) backend: &'static str,
    /// What was measured.
    pub(crate) metric: &'static str,
    /// The measured value.
    pub(crate) value: f64,
    /// Its unit.
    pub(crate) unit: &'static str,
    /// The same work written by hand, where there is such a thing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) floor: Option<f64>,
    /// `value / floor`: higher is better for rates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ratio: Option<f64>,
}

impl Figure {
    /// A rate with its floor; values are rounded to 0.1, the ratio to 0.001.
    pub(crate) fn rate(
        bench: &'static str,
        backend: &'static str,
        metric: &'static str,
        value: f64,
        floor: f64,
    ) -> Self {
        let ratio = if floor > 0.0 {
            Some(round(value / floor, 3))
        } else {
            None
        };
        Self {
            bench,
            backend,
            metric,
            value: round(value, 1),
            unit: "msgs/s",
            floor: Some(round(floor, 1)),
            ratio,
        }
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// What a bench run produced.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// The figures, in order.
    pub(crate) figures: Vec<Figure>,
    /// Setup notes printed under the table (servers, settings, method).
    pub(crate) notes: Vec<String>,
}

impl Report {
    /// Prints the human table, the notes, then one JSON line per figure, to stdout.
    pub(crate) fn print(&self) {
        print!("{}", self.table());
        for figure in &self.figures {
            match serde_json::to_string(figure) {
                Ok(line) => println!("{line}"),
                Err(e) => eprintln!("cannot serialize {figure:?}: {e}"),
            }
        }
    }

    fn table(&self) -> String {
        let header = [
            "bench", "backend", "metric", "value", "floor", "ratio", "unit", "target",
        ];
        let mut rows: Vec<[String; 8]> = vec![header.map(str::to_owned)];
        for f in &self.figures {
            let verdict = match f.ratio {
                Some(r) if r >= TARGET_RATIO => "ok".to_owned(),
                Some(_) => format!("BELOW {TARGET_RATIO}"),
                None => String::new(),
            };
            rows.push([
                f.bench.to_owned(),
                f.backend.to_owned(),
                f.metric.to_owned(),
                thousands(f.value),
                f.floor.map(thousands).unwrap_or_default(),
                f.ratio.map(|r| format!("{r:.3}")).unwrap_or_default(),
                f.unit.to_owned(),
                verdict,
            ]);
        }
        let mut widths = [0usize; 8];
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        // Numbers right-aligned, words left-aligned.
        let right = [false, false, false, true, true, true, false, false];
        let mut out = String::new();
        for (i, row) in rows.iter().enumerate() {
            let cells: Vec<String> = row
                .iter()
                .zip(widths)
                .zip(right)
                .map(|((cell, w), r)| {
                    if r {
                        format!("{cell:>w$}")
                    } else {
                        format!("{cell:<w$}")
                    }
                })
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
            if i == 0 {
                let total = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
                out.push_str(&"-".repeat(total));
                out.push('\n');
            }
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for note in &self.notes {
                out.push_str("note: ");
                out.push_str(note);
                out.push('\n');
            }
        }
        out.push('\n');
        out
    }
}

/// `1234567.8` as `1,234,568`.
fn thousands(x: f64) -> String {
    let n = x.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(1_234_567.8), "1,234,568");
    }

    #[test]
    fn json_line_has_the_contract_fields() {
        let f = Figure::rate("outbox", "sqlite", "drain_rate", 800.0, 1000.0);
        let v: serde_json::Value = serde_json::to_value(&f).unwrap();
        assert_eq!(v["bench"], "outbox");
        assert_eq!(v["backend"], "sqlite");
        assert_eq!(v["metric"], "drain_rate");
        assert_eq!(v["value"], 800.0);
        assert_eq!(v["unit"], "msgs/s");
        assert_eq!(v["floor"], 1000.0);
        assert_eq!(v["ratio"], 0.8);
    }

    #[test]
    fn no_floor_no_ratio() {
        let f = Figure {
            floor: None,
            ratio: None,
            ..Figure::rate("outbox", "sqlite", "x", 1.0, 1.0)
        };
        let line = serde_json::to_string(&f).unwrap();
        assert!(!line.contains("floor") && !line.contains("ratio"), "{line}");
    }
}
