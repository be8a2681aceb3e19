//! The engine against a real store, on both backends: scripted agents, and a
//! randomised property test over saga shapes and outcome sequences.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use agentsaga_core::queue::Claim;
use agentsaga_core::testing::{self, Backend, fresh_url};
use agentsaga_core::{Envelope, Receipt, RetryPolicy, Store, both_backends, header};
use serde_json::{Value, json};

use crate::protocol::{self, StepOutcome};
use crate::{
    CompensationState, Engine, Error, Handled, Plan, PlanStart, PlanStep, PlannedSaga, Saga,
    SagaDefinition, SagaId, SagaState, Step, StepState, query,
};

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
        mut agent: impl FnMut(&mut fastrand::Rng, &Envelope, usize) -> Option<StepOutcome>,
        mut comp: impl FnMut(&mut fastrand::Rng, &Envelope) -> StepOutcome,
    ) {
        let (store, destinations) = (self.store.clone(), self.destinations.clone());
        testing::pump(
            &store,
            &destinations,
            "the sagas finish",
            Duration::from_secs(60),
            async || {
                let mut terminal = 0;
                for id in sagas {
                    let s = query::get(&store, *id).await.unwrap().unwrap();
                    if s.state.is_terminal() || s.state == SagaState::Stuck {
                        terminal += 1;
                    }
                }
                terminal == sagas.len()
            },
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
            tx.enqueue(&reply).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
}

fn ok() -> StepOutcome {
    StepOutcome::Ok(json!("ok"))
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

async fn happy_path(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 1).await;
    let id = w.start("trip", json!({"trip": 1})).await;
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed);
    assert_eq!(w.ledger.done.len(), 5);
    assert!(w.ledger.undone.is_empty());
    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(steps.len(), 5);
    assert!(steps.iter().all(|s| s.state == StepState::Succeeded));
    // The ledger was written with each dispatch, and never used.
    assert_eq!(
        steps[0].compensation_state,
        Some(CompensationState::Recorded)
    );
    assert_eq!(
        steps[0]
            .compensation_payload
            .as_deref()
            .map(|p| p.contains("cancel")),
        Some(true)
    );
    assert_eq!(
        steps[3].compensation_state, None,
        "the pivot has no compensation"
    );
    // Every timer was cancelled when its step replied: nothing left pending.
    assert_eq!(w.store.admin().stats().await.unwrap().pending, 0);
}
both_backends!(happy_path_tests, happy_path);

// The two replies of a parallel stage handled at the same time, in two transactions:
// the second waits for the first (the instance lock on PostgreSQL, the single writer on
// SQLite) and must then read the first's step update, or neither would see the stage
// complete and the saga would never move on.
async fn concurrent_replies_of_a_parallel_stage(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 1).await;
    let id = w.start("trip", json!({"trip": 1})).await;
    let claim_all = |store: Store, destinations: Vec<String>| async move {
        let batch = testing::claim(&store, &destinations, 64).await;
        let seqs: Vec<i64> = batch.iter().map(|e| e.seq).collect();
        store.queue().mark_delivered("t", &seqs).await.unwrap();
        batch
    };
    let mut agent = |_: &mut fastrand::Rng, _: &Envelope, _: usize| Some(ok());
    let mut comp = |_: &mut fastrand::Rng, _: &Envelope| ok();
    // The flight's command, its reply, then the hotel's and the car's commands.
    for expect in [1, 1, 2] {
        let batch = claim_all(w.store.clone(), w.destinations.clone()).await;
        assert_eq!(batch.len(), expect);
        for env in &batch {
            w.deliver(env, &mut agent, &mut comp).await;
        }
    }
    let replies = claim_all(w.store.clone(), w.destinations.clone()).await;
    assert_eq!(replies.len(), 2, "the hotel's and the car's replies");
    assert!(replies.iter().all(|e| e.destination.starts_with("saga.")));

    let mut first = w.store.begin().await.unwrap();
    w.engine.handle(&mut first, &replies[0]).await.unwrap();
    let (store, engine, second_reply) = (w.store.clone(), w.engine.clone(), replies[1].clone());
    let second = tokio::spawn(async move {
        let mut tx = store.begin().await.unwrap();
        let handled = engine.handle(&mut tx, &second_reply).await.unwrap();
        tx.commit().await.unwrap();
        handled
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!second.is_finished(), "the second reply did not wait");
    first.commit().await.unwrap();
    second.await.unwrap();

    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(steps.len(), 4, "the pivot was dispatched: {steps:?}");
    assert!(steps[..3].iter().all(|s| s.state == StepState::Succeeded));
    let next = claim_all(w.store.clone(), w.destinations.clone()).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].destination, "charge-agent");
}
both_backends!(
    concurrent_replies_tests,
    concurrent_replies_of_a_parallel_stage
);

