//! (feature `nats`) A saga in one service, one of its agents in another, each with its
//! own SQLite database, linked by a real `nats-server -js` (a throwaway one per test):
//! commands and replies cross the broker both ways, every saga ends, every effect
//! happens once, compensations of the remote step run remotely, and a restart of the
//! broker or of the agent service loses nothing. `python`: the agent service is a
//! Python program instead. `console`: the runtime's console showing the broker's side.

#[cfg(feature = "console")]
mod console;
mod dead_there;
mod names;
mod outage;
mod python;
mod python_wire;

use std::time::Duration;

use agentsaga_core::testing::{Backend, NatsServer, fresh_url};
use agentsaga_core::{Sql, Store};
use agentsaga_runtime::{Agent, AgentContext, NatsLink, Runtime, StepError};
use agentsaga_saga::{Saga, SagaDefinition, SagaId, SagaState, Step};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    n: u32,
}

/// Records each command it handles in its own database's `effects` table, in the
/// handler's transaction: a row per effect, so an effect applied twice shows.
/// `ship` fails every order whose `n % 4 == 3`, fatally.
struct Recorder(&'static str);

#[async_trait::async_trait]
impl Agent for Recorder {
    type Command = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        self.0
    }
    async fn handle(&self, ctx: &mut AgentContext<'_>, cmd: Value) -> Result<Value, StepError> {
        let saga = ctx.saga_id().expect("a saga's command").to_string();
        let undo = ctx.is_compensation();
        if self.0 == "ship" && cmd["n"].as_u64().unwrap_or_default() % 4 == 3 {
            return Err(StepError::fatal("nothing to ship to"));
        }
        let kind = if undo { "undo" } else { "do" };
        Sql::new("INSERT INTO effects (agent, saga, kind) VALUES (?, ?, ?)")
            .bind(self.0)
            .bind(&saga)
            .bind(kind)
            .execute(ctx.conn())
            .await?;
        Ok(json!({ "by": self.0 }))
    }
}

/// reserve (here) → charge (the payments service) → ship (here; fails for n % 4 == 3,
/// which refunds the charge there and releases the reservation here).
fn saga() -> SagaDefinition {
    Saga::<Order>::builder("order", 1)
        .step(Step::new("reserve", "stock").compensate("stock", |o: &Order| json!(o.n)))
        .step(
            Step::new("charge", "payments")
                .command(|o: &Order| json!({ "n": o.n }))
                .compensate("payments", |o: &Order| json!(o.n)),
        )
        .step(
            Step::new("ship", "ship")
                .command(|o: &Order| json!({ "n": o.n }))
                .nothing_to_undo(),
        )
        .build()
        .unwrap()
}

async fn effects_table(store: &Store) {
    let ddl = if store.backend() == "postgres" {
        "CREATE TABLE IF NOT EXISTS effects (n BIGSERIAL PRIMARY KEY, \
         agent TEXT NOT NULL, saga TEXT NOT NULL, kind TEXT NOT NULL)"
    } else {
        "CREATE TABLE IF NOT EXISTS effects (n INTEGER PRIMARY KEY AUTOINCREMENT, \
         agent TEXT NOT NULL, saga TEXT NOT NULL, kind TEXT NOT NULL)"
    };
    let mut tx = store.begin().await.unwrap();
    Sql::new(ddl).execute(tx.conn()).await.unwrap();
    tx.commit().await.unwrap();
}

/// The effects a store holds, `agent/kind` per saga, in the order they were written.
async fn effects(store: &Store) -> Vec<(String, String)> {
    Sql::new("SELECT saga, agent, kind FROM effects ORDER BY n")
        .fetch_all(store.reader())
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let (agent, kind) = (r.text("agent").unwrap(), r.text("kind").unwrap());
            (r.text("saga").unwrap(), format!("{agent}/{kind}"))
        })
        .collect()
}

async fn link(server: &NatsServer, service: &str) -> NatsLink {
    NatsLink::connect(&server.url(), service)
        .await
        .unwrap()
        .ack_wait(Duration::from_secs(2))
}

/// The shop: the saga and two of its agents; `payments` is remote.
async fn shop(url: &str, server: &NatsServer) -> Runtime {
    let rt = Runtime::builder()
        .database(url)
        .agent(Recorder("stock"))
        .agent(Recorder("ship"))
        .saga(saga())
        .remote("payments", &link(server, "shop").await)
        .start()
        .await
        .unwrap();
    effects_table(rt.store()).await;
    rt
}

