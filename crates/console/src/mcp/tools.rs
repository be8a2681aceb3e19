//! The tools: their arguments (each with its JSON schema) and what each calls.

use std::sync::Arc;

use agentsaga_saga::{SagaState, Signal, SignalSender};
use rmcp::handler::server::common::schema_for_input;
use rmcp::model::{CallToolResult, JsonObject};
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{McpServer, tool_error};
use crate::ops::{Action, Error, Result, SagaQuery, parse_message_id, parse_saga_id};

/// `list_sagas`' arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListSagasArgs {
    /// Only sagas in this state.
    #[schemars(extend("enum" = ["running", "compensating", "stuck", "completed", "compensated", "aborted"]))]
    state: Option<String>,
    /// Only sagas with this name.
    name: Option<String>,
    /// Only the saga started with this idempotency key.
    key: Option<String>,
    /// Only sagas parked at a wait for a signal.
    #[serde(default)]
    waiting: bool,
    /// Only sagas parked at a sleep (`Step::sleep`).
    #[serde(default)]
    sleeping: bool,
    /// Only the child sagas of this saga (its id, a UUID).
    parent: Option<String>,
    /// Only stalled sagas: running or compensating with nothing pending, in flight or
    /// scheduled for them, or no progress for longer than the threshold.
    #[serde(default)]
    stalled: bool,
    /// Only sagas created at or after this time (Unix milliseconds).
    created_from_ms: Option<i64>,
    /// Only sagas created before this time (Unix milliseconds).
    created_to_ms: Option<i64>,
    /// The page after this one: a previous answer's `next_cursor`.
    cursor: Option<String>,
    /// At most this many sagas (default 100).
    #[schemars(range(min = 1, max = 1000))]
    limit: Option<u32>,
}

/// The arguments of a tool on one saga.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SagaIdArgs {
    /// The saga's id (a UUID).
    id: String,
}

/// `start_saga`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct StartArgs {
    /// The registered saga's name.
    name: String,
    /// The saga's data, as its definition reads it (default null).
    #[serde(default)]
    data: Value,
    /// An idempotency key: a second start with the same key answers the first saga.
    key: Option<String>,
}

/// `signal_saga`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SignalArgs {
    /// The saga's id (a UUID).
    id: String,
    /// The signal's name: the wait's (`waiting_for` in the saga).
    name: String,
    /// Approve, with this payload folded into the saga's data (default null).
    data: Option<Value>,
    /// Reject with this reason instead: the wait fails (before the pivot the saga
    /// compensates). Not together with `data`.
    reject: Option<String>,
}

/// `pause_saga`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct PauseArgs {
    /// The saga's id (a UUID).
    id: String,
    /// Why it is paused (shown with the saga, for the person who decides whether it
    /// goes on).
    reason: String,
}

/// `list_dead_letters`' arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct DeadListArgs {
    /// Only dead letters to this destination.
    destination: Option<String>,
    /// The page after this one: a previous answer's `next_before`.
    before: Option<i64>,
    /// At most this many (default 100).
    #[schemars(range(min = 1, max = 1000))]
    limit: Option<u32>,
}

/// `redrive_dead_letter`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RedriveArgs {
    /// The dead letter's message id (a UUID).
    id: String,
    /// When re-driving it would be moot (its saga has moved past it), purge it instead
    /// of refusing.
    #[serde(default)]
    force: bool,
}

/// `status` takes no arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

/// The input schema of a tool taking `T` (with `properties`, if empty, for clients that
/// look for them).
fn schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    let mut schema = schema_for_input::<T>()
        .unwrap_or_else(|e| panic!("the input schema of {}: {e}", std::any::type_name::<T>()));
    if !schema.contains_key("properties") {
        Arc::make_mut(&mut schema).insert("properties".to_owned(), json!({}));
    }
    schema
}

/// A tool's arguments, or [`Error::Invalid`] saying what is wrong with them.
fn args<T: DeserializeOwned>(args: JsonObject) -> Result<T> {
    serde_json::from_value(Value::Object(args))
        .map_err(|e| Error::Invalid(format!("bad arguments: {e}")))
}