async fn fatal_failure_compensates_in_reverse(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 2).await;
    let id = w.start("trip", json!({"trip": 2})).await;
    // The pivot (step 3) declines: flight, then the hotel+car group, are undone.
    w.pump(
        &[id],
        |_, _, step| {
            Some(if step == 3 {
                StepOutcome::Fatal("card declined".into())
            } else {
                ok()
            })
        },
        |_, _| ok(),
    )
    .await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    assert!(s.error.unwrap().contains("card declined"));
    let undone: Vec<usize> = w.ledger.undone.iter().map(|(_, i)| *i).collect();
    assert_eq!(undone.len(), 3);
    assert_eq!(undone[2], 0, "the flight is undone last: {undone:?}");
    assert_eq!(
        undone[..2].iter().collect::<HashSet<_>>(),
        [1, 2].iter().collect()
    );
}
both_backends!(fatal_tests, fatal_failure_compensates_in_reverse);

async fn retryable_then_success_and_timeouts(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 3).await;
    let id = w.start("trip", json!({"trip": 3})).await;
    let mut calls: HashMap<usize, u32> = HashMap::new();
    // Flight: retryable twice then ok. Confirm (after the pivot): the agent "crashes"
    // (no reply) twice, then answers; no timeout is set on it, so retryable answers
    // drive it: retryable 5 times (beyond the 3-attempt budget: after the pivot there is
    // no budget), then ok.
    w.pump(
        &[id],
        |_, _, step| {
            let n = calls.entry(step).or_default();
            *n += 1;
            Some(match (step, *n) {
                (0, 1..=2) => StepOutcome::Retryable("flaky".into()),
                (4, 1..=5) => StepOutcome::Retryable("smtp down".into()),
                _ => ok(),
            })
        },
        |_, _| ok(),
    )
    .await;
    assert_eq!(
        query::get(&w.store, id).await.unwrap().unwrap().state,
        SagaState::Completed
    );
    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(steps[0].attempts, 3);
    assert_eq!(steps[4].attempts, 6);
}
both_backends!(retry_tests, retryable_then_success_and_timeouts);

async fn timeout_compensates_the_unknown_step_too(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 4).await;
    let id = w.start("trip", json!({"trip": 4})).await;
    // The car agent never answers: after its timeout the saga compensates the car
    // (outcome unknown), the hotel and the flight.
    w.pump(
        &[id],
        |_, _, step| if step == 2 { None } else { Some(ok()) },
        |_, _| ok(),
    )
    .await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    assert!(s.error.unwrap().contains("timed out"));
    let mut undone: Vec<usize> = w.ledger.undone.iter().map(|(_, i)| *i).collect();
    assert_eq!(undone.pop(), Some(0));
    undone.sort();
    assert_eq!(undone, vec![1, 2]);
}
both_backends!(timeout_tests, timeout_compensates_the_unknown_step_too);

