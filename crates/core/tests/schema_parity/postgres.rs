//! PostgreSQL's schema as one-line facts, from `information_schema` and `pg_catalog`.

use super::*;

pub(crate) async fn postgres_facts(pool: &PgPool) -> BTreeSet<String> {
    let mut facts = BTreeSet::new();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' \
         AND table_name <> '_sqlx_migrations'",
    )
    .fetch_all(pool)
    .await
    .expect("information_schema.tables");
    for table in &tables {
        facts.insert(format!("table {table}"));
    }

    let columns: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text \
         FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name <> '_sqlx_migrations'",
    )
    .fetch_all(pool)
    .await
    .expect("information_schema.columns");
    for (table, name, data_type, nullable) in columns {
        let not_null = if nullable == "NO" { ", not null" } else { "" };
        facts.insert(format!(
            "column {table}.{name}: {}{not_null}",
            postgres_class(&data_type)
        ));
    }

    let constraints: Vec<PgConstraint> = sqlx::query_as(
        "SELECT t.relname::text, c.contype::text, \
                 ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, o) \
                       JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n \
                       ORDER BY k.o), \
                 f.relname::text, \
                 ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(n, o) \
                       JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n \
                       ORDER BY k.o), \
                 c.confdeltype::text \
             FROM pg_constraint c \
             JOIN pg_class t ON t.oid = c.conrelid \
             JOIN pg_namespace s ON s.oid = t.relnamespace \
             LEFT JOIN pg_class f ON f.oid = c.confrelid \
             WHERE s.nspname = current_schema() AND t.relname <> '_sqlx_migrations' \
               AND c.contype IN ('p', 'u', 'c', 'f')",
    )
    .fetch_all(pool)
    .await
    .expect("pg_constraint");
    for (table, kind, mut cols, parent, parent_cols, on_delete) in constraints {
        let fact = match kind.as_str() {
            "p" => format!("primary key {table} ({})", cols.join(", ")),
            "u" => format!("unique {table} ({})", cols.join(", ")),
            "c" => {
                cols.sort();
                format!("check {table} ({})", cols.join(", "))
            }
            _ => format!(
                "foreign key {table} ({}) -> {} ({}) on delete {}",
                cols.join(", "),
                parent.unwrap_or_default(),
                parent_cols.join(", "),
                fk_action(&on_delete)
            ),
        };
        facts.insert(fact);
    }

    // Indexes that back no constraint (those are primary keys and uniques above).
    let indexes: Vec<PgIndex> = sqlx::query_as(
        "SELECT t.relname::text, i.relname::text, x.indisunique, \
             ARRAY(SELECT COALESCE(a.attname::text, '<expr>') \
                   FROM unnest(x.indkey::int2[]) WITH ORDINALITY k(n, o) \
                   LEFT JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.n \
                   WHERE k.o <= x.indnkeyatts ORDER BY k.o), \
             pg_get_expr(x.indpred, x.indrelid) \
         FROM pg_index x \
         JOIN pg_class i ON i.oid = x.indexrelid \
         JOIN pg_class t ON t.oid = x.indrelid \
         JOIN pg_namespace s ON s.oid = t.relnamespace \
         WHERE s.nspname = current_schema() AND t.relname <> '_sqlx_migrations' \
           AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid \
                           AND c.conrelid = x.indrelid)",
    )
    .fetch_all(pool)
    .await
    .expect("pg_index");
    for (table, name, unique, columns, pred) in indexes {
        facts.insert(index_fact(&table, &name, &columns, unique, pred.as_deref()));
    }

    let functions: Vec<String> = sqlx::query_scalar(
        "SELECT p.proname::text FROM pg_proc p \
         JOIN pg_namespace s ON s.oid = p.pronamespace WHERE s.nspname = current_schema()",
    )
    .fetch_all(pool)
    .await
    .expect("pg_proc");
    for f in functions {
        facts.insert(format!("function {f}"));
    }

    let triggers: Vec<(String, String)> = sqlx::query_as(
        "SELECT DISTINCT c.relname::text, t.tgname::text FROM pg_trigger t \
         JOIN pg_class c ON c.oid = t.tgrelid \
         JOIN pg_namespace s ON s.oid = c.relnamespace \
         WHERE s.nspname = current_schema() AND NOT t.tgisinternal",
    )
    .fetch_all(pool)
    .await
    .expect("pg_trigger");
    for (table, name) in triggers {
        facts.insert(format!("trigger {table}.{name}"));
    }
    facts
}
