//! The operator console's web page in a real browser: Debian's headless `chromium`,
//! driven over the DevTools protocol, against a SQLite database filled by the
//! trip_booking example (a child process, as users run it).
//!
//! It checks the overview's numbers against the database (and that they refresh by
//! themselves), reads a compensated saga's timeline (its compensations in reverse order
//! of its steps, as the ledger's times say they ran), and aborts a running saga with the
//! page's button: the confirmation dismissed changes nothing, accepted aborts it.
//!
//! Needs `chromium` on the PATH (`apt-get install -y chromium`; `scripts/test`, the
//! README's test command, installs it when it runs as root), or
//! `AGENTSAGA_CHROMIUM=/path/to/chrome`. Without a browser the test is not run: it says
//! so on the terminal (not only in captured output) and passes, except under `CI=true`
//! or `AGENTSAGA_REQUIRE_BROWSER=1`, where a missing browser fails it.
//! The saga page's screenshot is written to `<target>/tmp/console-saga.png`; with
//! `AGENTSAGA_UPDATE_SCREENSHOT=1`, also to `docs/console-saga.png`.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentsaga::core::sqlx;
use agentsaga::core::testing::{Backend, fresh_url};
use agentsaga::core::{ReadPool, Store};
use agentsaga::saga::{Engine, Saga, SagaId, SagaState, Step, query};
use agentsaga_console::Console;
use agentsaga_console::http::{HttpConfig, router};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

