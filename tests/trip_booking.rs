//! The trip_booking example as users run it: a child process, on both backends,
//! checked through its tables. Crash recovery kills it with SIGKILL.

#[path = "support/parked.rs"]
mod parked;
#[path = "support/schedule.rs"]
mod schedule;
mod support;

use parked::{asleep, waiting_starts};

use std::time::Duration;

use agentsaga::core::Store;
use agentsaga::core::both_backends;
use agentsaga::core::testing::{Backend, fresh_url, wait_until};

const UNDOABLE: &[(&str, &str)] = &[
    ("trip_flights", "booked"),
    ("trip_hotels", "booked"),
    ("trip_cars", "booked"),
];
const FORWARD: &[(&str, &str)] = &[("trip_payments", "charged"), ("trip_confirmations", "sent")];

async fn happy_path(backend: Backend) {
    let url = fresh_url(backend).await;
    let out = support::run(
        "trip_booking",
        &url,
        &["--sagas", "40", "--fail-rate", "0", "--seed", "3"],
    );
    assert!(out.contains("completed              : 40"), "{out}");
    let store = Store::connect(&url).await.unwrap();
    let (completed, compensated) = support::check_invariants(&store, UNDOABLE, FORWARD).await;
    assert_eq!((completed, compensated), (40, 0));
}
both_backends!(happy_path_tests, happy_path);

async fn failures_compensate(backend: Backend) {
    let url = fresh_url(backend).await;
    let out = support::run(
        "trip_booking",
        &url,
        &["--sagas", "120", "--fail-rate", "0.3", "--seed", "9"],
    );
    assert!(out.contains("stuck                  : 0"), "{out}");
    let store = Store::connect(&url).await.unwrap();
    let (completed, compensated) = support::check_invariants(&store, UNDOABLE, FORWARD).await;
    assert_eq!(completed + compensated, 120);
    assert!(
        completed > 0 && compensated > 0,
        "both paths taken: {completed} / {compensated}"
    );
    // Declined cards (fatal at the pivot) compensated reservations that were made.
    let cancelled = support::statuses(&store, "trip_flights")
        .await
        .values()
        .filter(|s| *s == "cancelled")
        .count();
    assert!(cancelled > 0);
}
both_backends!(failure_tests, failures_compensate);

async fn survives_kill_9(backend: Backend) {
    kill_9_rounds(backend, &[]).await;
}
both_backends!(kill_9_tests, survives_kill_9);

// The same with a small admission bound: most starts wait in `saga_starts` when the
// process is killed, and none is lost.
async fn survives_kill_9_while_starts_wait(backend: Backend) {
    kill_9_rounds(backend, &["--max-in-flight", "15"]).await;
}
both_backends!(kill_9_admission_tests, survives_kill_9_while_starts_wait);

// The same with business trips, each booking its trip as a child saga: killed at
// random moments across parents and children, every saga ends terminal, every effect
// once (the child's, checked as any saga's), each parent has exactly one child, and the
// parent ends as its child did (the child is its pivot).
async fn survives_kill_9_across_parent_and_child(backend: Backend) {
    kill_9_rounds(backend, &["--nested"]).await;
}
both_backends!(kill_9_nested_tests, survives_kill_9_across_parent_and_child);

// The same with a durable sleep after each charge (`--sleep-ms`): killed while trips
// sleep, between a wake-up's due time and its firing, or as it fires, every saga ends
// terminal with every effect once (each confirmation sent once: no wake-up fired twice,
// none lost).
async fn survives_kill_9_while_trips_sleep(backend: Backend) {
    kill_9_rounds(backend, &["--sleep-ms", "400"]).await;
}
both_backends!(kill_9_sleep_tests, survives_kill_9_while_trips_sleep);

// A reconciliation every second while the process is killed four times, mid-firing
// or not: every slot from the first to the last started one saga, none twice (the
// slots missed while it was down caught up), each recorded once.
async fn survives_kill_9_while_a_schedule_fires(backend: Backend) {
    kill_9_rounds(
        backend,
        &["--schedule", "* * * * * *", "--reconciliations", "3"],
    )
    .await;
}
both_backends!(
    kill_9_schedule_tests,
    survives_kill_9_while_a_schedule_fires
);

