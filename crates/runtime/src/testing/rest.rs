//! How a [`TestRuntime`] comes to rest and moves its clock: what is busy (in flight,
//! due), the next timer, and the moves from timer to timer.

use std::time::Duration;

use agentsaga_core::Sql;
use agentsaga_saga::{SagaId, SagaState};

use super::{FIRST_MOVE_PATIENCE, MAX_SKIPS, TestRuntime, recording};
use crate::{Error, Result};

impl TestRuntime {
    /// Lets `d` of clock time pass, as it would pass for real: the clock moves from
    /// timer to timer (a retry's backoff, a sleep's end, a timeout, a schedule's slot)
    /// up to `d`, and what falls due at each runs before it moves on (a retry that
    /// falls due again within `d` runs again). When it returns, the clock stands `d`
    /// later and the runtime is at rest. What is due when it is called runs first; an
    /// agent still at work after [`FIRST_MOVE_PATIENCE`] keeps its work, and the clock
    /// moves under it (so that a step's timeout can be passed under an agent that
    /// never answers).
    ///
    /// # Errors
    /// As [`run_until_idle`](Self::run_until_idle); [`Error::NotAtRest`] after
    /// [`MAX_SKIPS`] moves of the clock within `d`.
    pub async fn advance(&self, d: Duration) -> Result<()> {
        let target = self
            .now_ms()
            .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        // What is due now runs first; an agent still at work after a moment is left
        // at it (it may be waiting for this very move: a step's timeout).
        if let Err(e) = self.rest_within(FIRST_MOVE_PATIENCE).await
            && self.crashed()
        {
            return Err(e);
        }
        for _ in 0..MAX_SKIPS {
            let next = self.next_timer_ms().await?;
            let step = next.map_or(target, |t| t.min(target));
            let ahead = u64::try_from(step.saturating_sub(self.now_ms())).unwrap_or(0);
            self.runtime
                .store()
                .advance_clock(Duration::from_millis(ahead))
                .await?;
            self.run_until_idle().await?;
            if self.now_ms() >= target {
                return Ok(());
            }
        }
        Err(Error::NotAtRest(format!(
            "more than {MAX_SKIPS} timers fell due within {d:?}"
        )))
    }

    /// Waits (real time, at most its patience, [`PATIENCE`](super::PATIENCE) by default) until the runtime is at rest: no
    /// message in flight, none due by the clock, no schedule due. The clock does not
    /// move.
    ///
    /// # Errors
    /// [`Error::NotAtRest`] naming what was still in flight or due when its patience
    /// ran out; a store error.
    pub async fn run_until_idle(&self) -> Result<()> {
        self.rest_within(self.patience).await
    }

