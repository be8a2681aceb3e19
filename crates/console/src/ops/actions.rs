//! What an operator does to a saga: abort, retry, skip (the actions its state allows),
//! raise its budget, pause and resume it, rewind it to one of its steps, and signals.

use agentsaga_saga::{Budget, Engine, SagaId, Signal, SignalReceipt, SignalSender};
use serde::Serialize;

use super::{Console, Result, ShowDoc};

/// An operator action on a saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Compensate a running saga, or give up on one stuck after its pivot.
    Abort,
    /// Try a stuck saga's failed compensation (or step after the pivot) again.
    Retry,
    /// Mark a stuck compensation done by hand, and go on.
    Skip,
}

impl Action {
    /// Its name in the CLI and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Abort => "abort",
            Action::Retry => "retry",
            Action::Skip => "skip",
        }
    }
}

impl ShowDoc {
    /// The actions the engine would take on this saga as it stands (the page offers
    /// only these): abort a running saga before its pivot; retry or skip a stuck one
    /// whose compensation failed; retry or abort one stuck after its pivot.
    pub fn actions(&self) -> Vec<Action> {
        // The pivot and the steps after it are the rows without a compensation entry.
        let past_pivot = self.steps.iter().any(|s| s.compensation_state.is_none());
        let compensation_failed = self
            .steps
            .iter()
            .any(|s| s.compensation_state.as_deref() == Some("failed"));
        match self.saga.state {
            "running" if !past_pivot => vec![Action::Abort],
            "stuck" if compensation_failed => vec![Action::Retry, Action::Skip],
            "stuck" => vec![Action::Retry, Action::Abort],
            _ => Vec::new(),
        }
    }
}

/// What a signal did, and the saga after it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SignalDoc {
    /// `recorded`, or `duplicate` (the wait had its signal already: nothing changed).
    pub receipt: &'static str,
    /// The saga as it now stands.
    #[serde(flatten)]
    pub saga: ShowDoc,
}

impl Console {
    /// Abort, retry or skip saga `id`, in one transaction committed only if the engine
    /// accepts it; answers with the saga as it now stands.
    ///
    /// # Errors
    /// [`Error::NotFound`](crate::Error::NotFound);
    /// [`Error::Refused`](crate::Error::Refused) saying why (nothing changed);
    /// [`Error::Store`](crate::Error::Store).
    pub async fn act(&self, id: SagaId, action: Action) -> Result<ShowDoc> {
        let mut tx = self.store.begin().await?;
        let result = match action {
            Action::Abort => self.engine.abort(&mut tx, id).await,
            Action::Retry => self.engine.retry(&mut tx, id).await,
            Action::Skip => self.engine.skip(&mut tx, id).await,
        };
        match result {
            Ok(_) => tx.commit().await?,
            Err(e) => {
                // Nothing of the refused action may stay; a failed rollback only means
                // the transaction is already gone.
                let _ = tx.rollback().await;
                return Err(e.into());
            }
        }
        self.saga(id).await
    }

