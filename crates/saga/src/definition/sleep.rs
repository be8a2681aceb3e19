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
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::step::{Step, StepDef, Undo, data};
use super::wake::Wake;
use super::wake::unix_ms;

/// The destination a sleep's step row names: `sleep:<name>` (no agent serves it).
pub(crate) fn sleep_destination(name: &str) -> String {
    format!("sleep:{name}")
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
        Self {
            def: StepDef::sleep(name, wake),
            _marker: PhantomData,
        }
    }
}

impl StepDef {
    /// A sleep named `name` (the builder's and a plan's): it sends nothing, has
    /// nothing to undo, and wakes as `wake` says.
    pub(crate) fn sleep(name: String, wake: Wake) -> Self {
        Self {
            command: Arc::new(|_: &Value| Ok(Value::Null)),
            undo: Undo::Nothing,
            wake: Some(wake),
            ..Self::new(name.clone(), sleep_destination(&name))
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