    /// [`run_until_idle`](Self::run_until_idle) with `patience`.
    pub(super) async fn rest_within(&self, patience: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + patience;
        let mut quiet_before = false;
        loop {
            if self.crashed() {
                return Err(Error::NotAtRest(
                    "it crashed at its crash point (crash_before_hop): restart it".into(),
                ));
            }
            let busy = self.busy().await?;
            if busy.is_none() && quiet_before {
                return Ok(());
            }
            quiet_before = busy.is_none();
            if let Some(what) = busy
                && tokio::time::Instant::now() >= deadline
            {
                return Err(Error::NotAtRest(format!(
                    "after {patience:?} of real time, {what}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// When the next timer falls due, by the clock, strictly after now: the earliest
    /// message due later (a sleep's wake-up, a retry, a step's or saga's deadline; at a
    /// destination its circuit breaker pauses, no sooner than its next probe), wait on
    /// the clock (a rate-limit slot) or schedule slot; `None` if nothing waits on time.
    ///
    /// # Errors
    /// A store error.
    pub async fn next_timer_ms(&self) -> Result<Option<i64>> {
        let now = self.now_ms();
        let paused = self.paused_until();
        let rows = Sql::new(
            "SELECT destination, min({ms available_at}) AS t,
                    min(CASE WHEN {ms available_at} > {now_ms} THEN {ms available_at} END) AS later
               FROM outbox WHERE state = 'pending' GROUP BY destination",
        )
        .fetch_all(self.runtime.store().reader())
        .await?;
        let mut next: Option<i64> = None;
        let mut take = |t: i64| next = Some(next.map_or(t, |n: i64| n.min(t)));
        for row in &rows {
            match paused.get(&row.text("destination")?) {
                // A paused destination's rows go no sooner than its next probe.
                Some(&probe) => take(row.int("t")?.max(probe)),
                None => {
                    if let Some(t) = row.opt_int("later")? {
                        take(t);
                    }
                }
            }
        }
        // A delivery waiting on the clock (a rate-limit slot) wakes at its time.
        if let (_, Some(t)) = self.runtime.faults.waits()
            && t > now
        {
            take(t);
        }
        let slot = Sql::new(
            "SELECT min(next_due_ms) AS t FROM saga_schedules
              WHERE NOT paused AND next_due_ms > {now_ms}",
        )
        .fetch_one(self.runtime.store().reader())
        .await?
        .opt_int("t")?;
        if let Some(t) = slot {
            take(t);
        }
        Ok(next)
    }

    /// The destinations the relay's circuit breakers pause now, each with when (by
    /// the clock, Unix ms) its next probe may go.
    fn paused_until(&self) -> std::collections::HashMap<String, i64> {
        let Some(relay) = &self.runtime.relay else {
            return std::collections::HashMap::new();
        };
        let now = self.runtime.store().clock().now();
        relay
            .pauses()
            .into_iter()
            .filter(|(_, until)| *until > now)
            .map(|(d, until)| {
                let ahead = i64::try_from((until - now).as_millis()).unwrap_or(i64::MAX);
                (d, self.now_ms().saturating_add(ahead))
            })
            .collect()
    }

    /// Runs saga `id` to its end: runs what is due, then moves the clock to the next
    /// timer, again and again, until the saga is completed, compensated, failed or
    /// stuck, or nothing is left that time could bring (it waits for a signal only a
    /// test can send): its state then.
    ///
    /// # Errors
    /// As [`run_until_idle`](Self::run_until_idle); [`Error::NotAtRest`] after
    /// [`MAX_SKIPS`] moves of the clock; [`Error::NotRecorded`] once a step of the
    /// saga asked a [`Recording`](super::Recording) for a call it does not hold; the saga unknown.
    pub async fn run_to_end(&self, id: SagaId) -> Result<SagaState> {
        for _ in 0..MAX_SKIPS {
            self.run_until_idle().await?;
            if let Some(why) = recording::missed(id) {
                return Err(Error::NotRecorded(why));
            }
            let state = self.state(id).await?;
            if state.is_terminal() || state == SagaState::Stuck {
                return Ok(state);
            }
            let Some(next) = self.next_timer_ms().await? else {
                return Ok(state);
            };
            let ahead = u64::try_from(next.saturating_sub(self.now_ms())).unwrap_or(0);
            self.runtime
                .store()
                .advance_clock(Duration::from_millis(ahead))
                .await?;
        }
        Err(Error::NotAtRest(format!(
            "saga {id} had not ended after {MAX_SKIPS} moves of the clock"
        )))
    }

    /// What keeps the runtime busy, if anything: messages in flight, due, or a
    /// schedule due.
    pub(super) async fn busy(&self) -> Result<Option<String>> {
        let paused = self.paused_until();
        let rows = Sql::new(
            "SELECT destination,
                    sum(CASE WHEN state = 'in_flight' THEN 1 ELSE 0 END) AS in_flight,
                    sum(CASE WHEN state = 'pending' THEN 1 ELSE 0 END) AS due
               FROM outbox
              WHERE state = 'in_flight'
                 OR (state = 'pending' AND {ms available_at} <= {now_ms})
              GROUP BY destination",
        )
        .fetch_all(self.runtime.store().reader())
        .await?;
        let (mut in_flight, mut due, mut at) = (0, 0, Vec::new());
        for row in &rows {
            let destination = row.text("destination")?;
            // Due rows of a destination its breaker pauses wait for its next probe.
            let waits = paused.contains_key(&destination);
            let (f, d) = (row.int("in_flight")?, row.int("due")?);
            let d = if waits { 0 } else { d };
            if f + d > 0 {
                at.push(destination);
            }
            (in_flight, due) = (in_flight + f, due + d);
        }
        // Deliveries in flight that only wait on the clock are timers, not work.
        let (waiting, _) = self.runtime.faults.waits();
        in_flight = in_flight.saturating_sub(i64::try_from(waiting).unwrap_or(i64::MAX));
        let schedules = Sql::new(
            "SELECT count(*) AS n FROM saga_schedules WHERE NOT paused AND next_due_ms <= {now_ms}",
        )
        .fetch_one(self.runtime.store().reader())
        .await?
        .int("n")?;
        if in_flight + due + schedules == 0 {
            return Ok(None);
        }
        Ok(Some(format!(
            "{in_flight} message(s) in flight and {due} due (destinations: {}), \
             {schedules} schedule(s) due",
            at.join(",")
        )))
    }
}
