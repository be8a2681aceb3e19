//! The two migration trees (`migrations/sqlite`, `migrations/postgres`) define the same
//! schema: the same tables, columns (with a coarse type class and nullability), primary
//! keys, unique constraints, foreign keys, columns under a CHECK, indexes (name,
//! columns, uniqueness, partial-index predicate), and triggers (table and name).
//!
//! Each database is migrated by `Store::connect`, then introspected (SQLite:
//! `sqlite_master` and the `pragma_*` table functions; PostgreSQL: `information_schema`
//! and the `pg_catalog` tables) into a set of one-line facts, and the two sets are
//! compared. A fact on one side only fails the test unless it is in [`INTENDED`], which
//! says why; an entry of [`INTENDED`] that no longer differs fails it too, so the list
//! stays exact.
//!
//! Not compared: defaults (SQLite has no `now()`; its times are written by the code),
//! CHECK expressions (only which columns are under a CHECK), `AUTOINCREMENT` against
//! `GENERATED ALWAYS AS IDENTITY`, `WITHOUT ROWID`, the grouping parentheses of
//! partial-index predicates.
#![cfg(all(feature = "sqlite", feature = "postgres"))]

use std::collections::{BTreeMap, BTreeSet};

use agentsaga_core::Store;
use agentsaga_core::testing::{Backend, fresh_url};
use sqlx::{PgPool, SqlitePool};

#[path = "schema_parity/intended.rs"]
mod intended;

use intended::{INTENDED, Only};

#[path = "schema_parity/postgres.rs"]
mod postgres;

use postgres::postgres_facts;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_migration_trees_define_the_same_schema() {
    let sqlite = sqlite_facts(&migrated_sqlite().await).await;
    let pg_url = fresh_url(Backend::Postgres).await;
    let store = Store::connect(&pg_url)
        .await
        .unwrap_or_else(|e| panic!("connect {pg_url}: {e}"));
    let Some(pool) = store.reader().postgres() else {
        panic!("{pg_url} did not open PostgreSQL")
    };
    let postgres = postgres_facts(pool).await;

    assert!(
        sqlite.iter().any(|f| f == "table outbox") && postgres.iter().any(|f| f == "table outbox"),
        "introspection found no outbox table:\nSQLite: {sqlite:#?}\nPostgreSQL: {postgres:#?}"
    );
    let problems = drift(&sqlite, &postgres, INTENDED);
    assert!(
        problems.is_empty(),
        "the SQLite and PostgreSQL migrations drifted apart (add the missing part to the \
         other tree, or list an intended difference in INTENDED with its reason):\n{}",
        problems.join("\n")
    );
}

/// The comparison can fail: a column and an index added to one of two identically
/// migrated databases are reported, and so is a stale entry of the allow-list.
#[tokio::test]
async fn drift_is_reported() {
    let base = sqlite_facts(&migrated_sqlite().await).await;
    let pool = migrated_sqlite().await;
    sqlx::raw_sql(
        "ALTER TABLE outbox ADD COLUMN extra TEXT; \
         CREATE INDEX inbox_consumer ON inbox (consumer);",
    )
    .execute(&pool)
    .await
    .expect("alter");
    let changed = sqlite_facts(&pool).await;

    // `changed` stands in for the PostgreSQL side.
    assert_eq!(
        drift(&base, &changed, &[]),
        [
            "only in PostgreSQL: column outbox.extra: text",
            "only in PostgreSQL: index inbox.inbox_consumer (consumer)",
        ],
    );
    assert_eq!(
        drift(&base, &base, &[(Only::Sqlite, "table outbox", "stale")]),
        ["listed in INTENDED but not a difference: only in SQLite: table outbox"],
    );
}

/// What is wrong between the two sets of facts, given the intended differences.
fn drift(
    sqlite: &BTreeSet<String>,
    postgres: &BTreeSet<String>,
    intended: &[(Only, &str, &str)],
) -> Vec<String> {
    let found: BTreeSet<(Only, &str)> = sqlite
        .difference(postgres)
        .map(|f| (Only::Sqlite, f.as_str()))
        .chain(
            postgres
                .difference(sqlite)
                .map(|f| (Only::Postgres, f.as_str())),
        )
        .collect();
    let allowed: BTreeSet<(Only, &str)> = intended.iter().map(|&(o, f, _)| (o, f)).collect();
    let side = |only: Only| match only {
        Only::Sqlite => "only in SQLite",
        Only::Postgres => "only in PostgreSQL",
    };
    let mut problems: Vec<String> = found
        .difference(&allowed)
        .map(|(only, fact)| format!("{}: {fact}", side(*only)))
        .collect();
    problems.extend(allowed.difference(&found).map(|(only, fact)| {
        format!(
            "listed in INTENDED but not a difference: {}: {fact}",
            side(*only)
        )
    }));
    problems
}

