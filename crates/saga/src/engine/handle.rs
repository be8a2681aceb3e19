//! Advancing a saga: one transaction per event it receives (an answer, a timer, a
//! dead-letter notice), or an agent's answer applied in the agent's own transaction.

use super::child::child_addressed;
use super::*;

impl Engine {
    /// Writes `inst` (over `before`, its saved form, if any) and the effects `fx` of
    /// deciding it, in `tx`; inside a `saga.compensate` span when `fx` compensates.
    pub(super) async fn write(
        &self,
        tx: &mut Tx,
        inst: &Instance,
        before: Option<&Instance>,
        fx: Effects,
    ) -> Result<()> {
        let span = match &fx.compensating {
            Some(step) => tracing::info_span!(
                "saga.compensate",
                saga.id = %inst.id,
                saga.name = %inst.name,
                step.name = %step,
                otel.kind = "producer",
            ),
            None => tracing::Span::none(),
        };
        async move {
            // A rewind's undone rows and signals go first: the waits' rows and the
            // rows of the stage sent afresh are written after.
            if let Some(from) = fx.drop_steps_from {
                persist::drop_steps(tx.conn(), inst.id, from).await?;
            }
            if !fx.reset_signals.is_empty() || !fx.drop_signals.is_empty() {
                signals::reset(tx.conn(), inst.id, &fx.reset_signals, &fx.drop_signals).await?;
            }
            let mut saved = before;
            if !fx.waits.is_empty() {
                // The waits' rows refer to the instance: saved first (the save below
                // then has nothing left to write).
                persist::save(tx, inst, before, tx.store().clock().now_ms()).await?;
                signals::register(tx.conn(), inst.id, &fx.waits).await?;
                saved = Some(inst);
            }
            tx.cancel_pending(&fx.cancel).await?;
            // On SQLite, the save and the messages in one round trip.
            persist::save_and_enqueue(tx, inst, saved, tx.store().clock().now_ms(), &fx.send).await
        }
        .instrument(span)
        .await
    }

    /// Handles one message delivered to an orchestrator destination — a reply, a
    /// timeout, a dead-letter notice, a deadline — in `tx`, with the inbox record that
    /// makes it effectively-once.
    ///
    /// # Errors
    /// [`Error::VersionNotRegistered`] when the saga's version is not registered here
    /// (roll back and let a process that has it take the message);
    /// [`Error::Malformed`] for a message without the saga headers;
    /// [`Error::IllegalTransition`] if deciding meets a transition the lifecycle table
    /// lacks (nothing of it is written: roll `tx` back); store errors.
    pub async fn handle(&self, tx: &mut Tx, env: &Envelope) -> Result<Handled> {
        if tx.receive(&env.destination, env.id).await? == Receipt::Duplicate {
            return Ok(Handled::Duplicate);
        }
        self.handle_received(tx, env, None).await
    }

    /// The read that the hop of `env`, a message to one of this engine's orchestrator
    /// destinations, may open with (see
    /// [`Store::hop_receiving_prefetched`](agentsaga_core::Store::hop_receiving_prefetched)):
    /// the saga it concerns (for a child saga's start or undo, the child). `None` for
    /// a message that names no saga.
    pub fn prefetch_for(&self, env: &Envelope) -> Option<(SagaId, Prefetch)> {
        let saga = protocol::saga_id(env).ok()?;
        let saga = match crate::definition::child_of(&env.destination) {
            Some(_) => child_addressed(env)?,
            None => saga,
        };
        Some((saga, persist::prefetch(saga)?))
    }

