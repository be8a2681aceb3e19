//! What people and operators do to a saga: signals, abort, retry, skip, pause, resume.

use super::tree;
use super::*;
use agentsaga_core::{Message, Sql};
use tracing::Instrument as _;

impl Engine {
    /// Sends signal `name` to saga `id`, in `tx`: recorded in `saga_signals` and
    /// delivered to the saga's orchestrator when `tx` commits. A saga waiting for it
    /// goes on; one that has not reached its wait yet uses it when it does; a second
    /// signal for a wait that has had one changes nothing ([`SignalReceipt::Duplicate`]).
    /// Needs no saga definition (the CLI sends signals).
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown saga; [`Error::SignalRefused`] for a finished
    /// saga or a name it never waits for (nothing written either way); store errors.
    pub async fn signal(
        tx: &mut Tx,
        id: SagaId,
        name: &str,
        signal: Signal,
    ) -> Result<SignalReceipt> {
        Self::signal_by(tx, id, name, signal, SignalSender::Person).await
    }

    /// [`signal`](Self::signal) as `sender` may send it: an
    /// [`Agent`](SignalSender::Agent) (an LLM-facing surface) may not send the signal of
    /// a wait that is a person's decision ([`Step::approval`](crate::Step::approval),
    /// a plan's `"approval": true`).
    ///
    /// # Errors
    /// As [`signal`](Self::signal); [`Error::SignalRefused`] for an agent's signal to a
    /// person's decision, with nothing written.
    pub async fn signal_by(
        tx: &mut Tx,
        id: SagaId,
        name: &str,
        signal: Signal,
        sender: SignalSender,
    ) -> Result<SignalReceipt> {
        let outcome = match signal {
            Signal::Approve(value) => protocol::StepOutcome::Ok(value),
            Signal::Reject(reason) => {
                protocol::StepOutcome::Fatal(format!("signal `{name}` rejected: {reason}"))
            }
        };
        let now = tx.store().clock().now_ms();
        let (receipt, wake) = signals::record(tx.conn(), id, name, &outcome, sender, now).await?;
        if let Some(mut wake) = wake {
            let span = tracing::info_span!(
                "saga.signal",
                saga.id = %id,
                signal.name = %name,
                otel.kind = "producer",
            );
            in_saga_trace(tx, id, &span, std::slice::from_mut(&mut wake)).await?;
            tx.enqueue(&wake).instrument(span).await?;
        }
        Ok(receipt)
    }

