//! The commands. Each opens the store, does one thing, and prints either tables or one
//! pretty JSON document (`--json`).

mod dead;
mod maintenance;
mod saga_actions;
mod sagas;
mod status;

use serde::Serialize;

use crate::args::{Cli, Command, DeadCommand, SagasCommand};
use crate::db::{self, Missing};

/// Runs the parsed command line.
pub(crate) async fn run(cli: Cli) -> anyhow::Result<()> {
    let missing = match cli.command {
        Command::Migrate => Missing::Create,
        _ => Missing::Refuse,
    };
    let store = db::open(cli.database_url.as_deref(), missing).await?;
    let result = match cli.command {
        Command::Status(j) => status::run(&store, j.json).await,
        Command::Sagas(SagasCommand::List {
            state,
            name,
            key,
            waiting,
            limit,
            json,
        }) => sagas::list(&store, state, name, key, waiting, limit, json.json).await,
        Command::Sagas(SagasCommand::Signal {
            id,
            name,
            data,
            reject,
        }) => sagas::signal(&store, id, &name, data, reject).await,
        Command::Sagas(SagasCommand::Show { id, json }) => sagas::show(&store, id, json.json).await,
        Command::Sagas(SagasCommand::Abort(a)) => {
            saga_actions::run(&store, saga_actions::Action::Abort, a.id).await
        }
        Command::Sagas(SagasCommand::Retry(a)) => {
            saga_actions::run(&store, saga_actions::Action::Retry, a.id).await
        }
        Command::Sagas(SagasCommand::Skip(a)) => {
            saga_actions::run(&store, saga_actions::Action::Skip, a.id).await
        }
        Command::Dead(DeadCommand::List {
            destination,
            limit,
            json,
        }) => dead::list(&store, destination.as_deref(), limit, json.json).await,
        Command::Dead(DeadCommand::Show { id, json }) => dead::show(&store, id, json.json).await,
        Command::Dead(DeadCommand::Redrive {
            id,
            all: _,
            destination,
            force,
        }) => dead::redrive(&store, id, destination.as_deref(), force).await,
        Command::Dead(DeadCommand::Purge(o)) => dead::purge(&store, o.older_than).await,
        Command::Prune(o) => maintenance::prune(&store, o.older_than, o.sagas_older_than).await,
        Command::Migrate => maintenance::migrate(&store),
    };
    store.close().await;
    result
}

/// Prints `value` as one pretty JSON document.
fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// A JSON text stored in the database as a JSON value (or, if it does not parse, as
/// the string it is).
fn json_value(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_owned()))
}
