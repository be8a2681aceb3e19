//! The admin HTTP API served on 127.0.0.1 and called with reqwest, on SQLite and
//! PostgreSQL: every document equals the `Console` call's (the CLI's `--json`),
//! filters and cursor pages, each action answering the saga as it now stands, tokens
//! (401 / 403, nothing done), bad requests (400 / 404 / 413, JSON errors, nothing
//! written), a stalled saga reported, and `Runtime::admin_router` starting a runtime's
//! saga.

use std::time::Duration;

use agentsaga_console::http::{self, HttpConfig};
use agentsaga_console::{Action, Console, SagaQuery};
use agentsaga_core::queue::DeadLetter;
use agentsaga_core::testing::{self, Backend, fresh_url};
use agentsaga_core::{Message, MessageId, Receipt, RetryPolicy, Store, both_backends};
use agentsaga_saga::protocol::{self, StepOutcome};
use agentsaga_saga::{Engine, Saga, SagaDefinition, SagaId, SagaState, Step, query};
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------
// The database

/// reserve (undoable) → charge (the pivot) → confirm; the agents answer per the data's
/// `case` (see [`agent`]).
fn trip() -> SagaDefinition {
    Saga::<Value>::builder("trip", 1)
        .step(
            Step::new("reserve", "reserve-agent")
                .command(|d: &Value| d.clone())
                .compensate("reserve-agent", |d: &Value| json!({"cancel": d["case"]})),
        )
        .pivot(Step::new("charge", "charge-agent").command(|d: &Value| d.clone()))
        .step(Step::new("confirm", "confirm-agent").command(|d: &Value| d.clone()))
        .build()
        .expect("definition")
}

/// One step: wait for the signal `approval`.
fn waits() -> SagaDefinition {
    Saga::<Value>::builder("waits", 1)
        .step(Step::wait_for("approval"))
        .build()
        .expect("definition")
}

/// `ok`; `declined` (the charge fails: compensated); `stuck` (the charge fails and so
/// does the reservation's cancel); `after_pivot` (confirm fails for good).
fn agent(env: &agentsaga_core::Envelope) -> StepOutcome {
    let payload: Value = serde_json::from_str(&env.payload).expect("payload");
    if protocol::is_compensation(env) {
        return if payload["cancel"] == "stuck" {
            StepOutcome::Fatal("cancel API down".into())
        } else {
            StepOutcome::Ok(json!("cancelled"))
        };
    }
    match (env.destination.as_str(), payload["case"].as_str()) {
        ("charge-agent", Some("declined" | "stuck")) => StepOutcome::Fatal("card declined".into()),
        ("confirm-agent", Some("after_pivot")) => StepOutcome::Fatal("confirmation gone".into()),
        _ => StepOutcome::Ok(json!("done")),
    }
}

fn engine() -> Engine {
    Engine::new([trip(), waits()])
        .expect("engine")
        .with_compensation_retry(RetryPolicy::new(
            Duration::from_millis(1),
            Duration::from_millis(4),
            2,
        ))
}

/// A database holding one saga of each kind, a stalled one, a waiting one, a running
/// one and two dead letters (besides the stalled saga's dead reply).
struct Fixture {
    /// A console as `agentsaga serve` has it: no definitions.
    console: Console,
    completed: SagaId,
    compensated: SagaId,
    stuck: [SagaId; 2],
    after_pivot: SagaId,
    /// Running, its reply dead-lettered: stalled.
    stalled: SagaId,
    /// Parked at its wait for `approval`.
    waiting: SagaId,
    /// Running, its first command pending.
    running: SagaId,
    dead_mailer: MessageId,
    dead_sms: MessageId,
}

async fn start(
    store: &Store,
    engine: &Engine,
    name: &str,
    key: Option<&str>,
    data: Value,
) -> SagaId {
    let mut tx = store.begin().await.expect("begin");
    let id = engine
        .accept_keyed(&mut tx, name, key, data)
        .await
        .expect("start")
        .id();
    tx.commit().await.expect("commit");
    id
}

async fn prepare(backend: Backend) -> Fixture {
    let store = Store::connect(&fresh_url(backend).await)
        .await
        .expect("connect");
    let engine = engine();

    // The stalled saga: its agent answers, and the reply is dead-lettered.
    let stalled = start(&store, &engine, "trip", None, json!({"case": "ok"})).await;
    let command = testing::claim(&store, &["reserve-agent".to_owned()], 10)
        .await
        .remove(0);
    let mut tx = store.begin().await.expect("begin");
    tx.receive("reserve-agent", command.id)
        .await
        .expect("receive");
    tx.enqueue(
        &protocol::reply(&command, &agent(&command))
            .unwrap()
            .unwrap(),
    )
    .await
    .expect("reply");
    tx.commit().await.expect("commit");
    store
        .queue()
        .mark_delivered("t", &[command.seq])
        .await
        .expect("delivered");
    let reply = testing::claim(&store, &["saga.trip.v1".to_owned()], 10)
        .await
        .remove(0);
    let lost = DeadLetter {
        seq: reply.seq,
        reason: "lost".into(),
        notice: None,
    };
    store.queue().dead_letter("t", &[lost]).await.expect("dead");

    let waiting = start(&store, &engine, "waits", None, json!({})).await;
    let mut ids = Vec::new();
    for case in ["ok", "declined", "stuck", "stuck", "after_pivot"] {
        let key = (case == "ok").then_some("req-ok");
        ids.push(start(&store, &engine, "trip", key, json!({"case": case})).await);
    }
    pump(&store, &engine, &ids).await;
    let running = start(&store, &engine, "trip", None, json!({"case": "ok"})).await;

    let mut tx = store.begin().await.expect("begin");
    let mailer = Message::to("mailer")
        .key("ops")
        .json(&json!({"to": "ops@example.com"}))
        .expect("json")
        .header("trace", "t-1");
    let sms = Message::to("sms")
        .json(&json!({"to": "+100"}))
        .expect("json");
    let (dead_mailer, dead_sms) = (mailer.id, sms.id);
    tx.enqueue_batch(&[mailer, sms]).await.expect("enqueue");
    tx.commit().await.expect("commit");
    let claimed = testing::claim(&store, &["mailer".to_owned(), "sms".to_owned()], 10).await;
    let dead: Vec<DeadLetter> = claimed
        .iter()
        .map(|e| DeadLetter {
            seq: e.seq,
            reason: format!("{}: 550 mailbox unavailable", e.destination),
            notice: None,
        })
        .collect();
    assert_eq!(
        store.queue().dead_letter("t", &dead).await.expect("dead"),
        2
    );

    Fixture {
        console: Console::new(store),
        completed: ids[0],
        compensated: ids[1],
        stuck: [ids[2], ids[3]],
        after_pivot: ids[4],
        stalled,
        waiting,
        running,
        dead_mailer,
        dead_sms,
    }
}

