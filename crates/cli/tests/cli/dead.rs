//! Moot dead letters: never re-driven, purged with `--force`.

use agentsaga_core::Store;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::Engine;

use crate::common::{self, fails, json, ok};
use crate::documents::*;

// A dead-lettered saga command whose saga has since compensated is moot: re-driving it
// would let the do land after its undo. `dead list` says so, `redrive` refuses it (one
// or `--all`), and `--force` purges it instead.
pub(crate) async fn moot_dead_letters_are_not_redriven(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let engine = Engine::new([common::trip()]).unwrap();
    let (id, command) = common::moot_dead_letter(&store, &engine).await;
    let saga = json(&url, &["sagas", "show", &id.to_string(), "--json"]);
    assert_eq!(saga["saga"]["state"], "compensated");
    let dead = command.to_string();

    let list = json(&url, &["dead", "list", "--json"]);
    let moot = list["dead_letters"][0]["moot"].as_str().unwrap_or_default();
    assert!(moot.contains("compensated"), "{list}");
    let e = fails(&url, &["dead", "redrive", &dead]);
    assert!(e.contains("refused") && e.contains("--force"), "{e}");
    let out = ok(&url, &["dead", "redrive", "--all"]);
    assert!(
        out.contains("re-drove 0") && out.contains("refused"),
        "{out}"
    );
    assert_eq!(status(&url)["outbox"]["dead"], 1, "still dead, not pending");
    let out = ok(&url, &["dead", "redrive", &dead, "--force"]);
    assert!(out.contains("purged"), "{out}");
    assert_eq!(status(&url)["outbox"]["dead"], 0);
    assert!(fails(&url, &["dead", "show", &dead]).contains("not found"));
}