async fn stuck_compensation_and_operator_actions(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 5).await;
    let id = w.start("trip", json!({"trip": 5})).await;
    // The flight's cancellation always fails: stuck after 10 attempts.
    let fail_flight = |_: &mut fastrand::Rng, e: &Envelope| {
        if e.destination == "flight-agent" {
            StepOutcome::Fatal("cancel API down".into())
        } else {
            ok()
        }
    };
    w.pump(
        &[id],
        |_, _, step| {
            Some(if step == 1 {
                StepOutcome::Fatal("no rooms".into())
            } else {
                ok()
            })
        },
        fail_flight,
    )
    .await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Stuck);
    assert!(
        s.error.as_deref().unwrap().contains("cancel API down"),
        "{s:?}"
    );
    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(steps[0].compensation_state, Some(CompensationState::Failed));
    assert_eq!(steps[0].compensation_attempts, 10);

    // Abort refuses (a compensation failed) and changes nothing.
    let mut tx = w.store.begin().await.unwrap();
    assert!(matches!(
        w.engine.abort(&mut tx, id).await,
        Err(Error::WrongState { .. })
    ));
    tx.rollback().await.unwrap();
    // Retry: it fails again 10 times, still stuck.
    let mut tx = w.store.begin().await.unwrap();
    assert_eq!(
        w.engine.retry(&mut tx, id).await.unwrap(),
        SagaState::Compensating
    );
    tx.commit().await.unwrap();
    w.pump(&[id], |_, _, _| Some(ok()), fail_flight).await;
    assert_eq!(
        query::get(&w.store, id).await.unwrap().unwrap().state,
        SagaState::Stuck
    );
    // Skip: recorded as skipped by hand, and the saga ends compensated.
    let mut tx = w.store.begin().await.unwrap();
    assert_eq!(
        w.engine.skip(&mut tx, id).await.unwrap(),
        SagaState::Compensated
    );
    tx.commit().await.unwrap();
    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(
        steps[0].compensation_state,
        Some(CompensationState::Skipped)
    );
    assert!(
        steps[0]
            .compensation_error
            .as_deref()
            .unwrap()
            .contains("skipped by an operator")
    );
    // A terminal saga refuses every action.
    let mut tx = w.store.begin().await.unwrap();
    for r in [
        w.engine.abort(&mut tx, id).await,
        w.engine.retry(&mut tx, id).await,
        w.engine.skip(&mut tx, id).await,
    ] {
        assert!(
            matches!(
                r,
                Err(Error::WrongState {
                    state: SagaState::Compensated,
                    ..
                })
            ),
            "{r:?}"
        );
    }
    assert!(matches!(
        w.engine.abort(&mut tx, SagaId::new()).await,
        Err(Error::NotFound(_))
    ));
}
both_backends!(stuck_tests, stuck_compensation_and_operator_actions);

