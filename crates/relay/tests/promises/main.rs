//! The promise suite: what every transport between two services' outboxes must keep
//! (docs/guarantees.md, "Across services"), written once and run against each
//! transport on both backends. A transport is a [`Crossing`]: a relay on A's store
//! sending [`DEST`] to a receiving side that stores it in B's outbox, through a TCP
//! proxy of the test's own on 127.0.0.1 (throttled, cut and restored, or down).
//!
//! After each fault: B holds every message once, each key's in the order A enqueued
//! them; A dead-lettered nothing that could be carried.
//!
//! Run against: the HTTP transport and receiver, and NATS JetStream (a throwaway
//! `nats-server -js`, the proxy between it and both services). A new transport is done
//! when it passes here.

#[path = "../nats/proxy.rs"]
mod proxy;

mod crossings;
mod promises;

use std::collections::HashMap;
use std::time::Duration;

use agentsaga_core::testing::{Backend, fresh_url, wait_until};
use agentsaga_core::{Message, MessageId, RetryPolicy, Sql, Store};
use agentsaga_relay::{Relay, RelayConfig};

use proxy::Proxy;

/// The destination the receiving service serves.
const DEST: &str = "payments";

/// A destination no transport can carry (no route, not a subject).
const BAD: &str = "pay ments";

/// How long any condition may take before a test fails.
const DEADLINE: Duration = Duration::from_secs(40);

/// One way from A's outbox to B's: a relay on A and a receiving side on B, with a link
/// between them that the test controls.
pub(crate) trait Crossing: Sized {
    /// Starts the receiving side on `b` and a relay on `a` for [`DEST`] and [`BAD`].
    async fn start(a: &Store, b: &Store, config: RelayConfig) -> Self;
    /// A's relay.
    fn relay(&self) -> &Relay;
    /// The link (throttle, cut, restore).
    fn link(&self) -> &Proxy;
    /// The other side away: the broker, or the receiving service and its host.
    async fn away(&mut self);
    /// Back from [`away`](Self::away).
    async fn back(&mut self);
    /// The receiving side dies where it stands (its connections dropped, a batch or a
    /// request maybe committed and not answered) and starts again on B's store.
    async fn crash_receiver(&mut self);
    /// Stops everything it started.
    async fn stop(self);
}

async fn store(backend: Backend) -> Store {
    store_with(backend, agentsaga_core::StoreConfig::default()).await
}

async fn store_with(backend: Backend, config: agentsaga_core::StoreConfig) -> Store {
    Store::connect_with(&fresh_url(backend).await, config)
        .await
        .expect("open the store")
}

/// The relay's settings in the suite: quick polls, short shutdowns, `attempts` tries.
fn relay_config(attempts: u32) -> RelayConfig {
    RelayConfig::default()
        .poll_interval(Duration::from_millis(50))
        .shutdown_timeout(Duration::from_secs(5))
        .retry(RetryPolicy::new(
            Duration::from_millis(10),
            Duration::from_millis(100),
            attempts,
        ))
        .breaker_cooldown(Duration::from_millis(50))
}

/// `n` messages to [`DEST`] over `keys` keys (`k0`, `k1`, …), from `from` on, each
/// with `pad` bytes of payload, enqueued in one transaction.
async fn enqueue(store: &Store, from: usize, n: usize, keys: usize, pad: usize) -> Vec<Message> {
    let messages: Vec<Message> = (from..from + n)
        .map(|i| {
            Message::to(DEST)
                .key(format!("k{}", i % keys))
                .json(&serde_json::json!({ "i": i, "pad": "x".repeat(pad) }))
                .unwrap()
                .header("n", i.to_string())
        })
        .collect();
    let mut tx = store.begin().await.unwrap();
    tx.enqueue_batch(&messages).await.unwrap();
    tx.commit().await.unwrap();
    messages
}

/// B's rows of [`DEST`] (but its dead letters): (id, key), in its order.
async fn rows(store: &Store) -> Vec<(MessageId, Option<String>)> {
    let rows: Vec<(String, Option<String>)> = Sql::new(
        "SELECT id, key FROM outbox WHERE destination = ? AND state <> 'dead' ORDER BY seq",
    )
    .bind(DEST)
    .fetch_all(store.reader())
    .await
    .map(|rows| {
        rows.iter()
            .map(|r| (r.text("id").unwrap(), r.opt_text("key").unwrap()))
            .collect()
    })
    .expect("read B's outbox");
    rows.into_iter()
        .map(|(id, key)| (id.parse().expect("a uuid"), key))
        .collect()
}

/// Waits until B holds `sent.len()` rows, then checks the promise: each message once,
/// each key's in A's order, and nothing dead at A.
async fn arrived_once_in_order(a: &Store, b: &Store, sent: &[Message]) {
    wait_until(
        &format!("{} messages in B", sent.len()),
        DEADLINE,
        async || rows(b).await.len() >= sent.len(),
    )
    .await;
    let got = rows(b).await;
    assert_eq!(got.len(), sent.len(), "a message stored twice");
    let by_key = |pairs: Vec<(MessageId, Option<String>)>| {
        let mut m: HashMap<Option<String>, Vec<MessageId>> = HashMap::new();
        for (id, key) in pairs {
            m.entry(key).or_default().push(id);
        }
        m
    };
    let expected = by_key(sent.iter().map(|m| (m.id, m.key.clone())).collect());
    assert_eq!(by_key(got), expected, "per-key order or a message lost");
    let stats = a.admin().stats().await.unwrap();
    assert_eq!(
        stats.dead, 0,
        "A dead-lettered what could be carried: {stats:?}"
    );
}

/// Runs each named promise of [`promises`] against `$crossing` on both backends.
macro_rules! promises_of {
    ($crossing:ty => $module:ident: $($promise:ident),* $(,)?) => {
        mod $module {
            $(
                mod $promise {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn sqlite() {
                        crate::promises::$promise::<$crossing>(
                            agentsaga_core::testing::Backend::Sqlite,
                        )
                        .await;
                    }

                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn postgres() {
                        crate::promises::$promise::<$crossing>(
                            agentsaga_core::testing::Backend::Postgres,
                        )
                        .await;
                    }
                }
            )*
        }
    };
}

promises_of!(crate::crossings::Http => http:
    order_over_a_throttled_link,
    order_when_the_link_is_cut_and_restored,
    an_outage_longer_than_the_retry_policy_fails_nothing,
    what_cannot_be_carried_is_dead_lettered_with_its_reason,
    a_frozen_link_past_the_ack_wait_loses_nothing,
    a_receiver_crash_mid_stream_loses_nothing,
    what_the_receiver_cannot_store_is_dead_lettered_and_told,
);

promises_of!(crate::crossings::Nats => nats:
    order_over_a_throttled_link,
    order_when_the_link_is_cut_and_restored,
    an_outage_longer_than_the_retry_policy_fails_nothing,
    what_cannot_be_carried_is_dead_lettered_with_its_reason,
    a_frozen_link_past_the_ack_wait_loses_nothing,
    a_receiver_crash_mid_stream_loses_nothing,
    what_the_receiver_cannot_store_is_dead_lettered_and_told,
);
