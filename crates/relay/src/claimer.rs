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

mod shutdown;
mod upkeep;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use agentsaga_core::queue::Claim;
use agentsaga_core::{Envelope, Store};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::breaker::{Breakers, Change, Claimable};
use crate::handoff::Handoff;
use crate::pacer::{self, Signal, Signals};
use crate::settle::{ATTEMPTS_EXHAUSTED, Ack, Outcomes};
use crate::stats::StatsCell;
use crate::worker::{PoolRef, RouteKey, Task, spawn_pool};
use crate::{Delivery, RelayConfig, Transport};

/// What the claimer is told.
pub(crate) enum ClaimerMsg {
    /// New rows may be ready (wakeup or poll tick): claim for the free workers.
    Tick,
    /// A worker finished a delivery.
    Done(Done),
    /// Rows committed leased to this relay (direct handover): deliver them as claimed.
    Adopt(Vec<Envelope>),
    /// Write the collected outcomes, then claim (acknowledgements and claim in one
    /// call).
    Flush,
    /// Extend the leases of rows this relay still holds.
    Renew,
    /// Return rows with expired leases to the pool.
    Reclaim,
    /// Stop claiming, drain, release, stop; answer when done.
    Shutdown(Option<RpcReplyPort<()>>),
    /// The drain took too long: release what is left.
    ShutdownDeadline,
}

/// A worker's report.
pub(crate) struct Done {
    pub(crate) seq: i64,
    /// Which delivery of the row this was (see [`Delivering`]).
    pub(crate) number: u64,
    pub(crate) delivery: Delivery,
    /// When the delivery finished, Unix milliseconds (for the latency).
    pub(crate) finished_ms: i64,
}

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
            let handoff = Arc::new(Handoff::new(
                self.config.owner.clone(),
                self.config.lease,
                myself,
                caps,
            ));
            self.store.set_handover(Arc::clone(&handoff) as _);
            delivering.handoff = Some(handoff);
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
        state.delivering.stop_handover(&self.store);
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
            ClaimerMsg::Adopt(rows) => self.adopt(&myself, state, rows),
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
            )
            .await?;
            self.queue_flush(&myself, state);
        }
        Ok(())
    }
}

/// Rows handed to the pool and not yet reported back, counted per destination (for
/// [`RelayConfig::destination_limits`]).
#[derive(Default)]
pub(crate) struct Delivering {
    rows: HashMap<i64, Entry>,
    /// The number of the next delivery.
    next: u64,
    per_destination: HashMap<String, usize>,
    /// Direct handover, if on: its slots are given back as handed-over rows finish.
    handoff: Option<Arc<Handoff>>,
    /// The rows of these that were handed over (not claimed).
    handed: HashSet<i64>,
}

/// A row being delivered: its delivery's number, the signal that cancels it, and until
/// when this relay surely holds its lease.
struct Entry {
    envelope: Arc<Envelope>,
    number: u64,
    lost: tokio::sync::watch::Sender<bool>,
    /// Local time by which the lease surely still holds: [`held_for`] the lease from
    /// when its claim or handover was taken in, or from before its last renewal.
    held_until: Instant,
}

impl Delivering {
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Rows of `destination` in flight.
    pub(crate) fn count(&self, destination: &str) -> usize {
        self.per_destination.get(destination).copied().unwrap_or(0)
    }