/// Delivers every ready message until every saga in `ids` is terminal or stuck.
async fn pump(store: &Store, engine: &Engine, ids: &[SagaId]) {
    let mut destinations = engine.orchestrator_destinations();
    for d in engine.definitions() {
        destinations.extend(d.agent_destinations());
    }
    testing::pump(
        store,
        &destinations,
        "the sagas settle",
        Duration::from_secs(30),
        async || {
            let mut settled = 0;
            for id in ids {
                let s = query::get(store, *id).await.expect("get").expect("saga");
                if s.state.is_terminal() || s.state == SagaState::Stuck {
                    settled += 1;
                }
            }
            settled == ids.len()
        },
        async |batch| {
            for env in batch.iter() {
                let mut tx = store.begin().await.expect("begin");
                if env.destination.starts_with("saga.") {
                    engine.handle(&mut tx, env).await.expect("handle");
                } else if tx.receive(&env.destination, env.id).await.expect("receive")
                    == Receipt::First
                {
                    let reply = protocol::reply(env, &agent(env)).unwrap().unwrap();
                    tx.enqueue(&reply).await.expect("enqueue reply");
                }
                tx.commit().await.expect("commit");
            }
        },
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// The server and its client

/// The router over `console` served on 127.0.0.1, and a client for it.
struct Api {
    base: String,
    client: reqwest::Client,
    token: Option<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Api {
    async fn serve(app: axum::Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(http::serve(listener, app, async move {
            let _ = stopped.await;
        }));
        Self {
            base: format!("http://{addr}"),
            client: reqwest::Client::builder()
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
            token: None,
            stop: Some(stop),
        }
    }

    async fn console(console: &Console, config: HttpConfig) -> Self {
        Self::serve(http::router(console.clone(), config)).await
    }

    fn with_token(&self, token: Option<&str>) -> Self {
        Self {
            base: self.base.clone(),
            client: self.client.clone(),
            token: token.map(str::to_owned),
            stop: None,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.client.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    async fn send(req: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let res = req.send().await.expect("request");
        let status = res.status();
        let text = res.text().await.expect("body");
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {text}"));
        (status, body)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        Self::send(self.request(reqwest::Method::GET, path)).await
    }

    /// `POST` with `body` as JSON (an empty body if `Value::Null`), as an API client
    /// sends it: `Content-Type: application/json` either way.
    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let req = self.request(reqwest::Method::POST, path);
        let req = if body.is_null() {
            req.header("content-type", "application/json")
        } else {
            req.json(&body)
        };
        Self::send(req).await
    }

    async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (StatusCode, Value) {
        let req = self
            .request(reqwest::Method::POST, path)
            .header("content-type", "application/json")
            .body(body);
        Self::send(req).await
    }

    /// `GET path`: 200 with a document.
    async fn ok(&self, path: &str) -> Value {
        let (status, body) = self.get(path).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
        body
    }

    /// `POST path`: 200 with a document.
    async fn ok_post(&self, path: &str, body: Value) -> Value {
        let (status, doc) = self.post(path, body).await;
        assert_eq!(status, StatusCode::OK, "POST {path}: {doc}");
        doc
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Whatever it is, as JSON.
fn doc(v: &impl Serialize) -> Value {
    serde_json::to_value(v).expect("serialize")
}

/// A status document without the one field that moves by itself (the age of the
/// oldest pending row).
fn steady(mut status: Value) -> Value {
    status["outbox"]["oldest_pending_age_ms"] = Value::Null;
    status
}

/// `{"error": {"kind": kind, "message": …}}` with that status.
fn assert_error(got: &(StatusCode, Value), status: StatusCode, kind: &str, what: &str) {
    assert_eq!(got.0, status, "{what}: {}", got.1);
    assert_eq!(got.1["error"]["kind"], kind, "{what}: {}", got.1);
    assert!(
        got.1["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{what}: {}",
        got.1
    );
    assert_eq!(
        got.1.as_object().map(|o| o.len()),
        Some(1),
        "{what}: only `error`"
    );
}

/// Everything an operator sees of the database: status and every saga's document.
async fn everything(f: &Fixture) -> Value {
    let page = f
        .console
        .sagas(&SagaQuery {
            limit: 1000,
            ..SagaQuery::default()
        })
        .await
        .expect("list");
    let mut sagas = Vec::new();
    for s in &page.sagas {
        sagas.push(doc(&f
            .console
            .saga(s.id.parse().expect("id"))
            .await
            .expect("show")));
    }
    let dead = f.console.dead_letters(None, 1000).await.expect("dead");
    json!({
        "status": steady(doc(&f.console.status().await.expect("status"))),
        "sagas": sagas,
        "dead": doc(&dead),
    })
}

// ---------------------------------------------------------------------------------------
// The finished sagas' counts

/// Runs `sql` in a transaction of its own (a write an operator makes by hand).
async fn by_hand(store: &Store, sql: &'static str) -> u64 {
    let mut tx = store.begin().await.expect("begin");
    let n = match tx.conn() {
        agentsaga_core::Conn::Sqlite(c) => agentsaga_core::sqlx::query(sql)
            .execute(&mut *c)
            .await
            .map(|d| d.rows_affected()),
        agentsaga_core::Conn::Postgres(c) => agentsaga_core::sqlx::query(sql)
            .execute(&mut *c)
            .await
            .map(|d| d.rows_affected()),
    }
    .unwrap_or_else(|e| panic!("{sql}: {e}"));
    tx.commit().await.expect("commit");
    n
}

/// The overview's finished counts against a count of every saga (what it replaces).
async fn assert_finished_counts(c: &Console, store: &Store, when: &str) -> u64 {
    let status = c.status().await.expect("status");
    let truth: std::collections::HashMap<SagaState, u64> = query::count_by_state(store)
        .await
        .expect("count")
        .into_iter()
        .collect();
    let mut finished = 0;
    for state in [
        SagaState::Completed,
        SagaState::Compensated,
        SagaState::Aborted,
    ] {
        let want = truth.get(&state).copied().unwrap_or(0);
        assert_eq!(status.sagas[state.as_str()], want, "{state} sagas {when}");
        finished += want;
    }
    assert_eq!(
        status.sagas_total,
        truth.values().sum::<u64>(),
        "all sagas {when}"
    );
    finished
}

// `saga_finished_counts` follows every write of saga_instances: the engine finishing,
// compensating and aborting sagas, a state changed by hand (out of a final state too),
// rows deleted by hand and by the prune.
async fn finished_counts_follow_every_write(backend: Backend) {
    let f = prepare(backend).await;
    let c = &f.console;
    let store = c.store().clone();
    assert!(assert_finished_counts(c, &store, "after the engine's writes").await >= 2);

    c.act(f.running, Action::Abort).await.expect("abort");
    pump(&store, &engine(), &[f.running]).await;
    assert_finished_counts(c, &store, "after an abort").await;

    by_hand(
        &store,
        "UPDATE saga_instances SET state = 'aborted' WHERE state = 'completed'",
    )
    .await;
    assert_finished_counts(c, &store, "after completed → aborted by hand").await;
    assert!(
        by_hand(
            &store,
            "UPDATE saga_instances SET state = 'running' WHERE state = 'aborted'"
        )
        .await
            > 0
    );
    assert_finished_counts(c, &store, "after aborted → running by hand").await;
    by_hand(
        &store,
        "UPDATE saga_instances SET state = 'completed' WHERE state = 'running'",
    )
    .await;
    assert!(assert_finished_counts(c, &store, "after running → completed by hand").await > 2);
    assert!(
        by_hand(
            &store,
            "DELETE FROM saga_instances WHERE state = 'compensated'"
        )
        .await
            > 0
    );
    assert_finished_counts(c, &store, "after a DELETE by hand").await;

    let before = assert_finished_counts(c, &store, "before the prune").await;
    let pruned = query::prune_finished(&store, Duration::ZERO)
        .await
        .expect("prune");
    assert!(pruned.sagas > 0, "{pruned:?}");
    // The sagas completed by hand have no `finished_at`: the prune keeps them.
    let after = assert_finished_counts(c, &store, "after the prune").await;
    assert_eq!(after, before - pruned.sagas);
}

both_backends!(finished_count_tests, finished_counts_follow_every_write);

// ---------------------------------------------------------------------------------------
// Reads

async fn reads_equal_the_console_documents(backend: Backend) {
    let f = prepare(backend).await;
    let api = Api::console(&f.console, HttpConfig::default()).await;
    let c = &f.console;

    let status = api.ok("/api/v1/status").await;
    assert!(
        status["outbox"]["oldest_pending_age_ms"].is_u64(),
        "{status}"
    );
    assert_eq!(
        steady(status.clone()),
        steady(doc(&c.status().await.unwrap()))
    );
    assert_eq!(
        status["stalled"], 1,
        "the saga whose reply is dead: {status}"
    );
    assert_eq!(status["sagas_total"], 8, "{status}");

    // Lists, each filter.
    let all = api.ok("/api/v1/sagas").await;
    assert_eq!(all, doc(&c.sagas(&SagaQuery::default()).await.unwrap()));
    assert_eq!(all["sagas"].as_array().unwrap().len(), 8);
    assert_eq!(all["next_cursor"], Value::Null);
    let list = async |q: &str, query: SagaQuery| -> Vec<String> {
        let page = api.ok(&format!("/api/v1/sagas?{q}")).await;
        assert_eq!(page, doc(&c.sagas(&query).await.unwrap()), "{q}");
        page["sagas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let ids = |v: &[SagaId]| -> Vec<String> {
        let mut v: Vec<String> = v.iter().map(ToString::to_string).collect();
        v.sort();
        v
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let stuck = list(
        "state=stuck",
        SagaQuery {
            state: Some(SagaState::Stuck),
            ..SagaQuery::default()
        },
    )
    .await;
    assert_eq!(sorted(stuck), ids(&[f.stuck[0], f.stuck[1], f.after_pivot]));
    let keyed = list(
        "key=req-ok",
        SagaQuery {
            key: Some("req-ok".into()),
            ..SagaQuery::default()
        },
    )
    .await;
    assert_eq!(keyed, ids(&[f.completed]));
    let named = list(
        "name=waits",
        SagaQuery {
            name: Some("waits".into()),
            ..SagaQuery::default()
        },
    )
    .await;
    assert_eq!(named, ids(&[f.waiting]));
    let waiting = list(
        "waiting=true",
        SagaQuery {
            waiting: true,
            ..SagaQuery::default()
        },
    )
    .await;
    assert_eq!(waiting, ids(&[f.waiting]));
    let stalled = list(
        "stalled=true",
        SagaQuery {
            stalled: true,
            ..SagaQuery::default()
        },
    )
    .await;
    assert_eq!(stalled, ids(&[f.stalled]), "the stalled saga, and only it");
    let combined = list(
        "state=running&name=trip&stalled=false&waiting=0&key=&limit=1000",
        SagaQuery {
            state: Some(SagaState::Running),
            name: Some("trip".into()),
            limit: 1000,
            ..SagaQuery::default()
        },
    )
    .await;
    assert_eq!(sorted(combined), ids(&[f.stalled, f.running]));

    // Time ranges: Unix ms or RFC 3339; `from` inclusive, `to` exclusive. (Bounds a
    // millisecond away from the sagas: PostgreSQL keeps microseconds, and a saga's
    // `created_at_ms` is rounded.)
    let created: Vec<i64> = all["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["created_at_ms"].as_i64().unwrap())
        .collect();
    let (first, last) = (
        *created.iter().min().unwrap(),
        *created.iter().max().unwrap(),
    );
    let range = async |q: String, from: Option<i64>, to: Option<i64>| {
        let query = SagaQuery {
            created_from_ms: from,
            created_to_ms: to,
            ..SagaQuery::default()
        };
        list(&q, query).await.len()
    };
    let before_first = agentsaga_console::time::rfc3339(first - 1);
    assert_eq!(
        range(format!("from={before_first}"), Some(first - 1), None).await,
        8
    );
    assert_eq!(
        range(format!("from={}", last + 1), Some(last + 1), None).await,
        0
    );
    assert_eq!(
        range(format!("to={}", first - 1), None, Some(first - 1)).await,
        0
    );
    let after_last = agentsaga_console::time::rfc3339(last + 1).replace('Z', "+00:00");
    let q = format!("from={}&to={}", first - 1, after_last.replace('+', "%2B"));
    assert_eq!(range(q, Some(first - 1), Some(last + 1)).await, 8);
    // An unencoded `+` arrives as a space, and is read as the `+` it was.
    let q = format!("from={}&to={after_last}", first - 1);
    assert_eq!(range(q, Some(first - 1), Some(last + 1)).await, 8);

    // Cursor pages of three cover every saga once, newest first, as the whole list.
    let mut seen: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    for page_no in 0.. {
        assert!(page_no < 10, "pages never end");
        let path = match &cursor {
            Some(c) => format!("/api/v1/sagas?limit=3&cursor={c}"),
            None => "/api/v1/sagas?limit=3".to_owned(),
        };
        let page = api.ok(&path).await;
        let query = SagaQuery {
            limit: 3,
            cursor: cursor.clone(),
            ..SagaQuery::default()
        };
        assert_eq!(page, doc(&c.sagas(&query).await.unwrap()));
        let n = page["sagas"].as_array().unwrap().len();
        seen.extend(
            page["sagas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["id"].as_str().unwrap().to_owned()),
        );
        match page["next_cursor"].as_str() {
            Some(next) => {
                assert_eq!(n, 3);
                cursor = Some(next.to_owned());
            }
            None => break,
        }
    }
    let every: Vec<String> = all["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(seen, every);

    // One saga, each kind.
    for id in [
        f.completed,
        f.compensated,
        f.stuck[0],
        f.after_pivot,
        f.stalled,
        f.waiting,
        f.running,
    ] {
        let show = api.ok(&format!("/api/v1/sagas/{id}")).await;
        assert_eq!(show, doc(&c.saga(id).await.unwrap()), "{id}");
        assert_eq!(show["saga"]["id"], id.to_string());
    }
    let show = api.ok(&format!("/api/v1/sagas/{}", f.waiting)).await;
    assert_eq!(show["saga"]["waiting_for"], "approval", "{show}");
    let show = api.ok(&format!("/api/v1/sagas/{}", f.compensated)).await;
    assert_eq!(show["saga"]["state"], "compensated");
    assert_eq!(show["steps"][0]["compensation_state"], "done", "{show}");

    // Dead letters.
    let dead = api.ok("/api/v1/dead").await;
    assert_eq!(dead, doc(&c.dead_letters(None, 0).await.unwrap()));
    assert_eq!(dead["dead_letters"].as_array().unwrap().len(), 3, "{dead}");
    let sms = api.ok("/api/v1/dead?destination=sms&limit=10").await;
    assert_eq!(sms, doc(&c.dead_letters(Some("sms"), 10).await.unwrap()));
    assert_eq!(sms["dead_letters"][0]["id"], f.dead_sms.to_string());
    let one = api.ok(&format!("/api/v1/dead/{}", f.dead_mailer)).await;
    assert_eq!(one, doc(&c.dead_letter(f.dead_mailer).await.unwrap()));
    assert_eq!(one["headers"]["trace"], "t-1");
    api.ok("/api/v1/dead?limit=1").await["dead_letters"]
        .as_array()
        .map(|d| assert_eq!(d.len(), 1))
        .unwrap();

    // Bad requests: JSON errors.
    let missing = SagaId::new();
    let invalid = [
        "/api/v1/sagas?bogus=1",
        "/api/v1/sagas?state=lost",
        "/api/v1/sagas?limit=0",
        "/api/v1/sagas?limit=1001",
        "/api/v1/sagas?limit=ten",
        "/api/v1/sagas?waiting=yes",
        "/api/v1/sagas?from=yesterday",
        "/api/v1/sagas?to=2024-13-01T00:00:00Z",
        "/api/v1/sagas?cursor=nonsense",
        "/api/v1/sagas?name=a&name=b",
        "/api/v1/sagas?name=%ZZ",
        "/api/v1/status?verbose=1",
        "/api/v1/sagas/not-a-uuid",
        "/api/v1/dead/not-a-uuid",
        "/api/v1/dead?state=dead",
        "/api/v1/dead?limit=5000",
    ];
    for path in invalid {
        assert_error(
            &api.get(path).await,
            StatusCode::BAD_REQUEST,
            "invalid",
            path,
        );
    }
    let not_found = [
        format!("/api/v1/sagas/{missing}"),
        format!("/api/v1/dead/{}", MessageId::new()),
        format!("/api/v1/dead/{}", f.completed),
        "/api/v1/nothing".to_owned(),
        "/api/v1/sagas/x/y/z".to_owned(),
    ];
    for path in &not_found {
        assert_error(
            &api.get(path).await,
            StatusCode::NOT_FOUND,
            "not_found",
            path,
        );
    }
    let delete = api
        .request(reqwest::Method::DELETE, "/api/v1/status")
        .header("content-type", "application/json");
    let (status, body) = Api::send(delete).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    assert_eq!(body["error"]["kind"], "method_not_allowed");
}
both_backends!(read_tests, reads_equal_the_console_documents);

// ---------------------------------------------------------------------------------------
// Actions

async fn actions_answer_the_saga_as_it_now_stands(backend: Backend) {
    let f = prepare(backend).await;
    let api = Api::console(&f.console, HttpConfig::default()).await;
    let c = &f.console;
    let state = async |id: SagaId| c.saga(id).await.unwrap().saga.state;

    // Abort, retry, skip: each answers with the saga as `sagas show` now has it.
    let cases = [
        (f.running, "abort", "compensating"),
        (f.stuck[0], "retry", "compensating"),
        (f.stuck[1], "skip", "compensated"),
        (f.after_pivot, "abort", "aborted"),
    ];
    for (id, action, after) in cases {
        let doc_ = api
            .ok_post(&format!("/api/v1/sagas/{id}/{action}"), Value::Null)
            .await;
        assert_eq!(doc_["saga"]["state"], after, "{action}: {doc_}");
        assert_eq!(doc_, doc(&c.saga(id).await.unwrap()), "{action}");
    }

    // Refused and bad ones change nothing.
    let before = everything(&f).await;
    let refused = [
        format!("/api/v1/sagas/{}/retry", f.completed),
        format!("/api/v1/sagas/{}/skip", f.compensated),
        format!("/api/v1/sagas/{}/abort", f.completed),
    ];
    for path in &refused {
        assert_error(
            &api.post(path, Value::Null).await,
            StatusCode::CONFLICT,
            "refused",
            path,
        );
    }
    let missing = SagaId::new();
    assert_error(
        &api.post(&format!("/api/v1/sagas/{missing}/abort"), Value::Null)
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
        "an unknown saga",
    );
    for path in [
        "/api/v1/sagas/nope/abort".to_owned(),
        format!("/api/v1/sagas/{}/abort?force=true", f.stalled),
    ] {
        assert_error(
            &api.post(&path, Value::Null).await,
            StatusCode::BAD_REQUEST,
            "invalid",
            &path,
        );
    }
    assert_error(
        &api.post(&format!("/api/v1/sagas/{}/cancel", f.stalled), Value::Null)
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
        "an unknown action",
    );
    assert_error(
        &api.get(&format!("/api/v1/sagas/{}/abort", f.stalled)).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "GET on an action",
    );

    // Signals.
    let signal = format!("/api/v1/sagas/{}/signal", f.waiting);
    let bad_signals = [
        json!({"name": "approval", "data": 1, "reject": "no"}),
        json!({"name": "", "data": 1}),
        json!({"data": 1}),
        json!({"name": "approval", "extra": 1}),
        json!(["approval"]),
    ];
    for body in bad_signals {
        assert_error(
            &api.post(&signal, body.clone()).await,
            StatusCode::BAD_REQUEST,
            "invalid",
            &body.to_string(),
        );
    }
    assert_error(
        &api.post_raw(&signal, "{\"name\": ").await,
        StatusCode::BAD_REQUEST,
        "invalid",
        "malformed",
    );
    assert_error(
        &api.post_raw(&signal, "").await,
        StatusCode::BAD_REQUEST,
        "invalid",
        "empty",
    );
    assert_error(
        &api.post(&signal, json!({"name": "payment"})).await,
        StatusCode::CONFLICT,
        "refused",
        "a signal it never waits for",
    );
    assert_error(
        &api.post(
            &format!("/api/v1/sagas/{}/signal", f.completed),
            json!({"name": "approval"}),
        )
        .await,
        StatusCode::CONFLICT,
        "refused",
        "a finished saga",
    );
    assert_eq!(
        everything(&f).await,
        before,
        "nothing refused or bad was written"
    );

    let sent = api
        .ok_post(&signal, json!({"name": "approval", "data": {"by": "ann"}}))
        .await;
    assert_eq!(sent["receipt"], "recorded", "{sent}");
    let show = doc(&c.saga(f.waiting).await.unwrap());
    for k in ["saga", "data", "steps"] {
        assert_eq!(
            sent[k], show[k],
            "the signal's answer carries the saga: {k}"
        );
    }
    let again = api
        .ok_post(&signal, json!({"name": "approval", "reject": "too late"}))
        .await;
    assert_eq!(again["receipt"], "duplicate", "{again}");

    // Starting needs a runtime's definitions.
    assert_error(
        &api.post(
            "/api/v1/sagas",
            json!({"name": "trip", "data": {"case": "ok"}}),
        )
        .await,
        StatusCode::NOT_FOUND,
        "not_found",
        "start without definitions",
    );

    // Dead letters: one re-driven, one purged, moot ones refused, purge by age.
    let redriven = api
        .ok_post(&format!("/api/v1/dead/{}/redrive", f.dead_sms), Value::Null)
        .await;
    assert_eq!(
        redriven,
        json!({"id": f.dead_sms.to_string(), "outcome": "redriven", "moot": null})
    );
    assert_error(
        &api.get(&format!("/api/v1/dead/{}", f.dead_sms)).await,
        StatusCode::NOT_FOUND,
        "not_found",
        "a re-driven dead letter is pending again",
    );
    assert_error(
        &api.post(
            &format!("/api/v1/dead/{}/redrive?force=maybe", f.dead_mailer),
            Value::Null,
        )
        .await,
        StatusCode::BAD_REQUEST,
        "invalid",
        "force=maybe",
    );
    assert_error(
        &api.post(
            &format!("/api/v1/dead/{}/redrive", MessageId::new()),
            Value::Null,
        )
        .await,
        StatusCode::NOT_FOUND,
        "not_found",
        "an unknown dead letter",
    );
    let purged = api
        .ok_post(
            &format!("/api/v1/dead/{}/purge", f.dead_mailer),
            Value::Null,
        )
        .await;
    assert_eq!(purged, json!({"purged": 1}));
    assert_eq!(c.dead_letters(None, 0).await.unwrap().dead_letters.len(), 1);

    let before = everything(&f).await;
    for body in [
        json!({"older_than": "7x"}),
        json!({"older_than": 7}),
        json!({}),
        json!({"older_than": "7d", "destination": "sms"}),
    ] {
        assert_error(
            &api.post("/api/v1/dead/purge", body.clone()).await,
            StatusCode::BAD_REQUEST,
            "invalid",
            &body.to_string(),
        );
    }
    assert_error(
        &api.post("/api/v1/dead/redrive", json!({"force": "yes"}))
            .await,
        StatusCode::BAD_REQUEST,
        "invalid",
        "force: yes",
    );
    // Over 64 KiB: 413, nothing read.
    let huge = json!({"destination": "x".repeat(70 * 1024)}).to_string();
    assert_error(
        &api.post_raw("/api/v1/dead/redrive", huge).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        "huge",
    );
    assert_eq!(everything(&f).await, before, "nothing bad was written");

    assert_eq!(
        api.ok_post("/api/v1/dead/purge", json!({"older_than": "7d"}))
            .await,
        json!({"purged": 0})
    );
    assert_eq!(
        api.ok_post("/api/v1/dead/redrive", json!({"destination": "nowhere"}))
            .await,
        json!({"redriven": 0, "purged": 0, "refused": []})
    );
    // The stalled saga's dead reply: re-driven with the rest (an empty body).
    let all = api.ok_post("/api/v1/dead/redrive", Value::Null).await;
    assert_eq!(
        all,
        json!({"redriven": 1, "purged": 0, "refused": []}),
        "{all}"
    );
    assert!(
        c.dead_letters(None, 0)
            .await
            .unwrap()
            .dead_letters
            .is_empty()
    );
    assert_eq!(state(f.stalled).await, "running");
}
both_backends!(action_tests, actions_answer_the_saga_as_it_now_stands);

// ---------------------------------------------------------------------------------------
// Starts, with definitions

async fn starts_with_an_engine(backend: Backend) {
    let f = prepare(backend).await;
    let console = f.console.clone().with_engine(engine());
    let api = Api::console(&console, HttpConfig::default()).await;
    let before = everything(&f).await;
    let bad = [
        ("{}", StatusCode::BAD_REQUEST, "invalid"),
        ("{\"name\": \"trip\"", StatusCode::BAD_REQUEST, "invalid"),
        (
            "{\"name\": \"trip\", \"key\": 7}",
            StatusCode::BAD_REQUEST,
            "invalid",
        ),
        (
            "{\"name\": \"trip\", \"other\": 1}",
            StatusCode::BAD_REQUEST,
            "invalid",
        ),
        ("{\"name\": \"flight\"}", StatusCode::NOT_FOUND, "not_found"),
    ];
    for (body, status, kind) in bad {
        assert_error(
            &api.post_raw("/api/v1/sagas", body).await,
            status,
            kind,
            body,
        );
    }
    let huge = json!({"name": "trip", "data": "x".repeat(65 * 1024)}).to_string();
    assert_error(
        &api.post_raw("/api/v1/sagas", huge).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        "huge",
    );
    assert_eq!(everything(&f).await, before, "nothing was started");

    let started = api
        .ok_post(
            "/api/v1/sagas",
            json!({"name": "trip", "data": {"case": "ok"}, "key": "order-9"}),
        )
        .await;
    let id: SagaId = started["saga"]["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(started, doc(&console.saga(id).await.unwrap()));
    assert_eq!(started["saga"]["state"], "running");
    assert_eq!(started["saga"]["key"], "order-9");
    assert_eq!(started["data"], json!({"case": "ok"}));
    let again = api
        .ok_post(
            "/api/v1/sagas",
            json!({"name": "trip", "data": {"case": "other"}, "key": "order-9"}),
        )
        .await;
    assert_eq!(again["saga"]["id"], id.to_string(), "one key, one saga");
    let unkeyed = api.ok_post("/api/v1/sagas", json!({"name": "waits"})).await;
    assert_eq!(unkeyed["saga"]["name"], "waits");
    assert_eq!(unkeyed["data"], Value::Null);
    assert_eq!(
        console.status().await.unwrap().sagas_total,
        before["status"]["sagas_total"].as_u64().unwrap() + 2
    );
}
both_backends!(start_tests, starts_with_an_engine);

// ---------------------------------------------------------------------------------------
// Tokens

async fn tokens_guard_everything(backend: Backend) {
    let f = prepare(backend).await;
    let config = HttpConfig {
        read_token: Some("read-me".into()),
        action_token: Some("act now".into()),
        ..HttpConfig::default()
    };
    let anon = Api::console(&f.console, config).await;
    let reader = anon.with_token(Some("read-me"));
    let actor = anon.with_token(Some("act now"));
    let wrong = anon.with_token(Some("read-me-not"));
    let before = everything(&f).await;

    // Reads: 401 without the right token, the document with either token.
    for api in [&anon, &wrong] {
        for path in ["/api/v1/status", "/api/v1/sagas", "/api/v1/nothing"] {
            let got = api.get(path).await;
            assert_error(&got, StatusCode::UNAUTHORIZED, "unauthorized", path);
        }
    }
    let res = anon
        .request(reqwest::Method::GET, "/api/v1/status")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(res.headers().contains_key("www-authenticate"));
    let basic = anon
        .request(reqwest::Method::GET, "/api/v1/status")
        .basic_auth("admin", Some("act now"));
    assert_error(
        &Api::send(basic).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "basic",
    );
    for api in [&reader, &actor] {
        let status = api.ok("/api/v1/status").await;
        assert_eq!(
            steady(status),
            steady(doc(&f.console.status().await.unwrap()))
        );
        assert_error(
            &api.get("/api/v1/nothing").await,
            StatusCode::NOT_FOUND,
            "not_found",
            "after the token",
        );
    }

    // Actions: 401 without, 403 with the read token; nothing done.
    let abort = format!("/api/v1/sagas/{}/abort", f.running);
    let purge = format!("/api/v1/dead/{}/purge", f.dead_sms);
    for path in [&abort, &purge, &"/api/v1/dead/redrive".to_owned()] {
        assert_error(
            &anon.post(path, Value::Null).await,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            path,
        );
        assert_error(
            &wrong.post(path, Value::Null).await,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            path,
        );
        assert_error(
            &reader.post(path, Value::Null).await,
            StatusCode::FORBIDDEN,
            "forbidden",
            path,
        );
    }
    // Oversized or malformed bodies without a token: 401 first.
    let huge = "x".repeat(100 * 1024);
    assert_error(
        &anon.post_raw("/api/v1/dead/redrive", huge).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "huge",
    );
    assert_eq!(everything(&f).await, before, "nothing was done");
    let aborted = actor.ok_post(&abort, Value::Null).await;
    assert_eq!(aborted["saga"]["state"], "compensating");

    // A browser: `?token=` once sets the cookie and redirects without the token.
    let visit = |path: &str| anon.client.get(format!("{}{path}", anon.base)).send();
    let res = visit("/?token=act%20now").await.unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()["location"], "/");
    let cookie = res.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.starts_with("agentsaga_token=act%20now;"), "{cookie}");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    let res = visit("/sagas?state=stuck&token=read-me&limit=5")
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()["location"], "/sagas?state=stuck&limit=5");
    let res = visit("/?token=guess").await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(!res.headers().contains_key("set-cookie"));
    let res = visit("/").await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::UNAUTHORIZED,
        "the page needs a token too"
    );

    let with_cookie = |method: reqwest::Method, path: &str, token: &str| {
        anon.client
            .request(method, format!("{}{path}", anon.base))
            .header("cookie", format!("theme=dark; agentsaga_token={token}"))
    };
    // The API takes no cookie (a page elsewhere could make the browser send it).
    let (status, _) = Api::send(with_cookie(
        reqwest::Method::GET,
        "/api/v1/status",
        "read-me",
    ))
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let res = with_cookie(reqwest::Method::GET, "/", "read-me")
        .send()
        .await
        .unwrap();
    let page = res.status();
    assert!(
        page != StatusCode::UNAUTHORIZED && page != StatusCode::FORBIDDEN,
        "the page with the cookie: {page}"
    );
    let (status, _) = Api::send(with_cookie(reqwest::Method::GET, "/api/v1/status", "stale")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let api_skip = format!("/api/v1/sagas/{}/skip", f.stuck[1]);
    let got = Api::send(
        with_cookie(reqwest::Method::POST, &api_skip, "act%20now")
            .header("content-type", "application/json"),
    )
    .await;
    assert_error(
        &got,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "the action cookie at the API",
    );
    // The page's forms take it: the read cookie may not act, the action cookie may.
    let skip = format!("/sagas/{}/skip", f.stuck[1]);
    let res = with_cookie(reqwest::Method::POST, &skip, "read-me")
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::FORBIDDEN,
        "the read cookie acting"
    );
    assert_eq!(
        f.console.saga(f.stuck[1]).await.unwrap().saga.state,
        "stuck"
    );
    let res = with_cookie(reqwest::Method::POST, &skip, "act%20now")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        f.console.saga(f.stuck[1]).await.unwrap().saga.state,
        "compensated"
    );

    // An action token alone: it does everything; nothing without it.
    let act_only = Api::console(
        &f.console,
        HttpConfig {
            action_token: Some("only".into()),
            ..HttpConfig::default()
        },
    )
    .await;
    assert_error(
        &act_only.get("/api/v1/status").await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "none",
    );
    act_only.with_token(Some("only")).ok("/api/v1/status").await;
}
both_backends!(token_tests, tokens_guard_everything);

// ---------------------------------------------------------------------------------------
// Memory: dead letters by id, by pages bounded in bytes

async fn dead_letters_are_paged_by_bytes(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await)
        .await
        .expect("connect");
    // Six dead letters of 900 KiB each: 5.3 MiB, over one page's 4 MiB.
    let big = "x".repeat(900 * 1024);
    let mut tx = store.begin().await.expect("begin");
    let mut ids = Vec::new();
    for i in 0..6 {
        let m = Message::to("big")
            .json(&json!({"i": i, "blob": big}))
            .expect("json");
        ids.push(m.id.to_string());
        tx.enqueue(&m).await.expect("enqueue");
    }
    tx.commit().await.expect("commit");
    let claimed = testing::claim(&store, &["big".to_owned()], 10).await;
    let dead: Vec<DeadLetter> = claimed
        .iter()
        .map(|e| DeadLetter {
            seq: e.seq,
            reason: "too big to care".into(),
            notice: None,
        })
        .collect();
    store.queue().dead_letter("t", &dead).await.expect("dead");
    let console = Console::new(store.clone());
    let api = Api::console(&console, HttpConfig::default()).await;

    // Pages by `before` until the last: each under 4 MiB and one row, all six once.
    let mut seen = Vec::new();
    let mut path = "/api/v1/dead?limit=1000".to_owned();
    for _ in 0..10 {
        let page = api.ok(&path).await;
        let rows = page["dead_letters"].as_array().expect("rows");
        assert!(!rows.is_empty(), "{path}");
        assert!(
            rows.len() < 6,
            "a page stops at its bytes: {} rows",
            rows.len()
        );
        let bytes = page.to_string().len();
        assert!(bytes < 4 * 1024 * 1024 + 1024 * 1024, "{bytes} bytes");
        seen.extend(rows.iter().map(|r| r["id"].as_str().unwrap().to_owned()));
        match page["next_before"].as_i64() {
            Some(before) => path = format!("/api/v1/dead?limit=1000&before={before}"),
            None => break,
        }
    }
    let mut expected = ids.clone();
    expected.reverse();
    assert_eq!(seen, expected, "newest first, each once");
    let (status, body) = api.get("/api/v1/dead?before=x").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // One by id; every one re-driven, a batch at a time.
    let oldest = api.ok(&format!("/api/v1/dead/{}", ids[0])).await;
    assert_eq!(oldest["payload"]["i"], 0);
    let all = api.ok_post("/api/v1/dead/redrive", Value::Null).await;
    assert_eq!(all["redriven"], 6, "{all}");
    assert_eq!(store.admin().stats().await.expect("stats").dead, 0);
    store.close().await;
}
both_backends!(dead_page_tests, dead_letters_are_paged_by_bytes);

// ---------------------------------------------------------------------------------------
// Attackers: another site, a rebound name

/// Every state-changing route, with a body that would do something if taken: the path
/// and the body as a page elsewhere would post it (`text/plain`, which a browser sends
/// cross-site without asking first).
fn attacks(f: &Fixture) -> Vec<(String, &'static str)> {
    vec![
        (format!("/api/v1/sagas/{}/abort", f.running), ""),
        (format!("/api/v1/sagas/{}/retry", f.stuck[0]), ""),
        (format!("/api/v1/sagas/{}/skip", f.stuck[1]), ""),
        (
            format!("/api/v1/sagas/{}/signal", f.waiting),
            r#"{"name": "approval", "data": {"ok": true}}"#,
        ),
        ("/api/v1/sagas".to_owned(), r#"{"name": "waits"}"#),
        ("/api/v1/dead/redrive".to_owned(), r#"{"force": true}"#),
        ("/api/v1/dead/purge".to_owned(), r#"{"older_than": "0s"}"#),
        (format!("/api/v1/dead/{}/redrive", f.dead_mailer), ""),
        (format!("/api/v1/dead/{}/purge", f.dead_sms), ""),
        (format!("/sagas/{}/abort", f.running), ""),
        (format!("/dead/{}/purge", f.dead_sms), ""),
    ]
}

/// The origin of a page elsewhere.
const EVIL: &str = "http://evil.example";
/// Another port of this machine: the same site, not the same origin.
const OTHER_PORT: &str = "http://127.0.0.1:1";

/// Headers a browser adds to a request a page elsewhere makes, and the content type
/// that page chose.
type Trick = (
    &'static [(&'static str, &'static str)],
    Option<&'static str>,
);

async fn cross_site_requests_change_nothing(backend: Backend) {
    let f = prepare(backend).await;
    // No token: loopback, as `agentsaga serve` runs by default.
    let api = Api::console(&f.console, HttpConfig::default()).await;
    let port = api.base.rsplit(':').next().unwrap().to_owned();
    let before = everything(&f).await;
    // (headers a browser adds, the content type the page elsewhere chose)
    let tricks: [Trick; 8] = [
        (&[("origin", EVIL)], Some("text/plain")),
        (
            &[("origin", EVIL), ("sec-fetch-site", "cross-site")],
            Some("text/plain;charset=UTF-8"),
        ),
        (&[("origin", EVIL)], None),
        (&[("origin", EVIL)], Some("application/json")),
        // Another port of this machine: the same site, not the same origin.
        (
            &[("origin", OTHER_PORT), ("sec-fetch-site", "same-site")],
            Some("text/plain"),
        ),
        (&[("sec-fetch-site", "same-site")], Some("application/json")),
        (
            &[("origin", "null")],
            Some("application/x-www-form-urlencoded"),
        ),
        // A browser old enough to send neither: still no JSON without asking first.
        (&[], Some("text/plain")),
    ];
    for (path, body) in attacks(&f) {
        for (headers, content_type) in &tricks {
            if path.starts_with("/api/") || !headers.is_empty() {
                let mut req = api.client.post(format!("{}{path}", api.base)).body(body);
                for (k, v) in *headers {
                    req = req.header(*k, *v);
                }
                if let Some(ct) = content_type {
                    req = req.header("content-type", *ct);
                }
                let res = req.send().await.expect("request");
                let status = res.status();
                let text = res.text().await.unwrap();
                assert!(
                    status == StatusCode::FORBIDDEN || status == StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "POST {path} {headers:?} {content_type:?}: {status} {text}"
                );
                if path.starts_with("/api/") {
                    let body: Value = serde_json::from_str(&text).expect("a JSON error");
                    let kind = body["error"]["kind"].as_str().unwrap_or_default();
                    assert!(
                        ["cross_site", "unsupported_media_type"].contains(&kind),
                        "{path}: {body}"
                    );
                }
            }
        }
    }
    assert_eq!(everything(&f).await, before, "nothing was done");

    // This console's own origin, with JSON: done.
    let own = format!("http://127.0.0.1:{port}");
    let abort = format!("/api/v1/sagas/{}/abort", f.running);
    let req = api
        .request(reqwest::Method::POST, &abort)
        .header("origin", &own)
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/json");
    let (status, body) = Api::send(req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["saga"]["state"], "compensating");
    // A client that is no browser (curl, the CLI's users) sends JSON and no Origin.
    let purge = format!("/api/v1/dead/{}/purge", f.dead_sms);
    assert_eq!(api.ok_post(&purge, Value::Null).await["purged"], 1);

    // With tokens, the API takes no ambient cookie: a page elsewhere cannot borrow it.
    let tokens = Api::console(
        &f.console,
        HttpConfig {
            read_token: Some("read-me".into()),
            action_token: Some("act".into()),
            ..HttpConfig::default()
        },
    )
    .await;
    let skip = format!("/api/v1/sagas/{}/skip", f.stuck[1]);
    let with_cookie = |method: reqwest::Method, path: &str| {
        tokens
            .client
            .request(method, format!("{}{path}", tokens.base))
            .header("cookie", "agentsaga_token=act")
            .header("content-type", "application/json")
    };
    assert_error(
        &Api::send(with_cookie(reqwest::Method::POST, &skip)).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "the cookie acting on the API",
    );
    assert_error(
        &Api::send(with_cookie(reqwest::Method::GET, "/api/v1/sagas")).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "the cookie reading the API",
    );
    assert_eq!(
        f.console.saga(f.stuck[1]).await.unwrap().saga.state,
        "stuck",
        "nothing was done"
    );
}
both_backends!(cross_site_tests, cross_site_requests_change_nothing);

async fn rebound_hosts_are_refused(backend: Backend) {
    let f = prepare(backend).await;
    let api = Api::console(
        &f.console,
        HttpConfig {
            allowed_hosts: vec!["console.internal".into()],
            ..HttpConfig::default()
        },
    )
    .await;
    let port = api.base.rsplit(':').next().unwrap().to_owned();
    let before = everything(&f).await;
    let with_host = |method: reqwest::Method, path: &str, host: &str| {
        api.request(method, path)
            .header("host", host)
            .header("content-type", "application/json")
    };
    // A page at evil.example whose name now points at 127.0.0.1: its requests carry
    // its own name.
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("localhost.evil.example:{port}"),
        format!("console.internal.evil.example:{port}"),
        String::new(),
    ] {
        for path in ["/api/v1/sagas", "/api/v1/status", "/api/v1/dead"] {
            assert_error(
                &Api::send(with_host(reqwest::Method::GET, path, &host)).await,
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected",
                &format!("{host} {path}"),
            );
        }
        for path in ["/", "/sagas", "/dead"] {
            let res = with_host(reqwest::Method::GET, path, &host)
                .send()
                .await
                .unwrap();
            assert_eq!(
                res.status(),
                StatusCode::MISDIRECTED_REQUEST,
                "{host} {path}"
            );
            assert!(!res.text().await.unwrap().contains(&f.running.to_string()));
        }
        let abort = format!("/api/v1/sagas/{}/abort", f.running);
        assert_error(
            &Api::send(with_host(reqwest::Method::POST, &abort, &host)).await,
            StatusCode::MISDIRECTED_REQUEST,
            "misdirected",
            &format!("{host} abort"),
        );
    }
    assert_eq!(everything(&f).await, before, "nothing was done");

    // The names it is reached by: loopback names and addresses, the configured ones.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
        format!("console.internal:{port}"),
        "console.internal".to_owned(),
    ] {
        let (status, body) =
            Api::send(with_host(reqwest::Method::GET, "/api/v1/sagas", &host)).await;
        assert_eq!(status, StatusCode::OK, "{host}: {body}");
    }
}
both_backends!(host_tests, rebound_hosts_are_refused);

// ---------------------------------------------------------------------------------------
// Runtime::admin_router

struct Stock;

#[async_trait::async_trait]
impl agentsaga_runtime::Agent for Stock {
    type Command = Value;
    type Reply = String;
    fn destination(&self) -> &str {
        "stock"
    }
    async fn handle(
        &self,
        _: &mut agentsaga_runtime::AgentContext<'_>,
        _: Value,
    ) -> Result<String, agentsaga_runtime::StepError> {
        Ok("reserved".into())
    }
}

async fn the_runtime_router_starts_its_sagas(backend: Backend) {
    let order = Saga::<Value>::builder("order", 1)
        .step(Step::new("reserve", "stock").compensate("stock", |_: &Value| json!("release")))
        .build()
        .unwrap();
    let rt = agentsaga_runtime::Runtime::builder()
        .database(fresh_url(backend).await)
        .agent(Stock)
        .saga(order)
        .start()
        .await
        .unwrap();
    let server = Api::serve(rt.admin_router(HttpConfig {
        action_token: Some("t".into()),
        ..HttpConfig::default()
    }))
    .await;
    let api = server.with_token(Some("t"));
    let started = api
        .ok_post("/api/v1/sagas", json!({"name": "order", "data": {"id": 1}}))
        .await;
    assert_eq!(started["saga"]["name"], "order", "{started}");
    let id: SagaId = started["saga"]["id"].as_str().unwrap().parse().unwrap();
    let state = tokio::time::timeout(Duration::from_secs(30), rt.wait(id))
        .await
        .expect("the saga finishes")
        .unwrap();
    assert_eq!(state, SagaState::Completed);
    let show = api.ok(&format!("/api/v1/sagas/{id}")).await;
    assert_eq!(show["saga"]["state"], "completed");
    assert_eq!(show["steps"][0]["state"], "succeeded");
    let status = api.ok("/api/v1/status").await;
    assert_eq!(status["stalled_after_ms"], 900_000);
    assert_error(
        &api.post("/api/v1/sagas", json!({"name": "trip"})).await,
        StatusCode::NOT_FOUND,
        "not_found",
        "a saga the runtime does not host",
    );
    drop(server);
    rt.shutdown().await;
}
both_backends!(runtime_tests, the_runtime_router_starts_its_sagas);
