//! The one clock (`agentsaga_core::clock`): a runtime whose store has a
//! manual clock reads no other time. A three-day sleep, a step's timeout, a retry's
//! backoff and a schedule's next slot all wait for the clock to be moved, and then
//! happen at once; every time the runtime wrote in its rows is the clock's. On
//! PostgreSQL the database's `now()` follows the manual clock too.

#[path = "support/gated.rs"]
mod gated;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentsaga_core::clock::ManualClock;
use agentsaga_core::testing::{Backend, fresh_url, wait_until};
use agentsaga_core::{RetryPolicy, Sql, Store, StoreConfig};
use agentsaga_runtime::{Runtime, StepError};
use agentsaga_saga::query::{self, ListFilter};
use agentsaga_saga::schedule::{CatchUp, Schedule};
use agentsaga_saga::{Saga, SagaDefinition, SagaId, SagaState, Step};
use gated::{Answer, Gates};
use serde_json::{Value, json};

/// 2001-09-09T01:46:40Z: far from the real now, so that a time read from the system
/// clock instead of this one shows.
const EPOCH_MS: i64 = 1_000_000_000_000;
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

/// How long a test waits in real time for what the moved clock made due (generous:
/// the machine is shared; the clock itself never waits).
const PATIENCE: Duration = Duration::from_secs(30);

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap()
}

/// A runtime on a fresh SQLite file whose store runs on `clock`, with gated agents for
/// `destinations` (gates open) answering `answer`, running `def`.
async fn runtime(
    clock: &ManualClock,
    destinations: &[&'static str],
    answer: &Answer,
    def: SagaDefinition,
    gates: &Gates,
) -> Runtime {
    gates
        .agents(destinations, answer)
        .store_config(StoreConfig::default().clock(clock.clock()))
        .saga(def)
        .start()
        .await
        .unwrap()
}

/// When saga `id` wakes, if it sleeps.
async fn sleeping_until(rt: &Runtime, id: SagaId) -> Option<i64> {
    query::get(rt.store(), id)
        .await
        .unwrap()
        .unwrap()
        .sleeping_until_ms
}

async fn state(rt: &Runtime, id: SagaId) -> SagaState {
    query::get(rt.store(), id).await.unwrap().unwrap().state
}

/// Waits (real time, bounded) until saga `id` is in `want`.
async fn reaches(rt: &Runtime, id: SagaId, want: SagaState) {
    wait_until(&format!("saga in {want:?}"), PATIENCE, async || {
        state(rt, id).await == want
    })
    .await;
}

/// The smallest and largest Unix-ms time written in the runtime's rows.
async fn times_written(store: &Store) -> (i64, i64) {
    let row = Sql::new(
        "SELECT min({ms t}) AS lo, max({ms t}) AS hi FROM (
             SELECT created_at AS t FROM saga_instances
             UNION ALL SELECT updated_at FROM saga_instances
             UNION ALL SELECT finished_at FROM saga_instances WHERE finished_at IS NOT NULL
             UNION ALL SELECT dispatched_at FROM saga_steps WHERE dispatched_at IS NOT NULL
             UNION ALL SELECT replied_at FROM saga_steps WHERE replied_at IS NOT NULL
             UNION ALL SELECT created_at FROM outbox
             UNION ALL SELECT available_at FROM outbox
             UNION ALL SELECT delivered_at FROM outbox WHERE delivered_at IS NOT NULL
             UNION ALL SELECT received_at FROM inbox) AS times",
    )
    .fetch_one(store.reader())
    .await
    .unwrap();
    (row.int("lo").unwrap(), row.int("hi").unwrap())
}

fn ok() -> Answer {
    Arc::new(|_, _, _, _| Ok(json!("ok")))
}

