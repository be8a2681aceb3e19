//! A hop waiting for PostgreSQL's set lane, as the lane and its batches take it.

use tokio::sync::oneshot;
use uuid::Uuid;

use crate::store::Store;
use crate::store::types::{Admitted, Waiting};
use crate::{Error, MessageId, Result};

/// A hop waiting for the set lane.
pub(crate) struct Request {
    pub(crate) store: Store,
    pub(crate) consumer: String,
    pub(crate) id: MessageId,
    /// The prefetch's key and load.
    pub(crate) key: Uuid,
    pub(crate) load: &'static crate::read::Load,
    pub(crate) admitted: oneshot::Sender<Result<Admitted>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SetRequest")
    }
}

impl Request {
    /// The set lane's request of a hop waiting (one that records a message and reads
    /// a load, as the lane's `admit` sends); another is answered at once.
    pub(crate) fn of(w: Waiting) -> Option<Self> {
        match (w.inbox, w.prefetch) {
            (Some((consumer, id)), Some(p)) => Some(Self {
                store: w.store,
                consumer,
                id,
                key: p.key,
                load: p.load,
                admitted: w.admitted,
            }),
            _ => {
                let why = "a set lane's hop records a message and reads a load";
                let _ = w.admitted.send(Err(Error::SharedCommit(why.into())));
                None
            }
        }
    }
}
