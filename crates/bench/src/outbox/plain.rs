//! A plain sqlx pool of either backend: what the floors of the benches write with.

use sqlx::{PgPool, SqlitePool};

use crate::db::{self, Backend};

/// A plain sqlx pool of either backend, for the floors.
#[derive(Debug, Clone)]
pub(crate) enum Plain {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl Plain {
    pub(crate) async fn open(backend: Backend, url: &str) -> anyhow::Result<Self> {
        Ok(match backend {
            Backend::Sqlite => Self::Sqlite(db::plain_sqlite(url).await?),
            Backend::Postgres => Self::Postgres(db::plain_postgres(url).await?),
        })
    }

    pub(crate) async fn close(&self) {
        match self {
            Self::Sqlite(p) => p.close().await,
            Self::Postgres(p) => p.close().await,
        }
    }

    /// Every saga's `(state, created_at, updated_at)`, times in Unix ms: what the saga
    /// benches check and measure once a run is over.
    pub(crate) async fn saga_rows(&self) -> anyhow::Result<Vec<(String, i64, i64)>> {
        Ok(match self {
            Self::Sqlite(pool) => {
                sqlx::query_as("SELECT state, created_at, updated_at FROM saga_instances")
                    .fetch_all(pool)
                    .await?
            }
            Self::Postgres(pool) => {
                sqlx::query_as(
                    "SELECT state, (extract(epoch FROM created_at) * 1000)::bigint,
                        (extract(epoch FROM updated_at) * 1000)::bigint
                     FROM saga_instances",
                )
                .fetch_all(pool)
                .await?
            }
        })
    }
}
