//! The page over a real router and a fresh SQLite database: every value from the
//! database escaped, actions refused from another site, done from this one (a pause
//! and its resume: `tests/pause.rs`; a rewind: `tests/rewind.rs`).

use agentsaga_core::Store;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::{Engine, Saga, SagaId, SagaState, Step, query};
use serde_json::{Value, json};

use crate::Console;
use crate::http::{HttpConfig, router};

mod pause;
mod rewind;

const EVIL: &str = "<img src=x onerror=alert(1)>\"'&";

async fn serve(store: Store, jaeger: Option<&str>) -> String {
    let app = router(
        Console::new(store),
        HttpConfig {
            jaeger_url: jaeger.map(str::to_owned),
            ..HttpConfig::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A saga whose one step goes nowhere: it stays running, with `EVIL` as its key and
/// in its data.
async fn running_saga(store: &Store) -> SagaId {
    let def = Saga::<Value>::builder("page_test", 1)
        .step(
            Step::new("hold", "nowhere")
                .command(|v: &Value| v.clone())
                .compensate("nowhere", |_: &Value| json!({ "op": "release" })),
        )
        .build()
        .unwrap();
    let engine = Engine::new([def]).unwrap();
    let mut tx = store.begin().await.unwrap();
    let id = engine
        .accept_keyed(&mut tx, "page_test", Some(EVIL), json!({ "note": EVIL }))
        .await
        .unwrap()
        .id();
    tx.commit().await.unwrap();
    id
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn get(url: &str) -> (u16, String) {
    let r = client().get(url).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn pages_escape_what_the_database_holds() {
    let store = Store::connect(&fresh_url(Backend::Sqlite).await)
        .await
        .unwrap();
    let id = running_saga(&store).await;
    let base = serve(store, Some("http://jaeger.test:16686/")).await;
    for path in [
        "/".to_owned(),
        "/fragments/overview".to_owned(),
        "/sagas".to_owned(),
        format!("/sagas?key={}", super::html::pct(EVIL)),
        format!("/sagas/{id}"),
        "/dead".to_owned(),
    ] {
        let (status, body) = get(&format!("{base}{path}")).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(!body.contains("<img"), "{path} is not escaped: {body}");
    }
    let (_, body) = get(&format!("{base}/sagas?key={}", super::html::pct(EVIL))).await;
    assert!(body.contains(&id.to_string()), "the key filter finds it");
    assert!(body.contains("&lt;img src=x onerror=alert(1)&gt;&quot;&#39;&amp;"));
    let (_, page) = get(&format!("{base}/sagas/{id}")).await;
    assert!(
        page.contains("id=\"action-abort\""),
        "a running saga offers abort"
    );
    assert!(!page.contains("action-retry"));
    assert!(page.contains(
        "http://jaeger.test:16686/search?service=page_test&amp;tags=%7B%22saga.id%22%3A%22"
    ));
    assert!(page.contains("data-kind=\"step\" data-step=\"hold\""));

    let (status, body) = get(&format!("{base}/sagas/not-a-uuid")).await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = get(&format!("{base}/sagas/{}", SagaId::new())).await;
    assert_eq!(status, 404);
    let (status, body) = get(&format!("{base}/sagas?state=sleeping")).await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = get(&format!("{base}/sagas?stalled=maybe")).await;
    assert_eq!(status, 400);

    let (_, css) = get(&format!("{base}/assets/console.css")).await;
    assert!(css.contains(".tl-bar"));
    let r = client()
        .get(format!("{base}/assets/console.js"))
        .send()
        .await
        .unwrap();
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
    assert!(r.text().await.unwrap().contains("confirm"));
}

#[tokio::test]
async fn actions_refuse_other_sites_and_redirect_to_the_saga() {
    let url = fresh_url(Backend::Sqlite).await;
    let store = Store::connect(&url).await.unwrap();
    let id = running_saga(&store).await;
    let base = serve(store.clone(), None).await;
    let abort = format!("{base}/sagas/{id}/abort");
    let host = base.trim_start_matches("http://");

    for (name, value) in [
        ("origin", "http://evil.test".to_owned()),
        ("sec-fetch-site", "cross-site".to_owned()),
        ("sec-fetch-site", "same-site".to_owned()),
        ("origin", "null".to_owned()),
    ] {
        let r = client()
            .post(&abort)
            .header(name, value)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403, "{name}");
    }
    let state = |store: Store| async move { query::get(&store, id).await.unwrap().unwrap().state };
    assert_eq!(
        state(store.clone()).await,
        SagaState::Running,
        "nothing done"
    );

    let r = client()
        .post(format!("{base}/sagas/{id}/launch"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    let r = client()
        .post(&abort)
        .header("origin", format!("http://{host}"))
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(
        r.headers()["location"].to_str().unwrap(),
        format!("/sagas/{id}?done=abort")
    );
    let now = state(store.clone()).await;
    assert_eq!(
        now,
        SagaState::Compensating,
        "the step's undo is on its way"
    );
    let (_, page) = get(&format!("{base}/sagas/{id}?done=abort")).await;
    assert!(
        page.contains("Abort done: the saga is now <b>compensating</b>"),
        "{page}"
    );
    assert!(page.contains("data-kind=\"compensation\" data-step=\"hold\""));

    // Aborting again is refused by the engine: the saga's page says why, with a 409.
    let r = client().post(&abort).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 409);
    let body = r.text().await.unwrap();
    assert!(body.contains("Refused, nothing was changed"), "{body}");

    let r = client()
        .post(format!("{base}/dead/{}/purge", SagaId::new()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
}

// A saga's page shows what it and each step used and its budget; one held by its spent
// budget says why and how a person raises it (and, raised, that it waits for its
// runtime); one that never used anything says so.
#[tokio::test]
async fn a_saga_shows_its_usage_and_why_it_waits_for_a_raise() {
    use agentsaga_saga::testing::{capped, quick_engine, waiting_for_raise};

    let url = fresh_url(Backend::Sqlite).await;
    let store = Store::connect(&url).await.unwrap();
    let id = waiting_for_raise(&store, &quick_engine([capped()])).await;
    let idle = running_saga(&store).await;
    let base = serve(store.clone(), None).await;

    let (status, page) = get(&format!("{base}/sagas/{id}")).await;
    assert_eq!(status, 200, "{page}");
    for want in [
        "<dd id=\"usage\">tokens_in 30, tokens_out 100</dd>",
        "<dd id=\"budget\">at most tokens_out 100; once spent, wait for a raise</dd>",
        "id=\"waiting-for-raise\">Waiting for a person to raise its budget: spent: \
         tokens_out 100 of 100",
        &format!("`agentsaga sagas raise-budget {id} --tokens-out N`"),
        "<th>Usage</th>",
        "<td>tokens_in 30, tokens_out 100</td></tr>",
    ] {
        assert!(page.contains(want), "{want}: {page}");
    }
    // Raised where no runtime hosts it (as `agentsaga serve`): held until one does.
    Console::new(store.clone())
        .raise_budget(id, agentsaga_saga::Budget::new().tokens_out(1_000))
        .await
        .unwrap();
    let (_, page) = get(&format!("{base}/sagas/{id}")).await;
    assert!(
        page.contains(
            "<dd id=\"budget\">at most tokens_out 1000; once spent, wait for a raise</dd>"
        ),
        "{page}"
    );
    assert!(
        page.contains("id=\"waiting-for-raise\">raised: the steps held back go out"),
        "{page}"
    );
    let (_, page) = get(&format!("{base}/sagas/{idle}")).await;
    assert!(page.contains("<dd id=\"usage\">none</dd>"), "{page}");
    assert!(!page.contains("id=\"budget\""), "no budget: {page}");
    assert!(!page.contains("waiting-for-raise"), "{page}");
    store.close().await;
}

// A saga parked at a sleep: its page says until when and how long from now, its
// timeline bar says the same, the list names it, and `?sleeping=true` of the API finds
// it (with `sleeping_until`).
#[tokio::test]
async fn a_sleeping_saga_shows_when_it_wakes() {
    let url = fresh_url(Backend::Sqlite).await;
    let store = Store::connect(&url).await.unwrap();
    let def = Saga::<Value>::builder("napper", 1)
        .step(Step::sleep(
            "nap",
            std::time::Duration::from_secs(2 * 3600 + 600),
        ))
        .pivot(Step::new("after", "nowhere"))
        .build()
        .unwrap();
    let engine = Engine::new([def]).unwrap();
    let mut tx = store.begin().await.unwrap();
    let id = engine.start(&mut tx, "napper", &json!({})).await.unwrap();
    tx.commit().await.unwrap();
    let idle = running_saga(&store).await;
    let base = serve(store.clone(), None).await;

    let (status, page) = get(&format!("{base}/sagas/{id}")).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("<dt>Sleeping</dt><dd id=\"sleeping\">until <time"),
        "{page}"
    );
    // 2 h 10 min ahead, give or take the test's own seconds.
    assert!(
        page.contains("(in 2 h 9 min)") || page.contains("(in 2 h 10 min)"),
        "{page}"
    );
    assert!(
        page.contains("sleeps until 20"),
        "the timeline's bar: {page}"
    );
    let (_, list) = get(&format!("{base}/sagas")).await;
    assert!(list.contains("sleeps until <time"), "{list}");

    let (status, body) = get(&format!("{base}/api/v1/sagas?sleeping=true")).await;
    assert_eq!(status, 200, "{body}");
    let page: Value = serde_json::from_str(&body).unwrap();
    let sagas = page["sagas"].as_array().unwrap();
    assert_eq!(sagas.len(), 1, "{body}");
    assert_eq!(sagas[0]["id"], json!(id.to_string()));
    assert!(sagas[0]["sleeping_until_ms"].as_i64().is_some(), "{body}");
    let (_, page) = get(&format!("{base}/sagas/{idle}")).await;
    assert!(!page.contains("id=\"sleeping\""), "{page}");
    store.close().await;
}

// The schedules' page: each with its calendar, when it is due next (and how far off),
// its counts, its name escaped; paused and resumed by its button from this origin only.
#[tokio::test]
async fn schedules_show_when_they_fire_and_pause_from_the_page() {
    use agentsaga_saga::schedule::{self, Schedule};

    let url = fresh_url(Backend::Sqlite).await;
    let store = Store::connect(&url).await.unwrap();
    let base = serve(store.clone(), None).await;
    let (_, empty) = get(&format!("{base}/schedules")).await;
    assert!(empty.contains("id=\"none\""), "{empty}");
    let s = Schedule::new(EVIL, "page_test", "0 7 * * MON-FRI").time_zone("Europe/Paris");
    schedule::create(&store, &s).await.unwrap();

    let (status, page) = get(&format!("{base}/schedules")).await;
    assert_eq!(status, 200, "{page}");
    assert!(!page.contains("<img"), "not escaped: {page}");
    for want in [
        "<a href=\"/schedules\" aria-current=\"page\">Schedules</a>",
        "<code>0 7 * * MON-FRI</code><div class=\"muted\">Europe/Paris</div>",
        "data-state=\"active\"",
        "<div class=\"muted\" data-in>in ",
        "<span data-count=\"fired\">0</span> / <span data-count=\"skipped\">0</span>",
        "<span class=\"muted\">never</span>",
    ] {
        assert!(page.contains(want), "{want}: {page}");
    }
    let pause = format!("{base}/schedules/{}/pause", super::html::pct(EVIL));
    assert!(page.contains(&format!(
        "action=\"/schedules/{}/pause\"",
        super::html::pct(EVIL)
    )));
    let r = client()
        .post(&pause)
        .header("origin", "http://evil.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(
        !schedule::get(&store, EVIL)
            .await
            .unwrap()
            .unwrap()
            .schedule
            .paused
    );

    let r = client().post(&pause).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    assert!(
        location.starts_with("/schedules?done=paused&id="),
        "{location}"
    );
    assert!(
        schedule::get(&store, EVIL)
            .await
            .unwrap()
            .unwrap()
            .schedule
            .paused
    );
    let (_, page) = get(&format!("{base}{location}")).await;
    assert!(page.contains("id=\"notice\""), "{page}");
    assert!(page.contains("data-state=\"paused\""), "{page}");
    assert!(page.contains("name=\"resume\""), "{page}");
    assert!(!page.contains("<img"), "not escaped: {page}");
    let (_, other) = get(&format!("{base}/schedules?done=paused&id=made-up")).await;
    assert!(
        !other.contains("made-up"),
        "only a schedule that exists is echoed"
    );

    let r = client()
        .post(format!("{base}/schedules/none/pause"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let r = client()
        .post(format!(
            "{base}/schedules/{}/launch",
            super::html::pct(EVIL)
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    store.close().await;
}
