//! The assistant's data: what a saga is started with, the commands its plans send,
//! what its agents make, and its tables (shared with the test that runs the assistant
//! on `agentsaga::testing::TestRuntime`).

use super::*;

/// What a saga is started with: the request (`/input` in the saga data).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Input {
    pub(super) company: String,
}

/// A command of the plan (its `$from` references resolved): do the agent's work, or
/// undo it. The same shape for every agent; each reads the fields it needs.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(super) enum Command {
    Do(Task),
    /// Undo what the step made: the row its reply named; `None` when its outcome is
    /// unknown.
    Undo {
        #[serde(default)]
        id: Option<String>,
    },
}

/// The work a plan asks of an agent, with what earlier steps produced.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Task {
    pub(super) company: String,
    /// The research notes (for the draft).
    #[serde(default)]
    pub(super) findings: Option<String>,
    /// The reserved slot (for the draft).
    #[serde(default)]
    pub(super) slot: Option<String>,
    /// The email's body (for the email).
    #[serde(default)]
    pub(super) draft: Option<String>,
    /// Who approved the email (for the CRM record).
    #[serde(default)]
    pub(super) approved_by: Option<String>,
    /// The notes on the company's competitors, from the child sagas that researched
    /// them (for the draft); `null` for one whose reference found nothing.
    #[serde(default)]
    pub(super) competitors: Option<Vec<Option<String>>>,
    /// The company's reply to the email (for the follow-up); `null` if none came in
    /// time.
    #[serde(default)]
    pub(super) reply: Option<Value>,
}

/// What an agent made: its text, and for an effect that can be undone, the id of its
/// row (what the undo names). A plan refers to them as `/results/<step>/text` and
/// `/results/<step>/id`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Made {
    pub(super) text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) id: Option<String>,
}

pub(super) fn saga_of(ctx: &CallContext<'_>) -> Result<String, StepError> {
    ctx.saga_id()
        .map(|s| s.to_string())
        .ok_or_else(|| StepError::fatal("no saga id"))
}

pub(super) const DDL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS assistant_plans (saga_id TEXT PRIMARY KEY, steps TEXT NOT NULL, plan TEXT NOT NULL, answer TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS assistant_research (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status = 'done'), summary TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS assistant_calendar_slots (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status IN ('reserved', 'cancelled')), slot TEXT NOT NULL, event_id TEXT NOT NULL UNIQUE)",
    "CREATE TABLE IF NOT EXISTS assistant_drafts (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status IN ('drafted', 'discarded')), body TEXT NOT NULL, draft_id TEXT NOT NULL UNIQUE)",
    "CREATE TABLE IF NOT EXISTS assistant_emails (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status = 'sent'), body TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS assistant_crm_records (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status = 'created'), note TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS assistant_follow_ups (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status IN ('drafted', 'replied')), note TEXT NOT NULL)",
    llm_stub::CALLS_DDL,
];
