//! The floor's statements, each in both dialects (and PostgreSQL's set form), and the
//! transaction that runs them.

use anyhow::bail;
use sqlx::{Postgres, Sqlite, Transaction};
use uuid::Uuid;

use crate::outbox::Plain;

/// A statement in both dialects, with the same parameters in the same order. Times
/// are Unix ms; PostgreSQL converts them with `to_timestamp`.
pub(super) struct Sql {
    pub(super) sqlite: &'static str,
    pub(super) pg: &'static str,
    /// The same rows for many hops at once, on PostgreSQL: each parameter an array
    /// (`unnest`), one statement per kind per transaction.
    pub(super) pg_set: &'static str,
}

/// A parameter, bound as each backend stores it.
pub(super) enum Arg {
    /// UUID on PostgreSQL, its text on SQLite.
    Id(Uuid),
    Text(String),
    OptText(Option<String>),
    Int(i32),
    Ms(i64),
    Bool(bool),
}

pub(super) enum FloorTx {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
    /// PostgreSQL, each kind of statement's rows collected and written at the commit in
    /// one statement per kind (in the order each kind first came).
    PostgresSets(
        Transaction<'static, Postgres>,
        Vec<(&'static Sql, Vec<Vec<Arg>>)>,
    ),
}

/// One column of a set statement's rows, as the array PostgreSQL binds.
pub(super) enum Column {
    Id(Vec<Uuid>),
    Text(Vec<String>),
    OptText(Vec<Option<String>>),
    Int(Vec<i32>),
    Ms(Vec<i64>),
    Bool(Vec<bool>),
}

impl Column {
    pub(super) fn push(columns: &mut Vec<Self>, at: usize, arg: Arg) -> anyhow::Result<()> {
        if columns.len() == at {
            columns.push(match &arg {
                Arg::Id(_) => Self::Id(Vec::new()),
                Arg::Text(_) => Self::Text(Vec::new()),
                Arg::OptText(_) => Self::OptText(Vec::new()),
                Arg::Int(_) => Self::Int(Vec::new()),
                Arg::Ms(_) => Self::Ms(Vec::new()),
                Arg::Bool(_) => Self::Bool(Vec::new()),
            });
        }
        match (&mut columns[at], arg) {
            (Self::Id(v), Arg::Id(x)) => v.push(x),
            (Self::Text(v), Arg::Text(x)) => v.push(x),
            (Self::OptText(v), Arg::OptText(x)) => v.push(x),
            (Self::Int(v), Arg::Int(x)) => v.push(x),
            (Self::Ms(v), Arg::Ms(x)) => v.push(x),
            (Self::Bool(v), Arg::Bool(x)) => v.push(x),
            _ => bail!("parameter {} changes type between rows", at + 1),
        }
        Ok(())
    }
}

impl FloorTx {
    pub(super) async fn begin(plain: &Plain, sets: bool) -> anyhow::Result<Self> {
        Ok(match plain {
            Plain::Sqlite(pool) => Self::Sqlite(pool.begin_with("BEGIN IMMEDIATE").await?),
            Plain::Postgres(pool) if sets => Self::PostgresSets(pool.begin().await?, Vec::new()),
            Plain::Postgres(pool) => Self::Postgres(pool.begin().await?),
        })
    }

    pub(super) async fn exec(&mut self, sql: &'static Sql, args: Vec<Arg>) -> anyhow::Result<()> {
        match self {
            Self::PostgresSets(_, kinds) => {
                match kinds.iter_mut().find(|(k, _)| k.pg_set == sql.pg_set) {
                    Some((_, rows)) => rows.push(args),
                    None => kinds.push((sql, vec![args])),
                }
            }
            Self::Sqlite(tx) => {
                let mut q = sqlx::query(sql.sqlite);
                for arg in args {
                    q = match arg {
                        Arg::Id(u) => q.bind(u.to_string()),
                        Arg::Text(s) => q.bind(s),
                        Arg::OptText(s) => q.bind(s),
                        Arg::Int(i) => q.bind(i64::from(i)),
                        Arg::Ms(ms) => q.bind(ms),
                        Arg::Bool(b) => q.bind(b),
                    };
                }
                q.execute(&mut **tx).await?;
            }
            Self::Postgres(tx) => {
                let mut q = sqlx::query(sql.pg);
                for arg in args {
                    q = match arg {
                        Arg::Id(u) => q.bind(u),
                        Arg::Text(s) => q.bind(s),
                        Arg::OptText(s) => q.bind(s),
                        Arg::Int(i) => q.bind(i),
                        Arg::Ms(ms) => q.bind(ms),
                        Arg::Bool(b) => q.bind(b),
                    };
                }
                q.execute(&mut **tx).await?;
            }
        }
        Ok(())
    }