// `--schedule` as the README shows it (`support/schedule.rs`): the reconciliations run on
// their own beside the trips, each slot one saga.
async fn a_schedule_reconciles_beside_the_trips(backend: Backend) {
    schedule::reconciles_beside_the_trips(fresh_url(backend).await).await;
}
both_backends!(schedule_tests, a_schedule_reconciles_beside_the_trips);

async fn kill_9_rounds(backend: Backend, extra: &[&str]) {
    let url = fresh_url(backend).await;
    let mut rng = fastrand::Rng::with_seed(42);
    let store = Store::connect(&url).await.unwrap();
    let mut interrupted = 0;
    let mut killed_while_waiting = 0;
    let admission = extra.contains(&"--max-in-flight");
    let nested = extra.contains(&"--nested");
    let sleeps = extra.contains(&"--sleep-ms");
    let scheduled = extra.contains(&"--schedule");
    let mut killed_while_asleep = 0;
    for round in 0..4 {
        let sagas = if round == 0 { "300" } else { "0" };
        let mut args = vec!["--sagas", sagas, "--fail-rate", "0.2", "--seed", "7"];
        args.extend_from_slice(extra);
        let mut child = support::spawn("trip_booking", &url, &args);
        if round == 0 && admission {
            // Kill it while starts wait (however fast the runtime drains them): once
            // some are seen waiting, at a random moment soon after.
            let seen = std::time::Instant::now();
            while waiting_starts(&store).await == 0
                && seen.elapsed() < Duration::from_secs(20)
                && child.try_wait().unwrap().is_none()
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(rng.u64(0..150)));
        } else {
            // The first run (300 sagas) takes about 1.4 s in a debug build here: killed
            // mid-way.
            let ms = match (round, scheduled) {
                // Slots every second, 3 more awaited: killed after one or two, at any
                // moment of a firing.
                (_, true) => 1200..2800,
                (0, false) => 300..1000,
                _ => 400..1500,
            };
            std::thread::sleep(Duration::from_millis(rng.u64(ms)));
        }
        // Child::kill is SIGKILL on Unix: no destructor, no graceful anything.
        match child.try_wait().unwrap() {
            None => {
                child.kill().unwrap();
                interrupted += 1;
                child.wait().unwrap();
                killed_while_waiting = killed_while_waiting.max(waiting_starts(&store).await);
                killed_while_asleep = killed_while_asleep.max(asleep(&store).await);
            }
            Some(status) => {
                let out = child.wait_with_output().unwrap();
                assert!(
                    status.success(),
                    "round {round} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    assert!(
        interrupted >= 1,
        "no run was killed mid-way: the test proved nothing"
    );
    if sleeps {
        assert!(
            killed_while_asleep > 0,
            "no run was killed while trips slept: the test proved nothing"
        );
    }
    if admission {
        assert!(
            killed_while_waiting > 0,
            "no run was killed while starts waited: the test proved nothing"
        );
    }
    let left = support::sagas(&store)
        .await
        .iter()
        .filter(|(_, s)| !s.is_terminal())
        .count();
    let waiting: u64 = agentsaga::saga::Engine::waiting_starts(&store)
        .await
        .unwrap()
        .iter()
        .map(|(_, n)| n)
        .sum();
    if scheduled {
        let fired = schedule::check_slots(&store, 1_000).await.0;
        assert!(
            fired > 2,
            "{fired} slots fired before the last run: the test proved nothing"
        );
    }
    let mut args = vec!["--sagas", "0", "--fail-rate", "0.2", "--seed", "7"];
    args.extend_from_slice(extra);
    let out = support::run("trip_booking", &url, &args);
    assert_eq!(
        agentsaga::saga::Engine::waiting_starts(&store)
            .await
            .unwrap(),
        vec![],
        "every waiting start was started"
    );
    let trips = (nested || scheduled).then_some("trip_booking");
    if scheduled {
        let (slots, rows) = schedule::check_slots(&store, 1_000).await;
        eprintln!("{slots} slots fired, {rows} reconciliations recorded");
        assert!(rows >= 4, "{rows} reconciliations");
    }
    let (completed, compensated) =
        support::check_invariants_of(&store, trips, UNDOABLE, FORWARD).await;
    let total = if nested {
        one_child_each(&store).await
    } else {
        completed + compensated
    };
    // A kill during the start phase leaves only whole batches of 50 (one transaction
    // each): a saga exists completely or not at all.
    assert!(
        total > 0 && total <= 300 && total % 50 == 0,
        "{total} sagas: {out}"
    );
    eprintln!(
        "kill -9 x{interrupted}: {left} sagas were unfinished, {waiting} starts waited and at most {killed_while_asleep} slept at a kill before the last run; {completed} completed, {compensated} compensated"
    );
}

// Kills the process inside a shared commit (SQLite's lane, whose hops share its single
// writer's commits; PostgreSQL's set lane, whose hops share a transaction and its
// statements; `--stop-at-shared-commit` stops the sixth batch of at least 4
// hops there, with many sagas under way): once with the batch written but not
// committed, once committed but not yet answered (none of its messages acknowledged).
// Each batch is redone whole or skipped whole: every saga ends completed or
// compensated, every effect once.
async fn survives_kill_9_inside_a_shared_commit(backend: Backend) {
    use std::io::{BufRead, BufReader};

    const HOOK: &str = "crash hook:";
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    for at in ["before:4:5", "after:4:5"] {
        let args = ["--sagas", "300", "--fail-rate", "0.2", "--seed", "7"];
        let args = [&args[..], &["--stop-at-shared-commit", at]].concat();
        let mut child = support::spawn_with("trip_booking", &url, &args, |_| {});
        let stderr = child.stderr.take().expect("piped stderr");
        let (lines, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let mut stopped = None;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(line) if line.starts_with(HOOK) => {
                    stopped = Some(line);
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        // Child::kill is SIGKILL on Unix: the lane dies with its transaction open, or
        // with its hops committed and unanswered.
        child.kill().unwrap();
        child.wait().unwrap();
        let line = stopped.unwrap_or_else(|| {
            panic!("{at}: the process never stopped at a shared commit of 4 hops or more")
        });
        eprintln!("{at}: {line}");
    }
    let out = support::run(
        "trip_booking",
        &url,
        &["--sagas", "0", "--fail-rate", "0.2", "--seed", "7"],
    );
    let (completed, compensated) = support::check_invariants(&store, UNDOABLE, FORWARD).await;
    let total = completed + compensated;
    // Starts are whole batches of 50 (one transaction each), from two runs.
    assert!(
        total > 0 && total <= 600 && total % 50 == 0,
        "{total} sagas: {out}"
    );
    eprintln!("killed inside two shared commits: {completed} completed, {compensated} compensated");
}
both_backends!(
    shared_commit_kill_9_tests,
    survives_kill_9_inside_a_shared_commit
);

// Two processes on one database: on PostgreSQL they share the work through SKIP
// LOCKED claims and NOTIFY wakeups. (SQLite serves one process: see below.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_one_database() {
    let url = fresh_url(Backend::Postgres).await;
    let a = support::spawn(
        "trip_booking",
        &url,
        &["--sagas", "100", "--fail-rate", "0.2", "--seed", "1"],
    );
    let b = support::spawn(
        "trip_booking",
        &url,
        &["--sagas", "100", "--fail-rate", "0.2", "--seed", "2"],
    );
    for (name, child) in [("a", a), ("b", b)] {
        let out = support::wait_bounded(child, Duration::from_secs(240));
        assert!(
            out.status.success(),
            "process {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let store = Store::connect(&url).await.unwrap();
    let (completed, compensated) = support::check_invariants(&store, UNDOABLE, FORWARD).await;
    assert_eq!(completed + compensated, 200);
}

// SQLite serves one process: a second process on the file of a running one is refused
// at once, with an error naming PostgreSQL, and the first goes on undisturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_one_sqlite_file_is_refused() {
    let url = fresh_url(Backend::Sqlite).await;
    let db = url.strip_prefix("sqlite://").unwrap().to_owned();
    let a = support::spawn(
        "trip_booking",
        &url,
        &["--sagas", "1000000", "--fail-rate", "0.2", "--seed", "1"],
    );
    // Until `a` runs (its lock file names it), within a bound.
    let lock = format!("{db}-runtime.lock");
    let named = format!("{lock} names {}", a.id());
    wait_until(&named, Duration::from_secs(60), async || {
        std::fs::read_to_string(&lock).ok().as_deref() == Some(&a.id().to_string())
    })
    .await;
    let b = support::spawn(
        "trip_booking",
        &url,
        &["--sagas", "10", "--fail-rate", "0.2", "--seed", "2"],
    );
    let out = support::wait_bounded(b, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut a = a;
    let a_alive = a.try_wait().unwrap().is_none();
    let _ = a.kill();
    let _ = a.wait();
    assert!(!out.status.success(), "the second process ran: {stderr}");
    assert!(
        stderr.contains("another runtime") && stderr.contains("PostgreSQL"),
        "{stderr}"
    );
    assert!(a_alive, "the first process stopped");
}

/// Each `business_trip` has exactly one child (a `trip_booking`) and ended as it did;
/// no child without its parent. The number of business trips.
async fn one_child_each(store: &Store) -> usize {
    let all = support::all_sagas(store).await;
    let parents: Vec<_> = all.iter().filter(|s| s.name == "business_trip").collect();
    for p in &parents {
        let children: Vec<_> = all.iter().filter(|c| c.parent_id == Some(p.id)).collect();
        assert_eq!(children.len(), 1, "business trip {}: {children:?}", p.id);
        assert_eq!(children[0].name, "trip_booking");
        assert_eq!(
            children[0].state, p.state,
            "business trip {} and its trip",
            p.id
        );
    }
    let orphans = all
        .iter()
        .filter(|s| s.name == "trip_booking")
        .filter(|c| {
            !c.parent_id
                .is_some_and(|p| parents.iter().any(|s| s.id == p))
        })
        .count();
    assert_eq!(orphans, 0, "trips without their business trip");
    parents.len()
}

// On SQLite a schedule reads the one clock too: stepped two and a half hours ahead, the
// process catches up what it "missed", exactly as its policy says (`support/schedule.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_catches_up_on_the_one_clock_on_sqlite() {
    schedule::an_hour_ahead_catches_up(fresh_url(Backend::Sqlite).await).await;
}

// On SQLite a sleep's time is the one wall clock of the library (`clock::system_now_ms`): the
// trips sleep an hour after their charge, the process's clock is stepped an hour and a
// minute ahead (the test hook `clock::step`), and they wake at once and finish, every
// effect once. (On PostgreSQL the database's clock counts: the hook does not move it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_reads_the_one_clock_on_sqlite() {
    let url = fresh_url(Backend::Sqlite).await;
    let clock = support::clock::clock_file(&url);
    support::clock::step_clock(&clock, 0);
    let store = Store::connect(&url).await.unwrap();
    let args = [
        "--sagas",
        "50",
        "--fail-rate",
        "0",
        "--seed",
        "5",
        "--sleep-ms",
        "3600000",
    ];
    let child = support::spawn_with("trip_booking", &url, &args, |cmd| {
        cmd.env(agentsaga::core::clock::step::VAR, &clock);
    });
    wait_until("the trips sleep", Duration::from_secs(60), async || {
        asleep(&store).await == 50
    })
    .await;
    support::clock::step_clock(&clock, 3_660_000);
    let out =
        tokio::task::spawn_blocking(move || support::wait_bounded(child, Duration::from_secs(60)))
            .await
            .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(asleep(&store).await, 0);
    let (completed, compensated) =
        support::check_invariants_of(&store, None, UNDOABLE, FORWARD).await;
    assert_eq!((completed, compensated), (50, 0));
}
