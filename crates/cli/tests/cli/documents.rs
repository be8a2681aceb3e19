//! The documents the commands print (their keys, and the two read most), and the
//! commands that open the database.

use serde_json::Value;

use crate::common::json;

/// A saga id no database holds.
const UNKNOWN: &str = "0190a8f0-0000-7000-8000-000000000000";

/// Every kind of command that opens the database (all but `migrate`, which may create
/// it and migrates it): each refuses a database that is missing or behind the binary.
pub(crate) const OPENING: [&[&str]; 13] = [
    &["status"],
    &["status", "--json"],
    &["sagas", "list"],
    &["sagas", "show", UNKNOWN],
    &["sagas", "abort", UNKNOWN],
    &["dead", "list", "--json"],
    &["dead", "redrive", "--all"],
    &["dead", "purge", "--older-than", "1d"],
    &["starts", "list"],
    &["schedules", "list"],
    &[
        "schedules",
        "create",
        "nightly",
        "--saga",
        "trip",
        "--cron",
        "0 3 * * *",
    ],
    &["schedules", "pause", "nightly"],
    &["prune", "--older-than", "1d"],
];

pub(crate) const SAGA_KEYS: &[&str] = &[
    "id",
    "name",
    "version",
    "state",
    "key",
    "waiting_for",
    "sleeping_until",
    "sleeping_until_ms",
    "parent_id",
    "paused",
    "error",
    "created_at",
    "created_at_ms",
    "updated_at",
    "updated_at_ms",
];

pub(crate) const STEP_KEYS: &[&str] = &[
    "idx",
    "stage",
    "name",
    "destination",
    "state",
    "attempts",
    "error",
    "dispatched_at",
    "dispatched_at_ms",
    "replied_at",
    "replied_at_ms",
    "wakes_at",
    "wakes_at_ms",
    "compensation_destination",
    "compensation_payload",
    "compensation_state",
    "compensation_attempts",
    "compensation_error",
    "compensated_at",
    "compensated_at_ms",
    "usage",
];

pub(crate) const DEAD_KEYS: &[&str] = &[
    "id",
    "seq",
    "destination",
    "key",
    "attempts",
    "created_at",
    "created_at_ms",
    "last_error",
    "headers",
    "payload",
    "moot",
];

/// A schedule's document (`schedules show --json`, each of `schedules list --json`).
pub(crate) const SCHEDULE_KEYS: &[&str] = &[
    "name",
    "saga",
    "input",
    "cron",
    "time_zone",
    "overlap",
    "catch_up",
    "late_after",
    "jitter",
    "paused",
    "next_slot",
    "next_slot_ms",
    "next_due",
    "next_due_ms",
    "queued_slot",
    "queued_slot_ms",
    "last_slot",
    "last_slot_ms",
    "last_saga_id",
    "last_fired",
    "last_fired_ms",
    "last_error",
    "fired",
    "skipped",
    "created",
    "created_ms",
    "updated",
    "updated_ms",
];

pub(crate) fn status(url: &str) -> Value {
    json(url, &["status", "--json"])
}

pub(crate) fn show(url: &str, id: &str) -> Value {
    json(url, &["sagas", "show", id, "--json"])
}

/// `2024-05-01T12:34:56.789Z`.
pub(crate) fn is_rfc3339(v: &Value) -> bool {
    let s = v.as_str().unwrap_or_default();
    s.len() == 24 && s.ends_with('Z') && s.as_bytes()[10] == b'T' && s.starts_with("20")
}
