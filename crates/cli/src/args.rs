//! The command line, as clap sees it. Values are parsed here (ids, durations, states)
//! so that a malformed one is refused before the database is touched.

use std::path::PathBuf;
use std::time::Duration;

use agentsaga_core::MessageId;
use agentsaga_saga::{SagaId, SagaState};
use clap::{Args, Parser, Subcommand};

use crate::format;

mod sagas;
mod schedules;

pub(crate) use sagas::{PauseArgs, RaiseBudget, RewindArgs, SagasCommand, SagasList};
pub(crate) use schedules::{ScheduleArgs, ScheduleName, SchedulesCommand};

/// The agentsaga operator CLI: inspect and repair the outbox, dead letters and sagas.
#[derive(Debug, Parser)]
#[command(name = "agentsaga", version, about, long_about = None)]
pub(crate) struct Cli {
    /// The database: `sqlite://file.db`, a bare path `file.db`, or
    /// `postgres://user@host:port/db`.
    #[arg(
        long,
        global = true,
        env = "DATABASE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) database_url: Option<String>,

    /// A running saga that made no progress for this long counts as stalled (`status`,
    /// `sagas list --stalled`), as does one with nothing pending or in flight at all (a
    /// command delivered to another service is its answer awaited: not at once).
    #[arg(long, global = true, value_name = "DUR", default_value = "15m", value_parser = parse_duration)]
    pub(crate) stalled_after: Duration,

    /// A NATS server with JetStream (`nats://host:4222`, `tls://…`): `remote` reads the
    /// lag of the stream's consumers there, and `status`, `serve` and `mcp` show it too.
    /// A secured one: `nats://USER:PASSWORD@host:4222` or `nats://TOKEN@host:4222`, or
    /// AGENTSAGA_NATS_USER and AGENTSAGA_NATS_PASSWORD, AGENTSAGA_NATS_TOKEN; TLS with
    /// AGENTSAGA_NATS_TLS=1 (and the options below). Shown with its password as `***`.
    #[arg(
        long,
        global = true,
        env = "AGENTSAGA_NATS",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) nats: Option<String>,

    /// With `--nats`: the `.creds` file (user JWT and NKey seed) to authenticate with
    /// [env: AGENTSAGA_NATS_CREDS].
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) nats_creds: Option<PathBuf>,

    /// With `--nats`: the CA certificates (PEM) the server's certificate is checked
    /// against instead of the system's roots; requires TLS [env: AGENTSAGA_NATS_CA].
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) nats_ca: Option<PathBuf>,

    /// With `--nats`: a client certificate (PEM) for a server that verifies clients,
    /// with `--nats-key` [env: AGENTSAGA_NATS_CERT].
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) nats_cert: Option<PathBuf>,

    /// With `--nats`: the client certificate's key (PEM) [env: AGENTSAGA_NATS_KEY].
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) nats_key: Option<PathBuf>,

    /// With `--nats`: only the consumers of this service (those named `<NAME>_…`).
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) service: Option<String>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

impl Cli {
    /// What clap cannot check alone: values wrong only together (a schedule's cron
    /// expression in its time zone, its bounds), refused as a usage error (exit 2)
    /// before the database is touched.
    pub(crate) fn checked(self) -> Result<Self, clap::Error> {
        if let Command::Schedules(c) = &self.command {
            c.check().map_err(|e| {
                clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{e}\n"))
            })?;
        }
        Ok(self)
    }
}

/// The top-level commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Outbox counts by state, relay lag, dead letters and sagas by state.
    Status(JsonFlag),
    /// Destinations served over NATS (`--nats`): per consumer, what the broker holds
    /// for it and what is in its service's hands, beside this database's rows waiting.
    Remote(JsonFlag),
    /// Inspect sagas; abort, retry or skip a stuck one; pause and resume one; rewind
    /// one to a step.
    #[command(subcommand)]
    Sagas(SagasCommand),
    /// Inspect, re-drive or purge dead letters.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Waiting starts that could not be started when their turn came (set aside by
    /// admission control): list them, remove one.
    #[command(subcommand)]
    Starts(StartsCommand),
    /// Schedules (sagas started on a cron calendar): list, show, create, put, pause,
    /// resume, delete.
    #[command(subcommand)]
    Schedules(SchedulesCommand),
    /// Delete delivered outbox rows and inbox records older than a duration (and, with
    /// `--sagas-older-than`, finished sagas with their steps and dead letters).
    Prune(PruneArgs),
    /// Create the database if missing and apply the schema migrations.
    Migrate,
    /// Serve the operator console: the admin HTTP API (`/api/v1`) and the web page
    /// (`/`). Loopback by default; any other address needs a token.
    Serve(ServeArgs),
    /// Speak the Model Context Protocol over stdio: tools for AI agents to read sagas
    /// and dead letters, and, only with `--allow`, to act on them.
    Mcp(McpArgs),
}

