//! `agentsaga sagas abort | retry | skip | raise-budget | pause | resume | rewind`:
//! one transaction each, committed only if the engine accepts the action (the
//! console's [`Console::act`], [`Console::raise_budget`], [`Console::pause`],
//! [`Console::resume`], [`Console::rewind`]).

use agentsaga_console::{Action, Console};
use agentsaga_saga::{Budget, SagaId};

use super::sagas::print_saga;
use crate::args::{PauseArgs, RaiseBudget, RewindArgs};
use crate::format::print_json;

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

/// `sagas raise-budget ID --tokens-out N …`: the saga as `sagas show` prints it after.
pub(super) async fn raise_budget(console: &Console, r: RaiseBudget) -> anyhow::Result<()> {
    let raise = Budget {
        tokens_in: r.tokens_in,
        tokens_out: r.tokens_out,
        cost_micros: r.cost_micros,
        calls: r.calls,
    };
    let doc = console.raise_budget(r.id, raise).await?;
    if r.json.json {
        return print_json(&doc);
    }
    print_saga(&doc);
    Ok(())
}

/// Who acts: `--by`, else `$USER`, else `cli`.
fn who(by: Option<String>) -> String {
    by.unwrap_or_else(|| {
        std::env::var("USER")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| "cli".to_owned())
    })
}

/// `sagas pause ID --reason TEXT [--by NAME]`: `--by` defaults to `$USER`, else `cli`.
pub(super) async fn pause(console: &Console, p: PauseArgs) -> anyhow::Result<()> {
    let by = who(p.by);
    let doc = console.pause(p.id, &by, &p.reason).await?;
    let by = doc
        .saga
        .paused
        .as_ref()
        .map_or(by.as_str(), |p| p.by.as_str());
    outln!(
        "paused saga {} (by {by}): it sends nothing new until `agentsaga sagas resume {}`",
        p.id,
        p.id
    );
    Ok(())
}

/// `sagas resume ID`.
pub(super) async fn resume(console: &Console, id: SagaId) -> anyhow::Result<()> {
    let doc = console.resume(id).await?;
    outln!(
        "resumed saga {id}: it is {}; what its pause held back goes out once its runtime \
         picks it up",
        doc.saga.state
    );
    Ok(())
}

/// `sagas rewind ID --to STEP --reason TEXT [--by NAME]`: `--by` defaults to `$USER`,
/// else `cli`.
pub(super) async fn rewind(console: &Console, r: RewindArgs) -> anyhow::Result<()> {
    let by = who(r.by);
    let doc = console.rewind(r.id, &r.to, &by, &r.reason).await?;
    let (id, to) = (r.id, r.to.trim());
    let by = doc.rewinds.last().map_or(by.as_str(), |r| r.by.as_str());
    if doc.rewinds.last().is_some_and(|r| r.under_way()) {
        outln!(
            "rewinding saga {id} to `{to}` (by {by}): the steps from `{to}` on are undone by \
             their compensations, then it runs again from there (`agentsaga sagas show {id}` \
             follows it)"
        );
    } else {
        outln!(
            "rewound saga {id} to `{to}` (by {by}): nothing to undo; it runs again from `{to}` \
             once its runtime picks it up"
        );
    }
    Ok(())
}