    /// Operator: abort a running saga (compensate what it did), or give up on one
    /// stuck after its pivot (`aborted`).
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::WrongState`] saying why, with nothing changed;
    /// [`Error::IllegalTransition`] as in [`handle`](Self::handle).
    pub async fn abort(&self, tx: &mut Tx, id: SagaId) -> Result<SagaState> {
        self.operate(tx, id, |c| c.abort()).await
    }

    /// Operator: retry a stuck saga (its failed compensation, or its failed step after
    /// the pivot).
    ///
    /// # Errors
    /// As [`abort`](Self::abort).
    pub async fn retry(&self, tx: &mut Tx, id: SagaId) -> Result<SagaState> {
        self.operate(tx, id, |c| c.retry()).await
    }

    /// Operator: mark a stuck compensation done by hand (recorded as skipped) and go on.
    ///
    /// # Errors
    /// As [`abort`](Self::abort).
    pub async fn skip(&self, tx: &mut Tx, id: SagaId) -> Result<SagaState> {
        self.operate(tx, id, |c| c.skip()).await
    }

    /// Operator: raise saga `id`'s budget to the limits `raise` names (the others
    /// kept; a saga without a budget gets one that waits when spent). A saga that held
    /// back a forward step for its spent budget goes on, now if this engine has its
    /// definition, else once its orchestrator is woken when `tx` commits; so do the
    /// child sagas below it that its tree's spent budget held (woken likewise). Needs
    /// no definition (the CLI raises budgets). A person's act: the MCP tools cannot.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::WrongState`] for a finished saga, with nothing
    /// changed.
    pub async fn raise_budget(
        &self,
        tx: &mut Tx,
        id: SagaId,
        raise: crate::Budget,
    ) -> Result<SagaState> {
        let state = self.operate(tx, id, |c| c.raise_budget(raise)).await?;
        // Child sagas held for this saga's tree budget go on too.
        tree::wake_held_below(tx, id).await?;
        Ok(state)
    }

    /// Operator: pause saga `id` (`by`, for `reason`). It sends nothing new until it is
    /// [resumed](Self::resume): the commands already sent are delivered and their
    /// answers recorded (a sleep ends on time, a timeout is noted), and what would go
    /// next (the next stage, a step sent again, a compensation) is held. A pause is
    /// stored with the saga, so it survives restarts. Needs no definition (the CLI
    /// pauses). An abort ends a pause.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::WrongState`] for a finished saga or one paused
    /// already, with nothing changed.
    pub async fn pause(
        &self,
        tx: &mut Tx,
        id: SagaId,
        by: &str,
        reason: &str,
    ) -> Result<SagaState> {
        self.operate(tx, id, |c| c.pause(by, reason)).await
    }

    /// Operator: resume paused saga `id`: what its pause held back is sent, now if
    /// this engine has its definition, else once its orchestrator is woken when `tx`
    /// commits.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::WrongState`] for a saga that is not paused, with
    /// nothing changed.
    pub async fn resume(&self, tx: &mut Tx, id: SagaId) -> Result<SagaState> {
        self.operate(tx, id, |c| c.resume()).await
    }

    /// Operator: rewind saga `id` to its step `to` (`by`, for `reason`): `to` and
    /// every step done after it are undone, latest stage first, each by its
    /// compensation as the ledger recorded it; then the saga runs forward again from
    /// `to`'s stage, with its data as that stage began (a planned saga plans again
    /// from there; a child saga of an undone step is undone as a whole; the signals its
    /// waits received are forgotten). The undos go out when `tx` commits, and the
    /// rewind is kept with the saga ([`Rewind`](crate::Rewind)), with the steps it
    /// undid. A rewind ends a pause. Needs no definition (the CLI rewinds): a
    /// compensation built from its step's reply, and the stage sent afresh, are then
    /// asked of the saga's orchestrator. Not for the MCP tools: a person's act.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::WrongState`], with nothing changed, for a saga
    /// that is not running, has taken no step `to`, has a step of `to`'s stage or a
    /// later one in flight (pause it, and rewind once its steps answered), or would
    /// undo a step at or past its pivot.
    pub async fn rewind(
        &self,
        tx: &mut Tx,
        id: SagaId,
        to: &str,
        by: &str,
        reason: &str,
    ) -> Result<SagaState> {
        self.operate(tx, id, |c| c.rewind(to, by, reason)).await
    }

    pub(super) async fn operate(
        &self,
        tx: &mut Tx,
        id: SagaId,
        op: impl FnOnce(&mut Ctx<'_>) -> Result<()>,
    ) -> Result<SagaState> {
        let mut inst = persist::load(tx.conn(), id)
            .await?
            .ok_or(Error::NotFound(id))?;
        let before = inst.clone();
        let signals = self.signals_of(tx, &inst).await?;
        let spenders = self.spenders_of(tx, &inst).await?;
        let mut ctx = self.ctx(&mut inst, tx.store().clock().now_ms())?;
        ctx.signals = signals;
        ctx.spenders = spenders;
        op(&mut ctx)?;
        let mut fx = std::mem::take(&mut ctx.fx);
        let span = tracing::info_span!("saga.operate", saga.id = %id, otel.kind = "producer");
        in_saga_trace(tx, id, &span, &mut fx.send).await?;
        self.write(tx, &inst, Some(&before), fx)
            .instrument(span)
            .await?;
        Ok(inst.state)
    }
}

/// Puts an act on saga `id` (a signal, an operator's act) in the saga's trace: `span`
/// becomes a child of the saga's `saga.start` (its kept trace context), and
/// `messages` carry `span`'s context, or the saga's own where nothing traces here (a
/// CLI without a tracer), so that the hops they cause continue the saga's trace: one
/// saga, one trace, whoever acts on it and from whichever process. A saga without a
/// kept context leaves both as they are (the messages then take the sender's context,
/// if any, when enqueued).
async fn in_saga_trace(
    tx: &mut Tx,
    id: SagaId,
    span: &tracing::Span,
    messages: &mut [Message],
) -> Result<()> {
    if messages.is_empty() {
        return Ok(());
    }
    let kept = Sql::new("SELECT trace_parent FROM saga_instances WHERE id = ?")
        .bind(*id.as_uuid())
        .fetch_optional(tx.conn())
        .await?
        .map(|r| r.opt_text("trace_parent"))
        .transpose()?
        .flatten();
    let Some(kept) = kept else {
        return Ok(());
    };
    let traceparent = agentsaga_core::header::TRACEPARENT;
    let parent = agentsaga_core::Headers::from([(traceparent.to_owned(), kept.clone())]);
    agentsaga_core::propagation::adopt(span, &parent);
    // A span the subscriber filters out has no context of its own: the saga's then.
    let context = if span.is_disabled() {
        kept
    } else {
        span.in_scope(agentsaga_core::propagation::current_traceparent)
            .unwrap_or(kept)
    };
    for m in messages {
        m.headers
            .entry(traceparent.to_owned())
            .or_insert_with(|| context.clone());
    }
    Ok(())
}
