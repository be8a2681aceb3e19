//! A slow step sent again applies its effects once; a call whose lease is lost is cancelled.

use super::*;

/// Inserts one row per handling into `effects` (through the handler's transaction);
/// the first handling then outlives the step's timeout.
struct SlowOnce {
    handled: Arc<AtomicU32>,
}

#[async_trait::async_trait]
impl Agent for SlowOnce {
    type Command = Value;
    type Reply = u32;
    fn destination(&self) -> &str {
        "ledger"
    }
    async fn handle(&self, ctx: &mut AgentContext<'_>, _: Value) -> Result<u32, StepError> {
        let saga = ctx.saga_id().unwrap().to_string();
        agentsaga_core::Sql::new("INSERT INTO effects (saga) VALUES (?)")
            .bind(&saga)
            .execute(ctx.conn())
            .await?;
        if self.handled.fetch_add(1, Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        Ok(1)
    }
}

// A forward-only step that was slow, not lost, is sent again after its timeout; its
// database effects still happen once: the slow handling is cancelled at the timeout,
// before it commits, so only the re-sent command's effects are kept.
async fn a_slow_step_sent_again_applies_its_effects_once(backend: Backend) {
    let handled = Arc::new(AtomicU32::new(0));
    let pay = Step::new("pay", "ledger")
        .timeout(Duration::from_millis(300))
        .retry(quick_retry());
    let saga = one_pivot("pay", pay);
    let rt = builder(backend)
        .await
        .agent(SlowOnce {
            handled: Arc::clone(&handled),
        })
        .saga(saga)
        .start()
        .await
        .unwrap();
    execute(&rt, "CREATE TABLE effects (saga TEXT NOT NULL)").await;
    let id = rt.start_saga("pay", &Job { n: 1 }).await.unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Completed);
    assert_eq!(
        handled.load(Ordering::SeqCst),
        2,
        "handled twice: slow, then again"
    );
    let steps = query::steps(rt.store(), id).await.unwrap();
    assert_eq!(steps[0].attempts, 2, "{steps:?}");
    let mut tx = rt.store().begin().await.unwrap();
    let rows = agentsaga_core::Sql::new("SELECT count(*) AS n FROM effects")
        .fetch_one(tx.conn())
        .await
        .unwrap()
        .int("n")
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(rows, 1, "the effects happened once");
    rt.shutdown().await;
}
both_backends!(
    slow_step_tests,
    a_slow_step_sent_again_applies_its_effects_once
);

/// Runs `sql` (the same text on both backends) in a transaction of `rt`'s store.
async fn execute(rt: &Runtime, sql: &'static str) -> u64 {
    let mut tx = rt.store().begin().await.unwrap();
    let n = agentsaga_core::Sql::new(sql)
        .execute(tx.conn())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    n
}

// A worker that lost its lease learns it and stops: here another relay ("thief") has
// taken the row over while the call waits. The relay's next renewal finds the row is
// not its own, and the call is cancelled (its future dropped) rather than left to land
// after the row's new owner has moved on (an outside "do" after its "undo"). Its outcome
// is not written. Once the row comes back, it is delivered again and completes.
async fn a_call_whose_lease_is_lost_is_cancelled(backend: Backend) {
    let (llm, calls, _open) = Outside::new("llm", vec![Act::Gate, Act::Answer]);
    // The step's timeout is far beyond the test's bounds: only the lost lease can
    // cancel the call in time.
    let think = Step::new("think", "llm").timeout(Duration::from_secs(600));
    let saga = one_step("lost", think.nothing_to_undo());
    let lease = Duration::from_millis(300);
    let rt = start_calling(builder_with_lease(backend, lease), llm, saga).await;
    let id = rt.start_saga("lost", &Job { n: 1 }).await.unwrap();
    let began = std::time::Instant::now();
    calls.until_in_flight("the call waits", 1).await;
    eprintln!("the call waits after {:?}", began.elapsed());
    let stolen_at = std::time::Instant::now();
    let stolen = execute(
        &rt,
        "UPDATE outbox SET lease_owner = 'thief' WHERE state = 'in_flight' AND destination = 'llm'",
    )
    .await;
    assert_eq!(stolen, 1);
    until("the call whose lease was lost is cancelled", || {
        calls.cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
    eprintln!("cancelled {:?} after the theft", stolen_at.elapsed());
    assert!(rt.relay_stats().unwrap().leases_lost >= 1);
    // The thief dies: its lease runs out, the row comes back, and this relay delivers it
    // again (the second call answers).
    assert_eq!(settle(&rt, id).await, SagaState::Completed);
    assert_eq!(calls.started.load(Ordering::SeqCst), 2);
    assert_eq!(calls.cancelled.load(Ordering::SeqCst), 1);
    rt.shutdown().await;
}
both_backends!(lost_lease_tests, a_call_whose_lease_is_lost_is_cancelled);
