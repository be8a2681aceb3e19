//! Schedules in the runtime: [`Schedules`] (what `Runtime::schedules` gives) and the
//! task that fires them.
//!
//! The task asks the database for due schedules of this runtime's sagas, fires them
//! ([`Engine::fire_schedules`]: one transaction per schedule, each slot one saga under
//! its start key), then sleeps until the next one is due, or at most a second (a
//! schedule another process or the CLI wrote is seen then), or until this runtime
//! writes one. Every process that registers a schedule's saga may fire it; its slots
//! start one saga each whichever does.

use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::Store;
use agentsaga_saga::Engine;
use agentsaga_saga::schedule::{self, Firings, Schedule, ScheduleView};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::Result;

/// The longest the task sleeps between two looks.
const EVERY: Duration = Duration::from_secs(1);

/// After a store error, the task waits this long before it asks again.
const AFTER_ERROR: Duration = Duration::from_secs(1);

/// The schedules of a runtime's database (see [`agentsaga_saga::schedule`]): create,
/// replace, pause, resume, delete and read them. Writes are checked against this
/// runtime's sagas first and wake its firing task.
#[derive(Debug, Clone)]
pub struct Schedules {
    pub(crate) store: Store,
    pub(crate) engine: Engine,
    pub(crate) wake: Arc<Notify>,
    pub(crate) admission: Arc<Notify>,
}

impl Schedules {
    /// Stores a new schedule, its first slot the first after now.
    ///
    /// # Errors
    /// [`agentsaga_saga::Error::InvalidSchedule`] (as [`Error::Saga`](crate::Error::Saga))
    /// for a bad name, expression, time zone or bound, a saga this runtime does not
    /// register, or an input its saga refuses; [`agentsaga_saga::Error::ScheduleExists`];
    /// store errors. Nothing is written on an error.
    pub async fn create(&self, s: &Schedule) -> Result<ScheduleView> {
        self.engine.check_schedule(&self.store, s)?;
        let view = schedule::create(&self.store, s).await?;
        self.wake.notify_one();
        Ok(view)
    }

    /// Stores `s`, replacing the schedule of its name if there is one (its counts are
    /// kept), its next slot the first after now.
    ///
    /// # Errors
    /// As [`create`](Self::create), without `ScheduleExists`.
    pub async fn put(&self, s: &Schedule) -> Result<ScheduleView> {
        self.engine.check_schedule(&self.store, s)?;
        self.put_checked(s).await
    }

    /// [`put`](Self::put) of a schedule already checked.
    async fn put_checked(&self, s: &Schedule) -> Result<ScheduleView> {
        let view = schedule::put(&self.store, s).await?;
        self.wake.notify_one();
        Ok(view)
    }

    /// Declares `s`, as a program does at every start: stores it if there is no
    /// schedule of its name, leaves the stored one alone if it is the same but for
    /// being paused (its next slot kept, so the slots missed while no process ran are
    /// caught up as `s` says; an operator's pause kept), replaces it
    /// ([`put`](Self::put)) if it differs otherwise (then paused as `s` says).
    ///
    /// # Errors
    /// As [`put`](Self::put).
    pub async fn ensure(&self, s: &Schedule) -> Result<ScheduleView> {
        self.engine.check_schedule(&self.store, s)?;
        match schedule::get(&self.store, &s.name).await? {
            Some(view) if view.schedule == s.clone().paused(view.schedule.paused) => Ok(view),
            _ => self.put_checked(s).await,
        }
    }

    /// Pauses schedule `name`.
    ///
    /// # Errors
    /// [`agentsaga_saga::Error::NoSchedule`]; store errors.
    pub async fn pause(&self, name: &str) -> Result<ScheduleView> {
        Ok(schedule::pause(&self.store, name).await?)
    }

    /// Resumes schedule `name` from its first slot after now.
    ///
    /// # Errors
    /// [`agentsaga_saga::Error::NoSchedule`]; store errors.
    pub async fn resume(&self, name: &str) -> Result<ScheduleView> {
        let view = schedule::resume(&self.store, name).await?;
        self.wake.notify_one();
        Ok(view)
    }

    /// Deletes schedule `name` (its sagas stay); `false` if there was none.
    ///
    /// # Errors
    /// Store errors.
    pub async fn delete(&self, name: &str) -> Result<bool> {
        Ok(schedule::delete(&self.store, name).await?)
    }

    /// Schedule `name`, if there is one.
    ///
    /// # Errors
    /// Store errors.
    pub async fn get(&self, name: &str) -> Result<Option<ScheduleView>> {
        Ok(schedule::get(&self.store, name).await?)
    }

    /// Every schedule of the database, by name.
    ///
    /// # Errors
    /// Store errors.
    pub async fn list(&self) -> Result<Vec<ScheduleView>> {
        Ok(schedule::list(&self.store).await?)
    }

    /// Fires what is due now, as the runtime's task does on its own.
    ///
    /// # Errors
    /// Store errors.
    pub async fn fire_due(&self) -> Result<Firings> {
        let firings = self.engine.fire_schedules(&self.store).await?;
        if firings.fired.iter().any(|f| f.waiting) {
            self.admission.notify_one();
        }
        Ok(firings)
    }
}

/// The firing task; `None` when this runtime registers no saga.
pub(crate) fn spawn(schedules: Schedules) -> Option<JoinHandle<()>> {
    schedules.engine.definitions().next()?;
    Some(tokio::spawn(async move {
        loop {
            let sleep = match schedules.fire_due().await {
                Ok(firings) => {
                    for f in &firings.fired {
                        tracing::debug!(schedule = %f.schedule, slot_ms = f.slot_ms,
                            saga.id = %f.saga_id, "schedule fired");
                    }
                    firings.next_in.map_or(EVERY, |next| next.min(EVERY))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "schedules: could not fire (asking again)");
                    AFTER_ERROR
                }
            };
            // At most `EVERY` of real time (another process may have changed the
            // table), and at once when the store's clock is moved by hand.
            let clock = schedules.store.clock();
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = schedules.wake.notified() => {}
                () = clock.moved() => {}
            }
        }
    }))
}
