//! Dead letters: read (paged, bounded in bytes), re-driven unless moot, purged.

use std::collections::BTreeMap;
use std::time::Duration;

use agentsaga_core::MessageId;
use agentsaga_core::admin::{DeadQuery, DeadRow};
use agentsaga_saga::Engine;
use serde::Serialize;
use serde_json::Value;

use super::{Console, Error, MAX_PAGE, MAX_PAGE_BYTES, Result, json_value};
use crate::time::rfc3339;

/// The dead letters [`Console::redrive_all`] reads at a time.
const REDRIVE_BATCH: u32 = 100;

/// One dead letter: `dead list --json` (each), `dead show --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadDoc {
    /// The message id.
    pub id: String,
    /// Its outbox sequence number.
    pub seq: i64,
    /// Where it was going.
    pub destination: String,
    /// Its ordering key.
    pub key: Option<String>,
    /// Delivery attempts.
    pub attempts: u32,
    /// When it was written.
    pub created_at: String,
    /// The same, Unix ms.
    pub created_at_ms: i64,
    /// Why it died.
    pub last_error: Option<String>,
    /// Its headers.
    pub headers: BTreeMap<String, String>,
    /// Its payload (JSON, or the text it is).
    pub payload: Value,
    /// Why re-driving it would be wrong (its saga has moved past it), if it would.
    pub moot: Option<String>,
}

impl From<&DeadRow> for DeadDoc {
    fn from(d: &DeadRow) -> Self {
        let e = &d.envelope;
        Self {
            moot: None,
            id: e.id.to_string(),
            seq: e.seq,
            destination: e.destination.clone(),
            key: e.key.clone(),
            attempts: e.attempts,
            created_at: rfc3339(e.created_at_ms),
            created_at_ms: e.created_at_ms,
            last_error: d.last_error.clone(),
            headers: e.headers.clone(),
            payload: json_value(&e.payload),
        }
    }
}

/// `dead list --json`, `GET /api/v1/dead`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadList {
    /// The dead letters, newest first.
    pub dead_letters: Vec<DeadDoc>,
    /// When more follow (the page is full, in rows or in bytes): the `seq` to ask for
    /// dead letters before (`before`), for the next page; `null` for the last page.
    pub next_before: Option<i64>,
}

/// What became of one dead letter asked to be re-driven.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedriveDoc {
    /// The message id.
    pub id: String,
    /// `redriven` (pending again, attempts reset) or `purged` (moot, with `force`).
    pub outcome: &'static str,
    /// Why it was moot, when purged.
    pub moot: Option<String>,
}

/// What a re-drive of many dead letters did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedriveAllDoc {
    /// Re-driven: pending again, attempts reset.
    pub redriven: u64,
    /// Purged as moot (with `force`).
    pub purged: u64,
    /// Left as they are, moot: each id with why.
    pub refused: Vec<Refusal>,
}

/// A dead letter a re-drive left alone.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Refusal {
    /// The message id.
    pub id: String,
    /// Why re-driving it would be wrong.
    pub reason: String,
}

/// What a purge did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PurgeDoc {
    /// Dead letters deleted.
    pub purged: u64,
}

impl Console {
    /// Dead letters, newest first (to `destination` only, if given), each saying
    /// whether re-driving it would be moot: at most `limit` and [`MAX_PAGE_BYTES`].
    ///
    /// # Errors
    /// [`Error::Invalid`] for a limit over [`MAX_PAGE`]; [`Error::Store`].
    pub async fn dead_letters(&self, destination: Option<&str>, limit: u32) -> Result<DeadList> {
        self.dead_letters_before(destination, None, limit).await
    }

