//! `status`: the database at a glance.

use std::collections::BTreeMap;

use agentsaga_saga::SagaState;
use agentsaga_saga::{Engine, query};
use serde::Serialize;

use super::{Console, RemoteList, Result, SAGA_STATES};

/// Outbox counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxDoc {
    /// Rows waiting for delivery (timers included).
    pub pending: u64,
    /// Rows claimed by a relay.
    pub in_flight: u64,
    /// Rows delivered and not yet pruned.
    pub delivered: u64,
    /// Dead letters.
    pub dead: u64,
    /// How long the oldest ready pending row has waited (the relay's lag).
    pub oldest_pending_age_ms: Option<u64>,
}

/// `agentsaga status --json`, `GET /api/v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusDoc {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// The outbox.
    pub outbox: OutboxDoc,
    /// Dead letters (as `outbox.dead`).
    pub dead_letters: u64,
    /// Sagas per state, every state present.
    pub sagas: BTreeMap<&'static str, u64>,
    /// All sagas.
    pub sagas_total: u64,
    /// Starts waiting for room under their admission bound, per saga name.
    pub starts_waiting: BTreeMap<String, u64>,
    /// Starts that could not be started when their turn came, set aside (they hold
    /// nothing up; see `agentsaga starts list`), per saga name.
    pub starts_set_aside: BTreeMap<String, u64>,
    /// Stalled sagas (at most [`MAX_PAGE`](super::MAX_PAGE) counted).
    pub stalled: u64,
    /// The no-progress threshold `stalled` used, in ms.
    pub stalled_after_ms: u64,
    /// The remote destinations ([`Console::remote`]), only with a broker to read
    /// (omitted from the JSON otherwise). A broker that cannot be read is said in its
    /// `error`; the rest of the status answers all the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteList>,
}

impl Console {
    /// Outbox counts, relay lag, sagas per state, waiting starts, stalled sagas, and
    /// the remote destinations if this console has a broker to read.
    ///
    /// Cheap however many finished sagas the database keeps: the sagas under way
    /// (running, compensating, stuck) and the stalled ones are counted through the
    /// state index, the finished ones (completed, compensated, aborted) are read from
    /// the counts the database keeps itself (`saga_finished_counts`); all exact at
    /// the time of the call.
    ///
    /// # Errors
    /// [`Error::Store`](crate::Error::Store).
    pub async fn status(&self) -> Result<StatusDoc> {
        const LIVE: [SagaState; 3] = [
            SagaState::Running,
            SagaState::Compensating,
            SagaState::Stuck,
        ];
        let stats = self.store.admin().stats().await?;
        let mut counts = query::count_in_states(&self.store, &LIVE).await?;
        let finished = query::count_finished(&self.store).await?;
        counts.extend(finished);
        let starts_waiting: BTreeMap<String, u64> = Engine::waiting_starts(&self.store)
            .await?
            .into_iter()
            .collect();
        let mut starts_set_aside: BTreeMap<String, u64> = BTreeMap::new();
        for s in Engine::set_aside_starts(&self.store).await? {
            *starts_set_aside.entry(s.name).or_default() += 1;
        }
        let stalled = query::count_stalled(&self.store, self.stalled_after).await?;
        let mut sagas: BTreeMap<&'static str, u64> =
            SAGA_STATES.iter().map(|s| (s.as_str(), 0)).collect();
        for (state, n) in &counts {
            *sagas.entry(state.as_str()).or_default() += n;
        }
        let remote = if self.has_remote() {
            Some(self.remote().await?)
        } else {
            None
        };
        Ok(StatusDoc {
            remote,
            backend: self.store.backend(),
            dead_letters: stats.dead,
            sagas_total: sagas.values().sum(),
            sagas,
            starts_waiting,
            starts_set_aside,
            stalled,
            stalled_after_ms: u64::try_from(self.stalled_after.as_millis()).unwrap_or(u64::MAX),
            outbox: OutboxDoc {
                pending: stats.pending,
                in_flight: stats.in_flight,
                delivered: stats.delivered,
                dead: stats.dead,
                oldest_pending_age_ms: stats.oldest_pending_age_ms,
            },
        })
    }
}