/// `agentsaga mcp`.
#[derive(Debug, Args)]
pub(crate) struct McpArgs {
    /// Actions the tools may take, comma-separated: start, signal, abort, pause,
    /// redrive. None by default (read-only). Even with `signal`, a wait that is a
    /// person's decision (every wait, unless its saga says agents may signal it) is
    /// never signalled through MCP; and no tool resumes a paused saga (a person does).
    #[arg(long, value_name = "ACTIONS", value_delimiter = ',')]
    pub(crate) allow: Vec<agentsaga_console::mcp::McpAction>,
}

/// `agentsaga serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Where to listen. Anything but a loopback address requires `--token`.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7070")]
    pub(crate) addr: std::net::SocketAddr,
    /// Bearer token that may read and act (prefer the environment variable).
    #[arg(
        long,
        env = "AGENTSAGA_ADMIN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub(crate) token: Option<String>,
    /// Bearer token that may only read.
    #[arg(
        long,
        env = "AGENTSAGA_ADMIN_READ_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub(crate) read_token: Option<String>,
    /// Base URL of Jaeger's UI, for the link to a saga's trace.
    #[arg(long, env = "AGENTSAGA_JAEGER_URL", value_name = "URL")]
    pub(crate) jaeger_url: Option<String>,
    /// A host name the console is reached by, besides IP addresses and `localhost`
    /// (repeat it for more). Requests to any other name are refused (421), so that a
    /// web page whose name is rebound to this address cannot use the console.
    #[arg(long = "allow-host", value_name = "NAME", value_parser = parse_host_name)]
    pub(crate) allow_hosts: Vec<String>,
}

/// `--json`.
#[derive(Debug, Args)]
pub(crate) struct JsonFlag {
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `--older-than DUR`.
#[derive(Debug, Args)]
pub(crate) struct OlderThan {
    /// Age: a number and a unit (ms, s, m, h, d), e.g. `7d`.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub(crate) older_than: Duration,
}

/// `agentsaga prune`.
#[derive(Debug, Args)]
pub(crate) struct PruneArgs {
    /// Delivered outbox rows and inbox records older than this (a number and a unit:
    /// ms, s, m, h, d). Keep inbox records longer than any redelivery can take.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub(crate) older_than: Duration,
    /// Also delete sagas that finished (completed, compensated, aborted) longer ago
    /// than this, with their steps and their dead letters. Running and stuck sagas
    /// are never touched.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub(crate) sagas_older_than: Option<Duration>,
}

/// `agentsaga starts ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum StartsCommand {
    /// The set-aside starts, oldest first, with why each could not start.
    List {
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Delete one set-aside start (and the idempotency key that named it).
    Remove {
        /// The start's id (a UUID, as `starts list` prints it).
        #[arg(value_parser = parse_saga_id)]
        id: SagaId,
    },
}

/// `agentsaga dead ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum DeadCommand {
    /// Dead letters, newest first.
    List {
        /// Only dead letters to this destination.
        #[arg(long, value_name = "D")]
        destination: Option<String>,
        /// At most this many (and at most 4 MiB of payloads, headers and errors).
        #[arg(long, value_name = "K", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        /// Only dead letters older than this seq: the `next_before` of the page before.
        #[arg(long, value_name = "SEQ")]
        before: Option<i64>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// One dead letter: payload, headers, last error, attempts.
    Show {
        /// The message id (a UUID).
        #[arg(value_parser = parse_message_id)]
        id: MessageId,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Make dead letters pending again, attempts reset: one by id, or `--all`.
    #[command(group = clap::ArgGroup::new("which").required(true).args(["id", "all"]))]
    Redrive {
        /// The message id (a UUID).
        #[arg(value_parser = parse_message_id)]
        id: Option<MessageId>,
        /// Every dead letter (or every one of `--destination`).
        #[arg(long)]
        all: bool,
        /// With `--all`: only dead letters to this destination.
        #[arg(long, value_name = "D", requires = "all")]
        destination: Option<String>,
        /// Purge moot dead letters (whose saga has moved past them) instead of
        /// refusing them.
        #[arg(long)]
        force: bool,
    },
    /// Delete dead letters created more than a duration ago.
    Purge(OlderThan),
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    format::parse_duration(s)
}

/// A host name as `--allow-host` takes it: letters, digits, `-` and `.`, no scheme, no
/// path (a port, if given, is ignored).
fn parse_host_name(s: &str) -> Result<String, String> {
    let name = s.rsplit_once(':').map_or(s, |(name, _)| name);
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if ok {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "`{s}` is not a host name (e.g. `console.internal`: no scheme, no path)"
        ))
    }
}

fn parse_state(s: &str) -> Result<SagaState, String> {
    s.parse().map_err(|_| {
        format!(
            "unknown saga state `{s}`: expected one of running, compensating, completed, \
             compensated, stuck, aborted"
        )
    })
}

fn parse_saga_id(s: &str) -> Result<SagaId, String> {
    agentsaga_console::ops::parse_saga_id(s).map_err(|e| e.to_string())
}

fn parse_message_id(s: &str) -> Result<MessageId, String> {
    agentsaga_console::ops::parse_message_id(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
