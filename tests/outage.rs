//! The database going away under a running process: PostgreSQL is stopped for a few
//! seconds while the trip_booking example runs. The process logs it, keeps retrying
//! with backoff, carries on when the database is back, and loses nothing. This test
//! binary has its own throwaway server, so stopping it disturbs no other test.

mod support;

use std::time::Duration;

use agentsaga::core::Store;
use agentsaga::core::testing::{pg_server, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_postgres_going_away() {
    let server = pg_server();
    let url = server.fresh_database_url().await;
    let child = support::spawn(
        "trip_booking",
        &url,
        &["--sagas", "200", "--fail-rate", "0.1", "--seed", "11"],
    );
    // Wait until every saga is started (they start in transactions of 50), so the
    // outage hits deliveries, not the example's start-up loop.
    let store = Store::connect(&url).await.unwrap();
    wait_until(
        "the sagas are started",
        Duration::from_secs(60),
        async || support::sagas(&store).await.len() == 200,
    )
    .await;
    store.close().await;
    let unfinished_at_outage = {
        let s = Store::connect(&url).await.unwrap();
        let n = support::sagas(&s)
            .await
            .iter()
            .filter(|(_, st)| !st.is_terminal())
            .count();
        s.close().await;
        n
    };
    tokio::task::spawn_blocking(|| {
        pg_server().stop();
        // The outage lasts a while of real time (the process's reconnects meet it).
        std::thread::sleep(Duration::from_secs(4));
        pg_server().start();
    })
    .await
    .unwrap();
    let out =
        tokio::task::spawn_blocking(move || support::wait_bounded(child, Duration::from_secs(240)))
            .await
            .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the process must not exit on an outage: {stderr}"
    );
    assert!(
        unfinished_at_outage > 0,
        "the outage came after the work was done: the test proved nothing"
    );
    assert!(
        stderr.to_lowercase().contains("warn"),
        "the outage was not logged:\n{stderr}"
    );
    let store = Store::connect(&url).await.unwrap();
    let (completed, compensated) = support::check_invariants(
        &store,
        &[
            ("trip_flights", "booked"),
            ("trip_hotels", "booked"),
            ("trip_cars", "booked"),
        ],
        &[("trip_payments", "charged"), ("trip_confirmations", "sent")],
    )
    .await;
    assert_eq!(completed + compensated, 200);
}
