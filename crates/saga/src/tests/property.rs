//! A randomised property test over saga shapes and outcome sequences, typed and planned.

use super::*;

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
