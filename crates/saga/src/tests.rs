//! The engine against a real store, on both backends: scripted agents, and a
//! randomised property test over saga shapes and outcome sequences.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use agentsaga_core::testing::{self, Backend, fresh_url};
use agentsaga_core::{Envelope, Receipt, RetryPolicy, Store, both_backends, header};
use serde_json::{Value, json};

use crate::protocol::{self, StepOutcome};
use crate::{
    CompensationState, Engine, Error, Handled, Plan, PlanStart, PlanStep, PlannedSaga, Saga,
    SagaDefinition, SagaId, SagaState, Step, StepState, query,
};

mod budgets;
mod children;
mod compensations;
mod guardrails;
mod lifecycle;
mod pause;
mod property;
mod recovery;
mod replanning;
mod rewind;
mod schedules;
mod sleeps;
mod timers;

pub(crate) use compensations::booked;

type D = Value;

pub(crate) fn fast() -> RetryPolicy {
    RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(4), 3)
}

/// What the simulated agents did, in delivery order.
#[derive(Debug, Default)]
struct Ledger {
    done: Vec<(SagaId, usize)>,
    undone: Vec<(SagaId, usize)>,
}

/// Delivers everything ready until `until` holds or the deadline passes. `agent`
/// decides each command's outcome (`None`: the agent crashed, no reply); compensations
/// ask `comp`.
struct World {
    store: Store,
    engine: Engine,
    destinations: Vec<String>,
    ledger: Ledger,
    rng: fastrand::Rng,
    duplicate_rate: f64,
    /// What each reply to a command reports it used.
    usage: crate::Usage,
}

impl World {
    async fn new(backend: Backend, defs: Vec<SagaDefinition>, seed: u64) -> Self {
        let store = Store::connect(&fresh_url(backend).await).await.unwrap();
        let engine = Engine::new(defs)
            .unwrap()
            .with_compensation_retry(RetryPolicy::new(
                Duration::from_millis(1),
                Duration::from_millis(4),
                10,
            ));
        let mut destinations = engine.orchestrator_destinations();
        for d in engine.definitions() {
            destinations.extend(d.agent_destinations());
        }
        destinations.sort();
        destinations.dedup();
        Self {
            store,
            engine,
            destinations,
            ledger: Ledger::default(),
            rng: fastrand::Rng::with_seed(seed),
            duplicate_rate: 0.0,
            usage: crate::Usage::default(),
        }
    }

    async fn start(&self, name: &str, data: Value) -> SagaId {
        let mut tx = self.store.begin().await.unwrap();
        let id = self.engine.start(&mut tx, name, &data).await.unwrap();
        tx.commit().await.unwrap();
        id
    }

    async fn pump(
        &mut self,
        sagas: &[SagaId],
        agent: impl FnMut(&mut fastrand::Rng, &Envelope, usize) -> Option<StepOutcome>,
        comp: impl FnMut(&mut fastrand::Rng, &Envelope) -> StepOutcome,
    ) {
        let store = self.store.clone();
        let finished = async || {
            let mut terminal = 0;
            for id in sagas {
                let s = query::get(&store, *id).await.unwrap().unwrap();
                if s.state.is_terminal() || s.state == SagaState::Stuck {
                    terminal += 1;
                }
            }
            terminal == sagas.len()
        };
        self.pump_until("the sagas finish", finished, agent, comp)
            .await;
    }

    /// Delivers until `until` holds (at most 60 s).
    async fn pump_until(
        &mut self,
        what: &str,
        until: impl AsyncFnMut() -> bool,
        mut agent: impl FnMut(&mut fastrand::Rng, &Envelope, usize) -> Option<StepOutcome>,
        mut comp: impl FnMut(&mut fastrand::Rng, &Envelope) -> StepOutcome,
    ) {
        let (store, destinations) = (self.store.clone(), self.destinations.clone());
        testing::pump(
            &store,
            &destinations,
            what,
            Duration::from_secs(60),
            until,
            async |batch| {
                self.rng.shuffle(batch);
                for env in batch.iter() {
                    let times = if self.rng.f64() < self.duplicate_rate {
                        2
                    } else {
                        1
                    };
                    for _ in 0..times {
                        self.deliver(env, &mut agent, &mut comp).await;
                    }
                }
            },
        )
        .await;
    }

