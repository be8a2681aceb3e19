//! Provider rate limits (`RuntimeBuilder::rate_limit`): calls keep the pace, across
//! runtimes sharing the database; reported tokens settle the pace; a 429 pauses the
//! whole destination without spending a step retry.

use std::time::Instant;

use agentsaga_runtime::RateLimit;
use agentsaga_saga::Usage;

use super::*;

/// A calling agent that notes when each call starts (and which runtime made it),
/// reports `tokens`, and answers 429 to its first `refuse` calls.
struct Paced {
    runtime: u32,
    starts: Arc<Mutex<Vec<(Instant, u32)>>>,
    tokens: u64,
    refuse: Arc<AtomicU32>,
}

#[async_trait::async_trait]
impl CallingAgent for Paced {
    type Command = Value;
    type Output = ();
    type Reply = ();

    fn destination(&self) -> &str {
        "llm"
    }

    async fn call(&self, ctx: &CallContext<'_>, _: &Value) -> Result<(), StepError> {
        self.starts
            .lock()
            .unwrap()
            .push((Instant::now(), self.runtime));
        ctx.report_usage(Usage::tokens(0, self.tokens));
        let refused = self
            .refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if refused {
            return Err(StepError::rate_limited(Some(Duration::from_millis(600))));
        }
        Ok(())
    }

    async fn record(&self, _: &mut AgentContext<'_>, _: Value, (): ()) -> Result<(), StepError> {
        Ok(())
    }
}

fn ask() -> SagaDefinition {
    one_step(
        "ask",
        Step::new("ask", "llm")
            .command(|j: &Job| j.n)
            .nothing_to_undo()
            .retry(quick_retry()),
    )
}

struct Setup {
    runtimes: Vec<Runtime>,
    starts: Arc<Mutex<Vec<(Instant, u32)>>>,
    refuse: Arc<AtomicU32>,
}

/// `n` runtimes on one fresh database, each with the `Paced` agent under `limit`.
async fn setup(
    backend: Backend,
    n: u32,
    limit: RateLimit,
    tokens: u64,
    concurrency: usize,
) -> Setup {
    let url = fresh_url(backend).await;
    let starts = Arc::new(Mutex::new(Vec::new()));
    let refuse = Arc::new(AtomicU32::new(0));
    let mut runtimes = Vec::new();
    for runtime in 0..n {
        let rt = Runtime::builder()
            .database(url.clone())
            .relay_config(RelayConfig::default().retry(quick_retry()))
            .calling_agent(Paced {
                runtime,
                starts: Arc::clone(&starts),
                tokens,
                refuse: Arc::clone(&refuse),
            })
            .calling_concurrency(concurrency)
            .rate_limit("llm", limit)
            .saga(ask())
            .start()
            .await
            .unwrap();
        runtimes.push(rt);
    }
    Setup {
        runtimes,
        starts,
        refuse,
    }
}

impl Setup {
    /// Starts `n` sagas (round robin over the runtimes) and waits until all complete.
    async fn run(&self, n: u32) {
        let mut ids = Vec::new();
        for i in 0..n {
            let rt = &self.runtimes[(i as usize) % self.runtimes.len()];
            ids.push(rt.start_saga("ask", &Job { n: i }).await.unwrap());
        }
        for id in &ids {
            assert_eq!(settle(&self.runtimes[0], *id).await, SagaState::Completed);
        }
    }

    fn starts(&self) -> Vec<(Instant, u32)> {
        let mut s = self.starts.lock().unwrap().clone();
        s.sort();
        s
    }

    async fn shutdown(self) {
        for rt in self.runtimes {
            rt.shutdown().await;
        }
    }
}

/// The time from the first call's start to the last's.
fn span(starts: &[(Instant, u32)]) -> Duration {
    starts.last().unwrap().0 - starts.first().unwrap().0
}

// 12 calls at 600 a minute (one per 100 ms) take at least ~1.1 s (one interval of
// slack for a late first wake-up). On PostgreSQL two runtimes share the limit, each
// making some of the calls; SQLite serves one process.
async fn calls_keep_the_pace_across_runtimes(backend: Backend) {
    let runtimes = if backend == Backend::Postgres { 2 } else { 1 };
    let s = setup(backend, runtimes, RateLimit::requests_per_minute(600), 0, 2).await;
    s.run(12).await;
    let starts = s.starts();
    assert_eq!(starts.len(), 12);
    assert!(
        span(&starts) >= Duration::from_millis(1_000),
        "{:?}",
        span(&starts)
    );
    for r in 0..runtimes {
        assert!(
            starts.iter().any(|(_, by)| *by == r),
            "runtime {r} made no call"
        );
    }
    s.shutdown().await;
}
both_backends!(pace_tests, calls_keep_the_pace_across_runtimes);

// A call that estimated no tokens and reported 1,000, at 600,000 tokens a minute (10
// a millisecond), owes 100 ms: 4 calls one after the other take at least ~200 ms.
async fn reported_tokens_settle_the_pace(backend: Backend) {
    let s = setup(backend, 1, RateLimit::tokens_per_minute(600_000), 1_000, 1).await;
    s.run(4).await;
    let starts = s.starts();
    assert!(
        span(&starts) >= Duration::from_millis(200),
        "{:?}",
        span(&starts)
    );
    s.shutdown().await;
}
both_backends!(token_tests, reported_tokens_settle_the_pace);

// The first call is answered 429 with `Retry-After: 600 ms`, at a pace of one call per
// 200 ms. A call that had its slot before the 429 still goes (at 200 ms, as a request
// already on its way would), but no call starts between 250 and 580 ms: without the
// pause the refused call would run again at its next slot, 400 ms. The refused call
// runs again after the pause, and no step spent a retry.
async fn a_429_pauses_the_whole_destination(backend: Backend) {
    let s = setup(backend, 1, RateLimit::requests_per_minute(300), 0, 2).await;
    s.refuse.store(1, Ordering::SeqCst);
    s.run(4).await;
    let starts = s.starts();
    assert_eq!(starts.len(), 5, "4 calls and the refused one again");
    let refused_at = starts[0].0;
    let after: Vec<Duration> = starts[1..].iter().map(|(at, _)| *at - refused_at).collect();
    assert!(
        after
            .iter()
            .all(|d| *d <= Duration::from_millis(250) || *d >= Duration::from_millis(580)),
        "calls started {after:?} after the 429"
    );
    assert!(after[1] >= Duration::from_millis(580), "{after:?}");
    let rt = &s.runtimes[0];
    for summary in query::list(rt.store(), &query::ListFilter::default())
        .await
        .unwrap()
    {
        let steps = query::steps(rt.store(), summary.id).await.unwrap();
        assert_eq!(steps[0].attempts, 1, "no step retry spent");
    }
    s.shutdown().await;
}
both_backends!(pause_tests, a_429_pauses_the_whole_destination);

// A rate limit where no calling agent of the runtime consumes the destination limits
// nothing: refused at start, saying so.
#[tokio::test]
async fn a_limit_without_its_agent_is_refused() {
    let err = Runtime::builder()
        .database(fresh_url(backends()[0]).await)
        .rate_limit("nobody", RateLimit::requests_per_minute(1))
        .start()
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("rate limit for `nobody`"), "{err}");
}
