//! How an agent's delivery runs: a database-only [`Agent`] in one hop; a
//! [`CallingAgent`]'s outside call with nothing held, then its record in one hop. What
//! the work reported it used travels with the reply.

use agentsaga_core::Envelope;
use agentsaga_relay::Delivery;
use agentsaga_saga::Usage;
use tracing::Instrument;

use super::*;
use crate::agent::{Agent, AgentContext, CallContext, CallingAgent, Meter, StepError};
use crate::rate_limit::{self, MAX_RATE_LIMITED, Reservation};

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
            let deadline = deadline_of(env, hub.store.clock());
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
            finish(hub, env, (tx, read), result, used(&meter)).await
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
            let meter = Meter::default();
            let ctx = CallContext::metered(env, &meter);
            let output = match self.paced_call(hub, env, &ctx, &command, &meter).await {
                Ok(output) => output,
                Err(delivery) => return delivery,
            };
            let (mut tx, read) = match begin_received(hub, env).await {
                Ok(hop) => hop,
                Err(d) => return d,
            };
            // `record` gets a timeout of its own, from when it has its transaction.
            let deadline = deadline_of(env, hub.store.clock());
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
            finish(hub, env, (tx, read), result, used(&meter)).await
        };
        work.instrument(agent_span(env)).await
    }
}

impl<A: CallingAgent> Calling<A> {
    /// Runs the agent's call, at its slot if its destination is rate-limited: the slot
    /// is reserved in the database and waited for with nothing held; the step's timeout
    /// counts from the call's start. A call the outside world answers "too many
    /// requests" pauses the destination (every process) and runs again at its next
    /// slot, without spending a step retry, up to [`MAX_RATE_LIMITED`] times. `Err`:
    /// the delivery's outcome, already recorded.
    async fn paced_call(
        &self,
        hub: &Hub,
        env: &Envelope,
        ctx: &CallContext<'_>,
        command: &A::Command,
        meter: &Meter,
    ) -> Result<A::Output, Delivery> {
        let destination = self.0.destination();
        let estimate = self.0.estimate_tokens(command);
        let mut limited = 0;
        loop {
            let mut reservation = None;
            while let Some(limit) = hub.limit.as_ref().filter(|_| reservation.is_none()) {
                match rate_limit::reserve(&hub.store, destination, limit, estimate)
                    .await
                    .map_err(infra)?
                {
                    Reservation::Later(wait) => on_clock(hub, wait).await,
                    slot @ Reservation::Slot { wait, .. } => {
                        if !wait.is_zero() {
                            tracing::debug!(
                                wait_ms = wait.as_millis() as u64,
                                "waiting for a rate-limit slot"
                            );
                            on_clock(hub, wait).await;
                        }
                        reservation = Some(slot);
                    }
                }
            }
            let before = used(meter);
            // One outside call per `call`, and what the agent reports besides.
            ctx.report_usage(Usage::default().with_calls(1));
            let deadline = deadline_of(env, hub.store.clock());
            let call_span = tracing::info_span!(
                "agent.call",
                idempotency_key = %ctx.idempotency_key(),
                attempt = env.attempts,
            );
            let result = bounded(
                hub.store.clock(),
                deadline,
                self.0.call(ctx, command).instrument(call_span),
            )
            .await;
            if let Some((limit, reservation)) = hub.limit.as_ref().zip(reservation) {
                let tokens = |u: Usage| u.tokens_in.saturating_add(u.tokens_out);
                let spent = tokens(used(meter)).saturating_sub(tokens(before));
                if let Err(e) =
                    rate_limit::reconcile(&hub.store, destination, limit, reservation, spent).await
                {
                    tracing::warn!(error = %e, "a call's tokens were not settled with its rate limit");
                }
            }
            match result {
                None => return Err(finish_timed_out(hub, env).await),
                Some(Err(e @ StepError::RateLimited { retry_after })) => {
                    let Some(limit) = &hub.limit else {
                        return Err(finish_failed(hub, env, e, used(meter)).await);
                    };
                    let after = retry_after
                        .unwrap_or(rate_limit::DEFAULT_RETRY_AFTER)
                        .min(rate_limit::MAX_PAUSE);
                    tracing::info!(
                        retry_after_ms = after.as_millis() as u64,
                        "rate limited: the destination pauses"
                    );
                    rate_limit::pause(&hub.store, destination, limit, after)
                        .await
                        .map_err(infra)?;
                    limited += 1;
                    if limited > MAX_RATE_LIMITED {
                        return Err(finish_failed(hub, env, e, used(meter)).await);
                    }
                }
                Some(Err(e)) => return Err(finish_failed(hub, env, e, used(meter)).await),
                Some(Ok(output)) => return Ok(output),
            }
        }
    }
}

/// Waits `wait` on the store's clock, holding nothing: a timer a test runtime sees
/// (feature `testing`) and moves its manual clock to.
async fn on_clock(hub: &Hub, wait: std::time::Duration) {
    let clock = hub.store.clock();
    #[cfg(feature = "testing")]
    let _noted = hub.faults.waiting(
        clock
            .now_ms()
            .saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)),
    );
    clock.sleep(wait).await;
}