    pub(crate) fn seqs(&self) -> impl Iterator<Item = i64> + '_ {
        self.rows.keys().copied()
    }

    /// A new delivery of `envelope`, held until `held_until`: its task for the pool.
    fn insert(&mut self, envelope: Arc<Envelope>, held_until: Instant) -> Arc<Task> {
        *self
            .per_destination
            .entry(envelope.destination.clone())
            .or_default() += 1;
        self.next += 1;
        let (lost, watch) = tokio::sync::watch::channel(false);
        let task = Arc::new(Task {
            envelope: Arc::clone(&envelope),
            delivery: self.next,
            lost: watch,
        });
        let entry = Entry {
            envelope,
            number: self.next,
            lost,
            held_until,
        };
        if let Some(old) = self.rows.insert(entry.envelope.seq, entry) {
            // Claimed again (its lease expired and it came back): the old delivery
            // is not the row's any more.
            let _ = old.lost.send(true);
            self.forget(&old.envelope.destination);
        }
        task
    }

    /// Forgets a dispatch that did not happen.
    fn undo(&mut self, seq: i64) {
        self.remove(seq, None);
    }

    /// The row of delivery `number` (any, if `None`), if it is still this relay's.
    fn remove(&mut self, seq: i64, number: Option<u64>) -> Option<Arc<Envelope>> {
        if number.is_some_and(|n| self.rows.get(&seq).is_none_or(|e| e.number != n)) {
            return None;
        }
        let entry = self.rows.remove(&seq)?;
        self.forget(&entry.envelope.destination);
        self.unhand(seq, &entry.envelope.destination);
        Some(entry.envelope)
    }

    /// The leases of `renewed` hold until `held_until`; every other row of `asked` is
    /// not this relay's any more (its lease expired and another took it, or it was
    /// reclaimed): its delivery is cancelled and forgotten. Returns how many.
    fn renewed(&mut self, asked: &[i64], renewed: &[i64], held_until: Instant) -> usize {
        let renewed: HashSet<i64> = renewed.iter().copied().collect();
        let mut lost = Vec::new();
        for seq in asked {
            match self.rows.get_mut(seq) {
                Some(e) if renewed.contains(seq) => e.held_until = held_until,
                Some(_) => lost.push(*seq),
                None => {}
            }
        }
        self.lose(&lost)
    }

    /// Cancels and forgets the deliveries whose lease may have run out by `now` (the
    /// renewals failed meanwhile). Returns how many.
    fn expire(&mut self, now: Instant) -> usize {
        let lost: Vec<i64> = self
            .rows
            .iter()
            .filter(|(_, e)| e.held_until <= now)
            .map(|(seq, _)| *seq)
            .collect();
        self.lose(&lost)
    }

    fn lose(&mut self, seqs: &[i64]) -> usize {
        for &seq in seqs {
            if let Some(e) = self.rows.get(&seq) {
                let _ = e.lost.send(true);
            }
            self.remove(seq, None);
        }
        seqs.len()
    }

    /// Gives back the handover slot of `seq`, if it was handed over.
    fn unhand(&mut self, seq: i64, destination: &str) {
        if self.handed.remove(&seq)
            && let Some(h) = &self.handoff
        {
            h.done(destination);
        }
    }

    /// Takes no more handed-over rows, and removes the handover from `store`.
    pub(crate) fn stop_handover(&mut self, store: &Store) {
        if let Some(h) = &self.handoff {
            h.close();
            let h: Arc<dyn agentsaga_core::handover::Handover> = Arc::clone(h) as _;
            store.remove_handover(&h);
        }
    }

    fn forget(&mut self, destination: &str) {
        if let Some(n) = self.per_destination.get_mut(destination) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_destination.remove(destination);
            }
        }
    }

    /// Empties it, returning the rows' seqs.
    pub(crate) fn drain(&mut self) -> Vec<i64> {
        self.per_destination.clear();
        let rows: Vec<_> = self.rows.drain().collect();
        for (seq, entry) in &rows {
            self.unhand(*seq, &entry.envelope.destination);
        }
        rows.into_iter().map(|(seq, _)| seq).collect()
    }
}

/// How long after its claim (or renewal) was answered a lease surely still holds: the
/// lease less a tenth, for the round trip of the claim, and for a row handed over, the
/// time between its insert (where its lease began) and its commit.
pub(crate) fn held_for(lease: std::time::Duration) -> std::time::Duration {
    lease - lease / 10
}

impl Claimer {
    /// Claims rows up to the in-flight window and dispatches them.
    async fn claim(&self, myself: &ActorRef<ClaimerMsg>, state: &mut ClaimerState) {
        self.claim_acking(myself, state, Vec::new()).await;
    }

