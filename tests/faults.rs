//! Faults operators meet, injected into whole processes (the trip_booking example, as
//! users run it), each bounded well under a minute:
//!
//! - PostgreSQL: a process frozen past its leases (`SIGSTOP`) while a second process
//!   takes its work over, then thawed (`SIGCONT`) while the second still runs: the
//!   frozen one learns that it lost its leases and writes nothing for rows that are not
//!   its own any more;
//! - PostgreSQL: the database connection cut and black-holed under load, by a TCP proxy
//!   of the test's own on 127.0.0.1 between the process and PostgreSQL: connections
//!   closed mid-statement (and mid-`COMMIT`), and a stretch during which the proxy
//!   accepts but forwards nothing;
//! - SQLite: the process clock stepped forward past the leases and back while sagas
//!   run (the library's clock moved by a test hook, `clock::step`: stepping the real
//!   clock needs root).
//!
//! The example's `reserve_car` step calls a car rental company's HTTP API
//! (`examples/support/car_rental.rs`) with its idempotency key; the tests run that
//! company in the test process, outside the faulted ones, so that a request a frozen
//! process had sent still lands, and read its log. The example runs with
//! `--record-deliveries`: each message its agents handled is recorded with its key,
//! outbox seq and start and end.
//!
//! After each fault: every saga terminal, every effect exactly once and in force
//! exactly when its saga completed (`support::check_invariants`); every outside call's
//! idempotency key done at most once, and never after its undo
//! (`support::check_outside_calls`); per-key order, the messages of one key handled one
//! at a time and in enqueue order (`support::check_per_key_order`).
//! `docs/guarantees.md` ("Faults") says what holds and what the operator sees. A
//! handler that never returns is the lanes' watchdog's
//! (`crates/runtime/tests/watchdog.rs`, `crates/core/src/store/tests.rs`).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agentsaga::core::Store;
use agentsaga::core::testing::{Backend, fresh_url, pg_server, wait_until};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const UNDOABLE: &[(&str, &str)] = &[
    ("trip_flights", "booked"),
    ("trip_hotels", "booked"),
    ("trip_cars", "booked"),
];
const FORWARD: &[(&str, &str)] = &[("trip_payments", "charged"), ("trip_confirmations", "sent")];

/// One whole-system fault at a time: each test runs processes that load both cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits (bounded) until `n` sagas exist.
async fn until_started(store: &Store, n: usize) {
    wait_until(
        "the sagas are started",
        Duration::from_secs(60),
        async || support::sagas(store).await.len() >= n,
    )
    .await;
}

/// Waits (bounded) until the car rental company has logged `n` calls.
async fn until_called(rental: &support::car_rental::Service, n: usize) {
    wait_until("cars are rented", Duration::from_secs(60), async || {
        rental.log().len() >= n
    })
    .await;
}

/// The example's flags for a fault test: `extra`, the failure rate, the test's car
/// rental company, and the deliveries recorded for the per-key order check.
fn args<'a>(extra: &[&'a str], rental: &'a support::car_rental::Service) -> Vec<&'a str> {
    let mut args = extra.to_vec();
    args.extend([
        "--fail-rate",
        "0.2",
        "--car-rental-url",
        &rental.base_url,
        "--record-deliveries",
    ]);
    args
}

/// Waits (bounded, off the test's runtime, whose threads serve the car rental
/// company) for a child to exit.
async fn wait(child: std::process::Child, secs: u64) -> std::process::Output {
    tokio::task::spawn_blocking(move || support::wait_bounded(child, Duration::from_secs(secs)))
        .await
        .unwrap()
}

/// Every check after a fault: sagas terminal, effects once and in force exactly when
/// their saga completed, the outside world's calls (the car rental company's log)
/// done at most once per key and never after their undo, per-key order. Says what it
/// saw; returns (completed, compensated).
async fn check_all(
    store: &Store,
    rental: &support::car_rental::Service,
    fault: &str,
) -> (usize, usize) {
    let (completed, compensated) = support::check_invariants(store, UNDOABLE, FORWARD).await;
    let sagas = support::sagas(store).await;
    let calls = support::check_outside_calls(&rental.log(), &sagas);
    let (handled, keys) = support::check_per_key_order(store).await;
    eprintln!(
        "{fault}: {completed} completed, {compensated} compensated; car rentals: {} made, \
         {} cancellations, {} repeated requests ({} after their cancellation); {handled} \
         messages handled, {keys} keys with several, in order",
        calls.made, calls.cancels, calls.repeats, calls.late_repeats
    );
    (completed, compensated)
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} {pid}");
}

