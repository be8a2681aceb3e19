//! A scripted fake transport and helpers shared by the relay tests.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_core::{Envelope, Message, MessageId, RetryPolicy, Store};
use agentsaga_relay::{Delivery, Relay, RelayConfig, Transport};
use tokio::sync::watch;
use tokio::time::Instant;

/// How long any condition may take before a test fails.
pub(crate) const DEADLINE: Duration = Duration::from_secs(20);

/// One call the transport received.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) at: Instant,
    pub(crate) envelope: Envelope,
    pub(crate) reply: Delivery,
}

#[derive(Default)]
struct Script {
    by_key: HashMap<String, VecDeque<Delivery>>,
    by_destination: HashMap<String, VecDeque<Delivery>>,
    default_by_destination: HashMap<String, Delivery>,
    flaky: HashMap<String, f64>,
    delay: HashMap<String, Duration>,
    jitter_ms: u64,
    blocked_keys: HashSet<String>,
    blocked_destinations: HashSet<String>,
}

/// A transport whose replies are chosen call by call: first a reply scripted for the
/// message's key, then one scripted for its destination, then (with the destination's
/// flakiness) a retry, then the destination's default, then `Delivered`.
pub(crate) struct Scripted {
    script: Mutex<Script>,
    calls: Mutex<Vec<Call>>,
    gate: watch::Sender<bool>,
}

impl Scripted {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            script: Mutex::default(),
            calls: Mutex::default(),
            gate: watch::channel(false).0,
        })
    }

    fn with<R>(&self, f: impl FnOnce(&mut Script) -> R) -> R {
        f(&mut self.script.lock().unwrap())
    }

    pub(crate) fn script(&self, destination: &str, replies: impl IntoIterator<Item = Delivery>) {
        self.with(|s| {
            s.by_destination
                .entry(destination.to_owned())
                .or_default()
                .extend(replies)
        });
    }

    pub(crate) fn script_key(&self, key: &str, replies: impl IntoIterator<Item = Delivery>) {
        self.with(|s| s.by_key.entry(key.to_owned()).or_default().extend(replies));
    }

    pub(crate) fn default_for(&self, destination: &str, reply: Delivery) {
        self.with(|s| {
            s.default_by_destination
                .insert(destination.to_owned(), reply)
        });
    }

    /// This share of the destination's calls answer `Retry` (after 1 ms).
    pub(crate) fn flaky(&self, destination: &str, share: f64) {
        self.with(|s| s.flaky.insert(destination.to_owned(), share));
    }

    pub(crate) fn delay(&self, destination: &str, delay: Duration) {
        self.with(|s| s.delay.insert(destination.to_owned(), delay));
    }

    /// Every call sleeps a random 0..=`ms` milliseconds.
    pub(crate) fn jitter(&self, ms: u64) {
        self.with(|s| s.jitter_ms = ms);
    }

    /// Calls for this key wait until [`open_gate`](Self::open_gate).
    pub(crate) fn block_key(&self, key: &str) {
        self.with(|s| s.blocked_keys.insert(key.to_owned()));
    }

    /// Calls for this destination wait until [`open_gate`](Self::open_gate).
    pub(crate) fn block_destination(&self, destination: &str) {
        self.with(|s| s.blocked_destinations.insert(destination.to_owned()));
    }

    pub(crate) fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub(crate) fn calls_to(&self, destination: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.envelope.destination == destination)
            .collect()
    }

    pub(crate) fn calls_for(&self, id: MessageId) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.envelope.id == id)
            .collect()
    }
}

#[async_trait::async_trait]
impl Transport for Scripted {
    async fn deliver(&self, envelope: &Envelope) -> Delivery {
        let dest = &envelope.destination;
        let (reply, delay, blocked) = self.with(|s| {
            let scripted = envelope
                .key
                .as_ref()
                .and_then(|k| s.by_key.get_mut(k))
                .and_then(VecDeque::pop_front)
                .or_else(|| s.by_destination.get_mut(dest).and_then(VecDeque::pop_front));
            let flaky = s.flaky.get(dest).is_some_and(|p| fastrand::f64() < *p);
            let reply = scripted.unwrap_or_else(|| {
                if flaky {
                    Delivery::retry_after("flaky", Duration::from_millis(1))
                } else {
                    s.default_by_destination
                        .get(dest)
                        .cloned()
                        .unwrap_or(Delivery::Delivered)
                }
            });
            let jitter = Duration::from_millis(fastrand::u64(0..=s.jitter_ms));
            let delay = s.delay.get(dest).copied().unwrap_or_default() + jitter;
            let blocked = s.blocked_destinations.contains(dest)
                || envelope
                    .key
                    .as_ref()
                    .is_some_and(|k| s.blocked_keys.contains(k));
            (reply, delay, blocked)
        });
        self.calls.lock().unwrap().push(Call {
            at: Instant::now(),
            envelope: envelope.clone(),
            reply: reply.clone(),
        });
        if blocked {
            let mut gate = self.gate.subscribe();
            let _ = gate.wait_for(|open| *open).await;
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        reply
    }
}

/// A store on a fresh database.
pub(crate) async fn store(backend: Backend) -> Store {
    Store::connect(&fresh_url(backend).await)
        .await
        .expect("open the store")
}

/// Test defaults: quick polls, a tiny retry policy, short shutdowns.
pub(crate) fn config() -> RelayConfig {
    RelayConfig::default()
        .poll_interval(Duration::from_millis(50))
        .retry(RetryPolicy::new(
            Duration::from_millis(5),
            Duration::from_millis(20),
            5,
        ))
        .lease(Duration::from_secs(10))
        .shutdown_timeout(Duration::from_secs(5))
}

pub(crate) async fn start(
    store: &Store,
    destinations: &[&str],
    transport: &Arc<Scripted>,
    config: RelayConfig,
) -> Relay {
    let transport: Arc<dyn Transport> = transport.clone();
    Relay::start(
        store.clone(),
        destinations.iter().map(|d| (*d).to_owned()).collect(),
        transport,
        config,
    )
    .await
    .expect("start the relay")
}

/// Enqueues `messages` in one transaction and returns their ids.
pub(crate) async fn enqueue(store: &Store, messages: &[Message]) -> Vec<MessageId> {
    let mut tx = store.begin().await.expect("begin");
    for m in messages {
        tx.enqueue(m).await.expect("enqueue");
    }
    tx.commit().await.expect("commit");
    messages.iter().map(|m| m.id).collect()
}

pub(crate) fn msg(destination: &str, key: Option<&str>, payload: serde_json::Value) -> Message {
    let m = Message::to(destination).json(&payload).expect("json");
    match key {
        Some(k) => m.key(k),
        None => m,
    }
}

/// Polls `condition` until it holds; fails the test after [`DEADLINE`].
pub(crate) async fn wait_until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    agentsaga_core::testing::wait_until(what, DEADLINE, async || condition().await).await;
}

/// Waits until the relay has marked `n` rows delivered.
pub(crate) async fn wait_delivered(relay: &Relay, n: u64) {
    wait_until(&format!("{n} rows are delivered"), || async {
        relay.stats().delivered >= n
    })
    .await;
}
