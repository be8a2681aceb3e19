//! Starts that wait for room: admitted as sagas finish, listed, set aside with their
//! reason when they cannot start, removed; and a dead letter made moot by its saga.

use super::*;

impl Engine {
    /// Starts, in `tx`, as many waiting starts of saga `name` as its bound has room
    /// for, oldest first; returns their ids. The runtime calls it as sagas finish.
    ///
    /// A start that cannot begin (its data no longer decodes as the saga's input, its
    /// first command is over the size limit: say, after a deploy changed the saga) is
    /// set aside in `saga_starts` with the reason, in `tx`, and the starts behind it
    /// go on; see [`set_aside_starts`](Self::set_aside_starts).
    ///
    /// # Errors
    /// Store errors.
    pub async fn admit(&self, tx: &mut Tx, name: &str) -> Result<Vec<SagaId>> {
        let Some(bound) = self.max_in_flight(name) else {
            return Ok(Vec::new());
        };
        let version = self.version_of(name)?;
        let now = tx.store().clock().now_ms();
        let (_, waiting) = admission::pop(tx.conn(), name, bound as u64, now).await?;
        let mut ids = Vec::with_capacity(waiting.len());
        for w in waiting {
            let begun = self
                .prepare_input(name, version, &w.data)
                .and_then(|()| {
                    self.begin_instance(
                        w.id,
                        name,
                        version,
                        w.data.clone(),
                        w.waited_ms,
                        Some(&w.headers),
                        None,
                        now,
                    )
                })
                .and_then(|(inst, fx, span)| {
                    for m in &fx.send {
                        tx.store().check_message(m)?;
                    }
                    Ok((inst, fx, span))
                });
            match begun {
                Ok((inst, fx, span)) => {
                    self.write(tx, &inst, None, fx).instrument(span).await?;
                    ids.push(w.id);
                }
                Err(e) => {
                    tracing::warn!(
                        saga.id = %w.id, saga.name = %name, error = %e,
                        "a waiting start cannot be started: set aside (see `agentsaga starts list`)"
                    );
                    admission::set_aside(tx.conn(), name, &w, &e.to_string(), now).await?;
                }
            }
        }
        Ok(ids)
    }

    /// Would [`admit`](Self::admit) start anything for saga `name` now? Two reads,
    /// outside any transaction: starts wait, and the room under the bound is at least
    /// one admission batch.
    ///
    /// # Errors
    /// Store errors.
    pub async fn admission_due(&self, store: &Store, name: &str) -> Result<bool> {
        let Some(bound) = self.max_in_flight(name) else {
            return Ok(false);
        };
        if !admission::any_waiting_now(store, name).await? {
            return Ok(false);
        }
        let in_flight = admission::in_flight_now(store, name).await?;
        Ok(in_flight + admission::min_batch(bound as u64) <= bound as u64)
    }

    /// Starts waiting per saga name (a read).
    ///
    /// # Errors
    /// Store errors.
    pub async fn waiting_starts(store: &Store) -> Result<Vec<(String, u64)>> {
        admission::waiting(store).await
    }

    /// Is `id` a start still waiting for room (a read)?
    ///
    /// # Errors
    /// Store errors.
    pub async fn is_waiting(store: &Store, id: SagaId) -> Result<bool> {
        admission::is_waiting(store, id).await
    }

    /// The waiting starts that could not be started when their turn came and were set
    /// aside, oldest first (a read). They hold nothing up; each stays until an
    /// operator removes it ([`remove_set_aside`](Self::remove_set_aside)).
    ///
    /// # Errors
    /// Store errors; [`Error::Corrupt`] for a row this binary cannot read.
    pub async fn set_aside_starts(store: &Store) -> Result<Vec<SetAsideStart>> {
        Ok(admission::set_aside_rows(store, None)
            .await?
            .into_iter()
            .map(SetAsideStart::from)
            .collect())
    }

    /// The start `id`, if it was set aside (a read).
    ///
    /// # Errors
    /// As [`set_aside_starts`](Self::set_aside_starts).
    pub async fn set_aside_start(store: &Store, id: SagaId) -> Result<Option<SetAsideStart>> {
        Ok(admission::set_aside_rows(store, Some(id))
            .await?
            .into_iter()
            .next()
            .map(SetAsideStart::from))
    }

    /// Operator: deletes the set-aside start `id`, in `tx`, with the idempotency key
    /// that named it (a later start with that key starts afresh). Needs no saga
    /// definition.
    ///
    /// # Errors
    /// [`Error::NotFound`] if no start `id` is set aside (a start still waiting its
    /// turn is not removed); store errors.
    pub async fn remove_set_aside(tx: &mut Tx, id: SagaId) -> Result<()> {
        if admission::remove_set_aside(tx.conn(), id).await? {
            Ok(())
        } else {
            Err(Error::NotFound(id))
        }
    }

    /// Why re-driving the dead letter `env` would be wrong, if it would: a saga
    /// command or compensation whose saga has moved past it (finished, compensating or
    /// compensated that step, or sent a later attempt), or a message of a saga that no
    /// longer exists. `None`: not a saga message, or still wanted. An undo must never
    /// be overtaken by its do.
    ///
    /// # Errors
    /// Store errors; [`Error::Corrupt`] for a saga row this binary cannot read.
    pub async fn moot(store: &Store, env: &Envelope) -> Result<Option<String>> {
        let Ok(saga) = protocol::saga_id(env) else {
            return Ok(None);
        };
        let inst = store
            .read(async |c| Ok(persist::load(c, saga).await))
            .await??;
        let Some(inst) = inst else {
            return Ok(Some(format!("its saga {saga} no longer exists")));
        };
        let sent = Outbound::parse(env).and_then(|o| match o {
            Outbound::Command { step } | Outbound::Compensation { step } => {
                inst.steps.get(&step).map(|row| (o, row))
            }
        });
        Ok(match sent {
            Some((Outbound::Command { .. }, row)) => {
                if row.command_id != Some(env.id) {
                    Some(format!(
                        "step `{}` was sent again since (a later attempt supersedes it)",
                        row.name
                    ))
                } else if inst.state != SagaState::Running {
                    Some(format!(
                        "its saga is {}: the step may not run now",
                        inst.state
                    ))
                } else {
                    // A spent budget holds the step: re-driving it would spend past
                    // the budget. Once raised, the saga sends the step again itself.
                    // (Held for an ancestor's spent budget: in the held steps.)
                    inst.budget.as_ref().and_then(|b| {
                        let spent = b.limit.spent_by(&inst.usage).or_else(|| {
                            b.held
                                .steps
                                .contains(&row.idx)
                                .then(|| "its saga tree's budget is spent".to_owned())
                        })?;
                        Some(format!(
                            "budget spent: {spent}: step `{}` waits for an operator to \
                             raise the budget (`agentsaga sagas raise-budget`), and the \
                             saga then sends it again itself",
                            row.name
                        ))
                    })
                }
            }
            Some((Outbound::Compensation { .. }, row)) => {
                if row.compensation_message_id != Some(env.id) {
                    Some(format!(
                        "the compensation of step `{}` was sent again since",
                        row.name
                    ))
                } else if matches!(
                    row.compensation_state,
                    Some(crate::CompensationState::Done | crate::CompensationState::Skipped)
                ) {
                    Some(format!("step `{}` is compensated already", row.name))
                } else {
                    None
                }
            }
            None if inst.state.is_terminal() => Some(format!("its saga is {}", inst.state)),
            None => None,
        })
    }
}
