//! Child sagas ([`Step::saga`](crate::Step::saga)): a parent's step sends its command
//! (start the child) and its compensation (undo it) to `saga.<name>.child`, consumed by
//! every process that hosts saga `name`. Each is handled in one transaction with its
//! inbox record.
//!
//! A parent's step has one child, whatever is sent again or by whom: the child's id is
//! made from the parent's id and the step's index, so a second start finds the first
//! (the primary key). The child records its parent step
//! ([`ParentLink`](super::model::ParentLink)) and, once finished, answers it in the
//! transaction that finishes it (see `logic/child.rs`).
//!
//! Children take no admission slot: a child runs within its root's, so a parent
//! waiting on its children never holds a slot they need (they need none). What one
//! root may start is bounded instead by the depth and fan-out limits
//! ([`Engine::with_child_limits`]), checked before anything of a child is written.

use agentsaga_core::{Conn, Sql, header};

use super::model::ParentLink;
use super::*;
use crate::protocol::StepOutcome;

impl Engine {
    /// `env`, sent to the child destination of saga `name`, in `tx` past its inbox
    /// record.
    pub(super) async fn handle_child(
        &self,
        tx: &mut Tx,
        env: &Envelope,
        name: &str,
        loaded: Option<Option<Instance>>,
    ) -> Result<Handled> {
        let parent = protocol::saga_id(env)?;
        let step = protocol::step_of(env)
            .ok_or_else(|| Error::Malformed(format!("message {} names no step", env.id)))?;
        let reply_to = env.header(header::REPLY_TO).ok_or_else(|| {
            Error::Malformed(format!("message {} has no reply_to header", env.id))
        })?;
        let id = child_addressed(env).expect("a saga and a step, read above");
        match Outbound::parse(env) {
            Some(Outbound::Command { .. }) => {
                let link = ParentLink {
                    saga: parent,
                    step,
                    step_name: env.header(protocol::STEP_NAME).unwrap_or("").to_owned(),
                    reply_to: reply_to.to_owned(),
                    command: env.id,
                    compensation: None,
                    depth: 1,
                };
                self.start_child(tx, env, name, id, link, loaded).await
            }
            Some(Outbound::Compensation { .. }) => self.undo_child(tx, env, id, loaded).await,
            None => Err(Error::Malformed(format!(
                "message {} to `{}` is neither a command nor a compensation",
                env.id, env.destination
            ))),
        }
    }

    /// Starts child `id` of the parent step in `link`, unless it exists (the command
    /// sent again: the child's outcome then answers this one, at once if it is
    /// finished) or a limit refuses it (the step fails, nothing of the child written).
    /// `loaded`: the child as the hop read it when it opened (`None`: load it).
    async fn start_child(
        &self,
        tx: &mut Tx,
        env: &Envelope,
        name: &str,
        id: SagaId,
        mut link: ParentLink,
        loaded: Option<Option<Instance>>,
    ) -> Result<Handled> {
        let existing = match loaded {
            Some(loaded) => loaded,
            None => persist::load(tx.conn(), id).await?,
        };
        if let Some(mut inst) = existing {
            let before = inst.clone();
            let mut ctx = self.ctx(&mut inst, tx.store().clock().now_ms())?;
            let answer_now = match &mut ctx.inst.parent {
                Some(held) if held.compensation.is_none() => {
                    held.command = env.id;
                    ctx.inst.state.is_terminal()
                }
                _ => false,
            };
            if answer_now {
                ctx.answer_parent()?;
            } else {
                ctx.ignore("the child saga was started already")?;
            }
            let fx = std::mem::take(&mut ctx.fx);
            return self.finish_handle(tx, id, inst, before, fx).await;
        }
        // The limits' figures, from the parent's headers; read from the database only
        // for a start sent by an engine that did not write them.
        let counted = |h: &str| env.header(h).and_then(|v| v.parse::<u64>().ok());
        let (depth, children) = match (
            counted(protocol::CHILD_DEPTH),
            counted(protocol::CHILDREN_BEFORE),
        ) {
            (Some(depth), Some(before)) => (u32::try_from(depth).unwrap_or(u32::MAX), before),
            _ => {
                let facts = facts(tx.conn(), link.saga).await?;
                (facts.parent.map_or(1, |l| l.depth + 1), facts.children)
            }
        };
        link.depth = depth;
        if link.depth > self.max_child_depth {
            let why = format!(
                "the child saga `{name}` would be {} levels deep; the bound is {} \
                 (Engine::with_child_limits)",
                link.depth, self.max_child_depth
            );
            return refuse(tx, env, why).await;
        }
        if children >= u64::from(self.max_children) {
            let why = format!(
                "the parent saga has started {children} child sagas; the bound is {} \
                 (Engine::with_child_limits)",
                self.max_children
            );
            return refuse(tx, env, why).await;
        }
        let version = self.version_of(name)?;
        let data = match serde_json::from_str(&env.payload)
            .map_err(Error::from)
            .and_then(|data| self.prepare(name, version, data))
        {
            Ok(data) => data,
            Err(e) => {
                let why = format!("the child saga `{name}` refused its input: {e}");
                return refuse(tx, env, why).await;
            }
        };
        let timeout = env
            .header(header::TIMEOUT_MS)
            .and_then(|t| t.parse::<u64>().ok());
        let (inst, mut fx, span) = self.begin_instance(
            id,
            name,
            version,
            data,
            0,
            Some(&env.headers),
            Some(link),
            tx.store().clock().now_ms(),
        )?;
        // The parent step's timeout bounds the child: past it, the child is aborted
        // (compensated), and the parent's step fails.
        if let Some(ms) = timeout {
            fx.send.push(protocol::deadline_timer(
                id,
                &crate::orchestrator_destination(name, version),
                std::time::Duration::from_millis(ms),
            ));
        }
        let state = inst.state;
        self.write(tx, &inst, None, fx).instrument(span).await?;
        Ok(Handled::Advanced { saga: id, state })
    }