    pub(super) async fn commit(self) -> anyhow::Result<()> {
        match self {
            Self::Sqlite(tx) => tx.commit().await?,
            Self::Postgres(tx) => tx.commit().await?,
            Self::PostgresSets(mut tx, kinds) => {
                for (sql, rows) in kinds {
                    let mut columns = Vec::new();
                    for row in rows {
                        for (at, arg) in row.into_iter().enumerate() {
                            Column::push(&mut columns, at, arg)?;
                        }
                    }
                    let mut q = sqlx::query(sql.pg_set);
                    for column in columns {
                        q = match column {
                            Column::Id(v) => q.bind(v),
                            Column::Text(v) => q.bind(v),
                            Column::OptText(v) => q.bind(v),
                            Column::Int(v) => q.bind(v),
                            Column::Ms(v) => q.bind(v),
                            Column::Bool(v) => q.bind(v),
                        };
                    }
                    q.execute(&mut *tx).await?;
                }
                tx.commit().await?;
            }
        }
        Ok(())
    }
}

pub(super) const INSERT_INSTANCE: Sql = Sql {
    sqlite:
        "INSERT INTO saga_instances (id, name, version, state, data, stage, created_at, updated_at)
             VALUES (?1, ?2, 1, 'running', ?3, 0, ?4, ?4)",
    pg: "INSERT INTO saga_instances (id, name, version, state, data, stage, created_at, updated_at)
         VALUES ($1, $2, 1, 'running', $3::jsonb, 0, to_timestamp($4 / 1000.0),
                 to_timestamp($4 / 1000.0))",
    pg_set:
        "INSERT INTO saga_instances (id, name, version, state, data, stage, created_at, updated_at)
             SELECT u.id, u.name, 1, 'running', u.data::jsonb, 0, to_timestamp(u.now / 1000.0),
                    to_timestamp(u.now / 1000.0)
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int8[]) AS u(id, name, data, now)",
};

/// (saga, idx, name, destination, command id, input, compensation destination,
/// compensation payload, compensation state, now)
pub(super) const INSERT_STEP: Sql = Sql {
    sqlite: "INSERT INTO saga_steps (saga_id, idx, stage, name, destination, state, attempts,
                command_id, input, compensation_destination, compensation_payload,
                compensation_state, dispatched_at)
             VALUES (?1, ?2, ?2, ?3, ?4, 'dispatched', 1, ?5, ?6, ?7, ?8, ?9, ?10)",
    pg: "INSERT INTO saga_steps (saga_id, idx, stage, name, destination, state, attempts,
            command_id, input, compensation_destination, compensation_payload,
            compensation_state, dispatched_at)
         VALUES ($1, $2, $2, $3, $4, 'dispatched', 1, $5, $6::jsonb, $7, $8::jsonb, $9,
                 to_timestamp($10 / 1000.0))",
    pg_set: "INSERT INTO saga_steps (saga_id, idx, stage, name, destination, state, attempts,
                command_id, input, compensation_destination, compensation_payload,
                compensation_state, dispatched_at)
             SELECT u.s, u.i, u.i, u.n, u.d, 'dispatched', 1, u.c, u.inp::jsonb, u.cd,
                    u.cp::jsonb, u.cs, to_timestamp(u.now / 1000.0)
             FROM unnest($1::uuid[], $2::int4[], $3::text[], $4::text[], $5::uuid[],
                         $6::text[], $7::text[], $8::text[], $9::text[], $10::int8[])
                  AS u(s, i, n, d, c, inp, cd, cp, cs, now)",
};

/// (id, destination, key, payload, headers, now): the store's INSERT.
pub(super) const INSERT_OUTBOX: Sql = Sql {
    sqlite: "INSERT INTO outbox (id, destination, key, payload, headers, available_at, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
             ON CONFLICT (id) DO NOTHING",
    pg: "INSERT INTO outbox (id, destination, key, payload, headers, available_at)
         VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, to_timestamp($6 / 1000.0))
         ON CONFLICT (id) DO NOTHING",
    pg_set: "INSERT INTO outbox (id, destination, key, payload, headers, available_at)
             SELECT u.id, u.d, u.k, u.p::jsonb, u.h::jsonb, to_timestamp(u.now / 1000.0)
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[])
                  AS u(id, d, k, p, h, now)
             ON CONFLICT (id) DO NOTHING",
};