async fn abort_running_and_versions(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 6).await;
    let id = w.start("trip", json!({"trip": 6})).await;
    let mut tx = w.store.begin().await.unwrap();
    assert_eq!(
        w.engine.abort(&mut tx, id).await.unwrap(),
        SagaState::Compensating
    );
    tx.commit().await.unwrap();
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    assert!(s.error.unwrap().contains("aborted by an operator"));

    // Unknown saga name: a typed error, nothing written.
    let mut tx = w.store.begin().await.unwrap();
    assert!(matches!(
        w.engine.start(&mut tx, "nope", &json!({})).await,
        Err(Error::UnknownSaga(_))
    ));
    tx.rollback().await.unwrap();

    // An instance of a version this engine lacks is not advanced.
    let v2 = Saga::<D>::builder("trip", 2)
        .step(Step::new("only", "only-agent").nothing_to_undo())
        .build()
        .unwrap();
    let engine_v2 = Engine::new([v2]).unwrap();
    let mut tx = w.store.begin().await.unwrap();
    let old = w
        .engine
        .start(&mut tx, "trip", &json!({"trip": 7}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let dests = vec!["flight-agent".to_string()];
    let cmd = w
        .store
        .queue()
        .claim(&Claim {
            owner: "t",
            destinations: &dests,
            limit: 1,
            lease: Duration::from_secs(5),
        })
        .await
        .unwrap()
        .remove(0);
    let mut tx = w.store.begin().await.unwrap();
    let reply = protocol::reply(&cmd, &ok()).unwrap().unwrap();
    assert_eq!(reply.destination, "saga.trip.v1");
    tx.enqueue(&reply).await.unwrap();
    tx.commit().await.unwrap();
    let orch = vec!["saga.trip.v1".to_string()];
    let env = w
        .store
        .queue()
        .claim(&Claim {
            owner: "t",
            destinations: &orch,
            limit: 1,
            lease: Duration::from_secs(5),
        })
        .await
        .unwrap()
        .remove(0);
    let mut tx = w.store.begin().await.unwrap();
    assert!(matches!(
        engine_v2.handle(&mut tx, &env).await,
        Err(Error::VersionNotRegistered { version: 1, .. })
    ));
    tx.rollback().await.unwrap();
    // The version-1 engine takes it.
    let mut tx = w.store.begin().await.unwrap();
    assert!(matches!(
        w.engine.handle(&mut tx, &env).await.unwrap(),
        Handled::Advanced { .. }
    ));
    // A duplicate of it is recognised in the same transaction.
    assert_eq!(
        w.engine.handle(&mut tx, &env).await.unwrap(),
        Handled::Duplicate
    );
    tx.commit().await.unwrap();
    assert_eq!(
        query::steps(&w.store, old).await.unwrap()[0].state,
        StepState::Succeeded
    );
}
both_backends!(abort_version_tests, abort_running_and_versions);

/// A random saga's shape, built twice: as a typed definition and as a plan (run by
/// the planned saga `planned`), with the same steps, stages, waits and pivot.
struct Shape {
    def: SagaDefinition,
    plan: Plan,
    pivot: Option<usize>,
    /// stage_of[i]: the stage index of step i.
    stage_of: Vec<usize>,
    waits: Vec<String>,
}

/// A random saga: 1–8 steps, maybe a pivot, maybe one parallel group; all steps time
/// out quickly so that a crashed agent is noticed.
fn random_saga(rng: &mut fastrand::Rng, name: &str) -> Shape {
    let n = rng.usize(1..=8);
    let pivot = if rng.bool() {
        Some(rng.usize(0..n))
    } else {
        None
    };
    let group = if n >= 3 && rng.bool() {
        Some(rng.usize(0..n - 1))
    } else {
        None
    };
    let timeout = Duration::from_millis(400);
    let step = |i: usize| {
        Step::<D>::new(format!("s{i}"), format!("a{i}"))
            .retry(fast())
            .timeout(timeout)
    };
    let undo = |i: usize| step(i).compensate(format!("a{i}"), move |_: &D| json!({"undo": i}));
    let planned = |i: usize| PlanStep::command(format!("s{i}"), format!("a{i}"), json!({}));
    let planned_undo = |i: usize| planned(i).compensate(format!("a{i}"), json!({ "undo": i }));
    let mut stage_of = Vec::new();
    let mut waits = Vec::new();
    let mut plan = Plan::new();
    let mut b = Saga::<D>::builder(name, 1);
    let mut i = 0;
    let mut stage = 0;
    let before_pivot_end = pivot.unwrap_or(n);
    while i < before_pivot_end {
        if group == Some(i) && i + 1 < before_pivot_end {
            b = b.parallel([undo(i), undo(i + 1)]);
            plan = plan.parallel([planned_undo(i), planned_undo(i + 1)]);
            stage_of.extend([stage, stage]);
            i += 2;
        } else if rng.u8(0..5) == 0 {
            b = b.step(step(i).nothing_to_undo());
            plan = plan.then(planned(i).nothing_to_undo());
            stage_of.push(stage);
            i += 1;
        } else if rng.u8(0..5) == 0 {
            // A wait for a signal: approved, rejected or never sent (it times out).
            let w = format!("w{i}");
            b = b.step(Step::wait_for(w.clone()).timeout(timeout));
            plan = plan.then(PlanStep::wait_for(w.clone(), w.clone()).timeout(timeout));
            waits.push(w);
            stage_of.push(stage);
            i += 1;
        } else {
            b = b.step(undo(i));
            plan = plan.then(planned_undo(i));
            stage_of.push(stage);
            i += 1;
        }
        stage += 1;
    }
    let def = match pivot {
        None => b.build().unwrap(),
        Some(p) => {
            let mut a = b.pivot(step(p));
            plan = plan.then(planned(p).pivot());
            stage_of.push(stage);
            stage += 1;
            for j in p + 1..n {
                a = a.step(step(j));
                plan = plan.then(planned(j));
                stage_of.push(stage);
                stage += 1;
            }
            a.build().unwrap()
        }
    };
    Shape {
        def,
        plan,
        pivot,
        stage_of,
        waits,
    }
}

/// The planned saga that runs the shapes' plans: their steps' retries and timeouts as
/// the typed definitions'.
fn planned_saga() -> SagaDefinition {
    PlannedSaga::builder("planned", 1)
        .destinations((0..8).map(|i| format!("a{i}")))
        .retry(fast())
        .step_timeout(Duration::from_millis(400))
        .build()
        .unwrap()
}

async fn property_random_sagas(backend: Backend) {
    let mut signals = 0;
    for seed in 0..2u64 {
        let mut rng = fastrand::Rng::with_seed(seed * 7919 + 13);
        let shapes: Vec<Shape> = (0..16)
            .map(|i| random_saga(&mut rng, &format!("p{i}")))
            .collect();
        let mut defs: Vec<_> = shapes.iter().map(|s| s.def.clone()).collect();
        defs.push(planned_saga());
        let mut w = World::new(backend, defs, seed).await;
        w.duplicate_rate = 0.2;
        // Each shape twice: its typed saga, and its plan.
        let mut ids: Vec<(SagaId, &Shape, String)> = Vec::new();
        for shape in &shapes {
            let typed = w.start(shape.def.name(), json!({})).await;
            ids.push((typed, shape, shape.def.name().to_owned()));
            let start = PlanStart::new(shape.plan.clone(), Value::Null).unwrap();
            let planned = w.start("planned", json!(start)).await;
            ids.push((planned, shape, format!("{} (planned)", shape.def.name())));
        }
        // Each wait's signal, sent now (before any saga reaches its wait: kept until it
        // does): approved, rejected, approved twice (the second changes nothing), or
        // none (the wait times out). Rejected and timed-out waits compensate.
        let mut refused: HashSet<SagaId> = HashSet::new();
        for (id, shape, _) in &ids {
            for name in &shape.waits {
                let choice = rng.u8(0..4);
                if choice < 2 {
                    refused.insert(*id);
                }
                let signal = match choice {
                    0 => continue,
                    1 => crate::Signal::Reject("no".into()),
                    _ => crate::Signal::Approve(json!(null)),
                };
                let mut tx = w.store.begin().await.unwrap();
                let got = Engine::signal(&mut tx, *id, name, signal.clone())
                    .await
                    .unwrap();
                assert_eq!(got, crate::SignalReceipt::Recorded);
                if choice == 3 {
                    let again = Engine::signal(&mut tx, *id, name, signal).await.unwrap();
                    assert_eq!(again, crate::SignalReceipt::Duplicate);
                }
                tx.commit().await.unwrap();
                signals += 1;
            }
        }
        let pivots: HashMap<SagaId, Option<usize>> =
            ids.iter().map(|(id, s, _)| (*id, s.pivot)).collect();
        let saga_ids: Vec<SagaId> = ids.iter().map(|(i, _, _)| *i).collect();
        w.pump(
            &saga_ids,
            |rng, env, step| {
                let saga: SagaId = env.header(header::SAGA_ID).unwrap().parse().unwrap();
                let after_pivot = pivots[&saga].is_some_and(|p| step > p);
                match rng.u8(0..100) {
                    0..=69 => Some(ok()),
                    70..=79 => Some(StepOutcome::Retryable("flaky".into())),
                    80..=91 if !after_pivot => Some(StepOutcome::Fatal("no".into())),
                    80..=91 => Some(ok()),
                    _ => None, // crashed: no answer, the step times out
                }
            },
            |rng, _| {
                if rng.u8(0..100) < 25 {
                    StepOutcome::Retryable("undo flaky".into())
                } else {
                    ok()
                }
            },
        )
        .await;

        let mut ends = HashMap::new();
        for (id, shape, name) in &ids {
            let s = query::get(&w.store, *id).await.unwrap().unwrap();
            *ends.entry(s.state).or_insert(0) += 1;
            assert!(
                matches!(s.state, SagaState::Completed | SagaState::Compensated),
                "saga {name} ended {}: {:?}",
                s.state,
                s.error
            );
            if refused.contains(id) {
                assert_eq!(
                    s.state,
                    SagaState::Compensated,
                    "{name}: a rejected or unsignalled wait lets nothing through",
                );
            }
            let steps = query::steps(&w.store, *id).await.unwrap();
            let undone: Vec<usize> = w
                .ledger
                .undone
                .iter()
                .filter(|(i, _)| i == id)
                .map(|(_, s)| *s)
                .collect();
            match s.state {
                SagaState::Completed => {
                    assert!(undone.is_empty(), "nothing is compensated on success");
                    assert_eq!(steps.len(), shape.stage_of.len());
                }
                _ => {
                    // Every dispatched step with a compensation command is undone
                    // exactly once; none after the pivot; in reverse stage order.
                    let expected: HashSet<usize> = steps
                        .iter()
                        .filter(|s| s.compensation_destination.is_some())
                        .map(|s| s.idx as usize)
                        .collect();
                    let got: HashSet<usize> = undone.iter().copied().collect();
                    assert_eq!(
                        got.len(),
                        undone.len(),
                        "a step was undone twice: {undone:?}"
                    );
                    assert_eq!(got, expected, "{name}: undone {undone:?}");
                    if let Some(p) = shape.pivot {
                        assert!(
                            undone.iter().all(|i| *i < p),
                            "undid a step at/after the pivot"
                        );
                    }
                    let stages: Vec<usize> = undone.iter().map(|i| shape.stage_of[*i]).collect();
                    assert!(
                        stages.windows(2).all(|w| w[0] >= w[1]),
                        "not in reverse: {stages:?}"
                    );
                }
            }
        }
        assert!(
            ends.get(&SagaState::Completed).is_some_and(|n| *n > 0),
            "{ends:?}"
        );
        assert!(
            ends.get(&SagaState::Compensated).is_some_and(|n| *n > 0),
            "{ends:?}"
        );
        let stats = w.store.admin().stats().await.unwrap();
        assert_eq!(stats.in_flight, 0);
    }
    assert!(signals > 0, "the random shapes held no wait to signal");
}
both_backends!(property_tests, property_random_sagas);

async fn deadline_aborts_a_saga_that_hangs(backend: Backend) {
    // No step timeout: only the saga's deadline can notice the silent agent.
    let def = Saga::<D>::builder("slow", 1)
        .step(Step::new("a", "a-agent").compensate("a-agent", |_: &D| json!("undo a")))
        .step(Step::new("b", "b-agent").compensate("b-agent", |_: &D| json!("undo b")))
        .deadline(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut w = World::new(backend, vec![def], 8).await;
    let id = w.start("slow", json!({})).await;
    w.pump(
        &[id],
        |_, _, step| if step == 1 { None } else { Some(ok()) },
        |_, _| ok(),
    )
    .await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    assert!(s.error.unwrap().contains("deadline"));
    let undone: Vec<usize> = w.ledger.undone.iter().map(|(_, i)| *i).collect();
    assert_eq!(undone, vec![1, 0], "b (outcome unknown) then a");
}
both_backends!(deadline_tests, deadline_aborts_a_saga_that_hangs);

/// What the reservations of `booked` reply, as their compensation reads it.
#[derive(serde::Deserialize)]
struct Reservation {
    id: String,
}

/// `trip`'s shape, each reservation undone by the id its reply gave
/// (`compensate_with`); `None` when the step's outcome is unknown. Shared with the
/// engine logic's tests.
pub(crate) fn booked() -> SagaDefinition {
    let reserve = |n: &str| {
        Step::<D>::new(n, format!("{n}-agent"))
            .compensate_with(format!("{n}-agent"), |d: &D, r: Option<&Reservation>| {
                json!({ "cancel": r.map(|r| r.id.as_str()), "trip": d["trip"] })
            })
            .retry(fast())
            .timeout(Duration::from_millis(300))
    };
    Saga::<D>::builder("booked", 1)
        .step(reserve("flight"))
        .parallel([reserve("hotel"), reserve("car")])
        .pivot(Step::new("charge", "charge-agent").retry(fast()))
        .build()
        .unwrap()
}

// `compensate_with`: the compensation is built when it is dispatched, from the step's
// reply (`None` when the step timed out), and the ledger records what was sent.
async fn compensations_built_from_replies(backend: Backend) {
    let mut w = World::new(backend, vec![booked()], 9).await;
    let declined = w.start("booked", json!({"trip": 1})).await;
    let timed_out = w.start("booked", json!({"trip": 2})).await;
    let mut sent: HashMap<(SagaId, usize), Value> = HashMap::new();
    w.pump(
        &[declined, timed_out],
        |_, env, step| {
            let saga: SagaId = env.header(header::SAGA_ID).unwrap().parse().unwrap();
            match step {
                3 => Some(StepOutcome::Fatal("card declined".into())),
                // The car agent of the second saga never answers: it times out.
                2 if saga == timed_out => None,
                _ => Some(StepOutcome::Ok(json!({ "id": format!("{saga}/{step}") }))),
            }
        },
        |_, env| {
            let saga: SagaId = env.header(header::SAGA_ID).unwrap().parse().unwrap();
            let step: usize = env.header(protocol::STEP).unwrap().parse().unwrap();
            sent.insert((saga, step), serde_json::from_str(&env.payload).unwrap());
            ok()
        },
    )
    .await;
    for (id, trip) in [(declined, 1), (timed_out, 2)] {
        let s = query::get(&w.store, id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Compensated, "{:?}", s.error);
        let steps = query::steps(&w.store, id).await.unwrap();
        for step in 0..3 {
            let expected = if id == timed_out && step == 2 {
                json!({ "cancel": null, "trip": trip })
            } else {
                json!({ "cancel": format!("{id}/{step}"), "trip": trip })
            };
            assert_eq!(sent[&(id, step)], expected, "saga {trip}, step {step}");
            // What was built is in the ledger (`agentsaga sagas show` reads it).
            let recorded: Value =
                serde_json::from_str(steps[step].compensation_payload.as_deref().unwrap()).unwrap();
            assert_eq!(recorded, expected);
        }
    }
    assert!(
        query::get(&w.store, timed_out)
            .await
            .unwrap()
            .unwrap()
            .error
            .unwrap()
            .contains("timed out")
    );
}
both_backends!(compensate_with_tests, compensations_built_from_replies);

// An operator without the definition (the CLI) aborts a saga whose compensations are
// built from replies: the orchestrator that has the definition builds and sends them.
async fn operator_abort_of_compensations_built_from_replies(backend: Backend) {
    let mut w = World::new(backend, vec![booked()], 10).await;
    let id = w.start("booked", json!({"trip": 3})).await;
    // The flight is reserved; the hotel and the car are still to answer.
    let mut agent = |_: &mut fastrand::Rng, env: &Envelope, step: usize| {
        Some(StepOutcome::Ok(
            json!({ "id": format!("{}/{step}", env.header(header::SAGA_ID).unwrap()) }),
        ))
    };
    let mut comp = |_: &mut fastrand::Rng, _: &Envelope| ok();
    for dest in ["flight-agent", "saga.booked.v1"] {
        let batch = claim_of(&w.store, dest).await;
        assert_eq!(batch.len(), 1, "{dest}");
        w.deliver(&batch[0], &mut agent, &mut comp).await;
        w.store
            .queue()
            .mark_delivered("t", &[batch[0].seq])
            .await
            .unwrap();
    }
    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(steps[0].state, StepState::Succeeded);
    assert_eq!(steps[1].state, StepState::Dispatched);
    assert_eq!(
        steps[1].compensation_payload, None,
        "built when it is dispatched"
    );
    let cli = Engine::new(Vec::<SagaDefinition>::new()).unwrap();
    let mut tx = w.store.begin().await.unwrap();
    assert_eq!(
        cli.abort(&mut tx, id).await.unwrap(),
        SagaState::Compensating
    );
    tx.commit().await.unwrap();
    let mut sent: Vec<(usize, Value)> = Vec::new();
    w.pump(
        &[id],
        |_, _, _| Some(ok()),
        |_, env| {
            let step: usize = env.header(protocol::STEP).unwrap().parse().unwrap();
            sent.push((step, serde_json::from_str(&env.payload).unwrap()));
            ok()
        },
    )
    .await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated, "{:?}", s.error);
    sent.sort_by_key(|(step, _)| *step);
    assert_eq!(
        sent,
        vec![
            (0, json!({ "cancel": format!("{id}/0"), "trip": 3 })),
            (1, json!({ "cancel": null, "trip": 3 })),
            (2, json!({ "cancel": null, "trip": 3 })),
        ]
    );
}
both_backends!(
    operator_abort_from_reply_tests,
    operator_abort_of_compensations_built_from_replies
);

/// Claims the ready rows of `destination` (leased to "t").
async fn claim_of(store: &Store, destination: &str) -> Vec<Envelope> {
    testing::claim(store, &[destination.to_owned()], 10).await
}

/// The saga of `start_timeout_tests`: one undoable step with a 50 ms start timeout and
/// a 10 ms work timeout (which, measured from the agent's start, never fires here).
fn start_bounded() -> SagaDefinition {
    Saga::<D>::builder("bounded", 1)
        .step(
            Step::new("a", "a-agent")
                .timeout(Duration::from_millis(10))
                .start_timeout(Duration::from_millis(50))
                .compensate("a-agent", |_: &D| json!("undo a")),
        )
        .build()
        .unwrap()
}

async fn handle_orchestrator(engine: &Engine, store: &Store) -> Vec<Handled> {
    let mut out = Vec::new();
    for env in claim_of(store, "saga.bounded.v1").await {
        let mut tx = store.begin().await.unwrap();
        out.push(engine.handle(&mut tx, &env).await.unwrap());
        tx.commit().await.unwrap();
    }
    out
}

// The step's `timeout` is not a timer from dispatch: a command that waits in a
// backlog far longer than its timeout is still carried out (the agent's clock starts
// when it takes the command). A command no agent took within its optional start
// timeout is withdrawn and the step counts as timed out.
async fn start_timeout_withdraws_only_untaken_commands(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let engine = Engine::new(vec![start_bounded()]).unwrap();

    // 1. Taken in time, answered after the start timeout passed: the reply wins,
    //    whichever of the two the orchestrator sees first.
    let mut tx = store.begin().await.unwrap();
    let taken = engine.start(&mut tx, "bounded", &json!({})).await.unwrap();
    tx.commit().await.unwrap();
    let command = claim_of(&store, "a-agent").await.remove(0);
    assert_eq!(command.header(header::TIMEOUT_MS), Some("10"));
    tokio::time::sleep(Duration::from_millis(80)).await;
    let mut tx = store.begin().await.unwrap();
    let reply = protocol::reply(&command, &ok()).unwrap().unwrap();
    tx.enqueue(&reply).await.unwrap();
    tx.commit().await.unwrap();
    store
        .queue()
        .mark_delivered("t", &[command.seq])
        .await
        .unwrap();
    // The timer (enqueued at start) is older than the reply: it comes first.
    let handled = handle_orchestrator(&engine, &store).await;
    assert_eq!(handled.len(), 2, "{handled:?}");
    assert!(matches!(handled[0], Handled::Ignored(_)), "{handled:?}");
    let s = query::get(&store, taken).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed);

    // 2. Never taken: withdrawn once the start timeout passes, and compensated.
    let mut tx = store.begin().await.unwrap();
    let untaken = engine.start(&mut tx, "bounded", &json!({})).await.unwrap();
    tx.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let handled = handle_orchestrator(&engine, &store).await;
    assert_eq!(
        handled,
        vec![Handled::Advanced {
            saga: untaken,
            state: SagaState::Compensating
        }]
    );
    let s = query::get(&store, untaken).await.unwrap().unwrap();
    assert!(s.error.unwrap().contains("not started"));
    // The withdrawn command is gone: only its compensation is left for the agent.
    let left = claim_of(&store, "a-agent").await;
    assert_eq!(left.len(), 1);
    assert_eq!(
        left[0].header(header::KIND),
        Some(protocol::KIND_COMPENSATE)
    );
}
both_backends!(
    start_timeout_tests,
    start_timeout_withdraws_only_untaken_commands
);