    /// Writes `acks` and claims rows up to the in-flight window, in one call when it
    /// can, and dispatches them.
    async fn claim_acking(
        &self,
        myself: &ActorRef<ClaimerMsg>,
        state: &mut ClaimerState,
        acks: Vec<Ack>,
    ) {
        let now = Instant::now();
        if !state.claim_backoff.remaining(now).is_zero() {
            // The failure that set the backoff scheduled a Tick; the acks go alone.
            self.write_acks(myself, state, acks).await;
            return;
        }
        // The window: every worker busy plus a full batch queued in the pool behind
        // them. Claiming only for idle workers made each claim a handful of rows and
        // each ack smaller still (one statement per few rows); queued rows are leased
        // and renewed like the ones being delivered, and per-key order is the claim's
        // business (one row per key in flight), not the pool's.
        let window = self.config.workers + self.config.batch_size as usize;
        let free = window.saturating_sub(state.delivering.len());
        if free == 0 {
            self.write_acks(myself, state, acks).await;
            return;
        }
        let limit = u32::try_from(free)
            .unwrap_or(u32::MAX)
            .min(self.config.batch_size);
        let Claimable { mut closed, probe } = state.breakers.claimable(&self.destinations, now);
        // A destination at its in-flight cap sits this claim out.
        closed.retain(|d| {
            self.config
                .destination_limits
                .get(d)
                .is_none_or(|&cap| state.delivering.count(d) < cap)
        });
        let mut claimed = Vec::new();
        let mut error = None;
        let mut full = false;
        if closed.is_empty() {
            self.write_acks(myself, state, acks).await;
        } else {
            let seqs: Vec<i64> = acks.iter().map(|a| a.seq).collect();
            match self
                .store
                .queue()
                .ack_and_claim(&seqs, &self.claim_of(&closed, limit))
                .await
            {
                Ok((acked, rows)) => {
                    Outcomes::acked(&acks, acked, &self.stats);
                    full = rows.len() == limit as usize;
                    claimed.extend(rows.into_iter().map(|e| (e, false)));
                }
                Err(e) => {
                    // Neither happened: the acks wait for the retry below.
                    state.outcomes.restore_acks(acks);
                    error = Some(e);
                }
            }
        }
        // A half-open destination gets a single probe row.
        for destination in &probe {
            if error.is_some() || claimed.len() >= free {
                break;
            }
            let one = std::slice::from_ref(destination);
            match self.store.queue().claim(&self.claim_of(one, 1)).await {
                Ok(rows) => {
                    if !rows.is_empty() {
                        state.breakers.probing(destination, true);
                    }
                    claimed.extend(rows.into_iter().map(|e| (e, true)));
                }
                Err(e) => error = Some(e),
            }
        }
        let count = claimed.len();
        for (envelope, probe) in claimed {
            self.dispatch(myself, state, envelope, probe);
        }
        self.stats.set_in_flight(state.delivering.len());
        if let Some(e) = error {
            let delay = self.db_failed("claiming rows", &e, &mut state.claim_backoff);
            myself.send_after(delay, || ClaimerMsg::Tick);
            if !state.outcomes.is_empty() && !state.flush_queued {
                state.flush_queued = true;
                myself.send_after(delay, || ClaimerMsg::Flush);
            }
        } else {
            state.claim_backoff.reset();
            if full && count < free {
                // A full batch and room for more: there may be more ready rows.
                state.signals.post(myself, Signal::Tick);
            }
        }
    }

    /// Writes acknowledgements on their own (no claim to carry them).
    async fn write_acks(
        &self,
        myself: &ActorRef<ClaimerMsg>,
        state: &mut ClaimerState,
        acks: Vec<Ack>,
    ) {
        if !acks.is_empty() {
            state.outcomes.restore_acks(acks);
            self.flush(myself, state).await;
        }
    }

    fn claim_of<'a>(&'a self, destinations: &'a [String], limit: u32) -> Claim<'a> {
        Claim {
            owner: &self.config.owner,
            destinations,
            limit,
            lease: self.config.lease,
        }
    }

