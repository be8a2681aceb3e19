//! Schedules when something is wrong: a row this binary cannot read, a previous
//! firing's start set aside, more slots in time than one firing takes.

use super::*;

// A schedule whose row cannot be read (its expression written by a newer binary, say)
// neither stops the others nor is tried every second: it keeps why and is due again in
// a minute; it can still be listed and paused.
async fn a_broken_schedule_stops_no_other(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let engine = Engine::new(vec![brief()]).unwrap();
    let (cron, latest) = hourly();
    for name in ["a-broken", "b-good"] {
        let s = Schedule::new(name, "brief", &cron).catch_up(CatchUp::Latest);
        schedule::create(&store, &s).await.unwrap();
        down_since(&store, name, latest).await;
    }
    let mut tx = store.begin().await.unwrap();
    agentsaga_core::Sql::new("UPDATE saga_schedules SET cron = 'every full moon' WHERE name = ?")
        .bind("a-broken")
        .execute(tx.conn())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let firings = engine.fire_schedules(&store).await.unwrap();
    let fired: Vec<&str> = firings.fired.iter().map(|f| f.schedule.as_str()).collect();
    assert_eq!(fired, ["b-good"]);
    assert_eq!(firings.failed.len(), 1, "{firings:?}");
    let broken = schedule::get(&store, "a-broken").await.unwrap().unwrap();
    assert!(
        broken
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("full moon")),
        "{broken:?}"
    );
    let wait = broken.next_due_ms.unwrap() - agentsaga_core::clock::system_now_ms();
    assert!(
        (30_000..=60_000).contains(&wait),
        "due again in a minute: {wait} ms"
    );
    assert!(
        engine
            .fire_schedules(&store)
            .await
            .unwrap()
            .failed
            .is_empty()
    );
    assert_eq!(schedule::list(&store).await.unwrap().len(), 2);
    assert!(
        schedule::pause(&store, "a-broken")
            .await
            .unwrap()
            .schedule
            .paused
    );
}

both_backends!(broken_row, a_broken_schedule_stops_no_other);

// The previous firing's start was set aside (admission could not start it): it has
// stopped, so an overlap-skip schedule fires its next slot instead of skipping every
// slot from then on.
async fn a_start_set_aside_does_not_block_the_next(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let engine = Engine::new(vec![brief()]).unwrap();
    let (cron, latest) = hourly();
    let s = Schedule::new("s", "brief", &cron).catch_up(CatchUp::Latest);
    schedule::create(&store, &s).await.unwrap();
    let aside = SagaId::new();
    let mut tx = store.begin().await.unwrap();
    agentsaga_core::Sql::new(
        "INSERT INTO saga_starts (id, name, data, created_at, error) VALUES (?, ?, ?, ?, ?)",
    )
    .bind(*aside.as_uuid())
    .bind("brief")
    .bind_json("{}")
    .bind_now(agentsaga_core::clock::system_now_ms())
    .bind("its input no longer decodes")
    .execute(tx.conn())
    .await
    .unwrap();
    agentsaga_core::Sql::new("UPDATE saga_schedules SET last_saga_id = ?")
        .bind(*aside.as_uuid())
        .execute(tx.conn())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    down_since(&store, "s", latest).await;
    let fired = engine.fire_schedules(&store).await.unwrap().fired;
    assert_eq!(
        fired.iter().map(|f| f.slot_ms).collect::<Vec<_>>(),
        [latest]
    );
    assert_eq!(
        schedule::get(&store, "s").await.unwrap().unwrap().skipped,
        0
    );
}

both_backends!(set_aside, a_start_set_aside_does_not_block_the_next);

// Twenty minutes of a schedule every second, all in time (`late_after` an hour): one
// firing takes the latest 1,000 and counts the older ones as skipped, none silently.
async fn slots_beyond_one_firing_are_counted(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let engine = Engine::new(vec![brief()]).unwrap();
    let s = Schedule::new("every-second", "brief", "* * * * * *")
        .overlap(Overlap::Allow)
        .late_after(Duration::from_secs(3_600));
    schedule::create(&store, &s).await.unwrap();
    let first = (agentsaga_core::clock::system_now_ms() / 1_000 - 1_200) * 1_000;
    down_since(&store, "every-second", first).await;
    let firings = engine.fire_schedules(&store).await.unwrap();
    assert_eq!(firings.fired.len(), 1_000);
    let view = schedule::get(&store, "every-second")
        .await
        .unwrap()
        .unwrap();
    let newest = firings.fired.iter().map(|f| f.slot_ms).max().unwrap();
    let all = (newest - first) / 1_000 + 1;
    assert_eq!((view.fired, view.skipped), (1_000, all - 1_000));
    assert!(firings.fired.iter().all(|f| f.slot_ms > first + 150_000));
}

both_backends!(beyond_one_firing, slots_beyond_one_firing_are_counted);