/// A fresh in-memory SQLite database with the migrations applied by the store.
async fn migrated_sqlite() -> SqlitePool {
    let store = Store::connect("sqlite::memory:")
        .await
        .expect("open sqlite::memory:");
    let Some(pool) = store.reader().sqlite() else {
        panic!("sqlite::memory: did not open SQLite")
    };
    pool.clone()
}

/// The class of a SQLite column of this declared type (SQLite's affinity rules).
fn sqlite_class(declared: &str) -> String {
    let t = declared.to_ascii_uppercase();
    let class = if t.contains("INT") {
        "integer"
    } else if t.contains("CHAR") || t.contains("CLOB") || t.contains("TEXT") {
        "text"
    } else if t.is_empty() || t.contains("BLOB") {
        "blob"
    } else if t.contains("REAL") || t.contains("FLOA") || t.contains("DOUB") {
        "real"
    } else {
        "numeric"
    };
    class.to_owned()
}

/// The SQLite class a PostgreSQL column type is written as in the SQLite tree.
fn postgres_class(data_type: &str) -> String {
    match data_type {
        "smallint" | "integer" | "bigint" => "integer",
        "text" | "character varying" | "character" => "text",
        // SQLite keeps UUIDs as their text form.
        "uuid" => "text",
        // SQLite keeps JSON as text.
        "json" | "jsonb" => "text",
        // SQLite keeps times as Unix milliseconds.
        "timestamp with time zone" | "timestamp without time zone" => "integer",
        "real" | "double precision" => "real",
        "bytea" => "blob",
        "numeric" | "boolean" => "numeric",
        other => return format!("unmapped PostgreSQL type {other}"),
    }
    .to_owned()
}

/// A partial-index predicate in one spelling for both databases: lower case, no
/// parentheses, no `::text` casts, `= ANY (ARRAY[…])` written `IN (…)`, single spaces.
fn predicate(p: &str) -> String {
    let p = p
        .to_lowercase()
        .replace("::text[]", "")
        .replace("::text", "")
        .replace("= any (array[", "in (")
        .replace(['(', ')', '[', ']'], " ");
    p.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn fk_action(pg: &str) -> &'static str {
    match pg {
        "a" => "NO ACTION",
        "r" => "RESTRICT",
        "c" => "CASCADE",
        "n" => "SET NULL",
        "d" => "SET DEFAULT",
        _ => "?",
    }
}

fn index_fact(
    table: &str,
    name: &str,
    columns: &[String],
    unique: bool,
    pred: Option<&str>,
) -> String {
    let mut fact = format!("index {table}.{name} ({})", columns.join(", "));
    if unique {
        fact.push_str(" unique");
    }
    if let Some(p) = pred {
        fact.push_str(&format!(" where {}", predicate(p)));
    }
    fact
}