    fn dispatch(
        &self,
        myself: &ActorRef<ClaimerMsg>,
        state: &mut ClaimerState,
        envelope: Envelope,
        probe: bool,
    ) {
        if envelope.attempts > self.config.retry.max_attempts {
            // Claimed more often than the budget allows: relays died delivering it
            // (e.g. it crashes whatever handles it). Do not try again.
            if probe {
                state.breakers.probing(&envelope.destination, false);
            }
            state
                .outcomes
                .give_up(&envelope, ATTEMPTS_EXHAUSTED.to_owned());
            self.queue_flush(myself, state);
            return;
        }
        let envelope = Arc::new(envelope);
        let seq = envelope.seq;
        let held_until = Instant::now() + held_for(self.config.lease);
        let task = state.delivering.insert(Arc::clone(&envelope), held_until);
        match state.pool.dispatch(RouteKey::of(&envelope), task) {
            Ok(()) => {}
            Err(e) => {
                state.delivering.undo(seq);
                tracing::warn!(seq, error = %e, "relay delivery pool unavailable; releasing the row");
                if probe {
                    state.breakers.probing(&envelope.destination, false);
                }
                state.outcomes.release(seq);
                self.queue_flush(myself, state);
            }
        }
    }

    /// Rows handed over on commit: delivered like claimed ones (renewed, acknowledged,
    /// retried), or, once the relay stops, released to the pool.
    fn adopt(&self, myself: &ActorRef<ClaimerMsg>, state: &mut ClaimerState, rows: Vec<Envelope>) {
        for envelope in rows {
            let seq = envelope.seq;
            let destination = envelope.destination.clone();
            if matches!(state.stop, Stop::Running) {
                self.dispatch(myself, state, envelope, false);
            } else {
                state.outcomes.release(seq);
                self.queue_flush(myself, state);
            }
            if state.delivering.rows.contains_key(&seq) {
                state.delivering.handed.insert(seq);
                self.stats.handed_over(1);
            } else if let Some(h) = &state.delivering.handoff {
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
        let ok = !matches!(done.delivery, Delivery::Retry { .. });
        match state
            .breakers
            .record(&envelope.destination, ok, Instant::now())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(seq: i64) -> Arc<Envelope> {
        Arc::new(Envelope {
            seq,
            id: agentsaga_core::MessageId::new(),
            destination: "d".into(),
            key: None,
            payload: "null".into(),
            headers: Default::default(),
            attempts: 1,
            created_at_ms: 0,
        })
    }

    // A row claimed again by the same relay is another delivery: the old one is told
    // it lost the row, and its outcome does not settle the new one.
    #[test]
    fn a_second_delivery_of_a_row_fences_the_first() {
        let mut d = Delivering::default();
        let later = Instant::now() + std::time::Duration::from_secs(60);
        let first = d.insert(envelope(7), later);
        assert!(!*first.lost.borrow());
        let second = d.insert(envelope(7), later);
        assert!(*first.lost.borrow(), "the first delivery is told");
        assert!(!*second.lost.borrow());
        assert_eq!(d.len(), 1);
        assert_eq!(d.count("d"), 1);
        assert!(
            d.remove(7, Some(first.delivery)).is_none(),
            "a stale outcome"
        );
        assert_eq!(d.len(), 1);
        assert!(d.remove(7, Some(second.delivery)).is_some());
        assert!(d.is_empty());
    }

    // Renewal: rows not renewed are lost (cancelled, forgotten); with renewals failing,
    // rows past their local deadline are.
    #[test]
    fn rows_not_renewed_are_lost() {
        let mut d = Delivering::default();
        let now = Instant::now();
        let a = d.insert(envelope(1), now + std::time::Duration::from_secs(60));
        let b = d.insert(envelope(2), now + std::time::Duration::from_secs(60));
        assert_eq!(
            d.renewed(&[1, 2], &[1], now + std::time::Duration::from_secs(30)),
            1
        );
        assert!(!*a.lost.borrow());
        assert!(*b.lost.borrow());
        assert_eq!(d.len(), 1);
        assert_eq!(d.expire(now + std::time::Duration::from_secs(29)), 0);
        assert_eq!(d.expire(now + std::time::Duration::from_secs(31)), 1);
        assert!(*a.lost.borrow());
        assert!(d.is_empty());
    }
}