    async fn deliver(
        &mut self,
        env: &Envelope,
        agent: &mut impl FnMut(&mut fastrand::Rng, &Envelope, usize) -> Option<StepOutcome>,
        comp: &mut impl FnMut(&mut fastrand::Rng, &Envelope) -> StepOutcome,
    ) {
        let mut tx = self.store.begin().await.unwrap();
        if env.destination.starts_with("saga.") {
            self.engine.handle(&mut tx, env).await.unwrap();
            tx.commit().await.unwrap();
            return;
        }
        if tx.receive(&env.destination, env.id).await.unwrap() == Receipt::Duplicate {
            return;
        }
        let saga: SagaId = env.header(header::SAGA_ID).unwrap().parse().unwrap();
        let step: usize = env.header(protocol::STEP).unwrap().parse().unwrap();
        let out = if env.header(header::KIND) == Some(protocol::KIND_COMPENSATE) {
            let out = comp(&mut self.rng, env);
            if matches!(out, StepOutcome::Ok(_)) {
                self.ledger.undone.push((saga, step));
            }
            Some(out)
        } else {
            let out = agent(&mut self.rng, env, step);
            if matches!(out, Some(StepOutcome::Ok(_))) {
                self.ledger.done.push((saga, step));
            }
            out
        };
        let usage = if env.header(header::KIND) == Some(protocol::KIND_COMPENSATE) {
            crate::Usage::default()
        } else {
            self.usage
        };
        if out.is_none()
            && env.header(header::TIMEOUT_MS).is_some()
            && let Some(notice) = protocol::timed_out(env)
        {
            // What the runtime's agents do with work that runs past the step's
            // timeout: cancel it and report the outcome unknown.
            tx.enqueue(&notice).await.unwrap();
        }
        if let Some(out) = out {
            let reply = protocol::reply(env, &out).unwrap().unwrap();
            tx.enqueue(&protocol::with_usage(reply, &usage))
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }
}

/// The steps of `saga` in `ledger` (the world's done or undone), in order.
fn of(ledger: &[(SagaId, usize)], saga: SagaId) -> Vec<usize> {
    ledger
        .iter()
        .filter(|(s, _)| *s == saga)
        .map(|(_, i)| *i)
        .collect()
}

/// Nothing pending or in flight in the outbox (the tests of pauses and rewinds wait
/// for it).
async fn quiet(store: &Store) -> bool {
    let stats = store.admin().stats().await.unwrap();
    stats.pending + stats.in_flight == 0
}

fn ok() -> StepOutcome {
    StepOutcome::Ok(json!("ok"))
}

/// Agents (for [`World::pump`]) that answer every step's command `ok`, but step
/// `failing`'s fatally with `reason`.
fn fatal_at(
    failing: usize,
    reason: &'static str,
) -> impl FnMut(&mut fastrand::Rng, &Envelope, usize) -> Option<StepOutcome> {
    move |_, _, step| {
        Some(if step == failing {
            StepOutcome::Fatal(reason.into())
        } else {
            ok()
        })
    }
}

fn trip() -> SagaDefinition {
    let undoable = |n: &str| {
        Step::<D>::new(n, format!("{n}-agent"))
            .command(|d: &D| d.clone())
            .on_reply(move |d: &mut D, r: Value| {
                let k = format!("r{}", d.as_object().map_or(0, |o| o.len()));
                d[k] = r;
            })
            .compensate(format!("{n}-agent"), |d: &D| json!({"cancel": d["trip"]}))
            .retry(fast())
            .timeout(Duration::from_millis(300))
    };
    Saga::<D>::builder("trip", 1)
        .step(undoable("flight"))
        .parallel([undoable("hotel"), undoable("car")])
        .pivot(Step::new("charge", "charge-agent").retry(fast()))
        .step(Step::new("confirm", "confirm-agent").retry(fast()))
        .build()
        .unwrap()
}

/// Claims the ready rows of `destination` (leased to "t").
async fn claim_of(store: &Store, destination: &str) -> Vec<Envelope> {
    testing::claim(store, &[destination.to_owned()], 10).await
}