// A saga sleeps three days on the manual clock: real time passing does not wake it;
// moving the clock three days does, at once. Every time the runtime wrote lies
// between the clock's start and where it was moved to: nothing read the system clock.
async fn a_three_day_sleep_wakes_when_the_clock_is_moved(backend: Backend) {
    let clock = ManualClock::new(EPOCH_MS);
    let def = Saga::<Value>::builder("follow_up", 1)
        .step(Step::new("send", "mailer").nothing_to_undo())
        .step(Step::sleep("nap", 3 * DAY))
        .pivot(Step::new("follow_up", "mailer"))
        .build()
        .unwrap();
    let gates = Gates::new(fresh_url(backend).await, true);
    let rt = runtime(&clock, &["mailer"], &ok(), def, &gates).await;
    let id = rt.start_saga("follow_up", &json!({})).await.unwrap();

    wait_until("the saga sleeps", PATIENCE, async || {
        sleeping_until(&rt, id).await.is_some()
    })
    .await;
    let until = sleeping_until(&rt, id).await.unwrap();
    assert_eq!(
        until,
        EPOCH_MS + ms(3 * DAY),
        "three days from the clock's now"
    );
    let sleeping = ListFilter {
        sleeping: true,
        ..ListFilter::default()
    };
    assert_eq!(query::list(rt.store(), &sleeping).await.unwrap().len(), 1);

    // Real time passes (the relay polls, the schedules task looks): still asleep.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(state(&rt, id).await, SagaState::Running);
    assert_eq!(gates.seen().len(), 1, "only `send` ran");

    rt.store()
        .advance_clock(3 * DAY - Duration::from_secs(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(state(&rt, id).await, SagaState::Running, "a second to go");

    rt.store()
        .advance_clock(Duration::from_secs(1))
        .await
        .unwrap();
    reaches(&rt, id, SagaState::Completed).await;
    assert_eq!(gates.seen().len(), 2, "`follow_up` ran once");

    let (lo, hi) = times_written(rt.store()).await;
    assert!(
        lo >= EPOCH_MS && hi <= clock.now_ms(),
        "every time written is the manual clock's: {lo}..{hi}, the clock ran \
         {EPOCH_MS}..{}",
        clock.now_ms()
    );
    rt.shutdown().await;
}

// A step whose agent does not answer within its timeout (an hour, on the manual
// clock) times out when the clock is moved past it, not before; before the pivot a
// timed-out step is compensated.
async fn a_step_times_out_when_the_clock_passes_its_timeout(backend: Backend) {
    let clock = ManualClock::new(EPOCH_MS);
    let def = Saga::<Value>::builder("slow", 1)
        .step(Step::new("ask", "oracle").timeout(HOUR).nothing_to_undo())
        .pivot(Step::new("after", "oracle"))
        .build()
        .unwrap();
    // The gate stays closed: the agent's call never ends on its own.
    let gates = Gates::new(fresh_url(backend).await, false);
    let rt = runtime(&clock, &["oracle"], &ok(), def, &gates).await;
    let id = rt.start_saga("slow", &json!({})).await.unwrap();

    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        state(&rt, id).await,
        SagaState::Running,
        "waiting on the agent"
    );
    rt.store()
        .advance_clock(HOUR - Duration::from_secs(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(state(&rt, id).await, SagaState::Running, "a second to go");

    rt.store()
        .advance_clock(Duration::from_secs(1))
        .await
        .unwrap();
    reaches(&rt, id, SagaState::Compensated).await;
    assert!(
        gates.seen().is_empty(),
        "the call never finished: nothing recorded"
    );
    rt.shutdown().await;
}

// A step that fails retryably is tried again after its backoff on the manual clock:
// the retry is stored as due later than the clock's now, and runs when the clock is
// moved past its ceiling.
async fn a_retry_waits_for_its_backoff_on_the_clock(backend: Backend) {
    let clock = ManualClock::new(EPOCH_MS);
    let ceiling = 10 * DAY;
    let def = Saga::<Value>::builder("flaky", 1)
        .pivot(Step::new("charge", "payments").retry(RetryPolicy::new(ceiling, ceiling, 3)))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let answer: Answer = {
        let calls = Arc::clone(&calls);
        Arc::new(move |_, _, _, _| {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(StepError::retryable("the provider is busy"))
            } else {
                Ok(json!("charged"))
            }
        })
    };
    let gates = Gates::new(fresh_url(backend).await, true);
    let rt = runtime(&clock, &["payments"], &answer, def, &gates).await;
    let id = rt.start_saga("flaky", &json!({})).await.unwrap();

    wait_until("the first attempt failed", PATIENCE, async || {
        calls.load(Ordering::SeqCst) == 1
    })
    .await;
    // The retry is a row due later than the clock's now (its jittered backoff).
    wait_until("the retry is stored", PATIENCE, async || {
        let due = Sql::new(
            "SELECT count(*) AS n FROM outbox WHERE destination = 'payments' \
             AND state = 'pending' AND available_at > ?",
        )
        .bind_time(clock.now_ms())
        .fetch_one(rt.store().reader())
        .await
        .unwrap();
        due.int("n").unwrap() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "not retried in real time");

    rt.store().advance_clock(ceiling).await.unwrap();
    reaches(&rt, id, SagaState::Completed).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    rt.shutdown().await;
}

// An hourly schedule fires its next slot when the clock is moved to it, each slot
// once, and its saga runs at the slot's time.
async fn a_schedule_fires_when_the_clock_reaches_its_slot(backend: Backend) {
    // On the hour exactly: the next slot is an hour ahead.
    let start = EPOCH_MS - EPOCH_MS % ms(HOUR);
    let clock = ManualClock::new(start);
    let def = Saga::<Value>::builder("brief", 1)
        .pivot(Step::new("draft", "writer"))
        .build()
        .unwrap();
    let gates = Gates::new(fresh_url(backend).await, true);
    let rt = runtime(&clock, &["writer"], &ok(), def, &gates).await;
    let s = Schedule::new("hourly", "brief", "0 * * * *")
        .input(json!({ "at": { "$fire_time": "unix_ms" } }))
        .catch_up(CatchUp::None);
    let created = rt.schedules().create(&s).await.unwrap();
    assert_eq!(created.next_slot_ms, Some(start + ms(HOUR)));

    tokio::time::sleep(Duration::from_millis(600)).await;
    let all = ListFilter::default();
    assert!(query::list(rt.store(), &all).await.unwrap().is_empty());

    for hour in 1..=3 {
        rt.store().advance_clock(HOUR).await.unwrap();
        // Fired, and its saga ended: a slot that comes while the last one's saga still
        // runs is skipped (the schedule's overlap policy).
        wait_until(
            &format!("slot {hour} fired and ran"),
            PATIENCE,
            async || {
                let fired = query::list(rt.store(), &all).await.unwrap();
                fired.len() == hour && fired.iter().all(|s| s.state == SagaState::Completed)
            },
        )
        .await;
    }
    let fired = query::list(rt.store(), &all).await.unwrap();
    let mut keys: Vec<String> = fired.iter().filter_map(|s| s.key.clone()).collect();
    keys.sort();
    let want: Vec<String> = (1..=3)
        .map(|h| format!("schedule:hourly:{}", start + h * ms(HOUR)))
        .collect();
    assert_eq!(keys, want, "each slot once, at its time");
    rt.shutdown().await;
}

agentsaga_core::both_backends!(
    a_three_day_sleep_wakes_when_the_clock_is_moved,
    a_three_day_sleep_wakes_when_the_clock_is_moved
);
agentsaga_core::both_backends!(
    a_step_times_out_when_the_clock_passes_its_timeout,
    a_step_times_out_when_the_clock_passes_its_timeout
);
agentsaga_core::both_backends!(
    a_retry_waits_for_its_backoff_on_the_clock,
    a_retry_waits_for_its_backoff_on_the_clock
);
agentsaga_core::both_backends!(
    a_schedule_fires_when_the_clock_reaches_its_slot,
    a_schedule_fires_when_the_clock_reaches_its_slot
);

/// Now, in Unix ms, by the database's clock of `store` (`now()` on PostgreSQL).
async fn database_now(store: &Store) -> i64 {
    Sql::new("SELECT {now_ms} AS n")
        .fetch_one(store.reader())
        .await
        .unwrap()
        .int("n")
        .unwrap()
}

// On PostgreSQL the database's own `now()` follows a store's manual clock, in every
// session of that store (and of another store on the same manual clock, as after a
// restart), column defaults included; another store on the system clock keeps the
// server's time, and so do leases (`pg_catalog.clock_timestamp()`). A database that
// agentsaga migrated on the server's clock (one in use) is refused a manual clock.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_follows_a_manual_clock() {
    let url = fresh_url(Backend::Postgres).await;
    let clock = ManualClock::new(EPOCH_MS);
    let config = || StoreConfig::default().clock(clock.clock());
    let store = Store::connect_with(&url, config()).await.unwrap();
    assert_eq!(database_now(&store).await, EPOCH_MS);

    store.advance_clock(DAY).await.unwrap();
    assert_eq!(
        clock.now_ms(),
        EPOCH_MS + ms(DAY),
        "the process's clock moved"
    );
    assert_eq!(database_now(&store).await, EPOCH_MS + ms(DAY));
    let again = Store::connect_with(&url, config()).await.unwrap();
    assert_eq!(database_now(&again).await, EPOCH_MS + ms(DAY), "a restart");
    let real = agentsaga_core::clock::system_now_ms();
    let other = Store::connect(&url).await.unwrap();
    assert!(
        (database_now(&other).await - real).abs() < 60_000,
        "a store on the system clock keeps the server's time"
    );

    let mut tx = store.begin().await.unwrap();
    Sql::new("INSERT INTO inbox (consumer, message_id) VALUES (?, ?)")
        .bind("probe")
        .bind(agentsaga_core::MessageId::new())
        .execute(tx.conn())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let received = Sql::new("SELECT {ms received_at} AS t FROM inbox")
        .fetch_one(store.reader())
        .await
        .unwrap()
        .int("t")
        .unwrap();
    assert_eq!(received, EPOCH_MS + ms(DAY), "a default reads the clock");

    let lease_now = Sql::new("SELECT {ms pg_catalog.clock_timestamp()} AS t")
        .fetch_one(store.reader())
        .await
        .unwrap()
        .int("t")
        .unwrap();
    assert!(
        (lease_now - real).abs() < 60_000,
        "leases read the server's real time: {lease_now} against {real}"
    );

    // A row claimed, then renewed, a day ahead on the manual clock: its lease counts
    // from the server's real time (a minute from now), and a reclaim (real time too)
    // leaves it alone.
    let mut tx = store.begin().await.unwrap();
    tx.enqueue(&agentsaga_core::Message::to("probe").raw_json("{}"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let lease_in = async || {
        Sql::new("SELECT {ms lease_until} AS t FROM outbox WHERE destination = 'probe'")
            .fetch_one(store.reader())
            .await
            .unwrap()
            .int("t")
            .unwrap()
            - agentsaga_core::clock::system_now_ms()
    };
    let claimed = agentsaga_core::testing::claim(&store, &["probe".to_owned()], 1).await;
    assert_eq!(claimed.len(), 1);
    let left = lease_in().await;
    assert!(
        (0..=60_000).contains(&left),
        "claimed: lease ends in {left} ms"
    );
    let renewed = store
        .queue()
        .renew_leases(
            agentsaga_core::testing::OWNER,
            &[claimed[0].seq],
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(renewed.len(), 1);
    let left = lease_in().await;
    assert!(
        (0..=60_000).contains(&left),
        "renewed: lease ends in {left} ms"
    );
    assert_eq!(store.queue().reclaim_expired().await.unwrap(), 0);

    let live = fresh_url(Backend::Postgres).await;
    drop(Store::connect(&live).await.unwrap());
    let err = Store::connect_with(&live, config()).await.unwrap_err();
    assert!(
        matches!(err, agentsaga_core::Error::ManualClockNeedsAFreshDatabase),
        "{err}"
    );
}
