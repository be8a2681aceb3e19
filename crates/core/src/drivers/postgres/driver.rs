//! PostgreSQL's [`Driver`]: its pool, its transactions (sqlx's, probed before a
//! commit that may hide an abort), its set lane and its advisory locks.

use std::sync::Arc;

use sqlx::Executor;

use super::Postgres;
use super::pgtx::PgTx;
use super::tx::rolled_back;
use crate::drivers::{Backend, ConnOf, HoldOf, ReaderOf, TxOf};
use crate::store::backend::{Dialect, Driver, DriverTx, not_mine};
use crate::store::prefetch::Prefetch;
use crate::store::queue_types::Claim;
use crate::store::types::{Admitted, Hop, Store, Tx};
use crate::store::write::Writes;
use crate::{Envelope, Message, MessageId, Result};

impl DriverTx for PgTx {
    fn conn(&mut self) -> ConnOf<'_> {
        ConnOf::Postgres(&mut self.tx)
    }

    fn allow_defer(&mut self) -> bool {
        if let Some(kept) = &mut self.sets {
            kept.deferrable = true;
        }
        false
    }

    fn mark_written(&mut self) {
        if let Some(kept) = &mut self.sets {
            kept.dirty = true;
        }
    }

    async fn execute(&mut self, sql: &'static str) -> Result<()> {
        self.tx.execute(sql).await?;
        Ok(())
    }

    async fn read(&mut self, sql: &crate::Sql, now_ms: i64) -> Result<Vec<crate::Row>> {
        super::Postgres::fetch_sql(&mut *self.tx, sql, now_ms).await
    }
}

impl Driver for Postgres {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn reader(&self) -> ReaderOf<'_> {
        ReaderOf::Postgres(&self.pool)
    }

    fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        &super::POSTGRES_MIGRATOR
    }

    fn file(&self) -> Option<std::path::PathBuf> {
        None
    }

    async fn begin(&self, store: &Store) -> Result<Hop> {
        Ok(Hop::own(
            self.begin_tx(store).await?,
            Arc::clone(&store.lanes().counts),
        ))
    }

    async fn begin_tx(&self, store: &Store) -> Result<Tx> {
        Ok(Tx::new(store, PgTx::of(self.pool.begin().await?)))
    }

    async fn admit(
        &self,
        store: &Store,
        inbox: Option<(String, MessageId)>,
        prefetch: Option<Prefetch>,
    ) -> Result<Admitted> {
        super::sets::admit(store, inbox, prefetch).await
    }

    fn committed(&self) {}

    #[cfg(feature = "testing")]
    async fn end_other_sessions(&self) -> Result<()> {
        sqlx::query(
            // Client sessions of this role only (not autovacuum, not another role's),
            // each waited for (up to 5 s) so that its locks are gone on return.
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()
                AND backend_type = 'client backend' AND usename = current_user",
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    #[cfg(feature = "testing")]
    async fn set_clock(&self, ms: i64) -> Result<()> {
        super::clock::set(&self.pool, ms).await
    }

    async fn try_exclusive(&self, _store: &Store, name: &str) -> Result<Option<HoldOf>> {
        Ok(super::exclusive::try_lock(&self.pool, name)
            .await?
            .map(HoldOf::Postgres))
    }

    async fn write(tx: &mut Tx, writes: Writes, last: bool) -> Result<()> {
        super::write::write(tx, writes, last).await
    }

    /// Many messages in at most two statements (those handed over, leased; the rest)
    /// instead of one per message handed over.
    async fn enqueue_handing(
        tx: &mut Tx,
        store: &Store,
        to: &Arc<dyn crate::store::Handover>,
        messages: &[Message],
    ) -> Result<()> {
        let kept = tx.pg().is_some_and(|t| t.sets.is_some());
        if messages.len() > 1 && !kept && store.config().max_pending.is_none() {
            for m in messages {
                store.validate(m)?;
            }
            let span = crate::propagation::enqueue_span(messages, true);
            let write = tx.write_messages(store, messages.to_vec());
            return tracing::Instrument::instrument(write, span).await;
        }
        tx.enqueue_handing(store, to, messages).await
    }

    /// PostgreSQL has no lane that the relay's statements join (its hops are
    /// transactions of their own, and no lane holds a single writer): they run on the
    /// pool.
    async fn ack_and_claim_in(
        tx: &mut Tx,
        delivered: &[i64],
        claim: &Claim<'_>,
    ) -> Result<(u64, Vec<Envelope>)> {
        let store = tx.store().clone();
        #[allow(irrefutable_let_patterns)] // a PostgreSQL-only build has no other
        let Backend::Postgres(db) = store.backend_ref() else {
            return Err(not_mine(Self::NAME, tx));
        };
        if claim.destinations.is_empty() || claim.limit == 0 {
            return Ok((db.mark_delivered(claim.owner, delivered).await?, Vec::new()));
        }
        db.ack_and_claim(delivered, claim).await
    }

    async fn commit(tx: Tx) -> Result<()> {
        #[allow(irrefutable_let_patterns)] // a PostgreSQL-only build has no other
        let TxOf::Postgres(_) = &tx.inner else {
            return Err(not_mine(Self::NAME, &tx));
        };
        let Tx {
            inner,
            store,
            mut handed,
            enqueued,
            unchecked,
            ..
        } = tx;
        #[allow(irrefutable_let_patterns)]
        let TxOf::Postgres(PgTx { tx: mut inner, .. }) = inner else {
            return Ok(());
        };
        // PostgreSQL answers the COMMIT of an aborted transaction with the tag
        // ROLLBACK, and sqlx reports it as success. An aborted transaction refuses
        // every statement but its end: one is enough to tell.
        if unchecked && let Err(e) = inner.execute("SELECT 1").await {
            let _ = inner.rollback().await;
            return Err(rolled_back(e));
        }
        inner.commit().await?;
        Tx::after_commit(&store, &mut handed, enqueued);
        Ok(())
    }

    async fn rollback(tx: Tx) -> Result<()> {
        #[allow(irrefutable_let_patterns)]
        if let TxOf::Postgres(t) = tx.inner {
            t.tx.rollback().await?;
        }
        Ok(())
    }
}
