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

mod browser;
mod pages;
#[path = "../support/mod.rs"]
mod support;

use browser::{Browser, Cdp};
use pages::*;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentsaga::core::Store;
use agentsaga::core::sqlx;
use agentsaga::core::testing::{Backend, fresh_url};
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
    a_sleeping_saga_says_when_it_wakes(&mut page, &store, &base).await;

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
