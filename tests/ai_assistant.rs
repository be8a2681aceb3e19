//! The ai_assistant example as a child process, on both backends.

mod support;

use agentsaga::core::Store;
use agentsaga::core::both_backends;
use agentsaga::core::testing::{Backend, fresh_url};

const UNDOABLE: &[(&str, &str)] = &[
    ("assistant_calendar_slots", "reserved"),
    ("assistant_drafts", "drafted"),
];
const FORWARD: &[(&str, &str)] = &[
    ("assistant_emails", "sent"),
    ("assistant_crm_records", "created"),
];

async fn happy_path(backend: Backend) {
    let url = fresh_url(backend).await;
    support::run(
        "ai_assistant",
        &url,
        &["--sagas", "30", "--fail-rate", "0", "--seed", "1"],
    );
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(
        support::check_invariants(&store, UNDOABLE, FORWARD).await,
        (30, 0)
    );
    assert_eq!(
        support::statuses(&store, "assistant_research").await.len(),
        30
    );
}
both_backends!(happy_path_tests, happy_path);

async fn failures_compensate(backend: Backend) {
    let url = fresh_url(backend).await;
    support::run(
        "ai_assistant",
        &url,
        &["--sagas", "80", "--fail-rate", "0.4", "--seed", "5"],
    );
    let store = Store::connect(&url).await.unwrap();
    let (completed, compensated) = support::check_invariants(&store, UNDOABLE, FORWARD).await;
    assert_eq!(completed + compensated, 80);
    assert!(
        completed > 0 && compensated > 0,
        "{completed} / {compensated}"
    );
    // A compensated saga's slot was cancelled (or never reserved); research, read-only,
    // is left as it was.
    let slots = support::statuses(&store, "assistant_calendar_slots").await;
    assert!(slots.values().any(|s| s == "cancelled"));
}
both_backends!(failure_tests, failures_compensate);
