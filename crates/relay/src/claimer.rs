//! The claimer: the one actor of a relay that talks to the outbox.
//!
//! It claims rows while fewer than `workers + batch_size` are in flight (on a wakeup,
//! a poll tick, or a worker finishing), dispatches them to the delivery pool, collects the outcomes the workers
//! report and writes them back in batches, renews the leases of rows still being
//! delivered, returns expired leases to the pool, and runs the graceful shutdown.
//!
//! Batching falls out of the mailbox: each outcome queues at most one `Flush` behind
//! it, so every outcome that arrived before that `Flush` is processed goes into the same
//! statements, and nothing waits on a timer. The acknowledgements of a `Flush` travel
//! with the claim that follows it ([`Store::ack_and_claim`]): one round trip on
//! PostgreSQL. No database transaction is open while a
//! transport delivers.

mod claim;
mod delivering;
pub(crate) mod msg;
mod shutdown;
mod upkeep;

use delivering::Delivering;
pub(crate) use delivering::held_for;
pub(crate) use msg::{ClaimerMsg, Done};

use std::sync::Arc;

use agentsaga_core::{Envelope, Store};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::breaker::{Breakers, Change};
use crate::handover::HandoverSlots;
use crate::outcomes::Outcomes;
use crate::pacer::{self, Signal, Signals};
use crate::stats::StatsCell;
use crate::worker::{PoolRef, spawn_pool};
use crate::{Delivery, RelayConfig, Transport};

/// The claimer's configuration (what changes lives in [`ClaimerState`]).
pub(crate) struct Claimer {
    pub(crate) store: Store,
    pub(crate) destinations: Vec<String>,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) config: RelayConfig,
    pub(crate) stats: Arc<StatsCell>,
}

#[derive(Debug)]
enum Stop {
    Running,
    /// Shutting down, waiting for deliveries in flight; these callers want to know.
    Draining(Vec<RpcReplyPort<()>>),
    Stopped,
}

pub(crate) struct ClaimerState {
    pool: PoolRef,
    signals: Arc<Signals>,
    pacer: Option<JoinHandle<()>>,
    /// Rows handed to the pool and not yet reported back.
    delivering: Delivering,
    outcomes: Outcomes,
    flush_queued: bool,
    breakers: Breakers,
    claim_backoff: Backoff,
    flush_backoff: Backoff,
    stop: Stop,
}