/// A `limit` argument as the console takes it (0: its default); over the maximum the
/// console refuses it.
fn limit(limit: Option<u32>) -> Result<u32> {
    match limit {
        Some(0) => Err(Error::Invalid("limit must be at least 1".to_owned())),
        other => Ok(other.unwrap_or(0)),
    }
}

/// A tool's answer: `f` called with the arguments, its document, or its error (bad
/// arguments included) as a tool error.
async fn call<A: DeserializeOwned, D: Serialize>(
    a: JsonObject,
    f: impl AsyncFnOnce(A) -> Result<D>,
) -> CallToolResult {
    answer(async { f(args(a)?).await }.await)
}

/// A call's answer: its document, or its error as a tool error.
fn answer<T: Serialize>(result: Result<T>) -> CallToolResult {
    let result = result.and_then(|doc| {
        serde_json::to_value(doc).map_err(|e| Error::Store(format!("cannot serialize: {e}")))
    });
    match result {
        Ok(doc) => CallToolResult::structured(doc),
        Err(e) => tool_error(e.kind(), &e.to_string()),
    }
}

#[tool_router(vis = "pub(super)")]
impl McpServer {
    #[tool(
        description = "The database at a glance: outbox counts (pending, in flight, \
                       delivered, dead) and the relay's lag, sagas per state, starts waiting \
                       for room, how many sagas are stalled, and (given a broker) the \
                       remote destinations with the broker's lag.",
        input_schema = schema::<NoArgs>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn status(&self, a: JsonObject) -> CallToolResult {
        call(a, async |NoArgs {}| self.console.status().await).await
    }

    #[tool(
        description = "A page of sagas, newest first, filtered by state, name, key, waiting \
                       (parked at a wait for a signal), sleeping (parked at a sleep), stalled, or creation time. Pass the \
                       answer's `next_cursor` as `cursor` for the next page (null: the last).",
        input_schema = schema::<ListSagasArgs>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_sagas(&self, a: JsonObject) -> CallToolResult {
        call(a, async |a: ListSagasArgs| self.list_sagas_doc(a).await).await
    }

    #[tool(
        description = "One saga: its state, key, the signal it waits for, its data as it now \
                       stands, what it used and its budget (`spending`; no tool raises a \
                       budget: a person does), and its steps in order with the compensation \
                       ledger (each step's dispatch, reply, attempts, errors, usage and \
                       compensation).",
        input_schema = schema::<SagaIdArgs>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn show_saga(&self, a: JsonObject) -> CallToolResult {
        call(a, async |a: SagaIdArgs| {
            self.console.saga(parse_saga_id(&a.id)?).await
        })
        .await
    }