/// (consumer, message id, now): the store's receive.
pub(super) const INSERT_INBOX: Sql = Sql {
    sqlite: "INSERT INTO inbox (consumer, message_id, received_at) VALUES (?1, ?2, ?3)
             ON CONFLICT DO NOTHING",
    pg: "INSERT INTO inbox (consumer, message_id, received_at)
         VALUES ($1, $2, to_timestamp($3 / 1000.0))
         ON CONFLICT DO NOTHING",
    pg_set: "INSERT INTO inbox (consumer, message_id, received_at)
             SELECT u.c, u.m, to_timestamp(u.now / 1000.0)
             FROM unnest($1::text[], $2::uuid[], $3::int8[]) AS u(c, m, now)
             ON CONFLICT DO NOTHING",
};

/// (saga, state, stage, error, finished, now)
pub(super) const UPDATE_INSTANCE: Sql = Sql {
    sqlite: "UPDATE saga_instances SET state = ?2, stage = ?3, error = ?4, updated_at = ?6,
                 finished_at = CASE WHEN ?5 THEN ?6 END
             WHERE id = ?1",
    pg: "UPDATE saga_instances SET state = $2, stage = $3, error = $4,
             updated_at = to_timestamp($6 / 1000.0),
             finished_at = CASE WHEN $5 THEN to_timestamp($6 / 1000.0) END
         WHERE id = $1",
    pg_set: "UPDATE saga_instances s SET state = u.st, stage = u.sg, error = u.e,
                 updated_at = to_timestamp(u.now / 1000.0),
                 finished_at = CASE WHEN u.f THEN to_timestamp(u.now / 1000.0) END
             FROM unnest($1::uuid[], $2::text[], $3::int4[], $4::text[], $5::bool[], $6::int8[])
                  AS u(id, st, sg, e, f, now)
             WHERE s.id = u.id",
};

/// (saga, idx, state, output, error, now)
pub(super) const UPDATE_STEP: Sql = Sql {
    sqlite: "UPDATE saga_steps SET state = ?3, output = ?4, error = ?5, replied_at = ?6
             WHERE saga_id = ?1 AND idx = ?2",
    pg: "UPDATE saga_steps SET state = $3, output = $4::jsonb, error = $5,
             replied_at = to_timestamp($6 / 1000.0)
         WHERE saga_id = $1 AND idx = $2",
    pg_set: "UPDATE saga_steps s SET state = u.st, output = u.o::jsonb, error = u.e,
                 replied_at = to_timestamp(u.now / 1000.0)
             FROM unnest($1::uuid[], $2::int4[], $3::text[], $4::text[], $5::text[], $6::int8[])
                  AS u(id, i, st, o, e, now)
             WHERE s.saga_id = u.id AND s.idx = u.i",
};

/// (saga, idx, compensation message id)
pub(super) const COMPENSATION_SENT: Sql = Sql {
    sqlite: "UPDATE saga_steps SET compensation_state = 'dispatched',
                 compensation_attempts = compensation_attempts + 1, compensation_message_id = ?3
             WHERE saga_id = ?1 AND idx = ?2",
    pg: "UPDATE saga_steps SET compensation_state = 'dispatched',
             compensation_attempts = compensation_attempts + 1, compensation_message_id = $3
         WHERE saga_id = $1 AND idx = $2",
    pg_set: "UPDATE saga_steps s SET compensation_state = 'dispatched',
                 compensation_attempts = s.compensation_attempts + 1, compensation_message_id = u.m
             FROM unnest($1::uuid[], $2::int4[], $3::uuid[]) AS u(id, i, m)
             WHERE s.saga_id = u.id AND s.idx = u.i",
};

/// (saga, idx, now)
pub(super) const COMPENSATION_DONE: Sql = Sql {
    sqlite: "UPDATE saga_steps SET compensation_state = 'done', compensated_at = ?3
             WHERE saga_id = ?1 AND idx = ?2",
    pg: "UPDATE saga_steps SET compensation_state = 'done',
             compensated_at = to_timestamp($3 / 1000.0)
         WHERE saga_id = $1 AND idx = $2",
    pg_set: "UPDATE saga_steps s SET compensation_state = 'done',
                 compensated_at = to_timestamp(u.now / 1000.0)
             FROM unnest($1::uuid[], $2::int4[], $3::int8[]) AS u(id, i, now)
             WHERE s.saga_id = u.id AND s.idx = u.i",
};