    /// Undoes child `id` at its parent's request (see `Ctx::undo_as_child`); a child
    /// that was never started (its start refused) has nothing to undo.
    async fn undo_child(
        &self,
        tx: &mut Tx,
        env: &Envelope,
        id: SagaId,
        loaded: Option<Option<Instance>>,
    ) -> Result<Handled> {
        let existing = match loaded {
            Some(loaded) => loaded,
            None => persist::load(tx.conn(), id).await?,
        };
        let Some(mut inst) = existing else {
            let answer = protocol::reply(env, &StepOutcome::Ok(Value::Null))?;
            tx.enqueue_batch(answer.as_slice()).await?;
            return Ok(Handled::Ignored(format!(
                "no child saga {id} was started: nothing to undo"
            )));
        };
        if !self.has(&inst.name, inst.version) {
            return Err(Error::VersionNotRegistered {
                name: inst.name,
                version: inst.version,
            });
        }
        let before = inst.clone();
        let mut ctx = self.ctx(&mut inst, tx.store().clock().now_ms())?;
        ctx.undo_as_child(env.id)?;
        let fx = std::mem::take(&mut ctx.fx);
        self.finish_handle(tx, id, inst, before, fx).await
    }
}

/// What a child's start reads of its parent, in one statement, when the start lacks
/// the headers that say it.
struct Facts {
    /// The parent's own link (`None`: the parent is a saga started on its own, or
    /// gone).
    parent: Option<ParentLink>,
    /// The children the parent has.
    children: u64,
}

/// [`Facts`] of saga `parent`.
async fn facts(conn: Conn<'_>, parent: SagaId) -> Result<Facts> {
    let row = Sql::new(
        "SELECT (SELECT parent FROM saga_instances WHERE id = ?) AS link,
                (SELECT count(*) FROM saga_instances WHERE parent_id = ?) AS children",
    )
    .bind(*parent.as_uuid())
    .bind(*parent.as_uuid())
    .fetch_one(conn)
    .await?;
    let (link, children) = (row.opt_text("link")?, row.int("children")?);
    Ok(Facts {
        parent: link.map(|l| serde_json::from_str(&l)).transpose()?,
        children: children.max(0) as u64,
    })
}

/// Answers the parent's command `env` with a fatal failure, `why`: no child is started.
async fn refuse(tx: &mut Tx, env: &Envelope, why: String) -> Result<Handled> {
    tracing::warn!(message.id = %env.id, %why, "child saga refused");
    let answer = protocol::reply(env, &StepOutcome::Fatal(why.clone()))?;
    tx.enqueue_batch(answer.as_slice()).await?;
    Ok(Handled::Ignored(why))
}

/// The id of the child saga of `parent`'s step `step`: the same on every process and
/// every delivery, so that one step has one child. The parent's id with its random half
/// replaced by a hash of that half and the step, marked as a UUIDv8 (so never a v7 id of
/// a saga started on its own). The hash is not linear (an XOR of the step into the
/// parent's bits would give the grandchildren of steps (a, b) and (b, a) one id), so
/// distinct paths from a root give distinct ids but by a chance of 2^-62.
#[cfg(test)]
pub(crate) fn child_id(parent: SagaId, step: usize) -> SagaId {
    child_id_of_run(parent, step, 0)
}

/// The child of `env`, a start or undo of a child saga: its parent's step's child for
/// the step's run (`protocol::CHILD_RUN`), `None` if it names no saga or step.
pub(crate) fn child_addressed(env: &Envelope) -> Option<SagaId> {
    let parent = protocol::saga_id(env).ok()?;
    let step = protocol::step_of(env)?;
    let run = env
        .header(protocol::CHILD_RUN)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    Some(child_id_of_run(parent, step, run))
}

/// The id of the child saga of run `run` of `parent`'s step `step` (a rewind of the
/// parent undid the earlier runs' children): run 0 is the step's first child (its id
/// as `child_id` gives it), each later run a distinct one, mixed into the hash.
pub(crate) fn child_id_of_run(parent: SagaId, step: usize, run: u64) -> SagaId {
    // SplitMix64's finalizer: a bijection of 64 bits whose every output bit depends on
    // every input bit.
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut bytes = *parent.as_uuid().as_bytes();
    let (_, low) = bytes.split_at_mut(8);
    let low: &mut [u8; 8] = low.try_into().expect("a UUID has 16 bytes");
    let run = if run == 0 {
        0
    } else {
        mix(run.wrapping_mul(0xd1b5_4a32_d192_ed03))
    };
    let step = mix((step as u64)
        .wrapping_add(1)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ run);
    *low = mix(u64::from_be_bytes(*low) ^ step).to_be_bytes();
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    SagaId::from(uuid::Uuid::from_bytes(bytes))
}