    #[tool(
        description = "Starts a saga registered in this process by its name, with its data \
                       (and an idempotency key if given); answers the saga. Only a process \
                       that hosts the saga's definition (a runtime serving these tools) can \
                       start it: elsewhere, as under the `agentsaga mcp` command, which \
                       hosts none, it answers not_found.",
        input_schema = schema::<StartArgs>(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn start_saga(&self, a: JsonObject) -> CallToolResult {
        call(a, async |a: StartArgs| {
            self.console.start(&a.name, a.key.as_deref(), a.data).await
        })
        .await
    }

    #[tool(
        description = "Sends a saga the signal its wait is parked for (its `waiting_for`): \
                       approve with optional `data`, or `reject` with a reason. Answers the \
                       receipt (`recorded`, or `duplicate` when the wait had its signal \
                       already and nothing changed) and the saga. Refused for a finished saga, \
                       a signal it never waits for, or a wait that is a person's decision \
                       (an approval: only a person sends it, never these tools).",
        input_schema = schema::<SignalArgs>(),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn signal_saga(&self, a: JsonObject) -> CallToolResult {
        call(a, async |a: SignalArgs| {
            let id = parse_saga_id(&a.id)?;
            let signal = match (a.data, a.reject) {
                (Some(_), Some(_)) => {
                    return Err(Error::Invalid(
                        "give `data` (approve) or `reject`, not both".to_owned(),
                    ));
                }
                (None, Some(reason)) => Signal::Reject(reason),
                (data, None) => Signal::Approve(data.unwrap_or(Value::Null)),
            };
            // An agent's signal: never a person's decision, whatever is allowed.
            self.console
                .signal_by(id, &a.name, signal, SignalSender::Agent)
                .await
        })
        .await
    }

    #[tool(
        description = "Aborts a saga: a running one compensates the steps it took, in \
                       reverse; one stuck after its pivot is given up. Answers the saga as it \
                       now stands; refused (nothing changed) when its state does not allow it.",
        input_schema = schema::<SagaIdArgs>(),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn abort_saga(&self, a: JsonObject) -> CallToolResult {
        call(a, async |a: SagaIdArgs| {
            self.console.act(parse_saga_id(&a.id)?, Action::Abort).await
        })
        .await
    }

    #[tool(
        description = "Pauses a saga, with the reason why: it sends nothing new (no next \
                       step, no step sent again, no compensation) until a person resumes it; \
                       what it sent already is still answered and recorded. No tool resumes \
                       a saga: a person does. Answers the saga as it now stands (its \
                       `paused`: by `mcp`, the reason, when); refused (nothing changed) for \
                       a finished saga or one paused already.",
        input_schema = schema::<PauseArgs>(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn pause_saga(&self, a: JsonObject) -> CallToolResult {
        call(a, async |a: PauseArgs| {
            self.console
                .pause(parse_saga_id(&a.id)?, "mcp", &a.reason)
                .await
        })
        .await
    }

    #[tool(
        description = "Dead letters (messages whose delivery gave up), newest first, each with \
                       its reason, payload and `moot`: why re-driving it would be wrong, when \
                       its saga has moved past it. A page holds at most `limit` and 4 MiB; \
                       pass its `next_before` as `before` for the next (null: the last).",
        input_schema = schema::<DeadListArgs>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_dead_letters(&self, a: JsonObject) -> CallToolResult {
        call(a, async |a: DeadListArgs| {
            self.console
                .dead_letters_before(a.destination.as_deref(), a.before, limit(a.limit)?)
                .await
        })
        .await
    }

    #[tool(
        description = "Re-drives a dead letter: pending again, attempts reset (outcome \
                       `redriven`). One whose saga has moved past it is moot: refused, or \
                       with `force` purged instead (outcome `purged`).",
        input_schema = schema::<RedriveArgs>(),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn redrive_dead_letter(&self, a: JsonObject) -> CallToolResult {
        call(a, async |a: RedriveArgs| {
            self.console
                .redrive(parse_message_id(&a.id)?, a.force)
                .await
        })
        .await
    }

    #[tool(
        description = "Every schedule (a saga started at the times a cron expression names, \
                       in a time zone), by name: its saga and input template, cron and time \
                       zone, overlap and catch-up policies, whether it is paused, its next \
                       slot and when that fires, its last firing and the saga it started, \
                       how many slots fired and were skipped, and why its last firing could \
                       not start its saga (`last_error`). Times are Unix ms and RFC 3339. \
                       No tool creates, changes, pauses or deletes a schedule: a person does.",
        input_schema = schema::<NoArgs>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_schedules(&self, a: JsonObject) -> CallToolResult {
        call(a, async |NoArgs {}| self.console.schedules().await).await
    }

    async fn list_sagas_doc(&self, a: ListSagasArgs) -> Result<crate::ops::SagaPage> {
        let state = a
            .state
            .as_deref()
            .map(|s| {
                s.parse::<SagaState>().map_err(|_| {
                    Error::Invalid(format!(
                        "unknown saga state `{s}`: expected one of running, compensating, \
                         completed, compensated, stuck, aborted"
                    ))
                })
            })
            .transpose()?;
        let limit = limit(a.limit)?;
        self.console
            .sagas(&SagaQuery {
                state,
                name: a.name,
                key: a.key,
                waiting: a.waiting,
                sleeping: a.sleeping,
                parent: a.parent.as_deref().map(parse_saga_id).transpose()?,
                stalled: a.stalled,
                created_from_ms: a.created_from_ms,
                created_to_ms: a.created_to_ms,
                cursor: a.cursor,
                limit,
            })
            .await
    }
}
