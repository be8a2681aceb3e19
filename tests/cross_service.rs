//! The cross_service example as two processes, each with its own SQLite file, linked by
//! a real `nats-server -js` (a throwaway one): `kill -9` of either process at random
//! moments and a restart of the broker mid-run lose nothing. Every order ends as its
//! number says, every effect happened once in the database of the service that owns
//! it, the refund of a remote charge ran remotely, and no message is left behind. The
//! same when either service is frozen (`SIGSTOP`) past its leases and ack wait.

mod support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agentsaga::core::Store;
use agentsaga::core::testing::{Backend, NatsServer, fresh_url};
use agentsaga::saga::SagaState;

/// The example as one of its services: `role` with `args`, its output discarded (the
/// test reads the databases).
fn spawn(role: &str, server: &NatsServer, url: &str, args: &[&str]) -> Child {
    Command::new(support::example("cross_service"))
        .arg(role)
        .args(["--nats", &server.url(), "--database-url", url])
        .args(["--lease-ms", "1000", "--ack-wait-ms", "1000"])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the cross_service example")
}

fn payments(server: &NatsServer, url: &str) -> Child {
    spawn("payments", server, url, &[])
}

/// SIGTERM, and waits (bounded) for the service to shut down.
fn terminate(child: Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    let out = support::wait_bounded(child, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "the service's shutdown: {}",
        out.status
    );
}

fn kill(mut child: Child) {
    // SIGKILL on Unix: no shutdown runs.
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends `signal` (`STOP`, `CONT`) to `child`.
fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal}");
}

/// `saga id -> ["agent/kind", …]` in the order they were written.
async fn effects(store: &Store) -> HashMap<String, Vec<String>> {
    let rows: Vec<(String, String, String)> = support::rows_of(
        store,
        "SELECT saga_id, agent, kind FROM effects ORDER BY rowid",
    )
    .await;
    let mut by_saga: HashMap<String, Vec<String>> = HashMap::new();
    for (saga, agent, kind) in rows {
        by_saga
            .entry(saga)
            .or_default()
            .push(format!("{agent}/{kind}"));
    }
    by_saga
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_either_service_and_a_broker_restart_lose_nothing() {
    const ORDERS: u64 = 1000;
    let orders = ORDERS.to_string();
    let mut server = NatsServer::start();
    let (shop_url, pay_url) = (
        fresh_url(Backend::Sqlite).await,
        fresh_url(Backend::Sqlite).await,
    );
    let seed = fastrand::u64(..);
    eprintln!("seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut moment = || Duration::from_millis(rng.u64(200..1000));

    let mut pay = payments(&server, &pay_url);
    let shop = spawn("shop", &server, &shop_url, &["--quiet", "--sagas", &orders]);
    tokio::time::sleep(moment()).await;
    kill(pay);
    pay = payments(&server, &pay_url);
    tokio::time::sleep(moment()).await;
    let mut shop = shop;
    if let Some(status) = shop.try_wait().unwrap() {
        panic!("the shop ended ({status}) before it was killed: it failed, or needs more orders");
    }
    kill(shop);
    server.restart();
    tokio::time::sleep(moment()).await;
    kill(pay);
    let pay = payments(&server, &pay_url);
    // The shop again: its orders are keyed, so it starts only those the killed one
    // had not, and waits until every order has ended.
    let shop = spawn("shop", &server, &shop_url, &["--quiet", "--sagas", &orders]);
    let out = support::wait_bounded(shop, Duration::from_secs(240));
    assert!(
        out.status.success(),
        "the shop's second run failed: {}",
        out.status
    );
    terminate(pay);
    check_orders(&shop_url, &pay_url, ORDERS).await;
}

/// Every order of `orders` ended as its number says, with each effect once in the
/// database of the service that owns it, undo after do; no dead letters, nothing in
/// flight.
async fn check_orders(shop_url: &str, pay_url: &str, orders: u64) {
    let shop = Store::connect(shop_url).await.unwrap();
    let pay = Store::connect(pay_url).await.unwrap();

    let sagas = support::all_sagas(&shop).await;
    assert_eq!(
        sagas.len() as u64,
        orders,
        "one saga per order, started once"
    );
    let (here, there) = (effects(&shop).await, effects(&pay).await);
    let none = Vec::new();
    for saga in &sagas {
        let n: u64 = saga
            .key
            .as_deref()
            .and_then(|k| k.strip_prefix("order-"))
            .and_then(|n| n.parse().ok())
            .expect("an order's key");
        let id = saga.id.to_string();
        let (mine, theirs) = (
            here.get(&id).unwrap_or(&none),
            there.get(&id).unwrap_or(&none),
        );
        if n % 4 == 3 {
            assert_eq!(saga.state, SagaState::Compensated, "order {n}");
            assert_eq!(mine, &["stock/do", "stock/undo"], "order {n}");
            assert_eq!(theirs, &["payments/do", "payments/undo"], "order {n}");
        } else {
            assert_eq!(saga.state, SagaState::Completed, "order {n}");
            assert_eq!(mine, &["stock/do", "ship/do"], "order {n}");
            assert_eq!(theirs, &["payments/do"], "order {n}");
        }
    }
    assert!(
        there.keys().all(|s| here.contains_key(s)),
        "the payments service has effects of a saga the shop does not know"
    );
    for (name, store) in [("shop", &shop), ("payments", &pay)] {
        let stats = store.admin().stats().await.unwrap();
        assert_eq!(stats.dead, 0, "{name}: dead letters: {stats:?}");
        assert_eq!(stats.in_flight, 0, "{name}: {stats:?}");
    }
}

// Each service frozen (SIGSTOP) well past its leases and the broker's ack wait, then
// thawed: what it held is redelivered or taken back, and found stored; nothing is lost
// or done twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_service_loses_nothing() {
    const ORDERS: u64 = 1000;
    let orders = ORDERS.to_string();
    let server = NatsServer::start();
    let (shop_url, pay_url) = (
        fresh_url(Backend::Sqlite).await,
        fresh_url(Backend::Sqlite).await,
    );
    let pay = payments(&server, &pay_url);
    let mut shop = spawn("shop", &server, &shop_url, &["--quiet", "--sagas", &orders]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    for which in ["shop", "payments"] {
        if let Some(status) = shop.try_wait().unwrap() {
            panic!("the shop ended ({status}) before a freeze: it failed, or needs more orders");
        }
        let frozen = if which == "shop" { &shop } else { &pay };
        signal(frozen, "STOP");
        tokio::time::sleep(Duration::from_secs(3)).await;
        signal(frozen, "CONT");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let out = support::wait_bounded(shop, Duration::from_secs(240));
    assert!(out.status.success(), "the shop failed: {}", out.status);
    terminate(pay);
    check_orders(&shop_url, &pay_url, ORDERS).await;
}
