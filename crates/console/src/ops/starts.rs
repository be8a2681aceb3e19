//! Starts: a saga started by name (with a runtime's definitions), and the starts set
//! aside by admission control.

use agentsaga_saga::{Engine, SagaId};
use serde::Serialize;
use serde_json::Value;

use super::{Console, Error, Result, ShowDoc};
use crate::time::rfc3339;

/// A start set aside: `starts list --json` (each), `starts remove --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetAsideDoc {
    /// The id it was given (no saga has it).
    pub id: String,
    /// The saga name.
    pub name: String,
    /// Its data.
    pub data: Value,
    /// Why it could not start.
    pub error: String,
    /// When it was accepted (RFC 3339).
    pub created_at: String,
    /// The same, Unix ms.
    pub created_at_ms: i64,
    /// When it was set aside (RFC 3339).
    pub set_aside_at: String,
    /// The same, Unix ms.
    pub set_aside_at_ms: i64,
}

impl From<&agentsaga_saga::SetAsideStart> for SetAsideDoc {
    fn from(s: &agentsaga_saga::SetAsideStart) -> Self {
        Self {
            id: s.id.to_string(),
            name: s.name.clone(),
            data: s.data.clone(),
            error: s.error.clone(),
            created_at: rfc3339(s.created_at_ms),
            created_at_ms: s.created_at_ms,
            set_aside_at: rfc3339(s.set_aside_at_ms),
            set_aside_at_ms: s.set_aside_at_ms,
        }
    }
}

impl Console {
    /// Starts saga `name` (one this console's engine has) with `data`, under `key` if
    /// given; answers with the saga.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a saga this process does not host; [`Error::Invalid`]
    /// for bad data, key or plan; [`Error::Store`].
    pub async fn start(&self, name: &str, key: Option<&str>, data: Value) -> Result<ShowDoc> {
        if !self.engine.definitions().any(|d| d.name() == name) {
            let hosted = self.startable();
            return Err(Error::NotFound(if hosted.is_empty() {
                format!("this process hosts no saga named `{name}` (it hosts none)")
            } else {
                format!(
                    "this process hosts no saga named `{name}` (it hosts: {})",
                    hosted.join(", ")
                )
            }));
        }
        let mut tx = self.store.begin().await?;
        let accepted = match self.engine.accept_keyed(&mut tx, name, key, data).await {
            Ok(a) => a,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e.into());
            }
        };
        tx.commit().await?;
        let id = accepted.id();
        match self.saga(id).await {
            // Waiting for room under the admission bound: not in `saga_instances` yet.
            Err(Error::NotFound(_)) if Engine::is_waiting(&self.store, id).await? => {
                Err(Error::Refused(format!(
                    "saga {id} is accepted and waits for room under its admission bound"
                )))
            }
            other => other,
        }
    }

    /// The starts set aside (they could not be started when their turn came), oldest
    /// first.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn set_aside_starts(&self) -> Result<Vec<SetAsideDoc>> {
        Ok(Engine::set_aside_starts(&self.store)
            .await?
            .iter()
            .map(SetAsideDoc::from)
            .collect())
    }

    /// Deletes the set-aside start `id` (and the idempotency key that named it).
    ///
    /// # Errors
    /// [`Error::NotFound`] if no start `id` is set aside; [`Error::Store`].
    pub async fn remove_start(&self, id: SagaId) -> Result<SetAsideDoc> {
        let Some(start) = Engine::set_aside_start(&self.store, id).await? else {
            return Err(Error::NotFound(format!("no set-aside start `{id}`")));
        };
        let mut tx = self.store.begin().await?;
        if let Err(e) = Engine::remove_set_aside(&mut tx, id).await {
            let _ = tx.rollback().await;
            return Err(match e {
                agentsaga_saga::Error::NotFound(_) => {
                    Error::NotFound(format!("no set-aside start `{id}`"))
                }
                e => e.into(),
            });
        }
        tx.commit().await?;
        Ok(SetAsideDoc::from(&start))
    }
}