async fn sqlite_facts(pool: &SqlitePool) -> BTreeSet<String> {
    let mut facts = BTreeSet::new();
    let tables: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' \
         AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name <> '_sqlx_migrations'",
    )
    .fetch_all(pool)
    .await
    .expect("sqlite_master");
    let triggers: Vec<(String, String)> =
        sqlx::query_as("SELECT tbl_name, name FROM sqlite_master WHERE type = 'trigger'")
            .fetch_all(pool)
            .await
            .expect("sqlite_master triggers");
    for (table, name) in triggers {
        facts.insert(format!("trigger {table}.{name}"));
    }
    for (table, sql) in tables {
        facts.insert(format!("table {table}"));

        let columns: Vec<(String, String, bool, i64)> =
            sqlx::query_as("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?)")
                .bind(&table)
                .fetch_all(pool)
                .await
                .expect("pragma_table_info");
        let mut primary_key: Vec<(i64, &str)> = Vec::new();
        for (name, declared, not_null, pk) in &columns {
            // A primary key column is NOT NULL in PostgreSQL; in SQLite an INTEGER
            // PRIMARY KEY cannot be NULL either, and the code never writes a NULL key.
            let not_null = if *not_null || *pk > 0 {
                ", not null"
            } else {
                ""
            };
            facts.insert(format!(
                "column {table}.{name}: {}{not_null}",
                sqlite_class(declared)
            ));
            if *pk > 0 {
                primary_key.push((*pk, name));
            }
        }
        primary_key.sort();
        let primary_key: Vec<&str> = primary_key.into_iter().map(|(_, c)| c).collect();
        facts.insert(format!("primary key {table} ({})", primary_key.join(", ")));

        let names: BTreeSet<&str> = columns.iter().map(|c| c.0.as_str()).collect();
        for cols in check_columns(&sql, &names) {
            facts.insert(format!("check {table} ({})", cols.join(", ")));
        }

        let fks: Vec<(i64, i64, String, String, Option<String>, String)> = sqlx::query_as(
            "SELECT id, seq, \"table\", \"from\", \"to\", on_delete \
             FROM pragma_foreign_key_list(?) ORDER BY id, seq",
        )
        .bind(&table)
        .fetch_all(pool)
        .await
        .expect("pragma_foreign_key_list");
        let mut by_id: BTreeMap<i64, (String, Vec<String>, Vec<String>, String)> = BTreeMap::new();
        for (id, _, parent, from, to, on_delete) in fks {
            let e = by_id
                .entry(id)
                .or_insert_with(|| (parent, Vec::new(), Vec::new(), on_delete));
            e.1.push(from);
            e.2.push(to.unwrap_or_else(|| "<primary key>".into()));
        }
        for (parent, from, to, on_delete) in by_id.into_values() {
            facts.insert(format!(
                "foreign key {table} ({}) -> {parent} ({}) on delete {on_delete}",
                from.join(", "),
                to.join(", ")
            ));
        }

        let indexes: Vec<(String, bool, String, bool)> =
            sqlx::query_as("SELECT name, \"unique\", origin, partial FROM pragma_index_list(?)")
                .bind(&table)
                .fetch_all(pool)
                .await
                .expect("pragma_index_list");
        for (name, unique, origin, partial) in indexes {
            let columns: Vec<Option<String>> =
                sqlx::query_scalar("SELECT name FROM pragma_index_info(?) ORDER BY seqno")
                    .bind(&name)
                    .fetch_all(pool)
                    .await
                    .expect("pragma_index_info");
            let columns: Vec<String> = columns
                .into_iter()
                .map(|c| c.unwrap_or_else(|| "<expr>".into()))
                .collect();
            match origin.as_str() {
                // Seen through pragma_table_info above.
                "pk" => {}
                "u" => {
                    facts.insert(format!("unique {table} ({})", columns.join(", ")));
                }
                _ => {
                    let pred = if partial {
                        let sql: String =
                            sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = ?")
                                .bind(&name)
                                .fetch_one(pool)
                                .await
                                .expect("index sql");
                        let at = sql
                            .to_ascii_uppercase()
                            .rfind("WHERE")
                            .unwrap_or_else(|| panic!("no WHERE in partial index {sql}"));
                        Some(sql[at + "WHERE".len()..].to_owned())
                    } else {
                        None
                    };
                    facts.insert(index_fact(&table, &name, &columns, unique, pred.as_deref()));
                }
            }
        }
    }
    facts
}

/// For each CHECK in a `CREATE TABLE` statement, the sorted names of the table's columns
/// its expression mentions (what PostgreSQL keeps in `pg_constraint.conkey`).
fn check_columns(sql: &str, columns: &BTreeSet<&str>) -> Vec<Vec<String>> {
    let upper = sql.to_ascii_uppercase();
    let bytes = sql.as_bytes();
    let mut checks = Vec::new();
    let mut from = 0;
    while let Some(found) = upper[from..].find("CHECK") {
        let start = from + found;
        from = start + "CHECK".len();
        let before = start.checked_sub(1).map(|i| bytes[i]);
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_') {
            continue;
        }
        let Some(open) = sql[from..].find('(').map(|i| from + i) else {
            continue;
        };
        if !sql[from..open].trim().is_empty() {
            continue;
        }
        // The parenthesised expression, skipping string literals.
        let (mut depth, mut i, mut idents, mut word) = (0, open, BTreeSet::new(), String::new());
        while i < bytes.len() {
            let b = bytes[i];
            if b == b'\'' {
                i += 1;
                while i < bytes.len() && bytes[i] != b'\'' {
                    i += 1;
                }
            } else if b.is_ascii_alphanumeric() || b == b'_' {
                word.push(b as char);
            } else {
                if columns.contains(word.as_str()) {
                    idents.insert(word.clone());
                }
                word.clear();
                if b == b'(' {
                    depth += 1;
                } else if b == b')' {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
            }
            i += 1;
        }
        from = i;
        checks.push(idents.into_iter().collect());
    }
    checks
}

/// A row of `pg_constraint`: table, kind, columns, referenced table and columns,
/// `ON DELETE` action.
type PgConstraint = (
    String,
    String,
    Vec<String>,
    Option<String>,
    Vec<String>,
    String,
);

/// A row of `pg_index`: table, index, unique, key columns, predicate.
type PgIndex = (String, String, bool, Vec<String>, Option<String>);
