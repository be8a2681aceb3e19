//! Schedules: sagas started on a cron calendar (`agentsaga_saga::schedule`), read,
//! created, replaced, paused, resumed and deleted. A console with a runtime's engine
//! checks a new schedule against its sagas (registered, its input decodes); one
//! without (`agentsaga serve`) checks what can be checked without them.

use agentsaga_saga::schedule::{self, Schedule, ScheduleView};
use serde::Serialize;

use super::{Console, Error, Result};
use crate::time::rfc3339;

/// One schedule: `GET /api/v1/schedules/{name}`, each of `GET /api/v1/schedules`, the
/// MCP `list_schedules`, and what `agentsaga schedules show --json` prints. The
/// library's fields ([`ScheduleView`]: the schedule, `late_after` and `jitter` in ms,
/// where it stands in Unix ms) and each time as RFC 3339 beside its `_ms` (`next_due`
/// beside `next_due_ms`, …).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleDoc {
    /// The schedule and where it stands.
    #[serde(flatten)]
    pub view: ScheduleView,
    /// Its next slot (`null`: its expression names no time to come).
    pub next_slot: Option<String>,
    /// When that slot fires (the slot plus its jitter).
    pub next_due: Option<String>,
    /// A slot waiting for the previous firing's saga to end.
    pub queued_slot: Option<String>,
    /// The last slot that started a saga.
    pub last_slot: Option<String>,
    /// When it last fired.
    pub last_fired: Option<String>,
    /// When it was created.
    pub created: String,
    /// When an operator last changed it.
    pub updated: String,
}

impl From<ScheduleView> for ScheduleDoc {
    fn from(view: ScheduleView) -> Self {
        Self {
            next_slot: view.next_slot_ms.map(rfc3339),
            next_due: view.next_due_ms.map(rfc3339),
            queued_slot: view.queued_slot_ms.map(rfc3339),
            last_slot: view.last_slot_ms.map(rfc3339),
            last_fired: view.last_fired_ms.map(rfc3339),
            created: rfc3339(view.created_ms),
            updated: rfc3339(view.updated_ms),
            view,
        }
    }
}

/// Every schedule: `{"schedules": [...]}`, by name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleList {
    /// The schedules, by name.
    pub schedules: Vec<ScheduleDoc>,
}

impl Console {
    /// Every schedule of the database, by name.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn schedules(&self) -> Result<ScheduleList> {
        Ok(ScheduleList {
            schedules: schedule::list(&self.store)
                .await?
                .into_iter()
                .map(ScheduleDoc::from)
                .collect(),
        })
    }

    /// Schedule `name`.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Store`].
    pub async fn schedule(&self, name: &str) -> Result<ScheduleDoc> {
        schedule::get(&self.store, name)
            .await?
            .map(ScheduleDoc::from)
            .ok_or_else(|| no_schedule(name))
    }

    /// Stores a new schedule, its first slot the first after now.
    ///
    /// # Errors
    /// [`Error::Invalid`] saying what is wrong with it (with an engine: also a saga it
    /// does not register, an input its saga refuses); [`Error::Refused`] if a schedule
    /// has its name; [`Error::Store`]. Nothing is written on an error.
    pub async fn create_schedule(&self, s: &Schedule) -> Result<ScheduleDoc> {
        self.check_schedule(s)?;
        Ok(schedule::create(&self.store, s).await?.into())
    }

    /// Stores `s`, replacing the schedule of its name if there is one (its counts and
    /// last firing kept), its next slot the first after now.
    ///
    /// # Errors
    /// As [`create_schedule`](Self::create_schedule), but a schedule of its name is
    /// replaced.
    pub async fn put_schedule(&self, s: &Schedule) -> Result<ScheduleDoc> {
        self.check_schedule(s)?;
        Ok(schedule::put(&self.store, s).await?.into())
    }

    /// Pauses schedule `name` (pausing a paused one changes nothing).
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Store`].
    pub async fn pause_schedule(&self, name: &str) -> Result<ScheduleDoc> {
        Ok(schedule::pause(&self.store, name).await?.into())
    }

    /// Resumes schedule `name` from its first slot after now (resuming a running one
    /// changes nothing).
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Store`].
    pub async fn resume_schedule(&self, name: &str) -> Result<ScheduleDoc> {
        Ok(schedule::resume(&self.store, name).await?.into())
    }

    /// Deletes schedule `name` (the sagas it started stay); answers it as it was.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Store`].
    pub async fn delete_schedule(&self, name: &str) -> Result<ScheduleDoc> {
        let doc = self.schedule(name).await?;
        if !schedule::delete(&self.store, name).await? {
            return Err(no_schedule(name));
        }
        Ok(doc)
    }

    /// With saga definitions, the engine's check (the saga registered, its input
    /// decoded); without, what can be checked without them.
    fn check_schedule(&self, s: &Schedule) -> Result<()> {
        if self.engine.definitions().next().is_some() {
            self.engine.check_schedule(&self.store, s)?;
        } else {
            s.check()?;
        }
        Ok(())
    }
}

fn no_schedule(name: &str) -> Error {
    agentsaga_saga::Error::NoSchedule(name.to_owned()).into()
}
