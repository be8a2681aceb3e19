//! The SQL of signals (`saga_signals`): one row per wait a saga declares, written when
//! it starts; a signal fills in the row's outcome. Read by the engine when a saga
//! whose definition waits is loaded.

use std::collections::BTreeMap;

use agentsaga_core::{Conn, Message, Sql, Tx, header};

use crate::definition::DeclaredWait;
use crate::protocol::{self, StepOutcome};
use crate::{Error, Result, SagaId, SagaState};

/// Writes the rows of the waits saga `id` declares (none: nothing written).
pub(crate) async fn register(conn: Conn<'_>, id: SagaId, waits: &[DeclaredWait]) -> Result<()> {
    if waits.is_empty() {
        return Ok(());
    }
    // One statement for all the waits.
    let mut sql = String::from("INSERT INTO saga_signals (saga_id, name, approval) VALUES ");
    for i in 0..waits.len() {
        sql.push_str(if i == 0 { "(?, ?, ?)" } else { ", (?, ?, ?)" });
    }
    sql.push_str(" ON CONFLICT DO NOTHING");
    let mut insert = Sql::new(sql);
    for w in waits {
        insert = insert.bind(*id.as_uuid()).bind(&w.name).bind(w.approval);
    }
    insert.execute(conn).await?;
    Ok(())
}

/// Forgets the signals saga `id`'s waits `names` received (a rewind's: the waits run
/// again and wait afresh). The rows of `dropped` go instead: the approvals of commands
/// (`approve_before`), written again, with the command to approve, when the saga
/// reaches the wait, so that no approval is taken before (a person approves what they
/// were shown).
pub(crate) async fn reset(
    mut conn: Conn<'_>,
    id: SagaId,
    names: &[String],
    dropped: &[String],
) -> Result<()> {
    for (sql, names) in [
        (
            "UPDATE saga_signals SET outcome = NULL, received_at = NULL \
             WHERE saga_id = ? AND name IN",
            names,
        ),
        (
            "DELETE FROM saga_signals WHERE saga_id = ? AND name IN",
            dropped,
        ),
    ] {
        if names.is_empty() {
            continue;
        }
        let marks = vec!["?"; names.len()].join(", ");
        let mut sql = Sql::new(format!("{sql} ({marks})")).bind(*id.as_uuid());
        for name in names {
            sql = sql.bind(name);
        }
        sql.execute(conn.reborrow()).await?;
    }
    Ok(())
}

/// The signals saga `id` has received, by wait name.
pub(crate) async fn received(tx: &mut Tx, id: SagaId) -> Result<BTreeMap<String, StepOutcome>> {
    let sql = Sql::new(
        "SELECT name, outcome FROM saga_signals WHERE saga_id = ? AND outcome IS NOT NULL",
    )
    .bind(*id.as_uuid());
    let rows = tx.read(&sql).await?;
    rows.iter()
        .map(|r| {
            Ok((
                r.text("name")?,
                StepOutcome::from_payload(&r.text("outcome")?),
            ))
        })
        .collect()
}

/// What a signal says to the saga waiting for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Signal {
    /// Go on; the payload folds into the saga data as the wait step's reply would
    /// (`Step::on_reply`).
    Approve(serde_json::Value),
    /// Do not: the wait step fails with this reason (before the pivot the saga
    /// compensates, at or after it the saga is stuck).
    Reject(String),
}

/// Who sends a signal, as the surface it comes through vouches: what
/// [`Engine::signal_by`](crate::Engine::signal_by) lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignalSender {
    /// A person (the CLI, the console's API or page with its token) or the
    /// application's own code: any wait.
    Person,
    /// An LLM-facing surface (the MCP tools): any wait but a person's decision
    /// (`Step::approval`), which is refused with nothing written.
    Agent,
}

/// What `Engine::signal` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalReceipt {
    /// The signal is recorded; the saga uses it at its wait (now, or when it gets
    /// there).
    Recorded,
    /// The wait had its signal already: nothing changed.
    Duplicate,
}

/// Records `outcome` as the signal `name` of saga `id` and wakes its orchestrator, in
/// the caller's transaction; refuses, writing nothing, a signal the saga cannot take.
pub(crate) async fn record(
    mut conn: Conn<'_>,
    id: SagaId,
    name: &str,
    outcome: &StepOutcome,
    sender: SignalSender,
    now_ms: i64,
) -> Result<(SignalReceipt, Option<Message>)> {
    let saga = Sql::new("SELECT name, version, state FROM saga_instances WHERE id = ?")
        .bind(*id.as_uuid())
        .fetch_optional(&mut conn)
        .await?
        .map(|r| -> agentsaga_core::Result<_> {
            Ok((r.text("name")?, r.int("version")?, r.text("state")?))
        })
        .transpose()?;
    let Some((saga_name, version, state)) = saga else {
        return Err(Error::NotFound(id));
    };
    let state: SagaState = state.parse().map_err(Error::Corrupt)?;
    if state.is_terminal() {
        return Err(Error::SignalRefused {
            saga: id,
            name: name.to_owned(),
            reason: format!("the saga is {state}"),
        });
    }
    if sender == SignalSender::Agent {
        // Checked before anything is written; the mark is written once, when the saga
        // (or its plan) declares the wait, and never changes.
        let approval = Sql::new("SELECT approval FROM saga_signals WHERE saga_id = ? AND name = ?")
            .bind(*id.as_uuid())
            .bind(name)
            .fetch_optional(&mut conn)
            .await?
            .map(|r| r.opt_bool("approval"))
            .transpose()?
            .flatten();
        if approval == Some(true) {
            return Err(Error::SignalRefused {
                saga: id,
                name: name.to_owned(),
                reason: "the wait is a person's decision (an approval): its signal is taken \
                         only from a person (the CLI, or the console with an action token), \
                         never from an agent's tools"
                    .to_owned(),
            });
        }
    }
    let payload = serde_json::to_string(outcome)?;
    let changed = Sql::new(
        "UPDATE saga_signals SET outcome = ?, received_at = ?
         WHERE saga_id = ? AND name = ? AND outcome IS NULL",
    )
    .bind_json(payload.as_str())
    .bind_now(now_ms)
    .bind(*id.as_uuid())
    .bind(name)
    .execute(&mut conn)
    .await?;
    let exists = changed == 1
        || Sql::new("SELECT 1 AS one FROM saga_signals WHERE saga_id = ? AND name = ?")
            .bind(*id.as_uuid())
            .bind(name)
            .fetch_optional(&mut conn)
            .await?
            .is_some();
    if !exists {
        return Err(Error::SignalRefused {
            saga: id,
            name: name.to_owned(),
            reason: if name.starts_with(crate::plan::APPROVE_PREFIX) {
                // An approval wait the engine inserts (`approve_before`) registers its
                // signal only once the saga reaches it, with the command to approve.
                format!(
                    "saga `{saga_name}` v{version} does not wait for `{name}` now: an \
                     approval of a held command can be sent only once the saga waits for \
                     it, with the command there to see (`sagas show`)"
                )
            } else {
                format!("saga `{saga_name}` v{version} never waits for `{name}`")
            },
        });
    }
    if changed == 0 {
        return Ok((SignalReceipt::Duplicate, None));
    }
    let wake = Message::to(crate::definition::orchestrator_destination(
        &saga_name,
        i32::try_from(version).unwrap_or(i32::MAX),
    ))
    .header(header::SAGA_ID, id.to_string())
    .header(header::KIND, protocol::KIND_SIGNAL)
    .header(protocol::SIGNAL, name);
    Ok((SignalReceipt::Recorded, Some(wake)))
}
