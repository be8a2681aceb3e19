//! The saga's deadline, and compensations built from replies (by the engine, and on an
//! operator's abort without the definition).

use super::*;

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
