//! How an agent's delivery runs: a database-only [`Agent`] in one hop; a
//! [`CallingAgent`]'s outside call with nothing held, then its record in one hop. What
//! the work reported it used travels with the reply.

use agentsaga_core::Envelope;
use agentsaga_relay::Delivery;
use agentsaga_saga::Usage;
use tracing::Instrument;

use super::*;
use crate::agent::{Agent, AgentContext, CallContext, CallingAgent, Meter};

#[async_trait::async_trait]
impl<A: Agent> AgentRunner for Local<A> {
    fn destination(&self) -> &str {
        self.0.destination()
    }

    fn calls_out(&self) -> bool {
        false
    }

    async fn run(&self, hub: &Hub, env: &Envelope) -> Delivery {
        let work = async {
            let command: A::Command = match decode(env) {
                Ok(c) => c,
                Err(d) => return d,
            };
            let (mut tx, read) = match begin_received(hub, env).await {
                Ok(hop) => hop,
                Err(d) => return d,
            };
            // The clock starts once the handler has its transaction: waiting for the
            // database (SQLite's single writer under load) is queueing, not work.
            let deadline = deadline_of(env);
            let meter = Meter::default();
            let result = {
                let mut ctx = AgentContext {
                    tx: &mut tx,
                    call: CallContext::metered(env, &meter),
                };
                match holding(hub, deadline, self.0.handle(&mut ctx, command)).await {
                    Ok(result) => result,
                    Err(retry) => return retry, // the hop is dropped: undone
                }
            };
            finish(hub, env, (tx, read), result, used(meter)).await
        };
        work.instrument(agent_span(env)).await
    }
}

#[async_trait::async_trait]
impl<A: CallingAgent> AgentRunner for Calling<A> {
    fn destination(&self) -> &str {
        self.0.destination()
    }

    fn calls_out(&self) -> bool {
        true
    }

    async fn run(&self, hub: &Hub, env: &Envelope) -> Delivery {
        let work = async {
            let command: A::Command = match decode(env) {
                Ok(c) => c,
                Err(d) => return d,
            };
            // A message already processed is not worth another outside call. Only a
            // redelivery can have been processed: a first delivery (attempt 1) is not
            // asked about, which saves a round trip (and a pooled connection) before
            // every call. (A dead letter re-driven after its processing had committed
            // starts again at attempt 1: its call runs again, as outside calls may;
            // the inbox still skips its database effects.)
            if env.attempts > 1 {
                match hub.store.seen(&env.destination, env.id).await {
                    Ok(true) => {
                        tracing::debug!("duplicate delivery skipped before the outside call");
                        return Delivery::Delivered;
                    }
                    Ok(false) => {}
                    Err(e) => return infra(e),
                }
            }
            let deadline = deadline_of(env);
            // One outside call per `call`, and what the agent reports besides.
            let meter = Meter::new(Usage::default().with_calls(1));
            let ctx = CallContext::metered(env, &meter);
            let call_span = tracing::info_span!(
                "agent.call",
                idempotency_key = %ctx.idempotency_key(),
                attempt = env.attempts,
            );
            let output =
                match bounded(deadline, self.0.call(&ctx, &command).instrument(call_span)).await {
                    None => return finish_timed_out(hub, env).await,
                    Some(Err(e)) => return finish_failed(hub, env, e, used(meter)).await,
                    Some(Ok(output)) => output,
                };
            let (mut tx, read) = match begin_received(hub, env).await {
                Ok(hop) => hop,
                Err(d) => return d,
            };
            // `record` gets a timeout of its own, from when it has its transaction.
            let deadline = deadline_of(env);
            let result = {
                let mut ctx = AgentContext {
                    tx: &mut tx,
                    call: CallContext::metered(env, &meter),
                };
                match holding(hub, deadline, self.0.record(&mut ctx, command, output)).await {
                    Ok(result) => result,
                    Err(retry) => return retry, // the hop is dropped: undone
                }
            };
            finish(hub, env, (tx, read), result, used(meter)).await
        };
        work.instrument(agent_span(env)).await
    }
}