    /// Raises saga `id`'s budget to the limits `raise` names (the others kept; a saga
    /// without a budget gets one that waits once spent), in one transaction committed
    /// only if the engine accepts it; a saga waiting for a raise goes on if something
    /// is left to spend. Answers with the saga as it now stands. A person's act: the
    /// MCP tools offer no way to it.
    ///
    /// # Errors
    /// [`Error::Invalid`](crate::Error::Invalid) for a raise that names no limit;
    /// [`Error::NotFound`](crate::Error::NotFound);
    /// [`Error::Refused`](crate::Error::Refused) for a finished saga (nothing changed);
    /// [`Error::Store`](crate::Error::Store).
    pub async fn raise_budget(&self, id: SagaId, raise: Budget) -> Result<ShowDoc> {
        if raise.is_empty() {
            return Err(crate::Error::Invalid(
                "the raise names no limit: give at least one of tokens_in, tokens_out, \
                 cost_micros, calls"
                    .into(),
            ));
        }
        let mut tx = self.store.begin().await?;
        match self.engine.raise_budget(&mut tx, id, raise).await {
            Ok(_) => tx.commit().await?,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e.into());
            }
        }
        self.saga(id).await
    }

    /// Pauses saga `id`, `by` someone for `reason` (both trimmed), in one transaction
    /// committed only if the engine accepts it: the saga sends nothing new until it is
    /// [resumed](Self::resume) (what it sent already is answered and recorded). Answers
    /// with the saga as it now stands, its `paused` saying who, why and when.
    ///
    /// # Errors
    /// [`Error::Invalid`](crate::Error::Invalid) for an empty reason or `by`;
    /// [`Error::NotFound`](crate::Error::NotFound);
    /// [`Error::Refused`](crate::Error::Refused) for a finished saga or one paused
    /// already (nothing changed); [`Error::Store`](crate::Error::Store).
    pub async fn pause(&self, id: SagaId, by: &str, reason: &str) -> Result<ShowDoc> {
        let (by, reason) = (by.trim(), reason.trim());
        if reason.is_empty() {
            return Err(crate::Error::Invalid(
                "the pause gives no reason: say why the saga is paused (`reason`)".into(),
            ));
        }
        if by.is_empty() {
            return Err(crate::Error::Invalid(
                "the pause names no one: say who pauses the saga (`by`)".into(),
            ));
        }
        let mut tx = self.store.begin().await?;
        match self.engine.pause(&mut tx, id, by, reason).await {
            Ok(_) => tx.commit().await?,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e.into());
            }
        }
        self.saga(id).await
    }

    /// Resumes paused saga `id`, in one transaction committed only if the engine
    /// accepts it: what its pause held back goes out (here if this console's engine has
    /// the saga's definition, else once its runtime's orchestrator picks it up). Answers
    /// with the saga as it now stands. A person's act: no MCP tool resumes a saga.
    ///
    /// # Errors
    /// [`Error::NotFound`](crate::Error::NotFound);
    /// [`Error::Refused`](crate::Error::Refused) for a saga that is not paused (nothing
    /// changed); [`Error::Store`](crate::Error::Store).
    pub async fn resume(&self, id: SagaId) -> Result<ShowDoc> {
        let mut tx = self.store.begin().await?;
        match self.engine.resume(&mut tx, id).await {
            Ok(_) => tx.commit().await?,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e.into());
            }
        }
        self.saga(id).await
    }

    /// Rewinds saga `id` to its step `to`, `by` someone for `reason` (all trimmed), in
    /// one transaction committed only if the engine accepts it: `to` and every step
    /// done after it are undone, latest first, by their compensations; then the saga
    /// runs forward again from `to`'s stage, with its data as that stage began (here if
    /// this console's engine has the saga's definition, else once its runtime's
    /// orchestrator picks it up). A rewind ends a pause. Answers with the saga as it
    /// now stands: its last `rewinds` entry is this one, under way (`compensating`)
    /// while there is something to undo. A person's act: no MCP tool rewinds a saga.
    ///
    /// # Errors
    /// [`Error::Invalid`](crate::Error::Invalid) for an empty step, reason or `by`;
    /// [`Error::NotFound`](crate::Error::NotFound);
    /// [`Error::Refused`](crate::Error::Refused), saying why, with nothing changed, for
    /// a saga that is not running (a rewind under way among them), a step it never
    /// took, a step of `to`'s stage or a later one in flight (pause it, and rewind once
    /// they answered), or a step at or past its pivot;
    /// [`Error::Store`](crate::Error::Store).
    pub async fn rewind(&self, id: SagaId, to: &str, by: &str, reason: &str) -> Result<ShowDoc> {
        let (to, by, reason) = (to.trim(), by.trim(), reason.trim());
        if to.is_empty() {
            return Err(crate::Error::Invalid(
                "the rewind names no step: say which step to rewind the saga to (`to`)".into(),
            ));
        }
        if reason.is_empty() {
            return Err(crate::Error::Invalid(
                "the rewind gives no reason: say why the saga is rewound (`reason`)".into(),
            ));
        }
        if by.is_empty() {
            return Err(crate::Error::Invalid(
                "the rewind names no one: say who rewinds the saga (`by`)".into(),
            ));
        }
        let mut tx = self.store.begin().await?;
        match self.engine.rewind(&mut tx, id, to, by, reason).await {
            Ok(_) => tx.commit().await?,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e.into());
            }
        }
        self.saga(id).await
    }

    /// Sends saga `id` the signal `name`; answers with the receipt and the saga.
    ///
    /// # Errors
    /// [`Error::NotFound`](crate::Error::NotFound) for an unknown saga;
    /// [`Error::Refused`](crate::Error::Refused) for a finished saga or a name it never
    /// waits for (nothing written); [`Error::Store`](crate::Error::Store).
    pub async fn signal(&self, id: SagaId, name: &str, signal: Signal) -> Result<SignalDoc> {
        self.signal_by(id, name, signal, SignalSender::Person).await
    }

    /// [`signal`](Self::signal) from `sender`: the MCP tools send as
    /// [`SignalSender::Agent`], which may not release a wait that is a person's
    /// decision (`Step::approval`).
    ///
    /// # Errors
    /// As [`signal`](Self::signal); [`Error::Refused`](crate::Error::Refused) for an
    /// agent's signal to a person's decision (nothing written).
    pub async fn signal_by(
        &self,
        id: SagaId,
        name: &str,
        signal: Signal,
        sender: SignalSender,
    ) -> Result<SignalDoc> {
        let mut tx = self.store.begin().await?;
        let receipt = match Engine::signal_by(&mut tx, id, name, signal, sender).await {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e.into());
            }
        };
        tx.commit().await?;
        Ok(SignalDoc {
            receipt: match receipt {
                SignalReceipt::Recorded => "recorded",
                SignalReceipt::Duplicate => "duplicate",
            },
            saga: self.saga(id).await?,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::ops::{SagaDoc, StepDoc};

    fn doc(state: &'static str, ledger: &[Option<&str>]) -> ShowDoc {
        let step = |i: usize, c: Option<&str>| StepDoc {
            idx: i as i64,
            stage: i as i64,
            name: format!("s{i}"),
            destination: "a".into(),
            state: "succeeded".into(),
            attempts: 1,
            error: None,
            dispatched_at: None,
            dispatched_at_ms: None,
            replied_at: None,
            replied_at_ms: None,
            wakes_at: None,
            wakes_at_ms: None,
            compensation_destination: None,
            compensation_payload: None,
            compensation_state: c.map(str::to_owned),
            compensation_attempts: 0,
            compensation_error: None,
            compensated_at: None,
            compensated_at_ms: None,
            usage: Default::default(),
        };
        ShowDoc {
            saga: SagaDoc {
                id: "x".into(),
                name: "n".into(),
                version: 1,
                state,
                error: None,
                key: None,
                waiting_for: None,
                sleeping_until: None,
                sleeping_until_ms: None,
                parent_id: None,
                paused: None,
                created_at: String::new(),
                created_at_ms: 0,
                updated_at: String::new(),
                updated_at_ms: 0,
            },
            data: Value::Null,
            spending: Default::default(),
            steps: ledger
                .iter()
                .enumerate()
                .map(|(i, c)| step(i, *c))
                .collect(),
            children: Vec::new(),
            rewinds: Vec::new(),
        }
    }

    // The actions offered are the ones the engine takes in that state.
    #[test]
    fn actions_follow_the_engine() {
        use Action::{Abort, Retry, Skip};
        assert_eq!(doc("running", &[Some("recorded")]).actions(), [Abort]);
        assert!(
            doc("running", &[Some("recorded"), None])
                .actions()
                .is_empty(),
            "past the pivot"
        );
        assert!(
            doc("compensating", &[Some("dispatched")])
                .actions()
                .is_empty()
        );
        assert_eq!(doc("stuck", &[Some("failed")]).actions(), [Retry, Skip]);
        assert_eq!(
            doc("stuck", &[Some("recorded"), None]).actions(),
            [Retry, Abort]
        );
        for done in ["completed", "compensated", "aborted"] {
            assert!(doc(done, &[Some("done")]).actions().is_empty());
        }
    }
}
