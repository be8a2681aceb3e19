//! The agents' delivery: answers, timeouts, redeliveries.

use std::sync::atomic::{AtomicU32, Ordering};

use agentsaga_core::Message;
use agentsaga_core::queue::Claim;

use super::*;
use crate::{AgentContext, CallingAgent};

struct Counting(Arc<AtomicU32>);

#[async_trait::async_trait]
impl CallingAgent for Counting {
    type Command = serde_json::Value;
    type Output = ();
    type Reply = u32;
    fn destination(&self) -> &str {
        "outside"
    }
    async fn call(&self, _: &CallContext<'_>, _: &serde_json::Value) -> Result<(), StepError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn record(
        &self,
        _: &mut AgentContext<'_>,
        _: serde_json::Value,
        (): (),
    ) -> Result<u32, StepError> {
        Ok(1)
    }
}

async fn claimed(store: &Store, msg: Message) -> Envelope {
    let mut tx = store.begin().await.unwrap();
    tx.enqueue(&msg).await.unwrap();
    tx.commit().await.unwrap();
    let destinations = vec!["outside".to_owned()];
    let claim = Claim {
        owner: "t",
        destinations: &destinations,
        limit: 1,
        lease: Duration::from_secs(30),
    };
    store.queue().claim(&claim).await.unwrap().remove(0)
}

// A redelivered message that was already processed is skipped before the outside
// call: the world is not asked twice for what the inbox already has.
#[tokio::test]
async fn a_processed_message_is_not_called_again() {
    let url = agentsaga_core::testing::fresh_url(agentsaga_core::testing::backends()[0]).await;
    let store = Store::connect(&url).await.unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let agent = Calling(Counting(Arc::clone(&calls)));
    let env = claimed(
        &store,
        Message::to("outside")
            .header(header::REPLY_TO, "orchestrator")
            .json(&1)
            .unwrap(),
    )
    .await;
    let hub = Hub {
        store: store.clone(),
        limit: None,
        sagas: None,
        faults: Arc::default(),
    };
    assert_eq!(agent.run(&hub, &env).await, Delivery::Delivered);
    // Its redelivery (attempt 2: the first answer was lost) is skipped before the
    // call.
    let again = Envelope {
        attempts: 2,
        ..env.clone()
    };
    assert_eq!(agent.run(&hub, &again).await, Delivery::Delivered);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // One reply, not two.
    assert_eq!(store.admin().stats().await.unwrap().pending, 1);
    // A first delivery is not asked about: were the same message delivered as new
    // (a dead letter re-driven after it committed), the call runs again, and the
    // inbox still keeps the reply from being written twice.
    assert_eq!(agent.run(&hub, &env).await, Delivery::Delivered);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(store.admin().stats().await.unwrap().pending, 1);
}

// A message with no idempotency key header uses its own id as the key.
#[tokio::test]
async fn the_key_defaults_to_the_message_id() {
    let url = agentsaga_core::testing::fresh_url(agentsaga_core::testing::backends()[0]).await;
    let store = Store::connect(&url).await.unwrap();
    let env = claimed(&store, Message::to("outside").json(&1).unwrap()).await;
    assert_eq!(CallContext::new(&env).idempotency_key(), env.id.to_string());
    let env = claimed(
        &store,
        Message::to("outside")
            .header(header::IDEMPOTENCY_KEY, "k-1")
            .json(&1)
            .unwrap(),
    )
    .await;
    assert_eq!(CallContext::new(&env).idempotency_key(), "k-1");
}
