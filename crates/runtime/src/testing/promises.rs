//! What `docs/guarantees.md` promises about one saga, checked from what happened
//! ([`TestRuntime::check_promises`]), and over many seeds of random faults
//! ([`RandomFaults`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::ops::Range;

use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::query;
use agentsaga_saga::{CompensationState, SagaId, SagaState};
use serde_json::Value;

use super::{Action, Entry, TestRuntime};
use crate::{Error, Result, RuntimeBuilder};

/// The environment variable that runs one seed of [`RandomFaults::check`] alone.
pub const SEED_VAR: &str = "AGENTSAGA_SEED";

/// The seeds a run of random faults takes: `default`, or the one seed named by the
/// environment variable `AGENTSAGA_SEED` (to run a failing seed alone).
///
/// # Errors
/// [`Error::PromiseBroken`] for an `AGENTSAGA_SEED` that is not a number.
pub fn seeds(default: Range<u64>) -> Result<Range<u64>> {
    match std::env::var(SEED_VAR) {
        Ok(seed) => {
            let seed: u64 = seed.trim().parse().map_err(|e| {
                Error::PromiseBroken(format!("{SEED_VAR}={seed:?} is not a seed: {e}"))
            })?;
            Ok(seed..seed.saturating_add(1))
        }
        Err(_) => Ok(default),
    }
}

impl TestRuntime {
    /// Checks that saga `id` kept the promises of `docs/guarantees.md`, from its
    /// [`ledger`](Self::ledger) and its steps' rows:
    ///
    /// - it has ended: completed, compensated, aborted, or stuck with its reason;
    /// - each step's command took effect at most once, and each compensation too;
    /// - no compensation took effect before its step's command (an undo never
    ///   overtakes its do);
    /// - compensations took effect stage by stage, latest first;
    /// - the pivot held: nothing after it was undone, and once it (or a step after
    ///   it) took effect nothing was undone and the saga did not end compensated;
    /// - a completed saga undid nothing; a compensated one undid every step that
    ///   took effect and has something to undo, and left no compensation unfinished;
    /// - a rewind (`Engine::rewind`) went back on a run of each step it undid: that
    ///   run's command, then its compensation after it, are set aside, and the rest is
    ///   judged as above;
    /// - one saga, one trace: its spans are all in one trace
    ///   ([`trace`](Self::trace)), across retries, faults, restarts and crashes.
    ///
    /// # Errors
    /// [`Error::PromiseBroken`] saying what broke; a store error; the saga unknown.
    pub async fn check_promises(&self, id: SagaId) -> Result<()> {
        let store = self.runtime.store();
        let Some(saga) = query::get(store, id).await? else {
            return Err(Error::Saga(agentsaga_saga::Error::NotFound(id)));
        };
        let steps: Vec<Row> = query::steps(store, id)
            .await?
            .iter()
            .filter_map(|s| {
                Some(Row {
                    idx: usize::try_from(s.idx).ok()?,
                    stage: s.stage,
                    undo: s.compensation_state,
                })
            })
            .collect();
        let data = query::data(store, id).await?.unwrap_or(Value::Null);
        let pivot = match self
            .runtime
            .engine()
            .definitions()
            .find(|d| d.name() == saga.name && d.version() == saga.version)
        {
            Some(def) => def.pivot_for(&data)?,
            None => None,
        };
        let ended = Ended {
            state: saga.state,
            error: saga.error.as_deref(),
            pivot,
        };
        let traced = self.trace(id).map(|_| ()).map_err(|e| e.to_string());
        let rewinds = query::rewinds(store, id).await?;
        past_rewinds(&self.ledger(id), &rewinds)
            .and_then(|ledger| judge(&ended, &ledger, &steps))
            .and(traced)
            .map_err(|why| {
                Error::PromiseBroken(format!(
                    "saga {id} ({} v{}, {}): {why}",
                    saga.name,
                    saga.version,
                    saga.state.as_str()
                ))
            })
    }
}

/// The ledger less what the saga's `rewinds` went back on (`Engine::rewind`): for
/// each step a rewind undid, the command of its run before the rewind and, if the
/// rewind undid it by its compensation, that compensation, after it. What is left is
/// judged as any saga's ledger: a step's later run is its run.
fn past_rewinds(
    ledger: &[Entry],
    rewinds: &[agentsaga_saga::Rewind],
) -> std::result::Result<Vec<Entry>, String> {
    let mut left: Vec<Option<&Entry>> = ledger.iter().map(Some).collect();
    let find = |left: &[Option<&Entry>], u: &agentsaga_saga::UndoneStep, action: Action| {
        left.iter().position(|e| {
            e.is_some_and(|e| e.idx == u.idx && e.step == u.name && e.action == action)
        })
    };
    for r in rewinds.iter().filter(|r| r.done_ms.is_some()) {
        for u in &r.undone {
            // Only a run that succeeded took effect (a wait has no agent at all).
            if u.output.is_none() {
                continue;
            }
            // A wait or a sleep has no agent: nothing took effect.
            let Some(done) = find(&left, u, Action::Done) else {
                continue;
            };
            left[done] = None;
            if u.compensation != Some(CompensationState::Done) {
                continue;
            }
            match find(&left, u, Action::Undone) {
                Some(at) if at > done => left[at] = None,
                Some(_) => {
                    return Err(format!(
                        "step `{}`'s compensation (rewind to `{}`) took effect before its command",
                        u.name, r.to
                    ));
                }
                None => {
                    return Err(format!(
                        "the rewind to `{}` undid step `{}`, yet its compensation never took effect",
                        r.to, u.name
                    ));
                }
            }
        }
    }
    Ok(left.into_iter().flatten().cloned().collect())
}