impl Actor for Claimer {
    type Msg = ClaimerMsg;
    type State = ClaimerState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<ClaimerMsg>,
        (): (),
    ) -> Result<ClaimerState, ActorProcessingErr> {
        let pool = spawn_pool(
            self.config.workers,
            Arc::clone(&self.transport),
            myself.clone(),
            self.store.clock().clone(),
        )
        .await?;
        let mut delivering = Delivering::default();
        if self.config.handover {
            let caps = self.destinations.iter().map(|d| {
                let cap = self
                    .config
                    .destination_limits
                    .get(d)
                    .copied()
                    .unwrap_or(self.config.workers);
                (d.clone(), cap)
            });
            let handover = Arc::new(HandoverSlots::new(
                self.config.owner.clone(),
                self.config.lease,
                myself,
                caps,
            ));
            delivering.installed = Some(self.store.install_handover(Arc::clone(&handover) as _));
            delivering.handover = Some(handover);
        }
        Ok(ClaimerState {
            pool,
            signals: Arc::default(),
            pacer: None,
            delivering,
            outcomes: Outcomes::default(),
            flush_queued: false,
            breakers: Breakers::new(self.config.breaker_threshold, self.config.breaker_cooldown),
            claim_backoff: Backoff::default(),
            flush_backoff: Backoff::default(),
            stop: Stop::Running,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<ClaimerMsg>,
        state: &mut ClaimerState,
    ) -> Result<(), ActorProcessingErr> {
        state.pacer = Some(pacer::spawn(
            myself,
            Arc::clone(&state.signals),
            self.store.wakeups().subscribe(),
            self.store.clock().clone(),
            self.config.poll_interval,
            self.config.lease,
        ));
        tracing::info!(
            owner = %self.config.owner,
            destinations = ?self.destinations,
            workers = self.config.workers,
            "relay started"
        );
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ClaimerMsg>,
        state: &mut ClaimerState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(pacer) = state.pacer.take() {
            pacer.abort();
        }
        state.delivering.stop_handover();
        state.pool.kill();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ClaimerMsg>,
        msg: ClaimerMsg,
        state: &mut ClaimerState,
    ) -> Result<(), ActorProcessingErr> {
        // Nothing in here returns an error: a failing database is logged and retried,
        // never a reason for the relay to die.
        match msg {
            ClaimerMsg::Tick => {
                state.signals.lower(Signal::Tick);
                if matches!(state.stop, Stop::Running) {
                    self.claim(&myself, state).await;
                }
            }
            ClaimerMsg::Done(done) => self.on_done(&myself, state, done),
            ClaimerMsg::Adopt(rows, leased_at) => self.adopt(&myself, state, rows, leased_at),
            ClaimerMsg::Flush => {
                state.flush_queued = false;
                if matches!(state.stop, Stop::Running) {
                    // The acknowledgements ride on the next claim (one round trip,
                    // and the claim sees their keys free); the other outcomes first.
                    let acks = if state.flush_backoff.remaining(Instant::now()).is_zero() {
                        state.outcomes.take_acks()
                    } else {
                        Vec::new()
                    };
                    self.flush(&myself, state).await;
                    self.claim_acking(&myself, state, acks).await;
                } else {
                    self.flush(&myself, state).await;
                    if matches!(state.stop, Stop::Draining(_)) && state.delivering.is_empty() {
                        self.finish(&myself, state).await;
                    }
                }
            }
            ClaimerMsg::Renew => {
                state.signals.lower(Signal::Renew);
                self.renew(state).await;
            }
            ClaimerMsg::Reclaim => {
                state.signals.lower(Signal::Reclaim);
                if matches!(state.stop, Stop::Running) {
                    self.reclaim(&myself, state).await;
                }
            }
            ClaimerMsg::Shutdown(reply) => self.begin_shutdown(&myself, state, reply).await,
            ClaimerMsg::ShutdownDeadline => {
                if matches!(state.stop, Stop::Draining(_)) {
                    tracing::warn!(
                        unfinished = state.delivering.len(),
                        "relay shutdown timed out; releasing unfinished deliveries"
                    );
                    self.finish(&myself, state).await;
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ClaimerMsg>,
        event: SupervisionEvent,
        state: &mut ClaimerState,
    ) -> Result<(), ActorProcessingErr> {
        let died = match &event {
            SupervisionEvent::ActorTerminated(who, ..) | SupervisionEvent::ActorFailed(who, _) => {
                who.get_id() == state.pool.get_id()
            }
            _ => false,
        };
        if died && matches!(state.stop, Stop::Running) {
            // Should not happen (the factory restarts its own workers). The deliveries
            // it held are lost: release them to be delivered again.
            tracing::error!(?event, "relay delivery pool died; restarting it");
            for seq in state.delivering.drain() {
                state.outcomes.release(seq);
            }
            self.stats.set_in_flight(0);
            state.pool = spawn_pool(
                self.config.workers,
                Arc::clone(&self.transport),
                myself.clone(),
                self.store.clock().clone(),
            )
            .await?;
            self.queue_flush(&myself, state);
        }
        Ok(())
    }
}

impl Claimer {
    /// Rows handed over on commit: delivered like claimed ones (renewed, acknowledged,
    /// retried), fenced from `leased_at` (their leases began at their insert, in the
    /// producer's transaction, not at its commit), or, once the relay stops, released to
    /// the pool. Rows whose leases ran out before the commit (a transaction open longer
    /// than the lease) are not delivered here: any relay's claim takes them, so that no
    /// two deliveries of a row overlap.
    fn adopt(
        &self,
        myself: &ActorRef<ClaimerMsg>,
        state: &mut ClaimerState,
        rows: Vec<Envelope>,
        leased_at: Instant,
    ) {
        let held_until = leased_at + held_for(self.config.lease);
        let now = self.store.clock().lease_now();
        let expired = held_until <= now;
        if expired {
            self.stats.leases_lost(rows.len());
            tracing::warn!(
                rows = rows.len(),
                open_ms = now.saturating_duration_since(leased_at).as_millis() as u64,
                lease_ms = self.config.lease.as_millis() as u64,
                "rows handed over by a transaction open longer than their lease: left to \
                 the claim (delivered once, by whichever relay claims them)"
            );
        }
        for envelope in rows {
            let seq = envelope.seq;
            let destination = envelope.destination.clone();
            if expired {
                if let Some(h) = &state.delivering.handover {
                    h.done(&destination);
                }
                continue;
            }
            if matches!(state.stop, Stop::Running) {
                self.dispatch(myself, state, envelope, false, held_until);
            } else {
                state.outcomes.release(seq);
                self.queue_flush(myself, state);
            }
            if state.delivering.mark_handed(seq) {
                self.stats.handed_over(1);
            } else if let Some(h) = &state.delivering.handover {
                h.done(&destination);
            }
        }
        self.stats.set_in_flight(state.delivering.len());
    }

    fn on_done(&self, myself: &ActorRef<ClaimerMsg>, state: &mut ClaimerState, done: Done) {
        let Some(envelope) = state.delivering.remove(done.seq, Some(done.number)) else {
            // Released meanwhile (pool restart or shutdown deadline), its lease lost,
            // or claimed again since: this delivery's outcome is not the row's.
            return;
        };
        let ok = !matches!(
            done.delivery,
            Delivery::Retry { .. } | Delivery::Unavailable { .. }
        );
        match state
            .breakers
            .record(&envelope.destination, ok, self.store.clock().now())
        {
            Some(Change::Opened) => {
                self.stats.breaker_tripped();
                tracing::warn!(
                    destination = %envelope.destination,
                    cooldown_ms = self.config.breaker_cooldown.as_millis() as u64,
                    "circuit breaker opened: destination paused"
                );
            }
            Some(Change::Closed) => {
                tracing::info!(destination = %envelope.destination, "circuit breaker closed");
            }
            None => {}
        }
        let breakers = &state.breakers;
        self.stats
            .set_paused(breakers.paused(), || breakers.pauses());
        state.outcomes.record(
            &envelope,
            done.delivery,
            done.finished_ms,
            &self.config.retry,
        );
        self.stats.set_in_flight(state.delivering.len());
        self.queue_flush(myself, state);
    }

    fn queue_flush(&self, myself: &ActorRef<ClaimerMsg>, state: &mut ClaimerState) {
        if !state.flush_queued && myself.cast(ClaimerMsg::Flush).is_ok() {
            state.flush_queued = true;
        }
    }

    /// Logs a failed database call and returns how long to back off.
    fn db_failed(
        &self,
        what: &str,
        error: &agentsaga_core::Error,
        backoff: &mut Backoff,
    ) -> std::time::Duration {
        self.stats.db_error();
        let delay = backoff.fail(Instant::now());
        tracing::warn!(
            error = %error,
            transient = error.is_transient(),
            retry_in_ms = delay.as_millis() as u64,
            "relay failed {what}; backing off"
        );
        delay
    }
}
