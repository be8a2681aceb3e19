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
    /// `value / floor`: higher is better for rates, lower for latencies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ratio: Option<f64>,
    /// What the issue asks of this figure (shown in the table, not in the JSON).
    #[serde(skip)]
    pub(crate) targets: Vec<Target>,
}

/// A target from an issue, checked in the table's last column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Target {
    /// `ratio >= x`.
    Ratio(f64),
    /// `value >= x` (rates).
    AtLeast(f64),
    /// `value <= x` (latencies).
    AtMost(f64),
}

impl Target {
    /// Whether `figure` meets the target; `None` if it cannot tell (no ratio).
    fn met(self, figure: &Figure) -> Option<bool> {
        match self {
            Self::Ratio(x) => figure.ratio.map(|r| r >= x),
            Self::AtLeast(x) => Some(figure.value >= x),
            Self::AtMost(x) => Some(figure.value <= x),
        }
    }

    /// `ratio>=0.8`, `>=2,500`, `<=20`.
    fn describe(self) -> String {
        match self {
            Self::Ratio(x) => format!("ratio>={x}"),
            Self::AtLeast(x) => format!(">={}", short(x)),
            Self::AtMost(x) => format!("<={}", short(x)),
        }
    }
}

impl Figure {
    /// A rate in msgs/s with its floor and the outbox target ([`TARGET_RATIO`]);
    /// values are rounded to 0.1, the ratio to 0.001.
    pub(crate) fn rate(
        bench: &'static str,
        backend: &'static str,
        metric: &'static str,
        value: f64,
        floor: f64,
    ) -> Self {
        Self::new(bench, backend, metric, value, "msgs/s")
            .with_floor(floor)
            .target(Target::Ratio(TARGET_RATIO))
    }

    /// A figure without floor or target: rates (≥ 100) rounded to 0.1, smaller values
    /// (latencies in ms) to 0.01.
    pub(crate) fn new(
        bench: &'static str,
        backend: &'static str,
        metric: &'static str,
        value: f64,
        unit: &'static str,
    ) -> Self {
        Self {
            bench,
            backend,
            metric,
            value: round_value(value),
            unit,
            floor: None,
            ratio: None,
            targets: Vec::new(),
        }
    }

    /// Adds the floor, and the ratio `value / floor` (rounded to 0.001).
    pub(crate) fn with_floor(mut self, floor: f64) -> Self {
        self.ratio = (floor > 0.0).then(|| round(self.value / round_value(floor), 3));
        self.floor = Some(round_value(floor));
        self
    }

    /// Adds a target.
    pub(crate) fn target(mut self, target: Target) -> Self {
        self.targets.push(target);
        self
    }

    /// The table's last column: the targets and whether they are met.
    fn verdict(&self) -> String {
        if self.targets.is_empty() {
            return String::new();
        }
        let wanted: Vec<String> = self.targets.iter().map(|t| t.describe()).collect();
        let missed = self.targets.iter().any(|t| t.met(self) == Some(false));
        let unknown = self.targets.iter().any(|t| t.met(self).is_none());
        let verdict = if missed {
            "MISSED"
        } else if unknown {
            "?"
        } else {
            "ok"
        };
        format!("{} {verdict}", wanted.join(" "))
    }
}

/// Rates rounded to 0.1, values below 100 (latencies) to 0.01.
fn round_value(x: f64) -> f64 {
    if x.abs() >= 100.0 {
        round(x, 1)
    } else {
        round(x, 2)
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
            rows.push([
                f.bench.to_owned(),
                f.backend.to_owned(),
                f.metric.to_owned(),
                number(f.value),
                f.floor.map(number).unwrap_or_default(),
                f.ratio.map(|r| format!("{r:.3}")).unwrap_or_default(),
                f.unit.to_owned(),
                f.verdict(),
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

/// Rates as [`thousands`], values below 100 (latencies in ms) with two decimals.
fn number(x: f64) -> String {
    if x.abs() >= 100.0 {
        thousands(x)
    } else {
        format!("{x:.2}")
    }
}

/// A target's number: `2,500`, `3`, `0.5`.
fn short(x: f64) -> String {
    if x.fract() == 0.0 {
        thousands(x)
    } else {
        format!("{x}")
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

/// Nearest-rank percentile of sorted values.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 50.0), 50.0);
        assert_eq!(percentile(&xs, 99.0), 99.0);
        assert_eq!(percentile(&xs, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

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
        let f = Figure::new("relay", "sqlite", "latency_p50_in_process", 1.234, "ms")
            .target(Target::AtMost(3.0));
        let line = serde_json::to_string(&f).unwrap();
        assert!(!line.contains("floor") && !line.contains("ratio"), "{line}");
        assert!(!line.contains("target"), "{line}");
        assert_eq!(f.value, 1.23);
        assert_eq!(f.verdict(), "<=3 ok");
    }

    #[test]
    fn verdicts() {
        let f = Figure::new("saga", "sqlite", "happy_rate", 2000.0, "sagas/s")
            .with_floor(5000.0)
            .target(Target::AtLeast(2500.0))
            .target(Target::Ratio(0.5));
        assert_eq!(f.ratio, Some(0.4));
        assert_eq!(f.verdict(), ">=2,500 ratio>=0.5 MISSED");
        let f = Figure::rate("outbox", "sqlite", "drain_rate", 900.0, 1000.0);
        assert_eq!(f.verdict(), "ratio>=0.8 ok");
        assert_eq!(number(12.345), "12.35");
        assert_eq!(number(12_345.0), "12,345");
    }
}
