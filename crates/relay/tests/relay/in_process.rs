//! The in-process transport, through a relay and on its own.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga_core::testing::{Backend, envelope};
use agentsaga_core::{Envelope, RetryPolicy};
use agentsaga_relay::in_process::{Deliver, InProcessTransport};
use agentsaga_relay::{Delivery, Relay, Transport};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::json;

use crate::support::{config, enqueue, msg, store, wait_delivered, wait_until};

/// Records what it gets under its name and answers with `reply` (or never, if `None`).
struct Recorder {
    name: &'static str,
    seen: Arc<Mutex<Vec<(&'static str, Envelope)>>>,
    reply: Option<Delivery>,
}

impl Actor for Recorder {
    type Msg = Deliver;
    type State = Vec<ractor::RpcReplyPort<Delivery>>;
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<Deliver>,
        (): (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(Vec::new())
    }

    async fn handle(
        &self,
        _: ActorRef<Deliver>,
        msg: Deliver,
        held: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        self.seen.lock().unwrap().push((self.name, msg.envelope));
        match &self.reply {
            Some(reply) => {
                let _ = msg.reply.send(reply.clone());
            }
            None => held.push(msg.reply),
        }
        Ok(())
    }
}

type Seen = Arc<Mutex<Vec<(&'static str, Envelope)>>>;

async fn recorder(name: &'static str, seen: &Seen, reply: Option<Delivery>) -> ActorRef<Deliver> {
    let r = Recorder {
        name,
        seen: Arc::clone(seen),
        reply,
    };
    Actor::spawn(None, r, ()).await.unwrap().0
}

async fn actors_receive_through_the_relay(backend: Backend) {
    let store = store(backend).await;
    let seen = Seen::default();
    let transport = Arc::new(InProcessTransport::new());
    transport.register("a", recorder("one", &seen, Some(Delivery::Delivered)).await);
    transport.register("a", recorder("two", &seen, Some(Delivery::Delivered)).await);
    let retry = RetryPolicy::new(Duration::from_millis(5), Duration::from_millis(20), 2);
    let relay = Relay::start(
        store.clone(),
        vec!["a".into(), "nobody".into()],
        Arc::clone(&transport) as Arc<dyn agentsaga_relay::Transport>,
        config().retry(retry).breaker_threshold(0),
    )
    .await
    .unwrap();

    let mut batch: Vec<_> = (0..40)
        .map(|i| msg("a", Some(&format!("k{}", i % 4)), json!(i)))
        .collect();
    batch.extend((0..10).map(|i| msg("a", None, json!(i))));
    batch.push(msg("nobody", None, json!("lost")));
    let ids = enqueue(&store, &batch).await;
    wait_delivered(&relay, 50).await;
    // A destination with no actor (not started yet, or restarting) for far longer than
    // the retry policy: its row waits, shown as such, and dies not.
    wait_until("the one with no actor failed five times", || async {
        relay.stats().retried >= 5
    })
    .await;
    let stats = store.admin().stats().await.unwrap();
    assert_eq!((stats.dead, stats.unavailable), (0, 1), "{stats:?}");

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 50);
    // A key sticks to one actor; keyless messages go round robin.
    let mut actors_of_key: HashMap<String, HashSet<&str>> = HashMap::new();
    let mut keyless: HashMap<&str, usize> = HashMap::new();
    for (actor, e) in &seen {
        match &e.key {
            Some(k) => {
                actors_of_key.entry(k.clone()).or_default().insert(actor);
            }
            None => *keyless.entry(actor).or_default() += 1,
        }
    }
    assert!(
        actors_of_key.values().all(|a| a.len() == 1),
        "{actors_of_key:?}"
    );
    assert_eq!(
        keyless.len(),
        2,
        "round robin used both actors: {keyless:?}"
    );

    let waiting = store.admin().waiting_by_destination().await.unwrap();
    assert_eq!(
        waiting[0].unavailable_reason.as_deref(),
        Some("unavailable: no actor for destination nobody")
    );
    // Its actor comes: the row is delivered.
    let late = Seen::default();
    transport.register(
        "nobody",
        recorder("late", &late, Some(Delivery::Delivered)).await,
    );
    wait_delivered(&relay, 51).await;
    assert_eq!(late.lock().unwrap()[0].1.id, *ids.last().unwrap());
    relay.shutdown().await;
}
agentsaga_core::both_backends!(through_the_relay, actors_receive_through_the_relay);

fn is_retry_with(d: &Delivery, needle: &str) -> bool {
    matches!(d, Delivery::Retry { reason, after: None } if reason.contains(needle))
}

#[tokio::test]
async fn silence_death_and_refusals_are_outcomes() {
    let seen = Seen::default();
    let transport = InProcessTransport::new().timeout(Duration::from_millis(100));

    let d = transport.deliver(&envelope("x", "null", [])).await;
    assert!(
        matches!(&d, Delivery::Unavailable { reason, .. } if reason == "no actor for destination x"),
        "{d:?}"
    );

    transport.register(
        "refuses",
        recorder("r", &seen, Some(Delivery::reject("nope"))).await,
    );
    assert_eq!(
        transport.deliver(&envelope("refuses", "null", [])).await,
        Delivery::reject("nope")
    );

    transport.register("silent", recorder("s", &seen, None).await);
    let d = transport.deliver(&envelope("silent", "null", [])).await;
    assert!(is_retry_with(&d, "did not answer within"), "{d:?}");

    let dead = recorder("d", &seen, Some(Delivery::Delivered)).await;
    transport.register("dead", dead.clone());
    dead.stop(None);
    wait_until("the actor stopped", || async {
        dead.get_status() == ractor::ActorStatus::Stopped
    })
    .await;
    // A stopped actor never got it: nothing reached the destination.
    let d = transport.deliver(&envelope("dead", "null", [])).await;
    assert!(matches!(d, Delivery::Unavailable { .. }), "{d:?}");
    // Its replacement takes over.
    transport.register(
        "dead",
        recorder("d2", &seen, Some(Delivery::Delivered)).await,
    );
    assert_eq!(
        transport.deliver(&envelope("dead", "null", [])).await,
        Delivery::Delivered
    );

    assert_eq!(transport.destinations(), ["dead", "refuses", "silent"]);
    transport.unregister("dead");
    assert_eq!(transport.destinations(), ["refuses", "silent"]);
}