// A process frozen past its leases while another takes its work over. Its leases are 1 s
// (`support::spawn`); it is frozen for 8 s, while it rents cars (calls to the company
// under way), and a second process starts 4 s into the freeze: it reclaims the
// expired rows and delivers them again, calling the company again with the same keys
// (answered as repeats). Rows whose hop the frozen process had open wait for it: its
// transaction still holds their locks (until it thaws, or PostgreSQL ends its idle
// session). Thawed, it finds its leases gone, cancels what it was delivering (its
// outside calls with it), writes no outcome for those rows, and both processes finish
// the sagas between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_frozen_past_its_leases_loses_them_cleanly() {
    let _serial = SERIAL.lock().await;
    let url = pg_server().fresh_database_url().await;
    let store = Store::connect(&url).await.unwrap();
    let rental = support::car_rental::start(21).await.unwrap();
    let a = support::spawn(
        "trip_booking",
        &url,
        &args(&["--sagas", "300", "--seed", "21"], &rental),
    );
    until_started(&store, 50).await;
    until_called(&rental, 30).await;
    signal(a.id(), "-STOP");
    // The freeze must outlast the leases, which the database's clock measures: real
    // time, which no paused clock can move.
    tokio::time::sleep(Duration::from_secs(4)).await;
    // `--sagas 0`: finish what is there.
    let b = support::spawn(
        "trip_booking",
        &url,
        &args(&["--sagas", "0", "--seed", "22"], &rental),
    );
    // The rest of the freeze (see above): the second process works beside the frozen
    // one for a while of real time.
    tokio::time::sleep(Duration::from_secs(4)).await;
    signal(a.id(), "-CONT");
    let (b_out, a_out) = tokio::join!(wait(b, 120), wait(a, 120));
    assert!(
        b_out.status.success(),
        "the second process: {}",
        String::from_utf8_lossy(&b_out.stderr)
    );
    let a_err = String::from_utf8_lossy(&a_out.stderr);
    assert!(a_out.status.success(), "the thawed process: {a_err}");
    let lost = a_err.matches("lost the lease of a row").count();
    assert!(
        lost > 0,
        "the thawed process lost no lease: the test proved nothing"
    );
    let (completed, compensated) = check_all(&store, &rental, "frozen past its leases").await;
    assert_eq!(completed + compensated, 300);
    eprintln!("frozen past its leases: the thawed process cancelled {lost} deliveries");
}

/// A TCP proxy on 127.0.0.1 to `upstream`, whose connections the test can cut, and
/// which can black-hole (accept, forward nothing) for a while.
struct Proxy {
    port: u16,
    /// Bumped to cut every connection open now.
    cut: watch::Sender<u64>,
    /// While true, bytes are not forwarded (connections hang).
    black_hole: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, cuts) = watch::channel(0u64);
        let black_hole = Arc::new(AtomicBool::new(false));
        let hole = Arc::clone(&black_hole);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let cuts = cuts.clone();
                let hole = Arc::clone(&hole);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let _ = pipe(client, server, cuts, hole).await;
                });
            }
        });
        Self {
            port,
            cut,
            black_hole,
            task,
        }
    }

    /// Closes every connection open now, wherever it is (a statement, a `COMMIT`).
    fn cut_all(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut_all();
    }
}

/// Copies both ways until either side closes or the connection is cut; while the
/// black hole is on, reads nothing (the bytes wait in the kernel's buffers).
async fn pipe(
    client: TcpStream,
    server: TcpStream,
    mut cuts: watch::Receiver<u64>,
    hole: Arc<AtomicBool>,
) -> std::io::Result<()> {
    use tokio::io::AsyncReadExt;
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let mut a = [0u8; 16 * 1024];
    let mut b = [0u8; 16 * 1024];
    cuts.borrow_and_update();
    loop {
        while hole.load(Ordering::Relaxed) {
            tokio::select! {
                _ = cuts.changed() => return Ok(()),
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        tokio::select! {
            _ = cuts.changed() => {
                let _ = cw.shutdown().await;
                let _ = sw.shutdown().await;
                return Ok(());
            }
            n = cr.read(&mut a) => {
                let n = n?;
                if n == 0 { return Ok(()); }
                sw.write_all(&a[..n]).await?;
            }
            n = sr.read(&mut b) => {
                let n = n?;
                if n == 0 { return Ok(()); }
                cw.write_all(&b[..n]).await?;
            }
        }
    }
}

// The database connection cut and black-holed under load: five rounds of every
// connection closed at once (some mid-COMMIT), then three seconds during which nothing
// gets through, then everything cut again. The process retries with backoff (transient
// errors), a commit whose outcome it could not learn is settled by the inbox when its
// message comes again, and every saga ends with every effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_connection_cut_under_load_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let server = pg_server();
    let direct = server.fresh_database_url().await;
    let proxy = Proxy::start(server.port()).await;
    let through = direct.replace(
        &format!("127.0.0.1:{}", server.port()),
        &format!("127.0.0.1:{}", proxy.port),
    );
    assert_ne!(through, direct);
    let store = Store::connect(&direct).await.unwrap();
    let rental = support::car_rental::start(31).await.unwrap();
    let child = support::spawn(
        "trip_booking",
        &through,
        &args(&["--sagas", "400", "--seed", "31"], &rental),
    );
    // Every saga started first (the example's own start-up loop gives up on a database
    // error, as a user's request handler would report it): the cuts hit deliveries.
    until_started(&store, 400).await;
    let mut rng = fastrand::Rng::with_seed(31);
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(rng.u64(50..400))).await;
        proxy.cut_all();
    }
    proxy.black_hole.store(true, Ordering::Relaxed);
    // The black hole lasts a while of real time: connections hang past the database
    // clients' timeouts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.cut_all();
    proxy.black_hole.store(false, Ordering::Relaxed);
    let out = wait(child, 150).await;
    assert!(
        out.status.success(),
        "the process under cuts: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (completed, compensated) = check_all(&store, &rental, "connections cut under load").await;
    assert_eq!(completed + compensated, 400);
}