/// The payments service: the `payments` agent, answering the shop's saga.
async fn payments(url: &str, server: &NatsServer) -> Runtime {
    let rt = Runtime::builder()
        .database(url)
        .agent(Recorder("payments"))
        .remote_saga("order", 1, &link(server, "payments").await)
        .start()
        .await
        .unwrap();
    effects_table(rt.store()).await;
    rt
}

/// Waits (bounded) for every saga to settle; returns their states.
async fn settle(rt: &Runtime, ids: &[SagaId]) -> Vec<SagaState> {
    let mut states = Vec::new();
    for id in ids {
        let state = tokio::time::timeout(Duration::from_secs(90), rt.wait(*id))
            .await
            .unwrap_or_else(|_| panic!("saga {id} did not settle within 90 s"))
            .unwrap();
        states.push(state);
    }
    states
}

/// Every saga ended as its `n` says, and each service holds exactly its effects, once
/// each, undo after do.
async fn check(shop: &Runtime, payments: &Runtime, ids: &[SagaId], states: &[SagaState]) {
    let (here, there) = (effects(shop.store()).await, effects(payments.store()).await);
    for (n, (id, state)) in ids.iter().zip(states).enumerate() {
        let failed = n % 4 == 3;
        let expected = if failed {
            SagaState::Compensated
        } else {
            SagaState::Completed
        };
        assert_eq!(*state, expected, "saga {id} (n = {n})");
        let of = |all: &[(String, String)]| -> Vec<String> {
            all.iter()
                .filter(|(s, _)| *s == id.to_string())
                .map(|(_, e)| e.clone())
                .collect()
        };
        let (mine, theirs) = (of(&here), of(&there));
        if failed {
            assert_eq!(mine, ["stock/do", "stock/undo"], "saga {id}");
            assert_eq!(theirs, ["payments/do", "payments/undo"], "saga {id}");
        } else {
            assert_eq!(mine, ["stock/do", "ship/do"], "saga {id}");
            assert_eq!(theirs, ["payments/do"], "saga {id}");
        }
    }
    for rt in [shop, payments] {
        let stats = rt.store().admin().stats().await.unwrap();
        assert_eq!(stats.dead, 0, "dead letters: {stats:?}");
    }
}

async fn start_orders(rt: &Runtime, orders: std::ops::Range<u32>) -> Vec<SagaId> {
    let mut ids = Vec::new();
    for n in orders {
        ids.push(rt.start_saga("order", &Order { n }).await.unwrap());
    }
    ids
}

// Commands go out to the payments service and its replies come back; the remote step
// is compensated remotely when a later one fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_crosses_services_and_back() {
    let server = NatsServer::start();
    let (url_shop, url_pay) = (
        fresh_url(Backend::Sqlite).await,
        fresh_url(Backend::Sqlite).await,
    );
    let pay = payments(&url_pay, &server).await;
    let shop = shop(&url_shop, &server).await;
    let ids = start_orders(&shop, 0..24).await;
    let states = settle(&shop, &ids).await;
    check(&shop, &pay, &ids, &states).await;
    shop.shutdown().await;
    pay.shutdown().await;
}

// The same with the shop on PostgreSQL (the payments service keeps its SQLite file):
// the link works the same on either backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_on_postgres_crosses_to_a_sqlite_service_and_back() {
    let server = NatsServer::start();
    let (url_shop, url_pay) = (
        fresh_url(Backend::Postgres).await,
        fresh_url(Backend::Sqlite).await,
    );
    let pay = payments(&url_pay, &server).await;
    let shop = shop(&url_shop, &server).await;
    assert_eq!(shop.store().backend(), "postgres");
    let ids = start_orders(&shop, 0..24).await;
    let states = settle(&shop, &ids).await;
    check(&shop, &pay, &ids, &states).await;
    shop.shutdown().await;
    pay.shutdown().await;
}

// The broker killed and started again mid-run, then the payments service stopped and
// started again on its database while sagas wait for it: every saga still ends, every
// effect happened once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_or_service_restart_loses_nothing() {
    let mut server = NatsServer::start();
    let (url_shop, url_pay) = (
        fresh_url(Backend::Sqlite).await,
        fresh_url(Backend::Sqlite).await,
    );
    let pay = payments(&url_pay, &server).await;
    let shop = shop(&url_shop, &server).await;
    let mut ids = start_orders(&shop, 0..16).await;
    server.restart();
    ids.extend(start_orders(&shop, 16..32).await);
    pay.shutdown().await;
    ids.extend(start_orders(&shop, 32..40).await);
    let pay = payments(&url_pay, &server).await;
    let states = settle(&shop, &ids).await;
    check(&shop, &pay, &ids, &states).await;
    shop.shutdown().await;
    pay.shutdown().await;
}