/// The longest any one wait of this test may take.
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_real_browser() {
    // The browser first: without one, say so before anything else is done.
    let Some(mut browser) = Browser::launch() else {
        return;
    };
    // A database as users have it after a run of the example: some sagas completed,
    // some compensated.
    let url = fresh_url(Backend::Sqlite).await;
    let out = support::run(
        "trip_booking",
        &url,
        &["--sagas", "40", "--fail-rate", "0.3", "--seed", "9"],
    );
    assert!(out.contains("stuck                  : 0"), "{out}");
    let store = Store::connect(&url).await.unwrap();

    let app = router(
        Console::new(store.clone()),
        HttpConfig {
            jaeger_url: Some("http://127.0.0.1:16686".into()),
            ..HttpConfig::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let mut page = Cdp::connect(&browser.ws_url).await;
    page.open_tab().await;

    overview_matches_the_database(&mut page, &store, &base).await;
    let held = start_held_saga(&store).await;
    overview_refreshes_by_itself(&mut page, &store).await;
    compensated_timeline_reads_in_reverse(&mut page, &store, &base).await;
    lists_and_dead_letters(&mut page, &store, &base).await;
    abort_with_the_button(&mut page, &store, &base, held).await;

    let problems = page.page_errors();
    assert!(
        problems.is_empty(),
        "the pages logged errors (script, CSP, failed loads): {problems:#?}"
    );
    page.close_browser().await;
    browser.wait_exit(Duration::from_secs(5));
    drop(browser);
    server.abort();
}

/// `/`: every number on the overview is the database's.
async fn overview_matches_the_database(page: &mut Cdp, store: &Store, base: &str) {
    page.navigate(&format!("{base}/")).await;
    let shown = overview_numbers(page).await;
    page.save_screenshot("console-overview.png").await;
    let sagas = sql_counts(
        store,
        "SELECT state, COUNT(*) FROM saga_instances GROUP BY state",
    )
    .await;
    let outbox = sql_counts(store, "SELECT state, COUNT(*) FROM outbox GROUP BY state").await;
    let status = Console::new(store.clone()).status().await.unwrap();
    let count = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0).to_string();
    for state in [
        "running",
        "compensating",
        "stuck",
        "completed",
        "compensated",
        "aborted",
    ] {
        assert_eq!(shown[state], count(&sagas, state), "sagas {state}");
    }
    assert!(
        sagas["completed"] > 0 && sagas["compensated"] > 0,
        "{sagas:?}"
    );
    assert_eq!(shown["total"], sagas.values().sum::<u64>().to_string());
    for state in ["pending", "in_flight", "delivered", "dead"] {
        assert_eq!(shown[state], count(&outbox, state), "outbox {state}");
    }
    assert_eq!(shown["stalled"], status.stalled.to_string());
    assert_eq!(shown["starts_waiting"], "0");
    if status.outbox.oldest_pending_age_ms.is_none() {
        assert_eq!(shown["lag"], "none");
    }
    eprintln!("overview as shown, equal to the database: {shown:?}");
}

async fn overview_numbers(page: &mut Cdp) -> HashMap<String, String> {
    let v = page
        .eval(
            "Object.fromEntries([...document.querySelectorAll('#overview [data-count]')]\
             .map(e => [e.dataset.count, e.textContent.trim()]))",
        )
        .await;
    serde_json::from_value(v).unwrap()
}

async fn sql_counts(store: &Store, sql: &'static str) -> BTreeMap<String, u64> {
    let ReadPool::Sqlite(reader) = store.reader() else {
        panic!("a SQLite database")
    };
    let rows: Vec<(String, i64)> = sqlx::query_as(sql).fetch_all(reader).await.unwrap();
    rows.into_iter().map(|(k, n)| (k, n as u64)).collect()
}

/// A saga nothing advances: its one step goes to a destination no process hosts, so
/// it stays running until someone aborts it.
async fn start_held_saga(store: &Store) -> SagaId {
    let def = Saga::<Value>::builder("held_order", 1)
        .step(
            Step::new("reserve_stock", "warehouse")
                .command(|v: &Value| v.clone())
                .compensate("warehouse", |_: &Value| json!({ "op": "release" })),
        )
        .build()
        .unwrap();
    let engine = Engine::new([def]).unwrap();
    let mut tx = store.begin().await.unwrap();
    let id = engine
        .accept_keyed(
            &mut tx,
            "held_order",
            Some("order-4711"),
            json!({ "order": 4711, "items": ["<b>not bold</b>"] }),
        )
        .await
        .unwrap()
        .id();
    tx.commit().await.unwrap();
    id
}

/// The overview, still open, shows the new running saga without being reloaded.
async fn overview_refreshes_by_itself(page: &mut Cdp, store: &Store) {
    let running = sql_counts(
        store,
        "SELECT state, COUNT(*) FROM saga_instances GROUP BY state",
    )
    .await
    .get("running")
    .copied()
    .unwrap_or(0);
    assert_eq!(running, 1, "the held saga runs");
    let href = page.eval("location.href").await;
    page.wait_for(
        "document.querySelector('#overview [data-count=running]').textContent.trim() === '1'",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(page.eval("location.href").await, href, "not reloaded");
    let live = page
        .eval("document.getElementById('live').textContent")
        .await;
    assert!(live.as_str().unwrap().starts_with("live"), "{live}");
}

/// `/sagas/{id}` of a compensated saga: the forward steps in index order, then the
/// compensations, latest stage first, each ending when the ledger says it did.
async fn compensated_timeline_reads_in_reverse(page: &mut Cdp, store: &Store, base: &str) {
    // The compensated saga with the most compensations (and of those, the most steps:
    // a declined payment, the pivot, turned it back).
    let mut best: Option<(SagaId, Vec<query::StepView>)> = None;
    let rank = |s: &[query::StepView]| {
        (
            s.iter().filter(|s| s.compensated_at_ms.is_some()).count(),
            s.len(),
        )
    };
    for (id, state) in support::sagas(store).await {
        if state != SagaState::Compensated {
            continue;
        }
        let id: SagaId = id.parse().unwrap();
        let steps = query::steps(store, id).await.unwrap();
        if best.as_ref().is_none_or(|(_, b)| rank(&steps) > rank(b)) {
            best = Some((id, steps));
        }
    }
    let (id, steps) = best.expect("a compensated saga");
    page.navigate(&format!("{base}/sagas/{id}")).await;
    assert_eq!(
        page.eval("document.querySelector('#state [data-state]').dataset.state")
            .await,
        "compensated"
    );
    assert_eq!(
        page.eval("document.getElementById('saga-id').textContent")
            .await,
        id.to_string()
    );
    assert_eq!(
        page.eval("document.getElementById('actions').textContent.trim()")
            .await,
        "No action: a compensated saga is finished."
    );
    let trace = page.eval("document.getElementById('trace').href").await;
    assert!(
        trace.as_str().unwrap().starts_with(
            "http://127.0.0.1:16686/search?service=trip_booking&tags=%7B%22saga.id%22%3A%22"
        ),
        "{trace}"
    );

    let rows: Vec<Row> = serde_json::from_value(
        page.eval(
            "[...document.querySelectorAll('#timeline .tl-row[data-kind]')].map(r => ({\
               kind: r.dataset.kind, step: r.querySelector('.name').textContent,\
               stage: +r.dataset.stage, idx: +r.dataset.idx, state: r.dataset.state,\
               end: r.dataset.endMs === '' ? null : +r.dataset.endMs,\
               bar: !!r.querySelector('.tl-bar') }))",
        )
        .await,
    )
    .unwrap();
    let forward: Vec<&Row> = rows.iter().filter(|r| r.kind != "compensation").collect();
    let backward: Vec<&Row> = rows.iter().filter(|r| r.kind == "compensation").collect();
    let first_comp = rows.iter().position(|r| r.kind == "compensation").unwrap();
    assert!(
        rows[first_comp..].iter().all(|r| r.kind == "compensation"),
        "compensations come after the forward steps: {rows:?}"
    );

    // Forward: every step, in index order, each as the ledger has it.
    let mut by_idx = steps.clone();
    by_idx.sort_by_key(|s| s.idx);
    assert_eq!(
        forward.iter().map(|r| r.step.as_str()).collect::<Vec<_>>(),
        by_idx.iter().map(|s| s.name.as_str()).collect::<Vec<_>>()
    );
    for (r, s) in forward.iter().zip(&by_idx) {
        assert_eq!(r.state, s.state.to_string(), "{}", s.name);
        assert!(r.bar, "{} has its bar", s.name);
    }

    // Backward: the compensated steps, latest stage first.
    let mut undone: Vec<&query::StepView> = steps
        .iter()
        .filter(|s| s.compensated_at_ms.is_some())
        .collect();
    undone.sort_by_key(|s| (std::cmp::Reverse(s.stage), std::cmp::Reverse(s.idx)));
    assert_eq!(
        backward.iter().map(|r| r.step.as_str()).collect::<Vec<_>>(),
        undone.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        "compensations in reverse order of the steps"
    );
    let stages: Vec<i64> = backward.iter().map(|r| r.stage).collect();
    assert!(
        stages.len() >= 2 && stages.first() > stages.last(),
        "more than one stage undone: {stages:?}"
    );
    assert!(stages.windows(2).all(|w| w[0] >= w[1]), "{stages:?}");
    // As they ran: each bar ends when the ledger says the undo was done, and an
    // earlier stage's undo was done only after every later stage's.
    for (r, s) in backward.iter().zip(&undone) {
        assert_eq!(r.state, "done", "{}", s.name);
        assert_eq!(r.end, s.compensated_at_ms, "{}", s.name);
    }
    for a in &backward {
        for b in &backward {
            if a.stage > b.stage {
                assert!(
                    a.end <= b.end,
                    "{} (stage {}) was undone after {} (stage {})",
                    a.step,
                    a.stage,
                    b.step,
                    b.stage
                );
            }
        }
    }
    eprintln!(
        "saga {id}: forward {:?}, compensations {:?}",
        forward.iter().map(|r| &r.step).collect::<Vec<_>>(),
        backward.iter().map(|r| &r.step).collect::<Vec<_>>()
    );

    let png = page.screenshot(1200).await;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(dir.join("console-saga.png"), &png).unwrap();
    if std::env::var_os("AGENTSAGA_UPDATE_SCREENSHOT").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/console-saga.png");
        std::fs::write(&docs, &png).unwrap();
        eprintln!("screenshot written to {}", docs.display());
    }
}

#[derive(Debug, serde::Deserialize)]
struct Row {
    kind: String,
    step: String,
    stage: i64,
    #[allow(dead_code)] // in the failure messages
    idx: i64,
    state: String,
    end: Option<i64>,
    bar: bool,
}

/// `/sagas` with a filter and `/dead`, as the database has them.
async fn lists_and_dead_letters(page: &mut Cdp, store: &Store, base: &str) {
    let compensated = sql_counts(
        store,
        "SELECT state, COUNT(*) FROM saga_instances GROUP BY state",
    )
    .await["compensated"];
    page.navigate(&format!("{base}/sagas?state=compensated"))
        .await;
    let shown = page
        .eval("document.querySelectorAll('#sagas tbody tr').length")
        .await;
    assert_eq!(shown.as_u64(), Some(compensated.min(100)));
    let states = page
        .eval("[...new Set([...document.querySelectorAll('#sagas [data-state]')].map(e => e.dataset.state))]")
        .await;
    assert_eq!(states, json!(["compensated"]));
    page.navigate(&format!("{base}/sagas?key=order-4711")).await;
    assert_eq!(
        page.eval("document.querySelectorAll('#sagas tbody tr').length")
            .await,
        1
    );
    page.navigate(&format!("{base}/dead")).await;
    assert_eq!(
        page.eval("document.getElementById('none').textContent")
            .await,
        "No dead letters."
    );
}

/// `/sagas/{id}` of the held saga: Abort asks first; dismissed, nothing happens;
/// accepted, the saga is aborted and the page shows it as it now stands.
async fn abort_with_the_button(page: &mut Cdp, store: &Store, base: &str, id: SagaId) {
    let saga_url = format!("{base}/sagas/{id}");
    page.navigate(&saga_url).await;
    assert_eq!(
        page.eval("document.getElementById('key').textContent")
            .await,
        "order-4711"
    );
    let data = page
        .eval("document.getElementById('data').textContent")
        .await;
    assert!(
        data.as_str().unwrap().contains("\"<b>not bold</b>\""),
        "{data}"
    );
    assert_eq!(
        page.eval("[...document.querySelectorAll('#actions button')].map(b => b.textContent)")
            .await,
        json!(["Abort"]),
        "a running saga offers abort only"
    );

    // Dismissed: nothing is sent.
    let message = page.click_and_answer("#action-abort", false).await;
    assert!(message.starts_with("Abort this saga?"), "{message}");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(page.eval("location.href").await, saga_url);
    let state = query::get(store, id).await.unwrap().unwrap().state;
    assert_eq!(
        state,
        SagaState::Running,
        "a dismissed confirm does nothing"
    );

    // Accepted: posted, done, and the saga's page shows where it now stands.
    page.click_and_answer("#action-abort", true).await;
    page.wait_for(
        &format!(
            "location.href === '{saga_url}?done=abort' && document.readyState === 'complete' \
             && !!document.getElementById('notice')"
        ),
        WAIT,
    )
    .await;
    let saga = query::get(store, id).await.unwrap().unwrap();
    assert!(
        matches!(
            saga.state,
            SagaState::Compensating | SagaState::Compensated | SagaState::Aborted
        ),
        "{saga:?}"
    );
    let shown = page
        .eval("document.querySelector('#state [data-state]').dataset.state")
        .await;
    assert_eq!(
        shown,
        saga.state.as_str(),
        "the page shows the database's state"
    );
    let notice = page
        .eval("document.getElementById('notice').textContent")
        .await;
    assert_eq!(
        notice,
        format!("Abort done: the saga is now {}.", saga.state)
    );
    assert_eq!(saga.error.as_deref(), Some("aborted by an operator"));
    // Its step's undo is on its way (nothing hosts `warehouse`): in the ledger and on
    // the timeline.
    let steps = query::steps(store, id).await.unwrap();
    let comp = steps[0].compensation_state.map(|c| c.to_string());
    let row = page
        .eval(
            "(r => r && r.dataset.state)(document.querySelector('#timeline [data-kind=compensation][data-step=reserve_stock]'))",
        )
        .await;
    assert_eq!(row.as_str(), comp.as_deref(), "the compensation row");
    page.save_screenshot("console-aborted.png").await;
    eprintln!(
        "aborted with the button: saga {id} is {}, its undo {row}",
        saga.state
    );
}

// ---------------------------------------------------------------------------------------
// The browser and a small DevTools protocol client.

/// Headless chromium, killed (its whole process group) when dropped.
struct Browser {
    child: Child,
    profile: PathBuf,
    ws_url: String,
}

fn on_path(bin: &str) -> Option<PathBuf> {
    if bin.contains('/') {
        return Path::new(bin).is_file().then(|| PathBuf::from(bin));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

impl Browser {
    /// The browser, or `None` when there is none and none is required: the test is then
    /// not run, and says so where the person running the suite sees it.
    fn launch() -> Option<Self> {
        let bin = std::env::var("AGENTSAGA_CHROMIUM").unwrap_or_else(|_| "chromium".into());
        let Some(exe) = on_path(&bin) else {
            let why = format!(
                "`{bin}` is not installed: this test drives Debian's headless chromium \
                 (`apt-get install -y chromium`, as scripts/test does when run as root), or \
                 the browser named by AGENTSAGA_CHROMIUM"
            );
            let required = |v: &str| std::env::var(v).is_ok_and(|v| v == "true" || v == "1");
            if required("CI") || required("AGENTSAGA_REQUIRE_BROWSER") {
                panic!("{why} (required: CI=true or AGENTSAGA_REQUIRE_BROWSER=1)");
            }
            // Straight to the terminal: the test harness captures `eprintln!` of a
            // passing test, and a skipped test must not pass unseen.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "\nconsole_in_a_real_browser: NOT RUN. {why}. Under CI=true it fails.\n"
            );
            return None;
        };
        static N: AtomicU64 = AtomicU64::new(0);
        let profile = std::env::temp_dir().join(format!(
            "agentsaga-chromium-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&profile).unwrap();
        let mut child = Command::new(&exe)
            .args([
                "--headless",
                // As root (CI) chromium's sandbox cannot start; it only ever opens
                // this test's own pages.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--hide-scrollbars",
                "--mute-audio",
                "--window-size=1200,900",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
        // Its stderr says where DevTools listens; keep draining it afterwards.
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + WAIT;
        let mut seen = Vec::new();
        let ws_url = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(url) = line.strip_prefix("DevTools listening on ") {
                        break url.trim().to_owned();
                    }
                    seen.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "{} did not say where DevTools listens within {WAIT:?}; its stderr:\n{}",
                        exe.display(),
                        seen.join("\n")
                    );
                }
            }
        };
        Some(Browser {
            child,
            profile,
            ws_url,
        })
    }
}

impl Browser {
    /// Waits (at most `limit`) for the browser to exit by itself, as it does after
    /// `Browser.close`, reaping its own processes.
    fn wait_exit(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The browser and its renderer, GPU and zygote processes: the group it leads.
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// One DevTools connection, with one tab attached (flat session mode).
struct Cdp {
    out: mpsc::UnboundedSender<Message>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>,
    events: mpsc::UnboundedReceiver<Value>,
    /// Every event read so far that says something went wrong on a page.
    errors: Vec<Value>,
    next: AtomicU64,
    session: Option<String>,
}

impl Cdp {
    async fn connect(ws_url: &str) -> Self {
        let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(ws_url))
            .await
            .expect("DevTools websocket within the time")
            .expect("DevTools websocket");
        let (mut sink, mut stream) = ws.split();
        let (out, mut out_rx) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                if sink.send(m).await.is_err() {
                    break;
                }
            }
        });
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>> = Arc::default();
        let (ev_tx, events) = mpsc::unbounded_channel();
        let waiting = pending.clone();
        tokio::spawn(async move {
            while let Some(Ok(msg)) = stream.next().await {
                let Message::Text(text) = msg else { continue };
                let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else {
                    continue;
                };
                match v.get("id").and_then(Value::as_u64) {
                    Some(id) => {
                        if let Some(tx) = waiting.lock().unwrap().remove(&id) {
                            let _ = tx.send(v);
                        }
                    }
                    None => {
                        let _ = ev_tx.send(v);
                    }
                }
            }
        });
        Cdp {
            out,
            pending,
            events,
            errors: Vec::new(),
            next: AtomicU64::new(1),
            session: None,
        }
    }

    /// Sends a command; its answer comes on the receiver.
    fn send(&self, method: &str, params: Value) -> oneshot::Receiver<Value> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        self.out
            .send(Message::text(msg.to_string()))
            .expect("DevTools connection open");
        rx
    }

    async fn answer(method: &str, rx: oneshot::Receiver<Value>) -> Result<Value, Value> {
        let v = tokio::time::timeout(WAIT, rx)
            .await
            .unwrap_or_else(|_| panic!("{method}: no answer within {WAIT:?}"))
            .unwrap_or_else(|_| panic!("{method}: the DevTools connection closed"));
        match v.get("error") {
            Some(e) => Err(e.clone()),
            None => Ok(v["result"].clone()),
        }
    }

    async fn call(&self, method: &str, params: Value) -> Value {
        let rx = self.send(method, params);
        Self::answer(method, rx)
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    /// A new tab, attached; its pages' errors are collected.
    async fn open_tab(&mut self) {
        let target = self
            .call("Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let attached = self
            .call(
                "Target.attachToTarget",
                json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await;
        self.session = Some(attached["sessionId"].as_str().unwrap().to_owned());
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            self.call(domain, json!({})).await;
        }
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1200, "height": 900, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
    }

    /// Notes an event if it reports an error on a page.
    fn note(&mut self, ev: &Value) {
        let bad = match ev["method"].as_str() {
            Some("Runtime.exceptionThrown") => true,
            Some("Runtime.consoleAPICalled") => ev["params"]["type"] == "error",
            Some("Log.entryAdded") => ev["params"]["entry"]["level"] == "error",
            _ => false,
        };
        if bad {
            self.errors.push(ev["params"].clone());
        }
    }

    /// The next event `method`, within `limit`.
    async fn event(&mut self, method: &str, limit: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let ev = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("no {method} within {limit:?}"))
                .expect("DevTools connection open");
            self.note(&ev);
            if ev["method"] == method {
                return ev;
            }
        }
    }

    /// The errors the pages reported so far.
    fn page_errors(&mut self) -> Vec<Value> {
        while let Ok(ev) = self.events.try_recv() {
            self.note(&ev);
        }
        self.errors.clone()
    }

    /// `expr`'s value, or the exception it threw (also while a page is being replaced).
    async fn try_eval(&self, expr: &str) -> Result<Value, Value> {
        let rx = self.send(
            "Runtime.evaluate",
            json!({ "expression": expr, "returnByValue": true }),
        );
        let r = Self::answer("Runtime.evaluate", rx).await?;
        match r.get("exceptionDetails") {
            Some(e) => Err(e.clone()),
            None => Ok(r["result"]["value"].clone()),
        }
    }

    async fn eval(&self, expr: &str) -> Value {
        self.try_eval(expr)
            .await
            .unwrap_or_else(|e| panic!("`{expr}` threw: {e}"))
    }

    /// Waits (at most `limit`) until `expr` is true on the page.
    async fn wait_for(&mut self, expr: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if self.try_eval(expr).await == Ok(Value::Bool(true)) {
                return;
            }
            if Instant::now() >= deadline {
                let at = self.try_eval("location.href").await;
                let text = self
                    .try_eval("document.body && document.body.innerText")
                    .await;
                panic!("not true within {limit:?}: {expr}\nthe page at {at:?}:\n{text:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Opens `url` and waits until it has loaded.
    async fn navigate(&mut self, url: &str) {
        let r = self.call("Page.navigate", json!({ "url": url })).await;
        assert!(r.get("errorText").is_none(), "{url}: {r}");
        self.wait_for(
            &format!(
                "location.href === {} && document.readyState === 'complete'",
                json!(url)
            ),
            WAIT,
        )
        .await;
        let title = self.eval("document.title").await;
        assert!(
            !title.as_str().unwrap_or("").starts_with("Error"),
            "{url} is an error page: {}",
            self.eval("document.body.innerText").await
        );
    }

    /// Clicks `selector`, answers the `confirm()` it opens (accept or dismiss), and
    /// returns the dialog's question.
    async fn click_and_answer(&mut self, selector: &str, accept: bool) -> String {
        // The click returns only once the dialog is answered: send it, then answer.
        let click = self.send(
            "Runtime.evaluate",
            json!({ "expression": format!("document.querySelector({}).click()", json!(selector)) }),
        );
        let dialog = self.event("Page.javascriptDialogOpening", WAIT).await;
        assert_eq!(dialog["params"]["type"], "confirm", "{dialog}");
        self.call("Page.handleJavaScriptDialog", json!({ "accept": accept }))
            .await;
        Self::answer("Runtime.evaluate", click)
            .await
            .unwrap_or_else(|e| panic!("click {selector}: {e}"));
        dialog["params"]["message"].as_str().unwrap().to_owned()
    }

    /// The page's screenshot into the target directory's `tmp/` (to look at).
    async fn save_screenshot(&self, name: &str) {
        let png = self.screenshot(1200).await;
        std::fs::write(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name), png).unwrap();
    }

    /// The whole page as a PNG, `width` pixels wide.
    async fn screenshot(&self, width: u64) -> Vec<u8> {
        let height = self
            .eval("document.documentElement.scrollHeight")
            .await
            .as_u64()
            .unwrap();
        let shot = self
            .call(
                "Page.captureScreenshot",
                json!({
                    "format": "png",
                    "captureBeyondViewport": true,
                    "clip": { "x": 0, "y": 0, "width": width, "height": height, "scale": 1 }
                }),
            )
            .await;
        let png = base64_decode(shot["data"].as_str().unwrap());
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
        png
    }

    async fn close_browser(&mut self) {
        self.session = None;
        let rx = self.send("Browser.close", json!({}));
        let _ = tokio::time::timeout(Duration::from_secs(5), rx).await;
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let digit = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3 + 3);
    for chunk in bytes.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | digit(c) << (18 - 6 * i));
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}
