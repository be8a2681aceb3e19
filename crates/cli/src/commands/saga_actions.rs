//! `agentsaga sagas abort | retry | skip`: one transaction each, committed only if
//! the engine accepts the action.

use agentsaga_core::Store;
use agentsaga_saga::{Engine, SagaDefinition, SagaId, SagaState};

/// An operator action on a saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Abort,
    Retry,
    Skip,
}

impl Action {
    fn done(self) -> &'static str {
        match self {
            Action::Abort => "aborted",
            Action::Retry => "retried",
            Action::Skip => "skipped the stuck compensation of",
        }
    }
}

pub(super) async fn run(store: &Store, action: Action, id: SagaId) -> anyhow::Result<()> {
    // No definitions: abort, skip and the retry of a failed compensation work from the
    // compensation ledger alone. Retrying a step after the pivot needs the definition,
    // and the engine refuses it here, saying so.
    let engine = Engine::new(Vec::<SagaDefinition>::new())?;
    let mut tx = store.begin().await?;
    let result = match action {
        Action::Abort => engine.abort(&mut tx, id).await,
        Action::Retry => engine.retry(&mut tx, id).await,
        Action::Skip => engine.skip(&mut tx, id).await,
    };
    match result {
        Ok(state) => {
            tx.commit().await?;
            outln!("{} saga {id}: it is now {state}", action.done());
            if state == SagaState::Compensating {
                outln!("its compensations run as soon as the runtime's relay delivers them");
            }
            Ok(())
        }
        Err(e) => {
            // Nothing of the refused action may stay; a failed rollback only means the
            // transaction is already gone.
            let _ = tx.rollback().await;
            Err(e.into())
        }
    }
}
