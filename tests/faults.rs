//! Faults operators meet, injected into whole processes (the trip_booking example, as
//! users run it) on PostgreSQL, each bounded well under a minute:
//!
//! - a process frozen past its leases (`SIGSTOP`) while a second process takes its
//!   work over, then thawed (`SIGCONT`): the frozen one learns that it lost its leases
//!   and writes nothing for rows that are not its own any more;
//! - the database connection cut and black-holed under load, by a TCP proxy of the
//!   test's own on 127.0.0.1 between the process and PostgreSQL: connections closed
//!   mid-statement (and mid-`COMMIT`), and a stretch during which the proxy accepts
//!   but forwards nothing.
//!
//! After each: every saga terminal, every effect exactly once and in force exactly when
//! its saga completed (`support::check_invariants`). `docs/guarantees.md` ("Faults")
//! says what holds and what the operator sees. A handler that never returns is the
//! lanes' watchdog's (`crates/core/src/store/tests.rs`); SQLite's clock is documented
//! there too.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use agentsaga::core::Store;
use agentsaga::core::testing::pg_server;
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
    let deadline = Instant::now() + Duration::from_secs(60);
    while support::sagas(store).await.len() < n {
        assert!(Instant::now() < deadline, "sagas were not started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} {pid}");
}

// A process frozen past its leases while another takes its work over. Its leases are 1 s
// (`support::spawn`), it is frozen for 4 s: the second process reclaims its rows and
// finishes every saga; the thawed one finds its leases gone, cancels what it was
// delivering, writes no outcome for those rows, and exits once all is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_frozen_past_its_leases_loses_them_cleanly() {
    let _serial = SERIAL.lock().await;
    let url = pg_server().fresh_database_url().await;
    let store = Store::connect(&url).await.unwrap();
    let a = support::spawn(
        "trip_booking",
        &url,
        &["--sagas", "300", "--fail-rate", "0.2", "--seed", "21"],
    );
    until_started(&store, 50).await;
    signal(a.id(), "-STOP");
    tokio::time::sleep(Duration::from_secs(4)).await;
    // While `a` is frozen: `b` takes over its expired rows and finishes every saga
    // started so far (`--sagas 0`: finish what is there).
    let b = support::spawn(
        "trip_booking",
        &url,
        &["--sagas", "0", "--fail-rate", "0.2", "--seed", "22"],
    );
    let b_out = support::wait_bounded(b, Duration::from_secs(120));
    signal(a.id(), "-CONT");
    assert!(
        b_out.status.success(),
        "the second process: {}",
        String::from_utf8_lossy(&b_out.stderr)
    );
    let a_out = support::wait_bounded(a, Duration::from_secs(120));
    assert!(
        a_out.status.success(),
        "the thawed process: {}",
        String::from_utf8_lossy(&a_out.stderr)
    );
    let (completed, compensated) = support::check_invariants(&store, UNDOABLE, FORWARD).await;
    assert_eq!(completed + compensated, 300);
    eprintln!("frozen past its leases: {completed} completed, {compensated} compensated");
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
    let child = support::spawn(
        "trip_booking",
        &through,
        &["--sagas", "400", "--fail-rate", "0.2", "--seed", "31"],
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
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.cut_all();
    proxy.black_hole.store(false, Ordering::Relaxed);
    let out = support::wait_bounded(child, Duration::from_secs(150));
    assert!(
        out.status.success(),
        "the process under cuts: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (completed, compensated) = support::check_invariants(&store, UNDOABLE, FORWARD).await;
    assert_eq!(completed + compensated, 400);
    eprintln!("connections cut under load: {completed} completed, {compensated} compensated");
}
