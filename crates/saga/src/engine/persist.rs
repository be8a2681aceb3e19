//! Loading and saving a saga instance with its steps, on each backend. The caller's
//! transaction is the unit: on PostgreSQL the instance row is locked (`FOR UPDATE`) so
//! that two processes handling two replies of one saga take turns; SQLite's single
//! writer already serialises them.

mod tables;

use agentsaga_core::read::{Loaded, Prefetch, Prefetched};
use agentsaga_core::write::Writes;
use agentsaga_core::{Conn, Message, Tx};

use super::model::{Instance, StepRow};
use crate::{Result, SagaId};
use tables::*;

pub(crate) async fn load(conn: Conn<'_>, id: SagaId) -> Result<Option<Instance>> {
    SAGA.fetch(conn, *id.as_uuid())
        .await?
        .map(|loaded| from_loaded(id, &loaded))
        .transpose()
}

/// Deletes saga `id`'s step rows from index `from` on (a rewind's undone steps: the
/// save after it writes those that run again afresh).
pub(crate) async fn drop_steps(conn: Conn<'_>, id: SagaId, from: usize) -> Result<()> {
    agentsaga_core::Sql::new("DELETE FROM saga_steps WHERE saga_id = ? AND idx >= ?")
        .bind(*id.as_uuid())
        .bind(from as i64)
        .execute(conn)
        .await?;
    Ok(())
}

/// The steps of `inst` that changed since `before` (all if `None`).
fn changed_steps<'a>(inst: &'a Instance, before: Option<&Instance>) -> Vec<&'a StepRow> {
    inst.steps
        .values()
        .filter(|s| before.and_then(|b| b.steps.get(&s.idx)) != Some(*s))
        .collect()
}

/// Saves the instance and the steps that changed since `before` (all if `None`), now.
pub(crate) async fn save(
    tx: &mut Tx,
    inst: &Instance,
    before: Option<&Instance>,
    now_ms: i64,
) -> Result<()> {
    if before == Some(inst) {
        return Ok(());
    }
    tx.write(save_writes(inst, &changed_steps(inst, before), now_ms))
        .await?;
    Ok(())
}

/// The load of saga `id` as a read that opens a hop (see [`Prefetch`]): on SQLite in
/// the hop's opening round trip, on PostgreSQL's set lane for all the sagas of the
/// batch.
pub(crate) fn prefetch(id: SagaId) -> Option<Prefetch> {
    Some(Prefetch::load(&SAGA, *id.as_uuid()))
}

/// The saga `id` from what [`prefetch`] read when the hop opened (`None`: no such
/// saga).
pub(crate) fn prefetched(id: SagaId, read: &Prefetched) -> Result<Option<Instance>> {
    read.loaded().map(|l| from_loaded(id, l)).transpose()
}

/// The saga `id` from its row and its steps' rows.
fn from_loaded(id: SagaId, loaded: &Loaded) -> Result<Instance> {
    let mut inst = instance_row(id, &loaded.parent)?;
    for r in &loaded.children {
        let step = step_row(r)?;
        inst.steps.insert(step.idx, step);
    }
    Ok(inst)
}

/// Saves the instance and its changed steps (as [`save`]), then enqueues `messages` in
/// `tx`, as the hop's last write ([`Tx::write_last`]): the store's driver writes them
/// in one round trip, or later with the round trip that ends the hop, or with the
/// statements of a batch of hops, as the hop allows.
pub(crate) async fn save_and_enqueue(
    tx: &mut Tx,
    inst: &Instance,
    before: Option<&Instance>,
    now_ms: i64,
    messages: &[Message],
) -> Result<()> {
    let mut writes = if before == Some(inst) {
        Writes::new()
    } else {
        save_writes(inst, &changed_steps(inst, before), now_ms)
    };
    writes.enqueue(messages);
    tx.write_last(writes).await?;
    Ok(())
}

/// Inserts new instances with their steps, then enqueues `messages`, in `tx`: a few
/// statements for the lot (the driver chunks them), on SQLite in one round trip with
/// the messages. `waits` are the `saga_signals` rows to write between the two, per
/// saga.
pub(crate) async fn insert_new(
    tx: &mut Tx,
    insts: &[Instance],
    waits: &[(SagaId, Vec<super::DeclaredWait>)],
    now_ms: i64,
    messages: &[Message],
) -> Result<()> {
    let mut writes = Writes::new();
    for inst in insts {
        writes.insert(&INSTANCES, instance_values(inst, now_ms));
    }
    for inst in insts {
        for s in inst.steps.values() {
            writes.insert(&STEPS, step_values(inst.id, s));
        }
    }
    if waits.is_empty() {
        writes.enqueue(messages);
        tx.write_last(writes).await?;
        return Ok(());
    }
    tx.write(writes).await?;
    for (id, declared) in waits {
        super::signals::register(tx.conn(), *id, declared).await?;
    }
    if !messages.is_empty() {
        tx.enqueue_batch(messages).await?;
    }
    Ok(())
}