// A saga whose reply was dead-lettered has nothing live left: it is stalled (and so is
// one with no progress past the threshold); one whose command is pending is not, nor
// one parked at a wait. Pages of the list follow each other by cursor.
async fn stalled_sagas_are_found(backend: Backend) {
    use agentsaga_core::queue::DeadLetter;
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let waits = Saga::<D>::builder("waits", 1)
        .step(Step::wait_for("approval"))
        .build()
        .unwrap();
    let engine = Engine::new(vec![trip(), waits]).unwrap();
    let start = async |name: &str| {
        let mut tx = store.begin().await.unwrap();
        let id = engine
            .start(&mut tx, name, &json!({ "trip": 1 }))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        id
    };
    let lost = start("trip").await;
    let moving = start("trip").await;
    let parked = start("waits").await;
    let hour = Duration::from_secs(3600);
    let stalled = async |t: Duration| -> Vec<SagaId> {
        let mut ids: Vec<SagaId> = query::stalled(&store, t, 0)
            .await
            .unwrap()
            .iter()
            .map(|s| s.id)
            .collect();
        ids.sort();
        ids
    };
    assert!(stalled(hour).await.is_empty(), "commands are pending");

    // `lost`'s flight agent answers; its reply is dead-lettered.
    let command = claim_of(&store, "flight-agent")
        .await
        .into_iter()
        .find(|e| e.header(header::SAGA_ID) == Some(&lost.to_string()))
        .unwrap();
    let mut tx = store.begin().await.unwrap();
    tx.receive("flight-agent", command.id).await.unwrap();
    tx.enqueue(&protocol::reply(&command, &ok()).unwrap().unwrap())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    store
        .queue()
        .mark_delivered("t", &[command.seq])
        .await
        .unwrap();
    let reply = claim_of(&store, "saga.trip.v1").await.remove(0);
    store
        .queue()
        .dead_letter(
            "t",
            &[DeadLetter {
                seq: reply.seq,
                reason: "lost".into(),
                notice: None,
            }],
        )
        .await
        .unwrap();
    assert_eq!(stalled(hour).await, [lost]);
    // No progress past a threshold of zero: `moving` too; never the parked one.
    let mut both = vec![lost, moving];
    both.sort();
    assert_eq!(stalled(Duration::ZERO).await, both);
    assert!(!stalled(Duration::ZERO).await.contains(&parked));

    // Pages of one saga each, by cursor, newest first, cover all three once.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = query::list(
            &store,
            &query::ListFilter {
                limit: 1,
                after,
                ..query::ListFilter::default()
            },
        )
        .await
        .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(query::Cursor::after(last));
        let text = after.unwrap().to_string();
        assert_eq!(text.parse::<query::Cursor>().unwrap(), after.unwrap());
        seen.push(last.id);
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 3);
    let future = query::list(
        &store,
        &query::ListFilter {
            created_from_ms: Some(agentsaga_core::clock::now_ms() + 60_000),
            ..query::ListFilter::default()
        },
    )
    .await
    .unwrap();
    assert!(future.is_empty());
}
both_backends!(stalled_tests, stalled_sagas_are_found);
