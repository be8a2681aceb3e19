//! SQLite's [`Driver`]: its single writer and its readers, its transactions (sqlx's
//! own, or the lane's on the writer it keeps), its lane and its lock files.

use std::sync::{Arc, PoisonError};

use sqlx::Executor;

use super::Sqlite;
use super::held::{Held, SqliteTx};
use crate::drivers::{ConnOf, HoldOf, ReaderOf, TxOf};
use crate::store::backend::{Driver, DriverTx, not_mine};
use crate::store::prefetch::Prefetch;
use crate::store::queue_types::Claim;
use crate::store::types::{Admitted, Caller, Hop, Store, Tx};
use crate::store::write::Writes;
use crate::{Envelope, MessageId, Result};

impl DriverTx for SqliteTx {
    fn conn(&mut self) -> ConnOf<'_> {
        debug_assert!(
            self.tail.is_none(),
            "a statement after a hop's deferred last write"
        );
        ConnOf::Sqlite(match &mut self.held {
            Held::Own(tx) => tx,
            // sqlx's thread runs what comes next: the lane's lock given back to it.
            Held::Lane(lane) => lane.sqlx(),
        })
    }

    fn allow_defer(&mut self) -> bool {
        matches!(self.held, Held::Lane(_))
    }

    fn mark_written(&mut self) {}

    async fn execute(&mut self, sql: &'static str) -> Result<()> {
        if let Held::Lane(lane) = &mut self.held
            && let Some(session) = lane.locked()
        {
            // The lane's savepoints, while it holds the connection.
            return session.run(&super::statements::Statement::plain(sql), |_| {});
        }
        #[allow(irrefutable_let_patterns)] // a SQLite-only build has no other
        if let ConnOf::Sqlite(c) = self.conn() {
            c.execute(sql).await?;
        }
        Ok(())
    }

    async fn read(&mut self, sql: &crate::Sql, now_ms: i64) -> Result<Vec<crate::Row>> {
        if let Held::Lane(lane) = &mut self.held
            && let Some(session) = lane.locked()
        {
            // While the lane holds the connection: no hand-over to sqlx's thread.
            debug_assert!(
                self.tail.is_none(),
                "a read after a hop's deferred last write"
            );
            let statement = super::sql::statement(sql, now_ms)?;
            let mut rows = Vec::new();
            session.run(&statement, |row| rows.push(row))?;
            return Ok(rows);
        }
        match self.conn() {
            ConnOf::Sqlite(c) => Sqlite::fetch_sql(&mut *c, sql, now_ms).await,
            #[allow(unreachable_patterns)] // a SQLite-only build has no other
            _ => unreachable!("a SQLite transaction's connection is SQLite's"),
        }
    }
}

impl Driver for Sqlite {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn reader(&self) -> ReaderOf<'_> {
        ReaderOf::Sqlite(&self.reader)
    }

    fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        &super::SQLITE_MIGRATOR
    }

    fn file(&self) -> Option<std::path::PathBuf> {
        // The writer runs in journal mode WAL exactly when the database is a file (see
        // `sqlite::open_once`); an in-memory one has no file to share.
        let options = self.writer.connect_options();
        let path = options.get_filename();
        let name = path.to_string_lossy();
        (self.checkpoints.is_some() && !name.is_empty() && !name.contains(":memory:"))
            .then(|| path.to_path_buf())
    }

    async fn begin(&self, store: &Store) -> Result<Hop> {
        store.not_holding().await?;
        if store.hops_running() {
            return store.hop().await;
        }
        let tx = self.begin_tx(store).await?;
        // The single writer is this caller's until the transaction ends.
        *store
            .lanes()
            .counts
            .holder
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Caller::current());
        Ok(Hop::own(tx, Arc::clone(&store.lanes().counts)))
    }

    async fn begin_tx(&self, store: &Store) -> Result<Tx> {
        // IMMEDIATE takes the write lock up front: a deferred transaction that later
        // upgrades can fail with SQLITE_BUSY whatever the busy timeout (another
        // process writing). In this process the single writer connection already
        // queues writers.
        let tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        Ok(Tx::new(store, SqliteTx::of(Held::Own(tx))))
    }

    async fn admit(
        &self,
        store: &Store,
        inbox: Option<(String, MessageId)>,
        prefetch: Option<Prefetch>,
    ) -> Result<Admitted> {
        super::lane::admit(store, inbox, prefetch).await
    }

    fn committed(&self) {
        if let Some(c) = &self.checkpoints {
            c.poke();
        }
    }

    async fn try_exclusive(&self, _store: &Store, name: &str) -> Result<Option<HoldOf>> {
        Ok(super::exclusive::Hold::take(self.file().as_deref(), name)?.map(HoldOf::Sqlite))
    }

    async fn write(tx: &mut Tx, writes: Writes, last: bool) -> Result<()> {
        super::write::write(tx, writes, last).await
    }

    /// In the lane, on its connection directly; in a transaction of its own, through
    /// sqlx.
    async fn ack_and_claim_in(
        tx: &mut Tx,
        delivered: &[i64],
        claim: &Claim<'_>,
    ) -> Result<(u64, Vec<Envelope>)> {
        if let Some(done) = tx.lane_ack_and_claim(delivered, claim).await {
            return done;
        }
        let at = super::ClaimTimes::of(tx.store().clock());
        let Some(c) = tx.sqlite_conn() else {
            return Err(not_mine(Self::NAME, tx));
        };
        let n = if delivered.is_empty() {
            0
        } else {
            Self::mark_delivered_on(&mut *c, claim.owner, delivered, at.now).await?
        };
        let rows = if claim.destinations.is_empty() || claim.limit == 0 {
            Vec::new()
        } else {
            Self::claim_on(c, claim, at).await?
        };
        Ok((n, rows))
    }

    async fn commit(mut tx: Tx) -> Result<()> {
        if tx.is_lane() {
            return tx.end_lane(true).await;
        }
        let Tx {
            inner,
            store,
            mut handed,
            enqueued,
            ..
        } = tx;
        #[allow(irrefutable_let_patterns)] // a SQLite-only build has no other
        if let TxOf::Sqlite(SqliteTx {
            held: Held::Own(t), ..
        }) = inner
        {
            t.commit().await?;
            Tx::after_commit(&store, &mut handed, enqueued);
            return Ok(());
        }
        Err(crate::Error::BackendMismatch {
            store: Self::NAME,
            connection: "another driver's transaction",
        })
    }

    async fn rollback(mut tx: Tx) -> Result<()> {
        if tx.is_lane() {
            return tx.end_lane(false).await;
        }
        #[allow(irrefutable_let_patterns)]
        if let TxOf::Sqlite(SqliteTx {
            held: Held::Own(t), ..
        }) = tx.inner
        {
            t.rollback().await?;
        }
        Ok(())
    }
}
