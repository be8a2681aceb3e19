//! The database away while a schedule fires (PostgreSQL restarted under a runtime
//! whose schedule fires every second): the firing task waits for it and goes on when
//! it is back, every slot of the outage fired once (they were late by less than
//! `late_after`), none twice. A binary of its own: it stops its PostgreSQL server.

#[path = "support/echo.rs"]
mod echo;

use std::time::Duration;

use agentsaga_core::Sql;
use agentsaga_core::testing::{Backend, backends, fresh_url, pg_server, wait_until};
use agentsaga_runtime::Runtime;
use agentsaga_saga::schedule::{CatchUp, Overlap, Schedule};
use agentsaga_saga::{Saga, Step};
use echo::Echo;
use serde_json::Value;

/// The slots schedule `tick` started, in order.
async fn slots(rt: &Runtime) -> Vec<i64> {
    let rows = Sql::new("SELECT key FROM saga_keys WHERE key LIKE 'schedule:tick:%'")
        .fetch_all(rt.store().reader())
        .await
        .unwrap();
    let mut slots: Vec<i64> = rows
        .iter()
        .map(|r| {
            let key = r.text("key").unwrap();
            key.rsplit_once(':').unwrap().1.parse().unwrap()
        })
        .collect();
    slots.sort_unstable();
    slots
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_while_a_schedule_fires_loses_no_slot() {
    if !backends().contains(&Backend::Postgres) {
        return; // a build without PostgreSQL
    }
    let url = fresh_url(Backend::Postgres).await;
    let brief = Saga::<Value>::builder("brief", 1)
        .pivot(Step::new("draft", "writer"))
        .build()
        .unwrap();
    let rt = Runtime::builder()
        .database(url)
        .agent(Echo("writer"))
        .saga(brief)
        .start()
        .await
        .unwrap();
    let s = Schedule::new("tick", "brief", "* * * * * *")
        .overlap(Overlap::Allow)
        .catch_up(CatchUp::All { max: 100 });
    rt.schedules().create(&s).await.unwrap();
    wait_until("two slots fired", Duration::from_secs(20), async || {
        slots(&rt).await.len() >= 2
    })
    .await;

    pg_server().stop();
    tokio::time::sleep(Duration::from_secs(3)).await;
    pg_server().start();
    let before = slots(&rt).await.len();
    wait_until(
        "it fires on after the outage",
        Duration::from_secs(30),
        async || slots(&rt).await.len() >= before + 5,
    )
    .await;

    let fired = slots(&rt).await;
    for pair in fired.windows(2) {
        assert_eq!(pair[1] - pair[0], 1_000, "a slot lost: {fired:?}");
    }
    let view = rt.schedules().get("tick").await.unwrap().unwrap();
    assert_eq!(
        usize::try_from(view.fired).unwrap(),
        fired.len(),
        "counted fired twice (or not at all)"
    );
    eprintln!("{} slots fired across a 3 s outage, each once", fired.len());
    rt.shutdown().await;
}
