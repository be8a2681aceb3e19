//! `agentsaga sagas abort | retry | skip`: one transaction each, committed only if
//! the engine accepts the action (the console's [`Console::act`]).

use agentsaga_console::{Action, Console};
use agentsaga_saga::SagaId;

fn done(action: Action) -> &'static str {
    match action {
        Action::Abort => "aborted",
        Action::Retry => "retried",
        Action::Skip => "skipped the stuck compensation of",
    }
}

pub(super) async fn run(console: &Console, action: Action, id: SagaId) -> anyhow::Result<()> {
    // No definitions: abort, skip and the retry of a failed compensation work from the
    // compensation ledger alone. Retrying a step after the pivot needs the definition,
    // and the engine refuses it here, saying so.
    let doc = console.act(id, action).await?;
    let state = doc.saga.state;
    outln!("{} saga {id}: it is now {state}", done(action));
    if state == "compensating" {
        outln!("its compensations run as soon as the runtime's relay delivers them");
    }
    Ok(())
}
