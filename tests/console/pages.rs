//! What the test checks on each page.

use super::*;

/// `/`: every number on the overview is the database's.
pub(crate) async fn overview_matches_the_database(page: &mut Cdp, store: &Store, base: &str) {
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

pub(crate) async fn overview_numbers(page: &mut Cdp) -> HashMap<String, String> {
    let v = page
        .eval(
            "Object.fromEntries([...document.querySelectorAll('#overview [data-count]')]\
             .map(e => [e.dataset.count, e.textContent.trim()]))",
        )
        .await;
    serde_json::from_value(v).unwrap()
}

pub(crate) async fn sql_counts(store: &Store, sql: &'static str) -> BTreeMap<String, u64> {
    let Some(reader) = store.reader().sqlite() else {
        panic!("a SQLite database")
    };
    let rows: Vec<(String, i64)> = sqlx::query_as(sql).fetch_all(reader).await.unwrap();
    rows.into_iter().map(|(k, n)| (k, n as u64)).collect()
}

/// A saga nothing advances: its one step goes to a destination no process hosts, so
/// it stays running until someone aborts it.
pub(crate) async fn start_held_saga(store: &Store) -> SagaId {
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
pub(crate) async fn overview_refreshes_by_itself(page: &mut Cdp, store: &Store) {
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
pub(crate) async fn compensated_timeline_reads_in_reverse(
    page: &mut Cdp,
    store: &Store,
    base: &str,
) {
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
pub(crate) async fn lists_and_dead_letters(page: &mut Cdp, store: &Store, base: &str) {
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
pub(crate) async fn abort_with_the_button(page: &mut Cdp, store: &Store, base: &str, id: SagaId) {
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
    // Time for a post the page should not send to land: that nothing happens has no
    // condition to poll for.
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

/// A saga parked at a sleep: its page says until when and in how long, and its
/// timeline's bar says it sleeps.
pub(crate) async fn a_sleeping_saga_says_when_it_wakes(page: &mut Cdp, store: &Store, base: &str) {
    let def = Saga::<Value>::builder("follow_up", 1)
        .step(Step::sleep(
            "three_days",
            Duration::from_secs(3 * 86_400 + 2 * 3_600),
        ))
        .pivot(Step::new("send_follow_up", "mailer"))
        .build()
        .unwrap();
    let engine = Engine::new([def]).unwrap();
    let mut tx = store.begin().await.unwrap();
    let id = engine
        .start(&mut tx, "follow_up", &json!({ "to": "ann@example.com" }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    page.navigate(&format!("{base}/sagas/{id}")).await;
    let sleeping = page
        .eval("document.getElementById('sleeping').textContent")
        .await;
    let sleeping = sleeping.as_str().unwrap_or_default().to_owned();
    assert!(sleeping.starts_with("until 20"), "{sleeping}");
    assert!(
        sleeping.ends_with("(in 3 d 2 h)") || sleeping.ends_with("(in 3 d 1 h)"),
        "{sleeping}"
    );
    let body = page.eval("document.body.innerText").await;
    assert!(
        body.as_str()
            .unwrap_or_default()
            .contains("sleeps until 20"),
        "{body}"
    );
    page.save_screenshot("console-sleeping.png").await;

    // Paused by an operator: the page says by whom and why.
    let mut tx = store.begin().await.unwrap();
    engine
        .pause(&mut tx, id, "ops-anna", "the customer asked to wait")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    page.navigate(&format!("{base}/sagas/{id}")).await;
    let body = page.eval("document.body.innerText").await;
    let body = body.as_str().unwrap_or_default();
    assert!(
        body.contains("ops-anna") && body.contains("the customer asked to wait"),
        "{body}"
    );
    page.save_screenshot("console-paused.png").await;
}
