//! The `agentsaga` binary against databases prepared by the saga engine, on SQLite and
//! PostgreSQL: the JSON documents, each action's effect on the tables, and bad input.
//!
//! One file a concern (`reads.rs`, `actions.rs`, `budgets.rs`, `pause.rs`, `rewind.rs`, `input.rs`, `dead.rs`,
//! `maintenance.rs`, `starts.rs`, `schedules.rs`, `remote.rs` with a throwaway NATS
//! server, on `documents.rs` and the shared `common/`); the tests on both backends are
//! declared here, with the two that need no database.

#[path = "../common/mod.rs"]
mod common;

mod actions;
mod budgets;
mod dead;
mod documents;
mod input;
mod maintenance;
mod pause;
mod reads;
mod remote;
mod rewind;
mod schedules;
mod starts;

use std::process::Command;

use agentsaga_core::both_backends;
use agentsaga_core::testing::{Backend, fresh_url};

use actions::actions;
use actions::signals;
use actions::sleeping;
use budgets::budgets;
use common::{expect_failure, fails, run_cmd, sqlite_path};
use dead::moot_dead_letters_are_not_redriven;
use documents::{OPENING, status};
use input::bad_ids_and_values;
use maintenance::only_migrate_migrates;
use maintenance::prune_keeps_inbox_records_a_redelivery_can_still_need;
use pause::pause_and_resume;
use reads::read_commands;
use reads::stalled_sagas_are_reported;
use rewind::rewinds;
use schedules::{schedule_firings, schedules};
use starts::set_aside_starts;

both_backends!(read_tests, read_commands);
both_backends!(action_tests, actions);
both_backends!(bad_input_tests, bad_ids_and_values);
both_backends!(moot_tests, moot_dead_letters_are_not_redriven);
both_backends!(signal_tests, signals);
both_backends!(sleep_tests, sleeping);
both_backends!(budget_tests, budgets);
both_backends!(pause_tests, pause_and_resume);
both_backends!(rewind_tests, rewinds);
both_backends!(stalled_tests, stalled_sagas_are_reported);
both_backends!(
    prune_inbox_tests,
    prune_keeps_inbox_records_a_redelivery_can_still_need
);
both_backends!(migrate_tests, only_migrate_migrates);
both_backends!(set_aside_tests, set_aside_starts);
both_backends!(schedule_tests, schedules);
both_backends!(schedule_firing_tests, schedule_firings);

#[tokio::test]
async fn a_missing_sqlite_file_is_never_created() {
    let url = fresh_url(Backend::Sqlite).await;
    let path = sqlite_path(&url).to_owned();
    let dir = path.parent().unwrap().to_owned();
    for args in OPENING {
        let e = fails(&url, args);
        assert!(e.contains("does not exist"), "{args:?}: {e}");
        // A bare path too, relative to the working directory.
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentsaga"));
        cmd.current_dir(&dir)
            .env("DATABASE_URL", "test.db")
            .args(args);
        let e = expect_failure(&run_cmd(cmd), &args);
        assert!(e.contains("`test.db` does not exist"), "{args:?}: {e}");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "{args:?} created {left:?}");
    }
    // `migrate` is the one command that creates it.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentsaga"));
    cmd.current_dir(&dir)
        .env("DATABASE_URL", "test.db")
        .arg("migrate");
    let r = run_cmd(cmd);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("backend: sqlite"), "{r:?}");
    assert!(path.exists());
    assert_eq!(status(&url)["sagas_total"], 0);
}

#[test]
fn bad_urls_and_no_url() {
    let e = fails("mysql://root@127.0.0.1/db", &["status"]);
    assert!(e.contains("unsupported scheme `mysql`"), "{e}");
    let e = fails("postgres://u:secret@127.0.0.1:1/db", &["status"]);
    assert!(e.contains("cannot open the postgres database"), "{e}");
    assert!(!e.contains("secret"), "the password is not printed: {e}");
    let e = fails("sqlite://x.db?mode=bogus", &["migrate"]);
    assert!(e.contains("invalid database url"), "{e}");
    // A password in the query string is not printed either, whoever writes the message.
    for url in [
        "postgres://u@127.0.0.1:1/db?password=secret",
        "postgres://u@127.0.0.1:1/db?sslmode=disable&sslpassword=secret",
        "mysql://root@127.0.0.1/db?password=secret",
        "sqlite://x.db?mode=bogus&password=secret",
    ] {
        let e = fails(url, &["migrate"]);
        assert!(!e.contains("secret"), "the password is not printed: {e}");
        assert!(e.contains("password=***"), "{e}");
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentsaga"));
    cmd.env_remove("DATABASE_URL").arg("status");
    let e = expect_failure(&run_cmd(cmd), &"no url");
    assert!(e.contains("DATABASE_URL"), "{e}");
}
