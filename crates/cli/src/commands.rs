//! The commands. Each opens the store, does one thing, and prints either tables or one
//! pretty JSON document (`--json`).

mod dead;
mod maintenance;
mod mcp;
mod remote;
mod saga_actions;
mod sagas;
mod schedules;
mod serve;
mod starts;
mod status;

use agentsaga_console::{Action, Console};
use agentsaga_relay::nats::NatsConnect;

use crate::args::{Cli, Command, DeadCommand, SagasCommand, StartsCommand};
use crate::db::{self, Missing};

/// Runs the parsed command line.
pub(crate) async fn run(cli: Cli) -> anyhow::Result<()> {
    let missing = match cli.command {
        Command::Migrate => Missing::Create,
        _ => Missing::Refuse,
    };
    // What `migrate` finds before it applies anything, to say what it did.
    let before = match cli.command {
        Command::Migrate => Some(db::applied(cli.database_url.as_deref()).await?),
        _ => None,
    };
    let store = db::open(cli.database_url.as_deref(), missing).await?;
    let console = Console::new(store.clone()).stalled_after(cli.stalled_after);
    let broker = cli.nats.as_deref().map(|url| {
        let mut to = NatsConnect::from_env(url);
        if let Some(path) = &cli.nats_creds {
            to = to.credentials_file(path);
        }
        if let Some(path) = &cli.nats_ca {
            to = to.ca(path);
        }
        match (&cli.nats_cert, &cli.nats_key) {
            (None, None) => to,
            (cert, key) => to.client_cert(
                cert.clone().unwrap_or_default(),
                key.clone().unwrap_or_default(),
            ),
        }
    });
    let console = remote::with_broker(console, broker, cli.service);
    let result = match cli.command {
        Command::Status(j) => status::run(&console, j.json).await,
        Command::Remote(j) => remote::run(&console, j.json).await,
        Command::Sagas(SagasCommand::List(list)) => sagas::list(&console, list).await,
        Command::Sagas(SagasCommand::Signal {
            id,
            name,
            data,
            reject,
        }) => sagas::signal(&console, id, &name, data, reject).await,
        Command::Sagas(SagasCommand::Show { id, json }) => {
            sagas::show(&console, id, json.json).await
        }
        Command::Sagas(SagasCommand::Abort(a)) => {
            saga_actions::run(&console, Action::Abort, a.id).await
        }
        Command::Sagas(SagasCommand::Retry(a)) => {
            saga_actions::run(&console, Action::Retry, a.id).await
        }
        Command::Sagas(SagasCommand::Skip(a)) => {
            saga_actions::run(&console, Action::Skip, a.id).await
        }
        Command::Sagas(SagasCommand::RaiseBudget(r)) => {
            saga_actions::raise_budget(&console, r).await
        }
        Command::Sagas(SagasCommand::Pause(p)) => saga_actions::pause(&console, p).await,
        Command::Sagas(SagasCommand::Resume(a)) => saga_actions::resume(&console, a.id).await,
        Command::Sagas(SagasCommand::Rewind(r)) => saga_actions::rewind(&console, r).await,
        Command::Dead(DeadCommand::List {
            destination,
            limit,
            before,
            json,
        }) => dead::list(&console, destination.as_deref(), before, limit, json.json).await,
        Command::Dead(DeadCommand::Show { id, json }) => dead::show(&console, id, json.json).await,
        Command::Dead(DeadCommand::Redrive {
            id,
            all: _,
            destination,
            force,
        }) => dead::redrive(&console, id, destination.as_deref(), force).await,
        Command::Dead(DeadCommand::Purge(o)) => dead::purge(&console, o.older_than).await,
        Command::Starts(StartsCommand::List { json }) => starts::list(&console, json.json).await,
        Command::Starts(StartsCommand::Remove { id }) => starts::remove(&console, id).await,
        Command::Schedules(c) => schedules::run(&console, c).await,
        Command::Prune(o) => maintenance::prune(&store, o.older_than, o.sagas_older_than).await,
        Command::Migrate => maintenance::migrate(&store, &before.unwrap_or_default()),
        Command::Serve(args) => serve::run(console, args).await,
        Command::Mcp(args) => mcp::run(console, args).await,
    };
    store.close().await;
    result
}
