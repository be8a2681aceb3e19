//! Time in a saga: a step that sleeps (`Step::sleep`, `Step::sleep_until`), and a wait
//! that ends when its time comes (`Step::wait_for(…).or_after(…)`).
//!
//! A sleep is a wait that no signal ends: the saga parks as it does at a wait, holding
//! no actor, connection or task, and its wake-up is a timer message to its own
//! orchestrator, written in the outbox in the transaction that parks it, due at the
//! sleep's time. The relay delivers it when it is due, in whichever process runs then,
//! after any restart; the step then succeeds and the saga goes on. A sleep has nothing
//! to undo.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentsaga_core::RetryPolicy;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::step::{Step, StepDef, Undo, data};
use crate::Result;

/// Computes a wake-up time (Unix ms) from the saga data.
pub(crate) type AtFn = Arc<dyn Fn(&Value) -> Result<i64> + Send + Sync>;

/// When a sleeping step (or a wait that ends by time) wakes.
#[derive(Clone)]
pub(crate) enum Wake {
    /// This long after the saga reaches the step.
    After(Duration),
    /// At the Unix time (milliseconds) computed from the saga data when the saga
    /// reaches the step; a time already past wakes at once.
    At(AtFn),
}

/// The longest a step sleeps: ten years. A later time (a `Duration::MAX`, a far
/// `sleep_until`) wakes it then, a time both backends store.
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(10 * 366 * 86_400);

impl Wake {
    /// The Unix time (ms) the step wakes at, reached at `now_ms` with `data`: at most
    /// [`MAX_SLEEP`] from now.
    pub(crate) fn due_ms(&self, now_ms: i64, data: &Value) -> Result<i64> {
        let latest = now_ms.saturating_add(agentsaga_core::clock::millis(MAX_SLEEP));
        let due = match self {
            Wake::After(d) => now_ms.saturating_add(agentsaga_core::clock::millis(*d)),
            Wake::At(at) => at(data)?,
        };
        Ok(due.min(latest))
    }
}

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wake::After(d) => f.debug_tuple("After").field(d).finish(),
            Wake::At(_) => f.write_str("At(..)"),
        }
    }
}

/// The destination a sleep's step row names: `sleep:<name>` (no agent serves it).
pub(crate) fn sleep_destination(name: &str) -> String {
    format!("sleep:{name}")
}

/// A time as Unix milliseconds (before 1970: negative; far beyond: saturated; the
/// engine wakes a step at most [`MAX_SLEEP`] from when it reaches it).
pub(crate) fn unix_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => agentsaga_core::clock::millis(d),
        Err(e) => agentsaga_core::clock::millis(e.duration()).saturating_neg(),
    }
}

impl<D, U> Step<D, U>
where
    D: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// A step named `name` that sleeps for `duration`, counted from when the saga
    /// reaches it ("follow up in three days"). The saga parks, holding nothing, and
    /// wakes at its time after any restart, in whichever process runs then; the step
    /// then succeeds (its output: `{"woke": "time", "due": <Unix ms>}`) and the saga
    /// goes on. A sleep has nothing to undo, so it stands before the pivot or after it
    /// as it is. `sagas list --sleeping` lists the sagas parked at one.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use agentsaga_saga::{Saga, Step};
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct Email { to: String }
    /// let saga = Saga::<Email>::builder("follow_up", 1)
    ///     .step(Step::new("send", "mailer").nothing_to_undo())
    ///     .step(Step::sleep("three_days", Duration::from_secs(3 * 86_400)))
    ///     .pivot(Step::new("follow_up", "mailer"))
    ///     .build()?;
    /// # Ok::<(), agentsaga_saga::Error>(())
    /// ```
    pub fn sleep(name: impl Into<String>, duration: Duration) -> Self {
        Self::sleeping(name.into(), Wake::After(duration))
    }

    /// A step named `name` that sleeps until the time `until` computes from the saga
    /// data when the saga reaches it ("try the vendor again tomorrow at 9"). A time
    /// already past wakes the saga at once; a time more than ten years ahead wakes it
    /// then. Otherwise as [`sleep`](Self::sleep). Data that does not decode fails the
    /// step (before the pivot the saga compensates).
    pub fn sleep_until<F>(name: impl Into<String>, until: F) -> Self
    where
        F: Fn(&D) -> SystemTime + Send + Sync + 'static,
    {
        let at = Arc::new(move |v: &Value| Ok(unix_ms(until(&data::<D>(v)?))));
        Self::sleeping(name.into(), Wake::At(at))
    }

    fn sleeping(name: String, wake: Wake) -> Self {
        // Nothing to undo before the pivot; after it, as every step there, never
        // undone (the builder's typestate decides where it stands).
        Self {
            def: StepDef {
                destination: sleep_destination(&name),
                name,
                command: Arc::new(|_: &Value| Ok(Value::Null)),
                fold: None,
                undo: Undo::Nothing,
                retry: RetryPolicy::default(),
                timeout: None,
                start_timeout: None,
                pivot: false,
                wait: None,
                approval: false,
                child: None,
                approves: None,
                wake: Some(wake),
            },
            _marker: PhantomData,
        }
    }
}

impl<D, U> Step<D, U>
where
    D: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// This wait ends by time as well as by its signal: if the signal has not come
    /// `after` the saga reached the wait, the step succeeds without it (its output
    /// `{"woke": "time", "due": <Unix ms>}`, and its [`on_reply`](Step::on_reply) fold
    /// not called) and the saga goes on: "draft a follow-up unless a reply came
    /// first". The fold of a signal that did come is how later steps tell the two
    /// paths apart. It replaces the wait's [`timeout`](Step::timeout), which fails the
    /// step instead. Only a wait ends by its signal; on any other step this changes
    /// nothing.
    pub fn or_after(mut self, after: Duration) -> Self {
        if self.def.wait.is_some() {
            self.def.wake = Some(Wake::After(after));
        }
        self
    }
}
