//! Admission control's mover: a task that starts waiting starts (`saga_starts`) as
//! sagas finish, in order, up to each saga name's bound.
//!
//! It looks when a saga of this process settles, when a start was queued here, at
//! start-up (starts left by a killed process) and every [`POLL`] (sagas finished by
//! other processes). A look is one or two reads; it admits (one short transaction per
//! saga name) only once the room under the bound is a whole batch (a tenth of the
//! bound, up to 100), so a busy saga name pays one admission per batch of sagas.

use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::Store;
use agentsaga_saga::{Engine, SagaId, query};
use tokio::sync::{Notify, broadcast, watch};
use tokio::task::JoinHandle;

use crate::actors::Settled;

/// How often admission looks without being told.
const POLL: Duration = Duration::from_millis(250);

/// The running admission task.
pub(crate) struct Admission {
    poke: Arc<Notify>,
    /// Bumped after every commit that started waiting starts.
    admitted: watch::Receiver<u64>,
    task: Option<JoinHandle<()>>,
}

impl Admission {
    pub(crate) fn spawn(
        store: Store,
        engine: Engine,
        settled: broadcast::Receiver<Settled>,
    ) -> Self {
        let poke = Arc::new(Notify::new());
        let (tx, admitted) = watch::channel(0);
        let task = (!engine.bounded_names().is_empty())
            .then(|| tokio::spawn(run(store, engine, settled, Arc::clone(&poke), tx)));
        Self {
            poke,
            admitted,
            task,
        }
    }

    /// The schedules' handle, which pokes this admission when a firing's start waits.
    pub(crate) fn schedules(&self, store: Store, engine: Engine) -> crate::Schedules {
        crate::Schedules {
            store,
            engine,
            wake: Arc::new(Notify::new()),
            admission: Arc::clone(&self.poke),
        }
    }

    /// A start was queued: look soon.
    pub(crate) fn poke(&self) {
        self.poke.notify_one();
    }

    /// Waits until the queued start `id` has started (bounded by nothing: this is the
    /// backpressure a caller of `start_saga` feels).
    ///
    /// # Errors
    /// [`agentsaga_saga::Error::StartSetAside`] if it could not be started when its
    /// turn came; [`agentsaga_saga::Error::NotFound`] if it is gone (an operator
    /// removed it); store errors.
    pub(crate) async fn started(&self, store: &Store, id: SagaId) -> crate::Result<()> {
        let mut admitted = self.admitted.clone();
        loop {
            if query::get(store, id).await?.is_some() {
                return Ok(());
            }
            // Admission moves a start to `saga_instances` in one transaction: ask the
            // queue first, then the instances again, so the move is not missed.
            if !Engine::is_waiting(store, id).await? {
                if query::get(store, id).await?.is_some() {
                    return Ok(());
                }
                return Err(not_started(store, id).await);
            }
            let _ = tokio::time::timeout(POLL, admitted.changed()).await;
        }
    }

    pub(crate) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why start `id`, neither waiting nor started, never will be: set aside (with the
/// reason it could not start when its turn came) or gone (an operator removed it).
pub(crate) async fn not_started(store: &Store, id: SagaId) -> crate::Error {
    match Engine::set_aside_start(store, id).await {
        Ok(Some(s)) => agentsaga_saga::Error::StartSetAside {
            id,
            name: s.name,
            reason: s.error,
        }
        .into(),
        Ok(None) => agentsaga_saga::Error::NotFound(id).into(),
        Err(e) => e.into(),
    }
}

async fn run(
    store: Store,
    engine: Engine,
    mut settled: broadcast::Receiver<Settled>,
    poke: Arc<Notify>,
    admitted: watch::Sender<u64>,
) {
    let names = engine.bounded_names();
    loop {
        for name in &names {
            match engine.admission_due(&store, name).await {
                Ok(false) => {}
                Ok(true) => match admit(&store, &engine, name).await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::debug!(saga.name = %name, started = n, "waiting starts admitted");
                        admitted.send_modify(|g| *g += 1);
                    }
                    Err(e) => {
                        tracing::warn!(saga.name = %name, error = %e, "admitting waiting starts failed; trying again")
                    }
                },
                Err(e) => {
                    tracing::warn!(saga.name = %name, error = %e, "reading waiting starts failed; trying again")
                }
            }
        }
        tokio::select! {
            ev = settled.recv() => {
                if let Err(broadcast::error::RecvError::Closed) = ev {
                    return;
                }
                // Everything that settled meanwhile is one look.
                while settled.try_recv().is_ok() {}
            }
            () = poke.notified() => {}
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

async fn admit(store: &Store, engine: &Engine, name: &str) -> crate::Result<usize> {
    let mut tx = store.begin().await?;
    let ids = engine.admit(&mut tx, name).await?;
    tx.commit().await?;
    Ok(ids.len())
}
