//! The admin HTTP API served on 127.0.0.1 and called with reqwest, on SQLite and
//! PostgreSQL: every document equals the `Console` call's (the CLI's `--json`),
//! filters and cursor pages, each action answering the saga as it now stands, usage and budgets (a person's
//! raise), a pause and its resume, a rewind, tokens
//! (401 / 403, nothing done), bad requests (400 / 404 / 413, JSON errors, nothing
//! written), a stalled saga reported, `Runtime::admin_router` starting a runtime's
//! saga, remote destinations from a fake broker, and schedules (created, read, paused,
//! resumed, replaced, deleted; guarded as every action; fired by a runtime).
//!
//! One file a concern, on a shared fixture (`fixture.rs`) and server (`server.rs`); the
//! tests are declared here, each on both backends.

use agentsaga_core::both_backends;

mod actions;
mod budgets;
mod children;
mod cross_site;
mod dead;
mod finished;
mod fixture;
mod pause;
mod reads;
mod remote;
mod rewind;
mod schedules;
mod server;
mod starts;
mod tokens;

use actions::actions_answer_the_saga_as_it_now_stands;
use budgets::budgets_show_and_a_person_raises_them;
use children::a_parent_shows_its_children;
use cross_site::cross_site_requests_change_nothing;
use cross_site::rebound_hosts_are_refused;
use dead::dead_letters_are_paged_by_bytes;
use finished::{a_fold_takes_any_number_of_deltas, finished_counts_follow_every_write};
use pause::a_person_pauses_and_resumes_a_saga;
use reads::reads_equal_the_console_documents;
use remote::remote_destinations_join_the_broker_and_the_outbox;
use rewind::a_person_rewinds_a_saga;
use schedules::{
    schedule_writes_are_guarded, schedules_round_trip,
    the_runtime_router_checks_and_fires_schedules,
};
use starts::starts_with_an_engine;
use starts::the_runtime_router_starts_its_sagas;
use tokens::tokens_guard_everything;

both_backends!(finished_count_tests, finished_counts_follow_every_write);
both_backends!(fold_tests, a_fold_takes_any_number_of_deltas);
both_backends!(read_tests, reads_equal_the_console_documents);
both_backends!(action_tests, actions_answer_the_saga_as_it_now_stands);
both_backends!(budget_tests, budgets_show_and_a_person_raises_them);
both_backends!(pause_tests, a_person_pauses_and_resumes_a_saga);
both_backends!(rewind_tests, a_person_rewinds_a_saga);
both_backends!(start_tests, starts_with_an_engine);
both_backends!(token_tests, tokens_guard_everything);
both_backends!(dead_page_tests, dead_letters_are_paged_by_bytes);
both_backends!(cross_site_tests, cross_site_requests_change_nothing);
both_backends!(host_tests, rebound_hosts_are_refused);
both_backends!(children_tests, a_parent_shows_its_children);
both_backends!(runtime_tests, the_runtime_router_starts_its_sagas);
both_backends!(schedule_tests, schedules_round_trip);
both_backends!(schedule_guard_tests, schedule_writes_are_guarded);
both_backends!(
    runtime_schedule_tests,
    the_runtime_router_checks_and_fires_schedules
);
both_backends!(
    remote_tests,
    remote_destinations_join_the_broker_and_the_outbox
);