// SQLite's clock stepped while sagas run (a test hook moves the library's one wall
// clock, `clock::system_now_ms`, in the child process: see `clock::step`), while it rents
// cars. Forward, 7 s in steps of 1 s every 100 ms, faster than the renewals of the 1 s
// leases: the relay finds the leases of rows it is delivering expired, returns them to
// the pool and delivers them again, cancelling the first deliveries (a car rental call
// made again carries the same idempotency key: the company answers it as a repeat);
// retries and delays fall due early. Again if that cancelled no delivery or made no
// call again (up to five times). Then back by 10 s, to 3 s behind the real clock,
// until the end: what was due or leased during the steps forward waits up to 10 s
// longer. Every saga still ends, every effect once, every outside call done at most
// once and never after its undo, per-key order kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clock_stepped_on_sqlite_loses_nothing() {
    use std::io::Read;
    let _serial = SERIAL.lock().await;
    let url = fresh_url(Backend::Sqlite).await;
    let clock = support::clock::clock_file(&url);
    support::clock::step_clock(&clock, 0);
    let store = Store::connect(&url).await.unwrap();
    let rental = support::car_rental::start(41).await.unwrap();
    let mut child = support::spawn_with(
        "trip_booking",
        &url,
        &args(&["--sagas", "1000", "--seed", "41"], &rental),
        |cmd| {
            cmd.env(agentsaga::core::clock::step::VAR, &clock);
        },
    );
    // Its warnings, read as they come.
    let mut pipe = child.stderr.take().unwrap();
    let stderr = Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let stderr = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                stderr
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let bit = || stderr.lock().unwrap().contains("lost the lease");
    // A car rental call made again: a saga whose reservation reached the company twice.
    let called_again = || {
        let mut seen = std::collections::HashSet::new();
        rental
            .log()
            .into_iter()
            .filter(|e| e.op == "reserve")
            .any(|e| !seen.insert(e.reference))
    };
    // While it rents cars: calls to the company under way.
    until_started(&store, 100).await;
    until_called(&rental, 30).await;
    // The clock runs ahead in steps of 1 s every 100 ms, 7 s in all: leases of 1 s run
    // out faster than their renewals (every 333 ms) extend them, and the relay's
    // reclaim (every 500 ms) finds them expired. Again, from the real clock, until a
    // delivery was cancelled and a car rental call was made again.
    let mut rounds = 0;
    let mut offset = 0;
    while !(bit() && called_again()) && rounds < 5 {
        rounds += 1;
        support::clock::step_clock(&clock, 0);
        for _ in 0..7 {
            offset += 1_000;
            support::clock::step_clock(&clock, offset);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        offset = 0;
        // What it bit shows within a second (a call made again lands in up to 200 ms).
        for _ in 0..20 {
            if bit() && called_again() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    support::clock::step_clock(&clock, -3_000);
    let out = wait(child, 120).await;
    reader.join().unwrap();
    let stderr = stderr.lock().unwrap().clone();
    assert!(
        out.status.success(),
        "the process whose clock stepped: {stderr}"
    );
    assert!(
        bit() && called_again(),
        "the clock ran ahead {rounds} times and no delivery of a car rental was cancelled \
         and made again: the test proved nothing"
    );
    let steps = stderr.matches("the clock stepped").count();
    assert!(
        steps > 7 * rounds,
        "the clock did not step as asked: {stderr}"
    );
    let lost = stderr.matches("lost the lease of a row").count();
    let (completed, compensated) = check_all(&store, &rental, "the clock stepped on SQLite").await;
    assert_eq!(completed + compensated, 1000);
    eprintln!(
        "the clock stepped on SQLite: {rounds} run(s) 7 s ahead, then 10 s back; {lost} deliveries cancelled for a lost lease"
    );
}
