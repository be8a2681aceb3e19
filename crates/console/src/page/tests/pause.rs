//! A saga paused and resumed by its page's buttons: the badge says who paused it and
//! why (escaped), the form needs a reason, another site is refused.

use agentsaga_core::Store;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::query;

use super::{EVIL, client, get, running_saga, serve};
use crate::page::html::pct;

// Pause needs a reason and is refused from another site; paused, the page wears the
// badge and offers Resume (the saga's own actions unchanged); resumed, Pause again;
// a second pause or resume is refused with the page saying why.
#[tokio::test]
async fn a_saga_is_paused_and_resumed_from_its_page() {
    let url = fresh_url(Backend::Sqlite).await;
    let store = Store::connect(&url).await.unwrap();
    let id = running_saga(&store).await;
    let base = serve(store.clone(), None).await;
    let page_url = format!("{base}/sagas/{id}");
    let post = |action: &str, form: String| {
        client()
            .post(format!("{base}/sagas/{id}/{action}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
    };
    let paused = async || query::get(&store, id).await.unwrap().unwrap().paused;

    let (_, page) = get(&page_url).await;
    for want in [
        "id=\"pause-actions\"",
        &format!("action=\"/sagas/{id}/pause\""),
        "name=\"reason\"",
        "id=\"action-pause\"",
        "id=\"action-abort\"",
    ] {
        assert!(page.contains(want), "{want}: {page}");
    }
    assert!(!page.contains("id=\"paused\""), "{page}");
    assert!(!page.contains("action-resume"), "{page}");

    let evil = format!("reason={}", pct(EVIL));
    let r = post("pause", evil.clone())
        .header("origin", "http://evil.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    for empty in ["", "reason=", "reason=+++", "by=someone"] {
        let r = post("pause", empty.to_owned()).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{empty:?}");
        assert!(r.text().await.unwrap().contains("`reason`"), "{empty:?}");
    }
    assert_eq!(paused().await, None, "nothing done");

    let r = post("pause", evil.clone()).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(
        r.headers()["location"].to_str().unwrap(),
        format!("/sagas/{id}?done=pause")
    );
    let p = paused().await.expect("paused");
    assert_eq!((p.by.as_str(), p.reason.as_str()), ("console", EVIL));
    let (_, page) = get(&format!("{page_url}?done=pause")).await;
    assert!(!page.contains("<img"), "not escaped: {page}");
    for want in [
        "Paused: the saga sends nothing new until it is resumed.",
        "class=\"badge st-paused\" id=\"paused\"",
        ">Paused by console: &lt;img src=x onerror=alert(1)&gt;&quot;&#39;&amp;</span>",
        &format!("action=\"/sagas/{id}/resume\""),
        "id=\"action-resume\"",
        "id=\"action-abort\"",
    ] {
        assert!(page.contains(want), "{want}: {page}");
    }
    assert!(!page.contains("action-pause"), "{page}");

    let r = post("pause", "reason=again".to_owned())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409);
    let body = r.text().await.unwrap();
    assert!(body.contains("Refused, nothing was changed"), "{body}");
    assert_eq!(paused().await.expect("still paused").reason, EVIL);

    let r = post("resume", String::new()).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(
        r.headers()["location"].to_str().unwrap(),
        format!("/sagas/{id}?done=resume")
    );
    assert_eq!(paused().await, None);
    let (_, page) = get(&format!("{page_url}?done=resume")).await;
    assert!(
        page.contains("Resumed: what its pause held back goes out."),
        "{page}"
    );
    assert!(page.contains("id=\"action-pause\""), "{page}");
    assert!(!page.contains("id=\"paused\""), "{page}");
    let r = post("resume", String::new()).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 409);
    store.close().await;
}
