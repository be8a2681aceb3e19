//! Bad ids and values: refused before the database is touched.

use agentsaga_core::testing::{Backend, fresh_url};

use crate::common::{expect_failure, fails, ok, run, sqlite_path};
use crate::documents::*;

pub(crate) async fn bad_ids_and_values(backend: Backend) {
    let url = fresh_url(backend).await;
    // A database agentsaga never migrated (an empty SQLite file, a fresh Postgres
    // database) is refused by every command but `migrate`, and left as it was.
    if backend == Backend::Sqlite {
        std::fs::write(sqlite_path(&url), b"").unwrap();
    }
    for args in [&["status"][..], &["dead", "purge", "--older-than", "1d"]] {
        let e = fails(&url, args);
        assert!(e.contains("holds no agentsaga tables"), "{e}");
    }
    if backend == Backend::Sqlite {
        assert_eq!(std::fs::metadata(sqlite_path(&url)).unwrap().len(), 0);
    }
    assert!(ok(&url, &["migrate"]).contains("schema up to date"));
    let unknown = "0190a8f0-0000-7000-8000-000000000000";
    for args in [
        &["sagas", "show", unknown][..],
        &["sagas", "abort", unknown],
        &["sagas", "retry", unknown],
        &["sagas", "skip", unknown],
    ] {
        let e = fails(&url, args);
        assert!(e.contains(&format!("no saga with id {unknown}")), "{e}");
    }
    for args in [
        &["dead", "show", unknown][..],
        &["dead", "redrive", unknown],
    ] {
        let e = fails(&url, args);
        assert!(e.contains("not found"), "{e}");
    }
    for (args, want) in [
        (&["sagas", "show", "nope"][..], "not a UUID"),
        (&["sagas", "abort", "1234"], "not a UUID"),
        (&["dead", "show", "xyz"], "not a UUID"),
        (&["dead", "redrive", "xyz"], "not a UUID"),
        (&["prune", "--older-than", "7x"], "invalid duration \"7x\""),
        (
            &["dead", "purge", "--older-than", "soon"],
            "expected a number and a unit",
        ),
        (
            &["sagas", "list", "--state", "bogus"],
            "unknown saga state `bogus`",
        ),
    ] {
        let r = run(&url, args);
        let e = expect_failure(&r, &args);
        assert_eq!(r.code, Some(2), "a usage error: {r:?}");
        assert!(e.contains(want), "{args:?}: {e}");
    }
    let s = status(&url);
    assert_eq!(s["sagas_total"], 0);
    assert_eq!(s["outbox"]["pending"], 0);
}
