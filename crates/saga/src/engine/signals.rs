//! The SQL of signals (`saga_signals`): one row per wait a saga declares, written when
//! it starts; a signal fills in the row's outcome. Read by the engine when a saga
//! whose definition waits is loaded.

// A build with one backend leaves the other's imports unused.
#![cfg_attr(
    not(all(feature = "sqlite", feature = "postgres")),
    allow(unused_imports, unused_variables)
)]

use std::collections::BTreeMap;

use agentsaga_core::sqlx::{self, Row};
use agentsaga_core::{Conn, Message, header};

use crate::definition::DeclaredWait;
use crate::protocol::{self, StepOutcome};
use crate::{Error, Result, SagaId, SagaState};

/// Writes the rows of the waits saga `id` declares (none: nothing written).
pub(crate) async fn register(conn: Conn<'_>, id: SagaId, waits: &[DeclaredWait]) -> Result<()> {
    if waits.is_empty() {
        return Ok(());
    }
    agentsaga_core::match_conn!(conn, sqlite(c) => {
        for w in waits {
            sqlx::query(
                "INSERT INTO saga_signals (saga_id, name, approval) VALUES (?1, ?2, ?3)
                 ON CONFLICT DO NOTHING",
            )
            .bind(id.to_string())
            .bind(&w.name)
            .bind(w.approval)
            .execute(&mut *c)
            .await?;
        }
    }, postgres(c) => {
        let names: Vec<&str> = waits.iter().map(|w| w.name.as_str()).collect();
        let approvals: Vec<bool> = waits.iter().map(|w| w.approval).collect();
        sqlx::query(
            "INSERT INTO saga_signals (saga_id, name, approval)
             SELECT $1, n, a FROM unnest($2::text[], $3::bool[]) AS w (n, a)
             ON CONFLICT DO NOTHING",
        )
        .bind(id.as_uuid())
        .bind(names)
        .bind(approvals)
        .execute(&mut *c)
        .await?;
    });
    Ok(())
}

/// The signals saga `id` has received, by wait name.
pub(crate) async fn received(conn: Conn<'_>, id: SagaId) -> Result<BTreeMap<String, StepOutcome>> {
    let rows: Vec<(String, String)> = agentsaga_core::match_conn!(conn, sqlite(c) => {
        sqlx::query_as(
            "SELECT name, outcome FROM saga_signals WHERE saga_id = ?1 AND outcome IS NOT NULL",
        )
        .bind(id.to_string())
        .fetch_all(&mut *c)
        .await?
    }, postgres(c) => {
        sqlx::query_as(
            "SELECT name, outcome::text FROM saga_signals
             WHERE saga_id = $1 AND outcome IS NOT NULL",
        )
        .bind(id.as_uuid())
        .fetch_all(&mut *c)
        .await?
    });
    Ok(rows
        .into_iter()
        .map(|(name, outcome)| (name, StepOutcome::from_payload(&outcome)))
        .collect())
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
    let saga: Option<(String, i64, String)> = agentsaga_core::match_conn!(&mut conn, sqlite(c) => {
        sqlx::query_as("SELECT name, version, state FROM saga_instances WHERE id = ?1")
            .bind(id.to_string())
            .fetch_optional(&mut **c)
            .await?
    }, postgres(c) => {
        sqlx::query("SELECT name, version, state FROM saga_instances WHERE id = $1")
            .bind(id.as_uuid())
            .fetch_optional(&mut **c)
            .await?
            .map(|r| -> std::result::Result<_, sqlx::Error> {
                Ok((r.try_get("name")?, i64::from(r.try_get::<i32, _>("version")?), r.try_get("state")?))
            })
            .transpose()?
    });
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
        let approval: Option<bool> = agentsaga_core::match_conn!(&mut conn, sqlite(c) => {
            sqlx::query_scalar("SELECT approval FROM saga_signals WHERE saga_id = ?1 AND name = ?2")
                .bind(id.to_string())
                .bind(name)
                .fetch_optional(&mut **c)
                .await?
        }, postgres(c) => {
            sqlx::query_scalar("SELECT approval FROM saga_signals WHERE saga_id = $1 AND name = $2")
                .bind(id.as_uuid())
                .bind(name)
                .fetch_optional(&mut **c)
                .await?
        });
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
    let (changed, exists) = agentsaga_core::match_conn!(&mut conn, sqlite(c) => {
        let changed = sqlx::query(
            "UPDATE saga_signals SET outcome = ?1, received_at = ?2
             WHERE saga_id = ?3 AND name = ?4 AND outcome IS NULL",
        )
        .bind(&payload)
        .bind(now_ms)
        .bind(id.to_string())
        .bind(name)
        .execute(&mut **c)
        .await?
        .rows_affected();
        let exists = changed == 1
            || sqlx::query("SELECT 1 FROM saga_signals WHERE saga_id = ?1 AND name = ?2")
                .bind(id.to_string())
                .bind(name)
                .fetch_optional(&mut **c)
                .await?
                .is_some();
        (changed, exists)
    }, postgres(c) => {
        let changed = sqlx::query(
            "UPDATE saga_signals SET outcome = $1::jsonb, received_at = now()
             WHERE saga_id = $2 AND name = $3 AND outcome IS NULL",
        )
        .bind(&payload)
        .bind(id.as_uuid())
        .bind(name)
        .execute(&mut **c)
        .await?
        .rows_affected();
        let exists = changed == 1
            || sqlx::query("SELECT 1 FROM saga_signals WHERE saga_id = $1 AND name = $2")
                .bind(id.as_uuid())
                .bind(name)
                .fetch_optional(&mut **c)
                .await?
                .is_some();
        (changed, exists)
    });
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