    /// [`handle`](Self::handle) in a hop that recorded `env` in the inbox when it
    /// opened (a first delivery), with what [`prefetch_for`](Self::prefetch_for) read
    /// then, if anything: the saga (or child) needs no load of its own. The hop must
    /// not have written that saga's rows since.
    ///
    /// # Errors
    /// As [`handle`](Self::handle).
    pub async fn handle_received(
        &self,
        tx: &mut Tx,
        env: &Envelope,
        read: Option<(SagaId, &Prefetched)>,
    ) -> Result<Handled> {
        let loaded = |expected: Option<SagaId>| -> Result<Option<Option<Instance>>> {
            match (read, expected) {
                (Some((saga, read)), Some(expected)) if saga == expected => {
                    persist::prefetched(saga, read).map(Some)
                }
                _ => Ok(None),
            }
        };
        if let Some(name) = crate::definition::child_of(&env.destination) {
            let child = child_addressed(env);
            return self.handle_child(tx, env, name, loaded(child)?).await;
        }
        let loaded = loaded(protocol::saga_id(env).ok())?;
        self.advance_loaded(tx, env, loaded).await
    }

    /// Does an orchestrator of this engine consume `destination`?
    pub fn consumes(&self, destination: &str) -> bool {
        self.definitions()
            .any(|d| d.orchestrator_destination() == destination)
    }

    /// Applies `answer` — a reply or timeout notice an agent of this process is about
    /// to commit for one of this engine's sagas — in the agent's own transaction `tx`,
    /// instead of sending it through the outbox: the step's outcome, the saga's next
    /// messages and the agent's effects commit together, and the answer never becomes
    /// a row, a delivery or an inbox record (nothing can deliver it twice).
    ///
    /// `Ok(None)`, with nothing written, when `answer` is not for this engine (another
    /// destination, a delay, a key) or its saga's version is not registered here: send
    /// it through the outbox as usual.
    ///
    /// # Errors
    /// As [`handle`](Self::handle). Some statements may have run: roll `tx` back.
    pub async fn apply_local(&self, tx: &mut Tx, answer: &Message) -> Result<Option<Handled>> {
        self.apply_local_prefetched(tx, answer, None).await
    }

    /// The read of saga `saga` that an agent's hop may start with (see
    /// [`Store::hop_receiving_prefetched`](agentsaga_core::Store::hop_receiving_prefetched)),
    /// so that [`apply_local_prefetched`](Self::apply_local_prefetched) needs no load of
    /// its own: on SQLite in the hop's opening round trip, on PostgreSQL by the set lane
    /// for all the sagas of its batch (see [`Prefetch`]).
    pub fn prefetch(&self, saga: SagaId) -> Option<Prefetch> {
        persist::prefetch(saga)
    }