    /// [`dead_letters`](Self::dead_letters) older than outbox seq `before` (a page's
    /// `next_before`).
    ///
    /// # Errors
    /// As [`dead_letters`](Self::dead_letters).
    pub async fn dead_letters_before(
        &self,
        destination: Option<&str>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<DeadList> {
        if limit > MAX_PAGE {
            return Err(Error::Invalid(format!(
                "limit {limit} is over the maximum of {MAX_PAGE}"
            )));
        }
        let limit = if limit == 0 { 100 } else { limit };
        let q = DeadQuery {
            destination,
            before_seq: before,
            limit,
            max_bytes: MAX_PAGE_BYTES,
        };
        let (rows, more) = self.store.admin().dead_letters_page(&q).await?;
        let mut dead_letters = Vec::with_capacity(rows.len());
        for d in &rows {
            dead_letters.push(self.dead_doc(d).await?);
        }
        Ok(DeadList {
            next_before: more.then(|| rows.last().map(|d| d.envelope.seq)).flatten(),
            dead_letters,
        })
    }

    /// One dead letter.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Store`].
    pub async fn dead_letter(&self, id: MessageId) -> Result<DeadDoc> {
        let row = self.dead_row(id).await?;
        self.dead_doc(&row).await
    }

    async fn dead_row(&self, id: MessageId) -> Result<DeadRow> {
        self.store
            .admin()
            .dead_letter(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("dead letter `{id}` not found")))
    }

    async fn dead_doc(&self, d: &DeadRow) -> Result<DeadDoc> {
        let mut doc = DeadDoc::from(d);
        doc.moot = Engine::moot(&self.store, &d.envelope).await?;
        Ok(doc)
    }

    /// Re-drives dead letter `id` (pending again, attempts reset), unless its saga has
    /// moved past it: then it is refused, or with `force` purged instead.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Refused`] for a moot one without `force`;
    /// [`Error::Store`].
    pub async fn redrive(&self, id: MessageId, force: bool) -> Result<RedriveDoc> {
        let row = self.dead_row(id).await?;
        match Engine::moot(&self.store, &row.envelope).await? {
            Some(why) if force => {
                self.store.admin().purge_dead_letter(id).await?;
                Ok(RedriveDoc {
                    id: id.to_string(),
                    outcome: "purged",
                    moot: Some(why),
                })
            }
            Some(why) => Err(Error::Refused(format!(
                "refused to re-drive dead letter {id}: {why}. Re-driving it could undo what \
                 its saga decided; a forced re-drive purges it instead"
            ))),
            None => {
                self.store.admin().redrive(id).await?;
                Ok(RedriveDoc {
                    id: id.to_string(),
                    outcome: "redriven",
                    moot: None,
                })
            }
        }
    }

    /// Re-drives every dead letter (to `destination`, if given) that is not moot;
    /// moot ones are left (or with `force` purged).
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn redrive_all(
        &self,
        destination: Option<&str>,
        force: bool,
    ) -> Result<RedriveAllDoc> {
        let mut doc = RedriveAllDoc {
            redriven: 0,
            purged: 0,
            refused: Vec::new(),
        };
        // A batch at a time, newest first, each batch bounded in rows and bytes: the
        // dead letters are never all in memory.
        let mut before = None;
        loop {
            let q = DeadQuery {
                destination,
                before_seq: before,
                limit: REDRIVE_BATCH,
                max_bytes: MAX_PAGE_BYTES,
            };
            let (rows, more) = self.store.admin().dead_letters_page(&q).await?;
            self.redrive_batch(&rows, force, &mut doc).await?;
            match rows.last() {
                Some(last) if more => before = Some(last.envelope.seq),
                _ => return Ok(doc),
            }
        }
    }

    async fn redrive_batch(
        &self,
        rows: &[DeadRow],
        force: bool,
        doc: &mut RedriveAllDoc,
    ) -> Result<()> {
        for row in rows {
            let id = row.envelope.id;
            match Engine::moot(&self.store, &row.envelope).await? {
                Some(_) if force => {
                    self.store.admin().purge_dead_letter(id).await?;
                    doc.purged += 1;
                }
                Some(why) => doc.refused.push(Refusal {
                    id: id.to_string(),
                    reason: why,
                }),
                None => {
                    self.store.admin().redrive(id).await?;
                    doc.redriven += 1;
                }
            }
        }
        Ok(())
    }

    /// Deletes dead letter `id`.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Store`].
    pub async fn purge(&self, id: MessageId) -> Result<PurgeDoc> {
        self.dead_row(id).await?;
        self.store.admin().purge_dead_letter(id).await?;
        Ok(PurgeDoc { purged: 1 })
    }

    /// Deletes dead letters created more than `older_than` ago.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn purge_older(&self, older_than: Duration) -> Result<PurgeDoc> {
        Ok(PurgeDoc {
            purged: self.store.admin().purge_dead(older_than).await?,
        })
    }
}
