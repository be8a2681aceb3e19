//! Set-aside starts: shown, listed, removed.

use agentsaga_core::Store;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::{Engine, Saga, Step};
use serde_json::{Value, json};

use crate::common::{assert_keys, fails, json, ok};
use crate::documents::*;

/// A waiting start that could not be started (its data no longer decodes after a
/// deploy) shows in `status` and `starts list`, and `starts remove` deletes it.
pub(crate) async fn set_aside_starts(backend: Backend) {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Job {
        n: u32,
    }
    fn saga<D>(command: fn(&D) -> Value) -> agentsaga_saga::SagaDefinition
    where
        D: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        Saga::<D>::builder("job", 1)
            .step(
                Step::new("work", "worker")
                    .command(command)
                    .nothing_to_undo(),
            )
            .build()
            .unwrap()
    }
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    // Any JSON at first: one in flight, a start waits.
    let engine = Engine::new([saga::<Value>(Value::clone)])
        .unwrap()
        .with_max_in_flight(Some(1));
    let mut tx = store.begin().await.unwrap();
    engine
        .accept(&mut tx, "job", json!({"n": 1}))
        .await
        .unwrap();
    let bad = engine
        .accept(&mut tx, "job", json!({"n": "one"}))
        .await
        .unwrap()
        .id();
    tx.commit().await.unwrap();
    // Then `Job`, with room for one more: its turn comes, it cannot start.
    let engine = Engine::new([saga::<Job>(|j| json!({"n": j.n}))])
        .unwrap()
        .with_max_in_flight(Some(2));
    let mut tx = store.begin().await.unwrap();
    assert!(engine.admit(&mut tx, "job").await.unwrap().is_empty());
    tx.commit().await.unwrap();
    store.close().await;

    let s = status(&url);
    assert_eq!(s["starts_set_aside"], json!({"job": 1}), "{s}");
    assert_eq!(s["starts_waiting"], json!({}), "{s}");
    let out = ok(&url, &["status"]);
    assert!(
        out.contains("starts set aside (could not start when their turn came): 1 (job 1)"),
        "{out}"
    );
    let list = json(&url, &["starts", "list", "--json"]);
    let starts = list["set_aside"].as_array().unwrap();
    assert_eq!(starts.len(), 1, "{list}");
    assert_keys(
        &starts[0],
        &[
            "id",
            "name",
            "data",
            "error",
            "created_at",
            "created_at_ms",
            "set_aside_at",
            "set_aside_at_ms",
        ],
    );
    assert_eq!(starts[0]["id"], bad.to_string());
    assert_eq!(starts[0]["data"], json!({"n": "one"}));
    assert!(
        starts[0]["error"].as_str().unwrap().contains("saga data"),
        "{list}"
    );
    assert!(is_rfc3339(&starts[0]["set_aside_at"]), "{list}");
    let out = ok(&url, &["starts", "list"]);
    assert!(out.contains(&bad.to_string()), "{out}");

    let out = ok(&url, &["starts", "remove", &bad.to_string()]);
    assert!(out.contains("removed the set-aside start"), "{out}");
    let e = fails(&url, &["starts", "remove", &bad.to_string()]);
    assert!(e.contains("no set-aside start"), "{e}");
    assert_eq!(ok(&url, &["starts", "list"]).trim(), "no set-aside starts");
    assert_eq!(status(&url)["starts_set_aside"], json!({}));
}