    /// [`apply_local`](Self::apply_local) with the saga as `read` found it when the hop
    /// opened ([`prefetch`](Self::prefetch) of `saga`), instead of a load of its own.
    /// The hop must not have written the saga's rows since. A read of another saga than
    /// the answer's is not used.
    ///
    /// # Errors
    /// As [`apply_local`](Self::apply_local).
    pub async fn apply_local_prefetched(
        &self,
        tx: &mut Tx,
        answer: &Message,
        read: Option<(SagaId, &Prefetched)>,
    ) -> Result<Option<Handled>> {
        if !answer.delay.is_zero() || answer.key.is_some() || !self.consumes(&answer.destination) {
            return Ok(None);
        }
        let env = protocol::envelope_at(answer, tx.store().clock().now_ms());
        let loaded = match read {
            Some((saga, read)) if protocol::saga_id(&env).ok() == Some(saga) => {
                Some(persist::prefetched(saga, read)?)
            }
            _ => None,
        };
        match self.advance_loaded(tx, &env, loaded).await {
            Ok(handled) => Ok(Some(handled)),
            // Raised after reading the saga, before writing anything.
            Err(Error::VersionNotRegistered { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`handle`](Self::handle) past the inbox: reads the saga (unless `loaded` has
    /// it, `Some(None)`: it does not exist), decides, writes.
    pub(super) async fn advance_loaded(
        &self,
        tx: &mut Tx,
        env: &Envelope,
        loaded: Option<Option<Instance>>,
    ) -> Result<Handled> {
        let saga = protocol::saga_id(env)?;
        // Parsed now, and refused only once its saga is known to be here: a message of
        // a saga that no longer exists is dropped, and one of a version this process
        // lacks is left for a process that has it, whatever else is wrong with it.
        let inbound = Inbound::parse(env);
        let loaded = match loaded {
            Some(loaded) => loaded,
            None => persist::load(tx.conn(), saga).await?,
        };
        let Some(mut inst) = loaded else {
            tracing::warn!(saga.id = %saga, message.id = %env.id, "message for an unknown saga; dropped");
            return Ok(Handled::Ignored(format!("unknown saga {saga}")));
        };
        if !self.has(&inst.name, inst.version) {
            return Err(Error::VersionNotRegistered {
                name: inst.name,
                version: inst.version,
            });
        }
        let inbound = inbound?;
        // A start timeout withdraws its command only if no agent has taken it: a
        // command claimed (or answered) in time is left to finish, and a committed
        // reply wins.
        let started_in_time = match inbound {
            Inbound::StartTimeout { step, causation } => {
                (tx.cancel_pending(&[causation]).await? != 1).then_some(step)
            }
            _ => None,
        };
        let before = inst.clone();
        let signals = self.signals_of(tx, &inst).await?;
        let spenders = self.spenders_of(tx, &inst).await?;
        let mut ctx = self.ctx(&mut inst, tx.store().clock().now_ms())?;
        ctx.signals = signals;
        ctx.spenders = spenders;
        match started_in_time {
            Some(step) => ctx.ignore(format!("step {step} started in time"))?,
            None => ctx.receive(inbound)?,
        }
        let fx = std::mem::take(&mut ctx.fx);
        self.finish_handle(tx, saga, inst, before, fx).await
    }

    pub(super) async fn finish_handle(
        &self,
        tx: &mut Tx,
        saga: SagaId,
        inst: Instance,
        before: Instance,
        fx: Effects,
    ) -> Result<Handled> {
        if let Some(why) = &fx.ignored {
            tracing::info!(saga.id = %saga, %why, "saga message ignored");
        }
        let ignored = fx.ignored.clone();
        self.write(tx, &inst, Some(&before), fx).await?;
        Ok(match ignored {
            Some(why) if inst == before => Handled::Ignored(why),
            _ => Handled::Advanced {
                saga,
                state: inst.state,
            },
        })
    }

    /// The orchestrator could not process `env` (its effects were rolled back): tells
    /// the saga, in `tx`, instead of leaving it waiting for an answer that will not
    /// come. The message is recorded in the inbox; the step it concerns fails with
    /// `reason` (before the pivot the saga compensates, after it the saga is stuck);
    /// a saga that was compensating is stuck.
    ///
    /// # Errors
    /// [`Error::Malformed`] without a saga id; [`Error::VersionNotRegistered`]; store
    /// errors.
    pub async fn fail(&self, tx: &mut Tx, env: &Envelope, reason: &str) -> Result<Handled> {
        if tx.receive(&env.destination, env.id).await? == Receipt::Duplicate {
            return Ok(Handled::Duplicate);
        }
        if crate::definition::child_of(&env.destination).is_some() {
            // A parent's start or undo of a child that could not be processed: its
            // step (or the step's compensation) fails, with the reason.
            let why = format!("the child saga could not be handled: {reason}");
            let answer = protocol::reply(env, &protocol::StepOutcome::Fatal(why.clone()))?;
            tx.enqueue_batch(answer.as_slice()).await?;
            return Ok(Handled::Ignored(why));
        }
        let saga = protocol::saga_id(env)?;
        let Some(mut inst) = persist::load(tx.conn(), saga).await? else {
            return Ok(Handled::Ignored(format!("unknown saga {saga}")));
        };
        if !self.has(&inst.name, inst.version) {
            return Err(Error::VersionNotRegistered {
                name: inst.name,
                version: inst.version,
            });
        }
        let step = protocol::step_of(env);
        let before = inst.clone();
        let mut ctx = self.ctx(&mut inst, tx.store().clock().now_ms())?;
        ctx.fail_processing(step, format!("the orchestrator could not go on: {reason}"))?;
        let fx = std::mem::take(&mut ctx.fx);
        self.finish_handle(tx, saga, inst, before, fx).await
    }
}