/// A step's row, as [`judge`] needs it.
struct Row {
    idx: usize,
    stage: i64,
    /// Where its compensation stands.
    undo: Option<CompensationState>,
}

impl TestRuntime {
    /// [`check_promises`](Self::check_promises) of every saga in the database (child
    /// sagas included), up to the 10,000 newest: a random run starts one saga and its
    /// children.
    async fn check_all(&self) -> Result<()> {
        let filter = query::ListFilter {
            limit: 10_000,
            ..query::ListFilter::default()
        };
        for saga in query::list(self.runtime.store(), &filter).await? {
            self.check_promises(saga.id).await?;
        }
        Ok(())
    }
}

/// How a saga ended, as [`judge`] needs it.
struct Ended<'a> {
    state: SagaState,
    error: Option<&'a str>,
    pivot: Option<usize>,
}

/// The first promise `ledger` and `steps` show broken, if any.
fn judge(saga: &Ended<'_>, ledger: &[Entry], steps: &[Row]) -> std::result::Result<(), String> {
    let name = |idx: usize| {
        ledger
            .iter()
            .find(|e| e.idx == idx)
            .map_or_else(|| format!("#{idx}"), |e| format!("`{}`", e.step))
    };
    match saga.state {
        SagaState::Running | SagaState::Compensating => {
            return Err("it has not ended (a wait for a signal no one sent?)".into());
        }
        SagaState::Stuck if saga.error.is_none() => {
            return Err("it is stuck without a reason".into());
        }
        _ => {}
    }
    let mut seen: HashMap<(usize, Action), usize> = HashMap::new();
    for (at, e) in ledger.iter().enumerate() {
        if let Some(first) = seen.insert((e.idx, e.action), at) {
            let what = match e.action {
                Action::Done => "command",
                Action::Undone => "compensation",
            };
            return Err(format!(
                "step {}'s {what} took effect twice (entries {first} and {at} of its ledger)",
                name(e.idx)
            ));
        }
    }
    for (&(idx, action), &at) in &seen {
        if action == Action::Undone
            && let Some(&done) = seen.get(&(idx, Action::Done))
            && done > at
        {
            return Err(format!(
                "step {}'s compensation took effect before its command",
                name(idx)
            ));
        }
    }
    let stage_of: HashMap<usize, i64> = steps.iter().map(|s| (s.idx, s.stage)).collect();
    let undone: Vec<&Entry> = ledger
        .iter()
        .filter(|e| e.action == Action::Undone)
        .collect();
    for pair in undone.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if stage_of.get(&a.idx) < stage_of.get(&b.idx) {
            return Err(format!(
                "step {} was undone before step {}, a later stage: compensations run latest first",
                name(a.idx),
                name(b.idx)
            ));
        }
    }
    if let Some(p) = saga.pivot {
        if let Some(e) = undone.iter().find(|e| e.idx > p) {
            return Err(format!("step {}, after the pivot, was undone", name(e.idx)));
        }
        let passed = ledger
            .iter()
            .any(|e| e.action == Action::Done && e.idx >= p);
        if passed && let Some(e) = undone.first() {
            return Err(format!(
                "the pivot took effect, yet step {} was undone",
                name(e.idx)
            ));
        }
        if passed && saga.state == SagaState::Compensated {
            return Err("the pivot took effect, yet the saga ended compensated".into());
        }
    }
    match saga.state {
        SagaState::Completed => {
            if let Some(e) = undone.first() {
                return Err(format!("it completed, yet step {} was undone", name(e.idx)));
            }
        }
        SagaState::Compensated => compensated(ledger, steps, &seen, &name)?,
        _ => {}
    }
    Ok(())
}

/// A compensated saga's promises: every step that took effect and has something to
/// undo was undone, and no compensation was left unfinished.
fn compensated(
    ledger: &[Entry],
    steps: &[Row],
    seen: &HashMap<(usize, Action), usize>,
    name: &dyn Fn(usize) -> String,
) -> std::result::Result<(), String> {
    for s in steps {
        let idx = s.idx;
        let owes = !matches!(s.undo, None | Some(CompensationState::NotNeeded));
        if owes
            && seen.contains_key(&(idx, Action::Done))
            && !seen.contains_key(&(idx, Action::Undone))
            && s.undo != Some(CompensationState::Skipped)
        {
            return Err(format!(
                "step {} took effect and was never undone ({} entries in its ledger)",
                name(idx),
                ledger.len()
            ));
        }
        if matches!(
            s.undo,
            Some(
                CompensationState::Recorded
                    | CompensationState::Dispatched
                    | CompensationState::Failed
            )
        ) && seen.contains_key(&(idx, Action::Done))
        {
            return Err(format!(
                "step {}'s compensation is left {:?}",
                name(idx),
                s.undo
            ));
        }
    }
    Ok(())
}

