//! Where a saga's time goes, per step: when each call and each record began
//! ([`Probe`]), and the gaps between them ([`Phases`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agentsaga_saga::SagaId;

use super::setup::STEPS;
use crate::report::percentile;

/// When each saga's calls and records began, per step.
#[derive(Debug, Default)]
pub(super) struct Probe {
    /// `[step]`: saga → when its `call` began.
    pub(super) calls: [Mutex<HashMap<SagaId, Instant>>; 3],
    /// `[step]`: saga → when its `record` began (its transaction is open by then).
    pub(super) records: [Mutex<HashMap<SagaId, Instant>>; 3],
}

impl Probe {
    pub(super) fn note(map: &Mutex<HashMap<SagaId, Instant>>, saga: Option<SagaId>) {
        if let (Some(saga), Ok(mut map)) = (saga, map.lock()) {
            map.entry(saga).or_insert_with(Instant::now);
        }
    }

    pub(super) fn take(map: &Mutex<HashMap<SagaId, Instant>>) -> HashMap<SagaId, Instant> {
        map.lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default()
    }
}

/// Per-saga gaps between phases, ms (each sorted).
#[derive(Debug, Default, Clone)]
pub(super) struct Phases {
    /// Start of the run → the saga's first `call`.
    pub(super) to_first_call: Vec<f64>,
    /// A step's `call` begin → its `record` begin, minus call_ms: waiting for the
    /// transaction (and the inbox insert) after the call.
    pub(super) call_to_record: Vec<f64>,
    /// A step's `record` begin → the next step's `call` begin: the saga's step in the
    /// same transaction (or, with `--answers-via-outbox`, the reply's relay hop and the
    /// orchestrator's transaction), the commit, the next command's relay hop.
    pub(super) hand_off: Vec<f64>,
    /// When the first and last `call` of each step began, ms from the run's start.
    pub(super) call_spread: [(f64, f64); 3],
}

impl Phases {
    pub(super) fn of(probe: &Probe, begin: Instant, call: Duration) -> Self {
        let calls: Vec<_> = probe.calls.iter().map(Probe::take).collect();
        let records: Vec<_> = probe.records.iter().map(Probe::take).collect();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let mut phases = Self::default();
        for (saga, at) in &calls[0] {
            phases.to_first_call.push(ms(at.duration_since(begin)));
            for step in 0..STEPS.len() {
                let (Some(c), Some(r)) = (calls[step].get(saga), records[step].get(saga)) else {
                    continue;
                };
                phases
                    .call_to_record
                    .push(ms(r.duration_since(*c)) - ms(call));
                if let Some(next) = calls.get(step + 1).and_then(|m| m.get(saga)) {
                    phases.hand_off.push(ms(next.duration_since(*r)));
                }
            }
        }
        for (step, map) in calls.iter().enumerate() {
            let first = map
                .values()
                .min()
                .map_or(0.0, |t| ms(t.duration_since(begin)));
            let last = map
                .values()
                .max()
                .map_or(0.0, |t| ms(t.duration_since(begin)));
            phases.call_spread[step] = (first, last);
        }
        for v in [
            &mut phases.to_first_call,
            &mut phases.call_to_record,
            &mut phases.hand_off,
        ] {
            v.sort_by(f64::total_cmp);
        }
        phases
    }

    /// One line: p50 / max of each gap, and when each step's calls began.
    pub(super) fn describe(&self) -> String {
        let gap = |v: &[f64]| {
            format!(
                "p50 {:.0} / p99 {:.0} / max {:.0} ms",
                percentile(v, 50.0),
                percentile(v, 99.0),
                v.last().copied().unwrap_or_default()
            )
        };
        let spread: Vec<String> = self
            .call_spread
            .iter()
            .zip(STEPS)
            .map(|((first, last), (name, _))| format!("{name} {first:.0}-{last:.0}"))
            .collect();
        format!(
            "run start -> first call {}; call end -> record (waiting for the transaction) \
             {}; record -> next step's call (the saga's step, commit, command hop) \
             {}; calls began at (ms from run start) {}",
            gap(&self.to_first_call),
            gap(&self.call_to_record),
            gap(&self.hand_off),
            spread.join(", ")
        )
    }
}
