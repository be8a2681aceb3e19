//! A saga rewound from its page: "Rewind to" offers the steps it has taken and needs a
//! step and a reason; another site is refused; a refusal (a step in flight) says why;
//! the rewind shows as "Rewinding to …" while under way, then "Rewound to …" (escaped).

use agentsaga_core::Store;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::testing::{pump, pump_until, quick_engine};
use agentsaga_saga::{Saga, SagaDefinition, Step, StepState, query};
use serde_json::{Value, json};

use super::{EVIL, client, get, serve};
use crate::Console;
use crate::page::html::{esc, pct};

/// `research` and `draft`, each undoable, then `send`, the pivot.
fn drafting() -> SagaDefinition {
    let undoable = |n: &str| {
        Step::<Value>::new(n, format!("{n}-agent"))
            .command(|d: &Value| d.clone())
            .compensate(format!("{n}-agent"), |_: &Value| json!("undo"))
    };
    Saga::<Value>::builder("page_drafting", 1)
        .step(undoable("research"))
        .step(undoable("draft"))
        .pivot(Step::new("send", "send-agent").command(|d: &Value| d.clone()))
        .build()
        .unwrap()
}

// Running with `research` out: the form offers `research`; a rewind from another site
// is 403, one without a step or a reason 400, one to a step in flight 409 (pause
// first), to a step never taken 409. Paused once `draft` is out, and rewound to
// `draft` when it answered: "Rewinding to `draft` by console: …" (the form gone while
// it undoes), a second rewind refused; its runtime undoes `draft` and runs it again to
// the end: "Rewound to `draft` by console: …", undid draft.
#[tokio::test]
async fn a_saga_is_rewound_from_its_page() {
    let url = fresh_url(Backend::Sqlite).await;
    let store = Store::connect(&url).await.unwrap();
    let engine = quick_engine([drafting()]);
    let mut tx = store.begin().await.unwrap();
    let id = engine
        .start(&mut tx, "page_drafting", &json!({ "note": EVIL }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let base = serve(store.clone(), None).await;
    let page_url = format!("{base}/sagas/{id}");
    let post = |form: String| {
        client()
            .post(format!("{base}/sagas/{id}/rewind"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
    };
    let rewinds = async || query::rewinds(&store, id).await.unwrap();

    let (_, page) = get(&page_url).await;
    for want in [
        "id=\"rewind-actions\"",
        &format!("action=\"/sagas/{id}/rewind\""),
        "<select name=\"to\" id=\"rewind-to\" required><option value=\"research\">research</option></select>",
        "id=\"rewind-reason\"",
        "id=\"action-rewind\"",
    ] {
        assert!(page.contains(want), "{want}: {page}");
    }
    assert!(!page.contains("id=\"rewinds\""), "never rewound: {page}");

    let evil = format!("to=research&reason={}", pct(EVIL));
    let r = post(evil.clone())
        .header("origin", "http://evil.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    for (form, names) in [
        ("", "`to`"),
        ("reason=x", "`to`"),
        ("to=+&reason=x", "`to`"),
        ("to=research", "`reason`"),
        ("to=research&reason=+++", "`reason`"),
    ] {
        let r = post(form.to_owned()).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{form:?}");
        assert!(r.text().await.unwrap().contains(names), "{form:?}");
    }
    for (form, says) in [
        (evil.as_str(), "is in flight (pause the saga"),
        ("to=nope&reason=x", "no step `nope`"),
    ] {
        let r = post(form.to_owned()).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 409, "{form:?}");
        let body = r.text().await.unwrap();
        assert!(body.contains("Refused, nothing was changed"), "{body}");
        assert!(body.contains(&esc(says)), "{says}: {body}");
    }
    assert!(rewinds().await.is_empty(), "nothing done");

    // `research` answered, `draft` out: paused; once `draft` answered, nothing is in
    // flight and `send` is held.
    pump_until(&store, &engine, "`draft` sent", async || {
        query::steps(&store, id).await.unwrap().len() == 2
    })
    .await;
    Console::new(store.clone())
        .pause(id, "ops-anna", "look")
        .await
        .unwrap();
    pump_until(&store, &engine, "`draft` answered", async || {
        let steps = query::steps(&store, id).await.unwrap();
        steps.len() == 2 && steps.iter().all(|s| s.state == StepState::Succeeded)
    })
    .await;
    let (_, page) = get(&page_url).await;
    assert!(
        page.contains(
            "<option value=\"research\">research</option><option value=\"draft\">draft</option>"
        ),
        "{page}"
    );

    let r = post(format!("to=draft&reason={}", pct(EVIL)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(
        r.headers()["location"].to_str().unwrap(),
        format!("/sagas/{id}?done=rewind")
    );
    let done = rewinds().await;
    assert_eq!(done.len(), 1);
    assert_eq!(
        (
            done[0].to.as_str(),
            done[0].by.as_str(),
            done[0].reason.as_str()
        ),
        ("draft", "console", EVIL)
    );
    assert_eq!(done[0].done_ms, None, "under way");
    let (_, page) = get(&format!("{page_url}?done=rewind")).await;
    assert!(!page.contains("<img"), "not escaped: {page}");
    for want in [
        "Rewound: the chosen step and those after it are undone, then the saga runs again from it.",
        "id=\"rewinds\"",
        "<li id=\"rewinding\">Rewinding to <code>draft</code> by console: \
         &lt;img src=x onerror=alert(1)&gt;&quot;&#39;&amp; ",
    ] {
        assert!(page.contains(want), "{want}: {page}");
    }
    for gone in ["id=\"rewind-actions\"", "id=\"paused\""] {
        assert!(!page.contains(gone), "{gone}: {page}");
    }
    let r = post("to=draft&reason=again".to_owned())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409);
    assert!(r.text().await.unwrap().contains("a rewind is under way"));
    assert_eq!(rewinds().await.len(), 1);

    // Its runtime undoes `draft` and runs the saga again from it, to the end.
    pump(&store, &engine, &[id]).await;
    let (_, page) = get(&page_url).await;
    for want in [
        "<li class=\"rewound\">Rewound to <code>draft</code> by console: \
         &lt;img src=x onerror=alert(1)&gt;&quot;&#39;&amp; ",
        "undid draft)",
        "data-state=\"completed\"",
    ] {
        assert!(page.contains(want), "{want}: {page}");
    }
    for gone in ["id=\"rewinding\"", "id=\"rewind-actions\""] {
        assert!(!page.contains(gone), "{gone}: {page}");
    }
    store.close().await;
}