/// Runs a saga under random faults, once per seed, each run on a fresh
/// [`TestRuntime`], and checks its promises ([`TestRuntime::check_promises`]).
///
/// ```no_run
/// # use agentsaga_runtime::{Runtime, RuntimeBuilder, testing::RandomFaults};
/// # fn trip() -> RuntimeBuilder { Runtime::builder() }
/// # async fn demo() -> agentsaga_runtime::Result<()> {
/// let report = RandomFaults::new(0..50)
///     .check(trip, "trip", &serde_json::json!({ "city": "Lisbon" }))
///     .await?; // Err names the seed that broke a promise, and how to run it alone
/// assert!(report.ended("compensated") > 0, "{report}");
/// # Ok(()) }
/// ```
///
/// With the environment variable `AGENTSAGA_SEED=N` set, only seed `N` runs.
#[derive(Debug, Clone)]
pub struct RandomFaults {
    seeds: Range<u64>,
    rate: f64,
}

impl RandomFaults {
    /// One run per seed in `seeds`, faulting a fifth of the deliveries.
    pub fn new(seeds: Range<u64>) -> Self {
        Self { seeds, rate: 0.2 }
    }

    /// The share of deliveries faulted, 0 to 1 (default 0.2).
    #[must_use]
    pub fn rate(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }

    /// For each seed: starts the runtime `runtime()` builds on a fresh
    /// [`TestRuntime`], draws random faults from the seed
    /// ([`TestRuntime::random_faults`]), starts saga `name` with `input`, runs it to
    /// its end and checks the promises of every saga it ran (its child sagas too).
    ///
    /// # Errors
    /// [`Error::PromiseBroken`] for the first seed whose saga broke a promise or did
    /// not come to rest, naming the seed and how to run it alone; an
    /// `AGENTSAGA_SEED` that is not a number; a runtime that does not start.
    pub async fn check(
        &self,
        runtime: impl Fn() -> RuntimeBuilder,
        name: &str,
        input: &Value,
    ) -> Result<Report> {
        let sqlite = async || fresh_url(Backend::Sqlite).await;
        self.check_on(sqlite, runtime, name, input).await
    }

    /// [`check`](Self::check) on databases of your own: `database()` gives each seed's
    /// run a fresh one (its URL: a PostgreSQL database no one else uses, see
    /// [`TestRuntime::start_on`]).
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn check_on(
        &self,
        database: impl AsyncFn() -> String,
        runtime: impl Fn() -> RuntimeBuilder,
        name: &str,
        input: &Value,
    ) -> Result<Report> {
        let seeds = seeds(self.seeds.clone())?;
        let mut report = Report::default();
        for seed in seeds {
            let t = TestRuntime::start_on(&database().await, runtime()).await?;
            t.random_faults(seed, self.rate);
            let id = t.start_saga(name, input).await?;
            let run = match t.run_to_end(id).await {
                Ok(state) => t.check_all().await.map(|()| state),
                Err(e) => Err(e),
            };
            let drawn = t.faults_drawn();
            t.shutdown().await;
            let state = run.map_err(|e| {
                let why = match e {
                    Error::PromiseBroken(why) => why,
                    e => e.to_string(),
                };
                Error::PromiseBroken(format!(
                    "seed {seed} (faults {drawn:?}): {why}; run it alone with {SEED_VAR}={seed}"
                ))
            })?;
            report.runs += 1;
            *report.ends.entry(state.as_str().to_owned()).or_default() += 1;
            for (kind, n) in drawn {
                *report.faults.entry(kind).or_default() += n;
            }
        }
        Ok(report)
    }
}

/// What a [`RandomFaults::check`] ran: how its sagas ended and which faults it drew,
/// so that a test can tell that the faults did bite.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Sagas run (one per seed).
    pub runs: u64,
    /// How many ended in each state (`completed`, `compensated`, `stuck`, …).
    pub ends: BTreeMap<String, u64>,
    /// Faults drawn, by kind.
    pub faults: BTreeMap<String, u64>,
}

impl Report {
    /// How many ended in state `state` (`completed`, `compensated`, `stuck`, …).
    pub fn ended(&self, state: &str) -> u64 {
        self.ends.get(state).copied().unwrap_or(0)
    }

    /// How many faults of `kind` were drawn (`retryable`, `fatal`, `timed out`,
    /// `dead letter`, `twice`).
    pub fn drawn(&self, kind: &str) -> u64 {
        self.faults.get(kind).copied().unwrap_or(0)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = format!("{} runs;", self.runs);
        for (state, n) in &self.ends {
            let _ = write!(s, " {n} {state}");
        }
        s.push_str("; faults:");
        for (kind, n) in &self.faults {
            let _ = write!(s, " {n} {kind}");
        }
        f.write_str(&s)
    }
}

#[cfg(test)]
mod tests;
