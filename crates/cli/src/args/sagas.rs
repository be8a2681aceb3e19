//! `agentsaga sagas ...`: list and show sagas, signal one, and act on one (abort,
//! retry, skip, raise its budget, pause and resume it, rewind it to a step).

use agentsaga_saga::{SagaId, SagaState};
use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Subcommand};

use super::{JsonFlag, parse_saga_id, parse_state};

/// `agentsaga sagas ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum SagasCommand {
    /// Sagas, newest first.
    List(SagasList),
    /// Send a saga the signal it waits for (an approval, an outside event): approve
    /// with `--data JSON` (the payload folded into its data), or `--reject REASON`.
    Signal {
        /// The saga id (a UUID).
        #[arg(value_parser = parse_saga_id)]
        id: SagaId,
        /// The signal's name (the `Step::wait_for` name).
        name: String,
        /// The approval's payload, as JSON (default `null`).
        #[arg(long, value_name = "JSON", conflicts_with = "reject")]
        data: Option<String>,
        /// Reject instead of approving, with this reason.
        #[arg(long, value_name = "REASON")]
        reject: Option<String>,
    },
    /// One saga and its steps as a timeline, with the compensation ledger.
    Show {
        /// The saga id (a UUID).
        #[arg(value_parser = parse_saga_id)]
        id: SagaId,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Abort a running saga (compensate what it did), or give up on one stuck after
    /// its pivot.
    Abort(SagaIdArg),
    /// Retry a stuck saga: its failed compensation (or its failed step after the pivot,
    /// which needs the saga's definition and so is refused here).
    Retry(SagaIdArg),
    /// Mark a stuck compensation as done by hand (recorded as `skipped`) and go on.
    Skip(SagaIdArg),
    /// Raise a saga's budget: set the limits given (the others are kept). A saga that
    /// waits for a raise goes on once its runtime picks it up, if something is left.
    RaiseBudget(RaiseBudget),
    /// Pause a saga: it sends nothing new (no next step, no step sent again, no
    /// compensation) until `sagas resume`; what it sent already is still answered and
    /// recorded. Refused for a finished saga or one paused already.
    Pause(PauseArgs),
    /// Resume a paused saga: what its pause held back goes out once its runtime picks
    /// it up. Refused for a saga that is not paused.
    Resume(SagaIdArg),
    /// Rewind a running saga to one of its steps: that step and every step after it
    /// are undone (latest first, by their compensations), then it runs again from that
    /// step's stage with its data as the stage began. Refused for a saga not running, a
    /// step it never took, a step of that stage or later in flight (pause it first, and
    /// rewind once they answered), or once its pivot is taken. Ends a pause.
    Rewind(RewindArgs),
}

/// `agentsaga sagas rewind ID --to STEP --reason TEXT [--by NAME]`.
#[derive(Debug, Args)]
pub(crate) struct RewindArgs {
    /// The saga id (a UUID).
    #[arg(value_parser = parse_saga_id)]
    pub(crate) id: SagaId,
    /// The step to rewind to (its name, as `sagas show` lists it): it and every step
    /// after it are undone, then run again.
    #[arg(long, value_name = "STEP", value_parser = NonEmptyStringValueParser::new())]
    pub(crate) to: String,
    /// Why it is rewound (kept with the saga, shown by `sagas show`).
    #[arg(long, value_name = "TEXT", value_parser = NonEmptyStringValueParser::new())]
    pub(crate) reason: String,
    /// Who rewinds it [default: $USER, else `cli`].
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    pub(crate) by: Option<String>,
}

/// `agentsaga sagas pause ID --reason TEXT [--by NAME]`.
#[derive(Debug, Args)]
pub(crate) struct PauseArgs {
    /// The saga id (a UUID).
    #[arg(value_parser = parse_saga_id)]
    pub(crate) id: SagaId,
    /// Why it is paused (shown with the saga).
    #[arg(long, value_name = "TEXT", value_parser = NonEmptyStringValueParser::new())]
    pub(crate) reason: String,
    /// Who pauses it [default: $USER, else `cli`].
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    pub(crate) by: Option<String>,
}

/// `agentsaga sagas raise-budget ID --tokens-out N …`: at least one limit.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("limit").required(true).multiple(true)))]
pub(crate) struct RaiseBudget {
    /// The saga id (a UUID).
    #[arg(value_parser = parse_saga_id)]
    pub(crate) id: SagaId,
    /// At most this many tokens sent to a model.
    #[arg(long, value_name = "N", group = "limit")]
    pub(crate) tokens_in: Option<u64>,
    /// At most this many tokens a model produced.
    #[arg(long, value_name = "N", group = "limit")]
    pub(crate) tokens_out: Option<u64>,
    /// At most this cost, in micro-units of the application's currency.
    #[arg(long, value_name = "N", group = "limit")]
    pub(crate) cost_micros: Option<u64>,
    /// At most this many outside calls.
    #[arg(long, value_name = "N", group = "limit")]
    pub(crate) calls: Option<u64>,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
}

/// `agentsaga sagas list`: the filters of the page it asks for.
#[derive(Debug, Args)]
pub(crate) struct SagasList {
    /// Only sagas in this state (running, compensating, completed, compensated,
    /// stuck, aborted).
    #[arg(long, value_name = "S", value_parser = parse_state)]
    pub(crate) state: Option<SagaState>,
    /// Only sagas of this name.
    #[arg(long, value_name = "N")]
    pub(crate) name: Option<String>,
    /// Only the saga started with this idempotency key.
    #[arg(long, value_name = "KEY")]
    pub(crate) key: Option<String>,
    /// Only sagas parked at a wait for a signal.
    #[arg(long)]
    pub(crate) waiting: bool,
    /// Only sagas parked at a sleep (`Step::sleep`), with when they wake.
    #[arg(long)]
    pub(crate) sleeping: bool,
    /// Only the child sagas of this saga (started by its steps: `Step::saga`).
    #[arg(long, value_name = "ID", value_parser = parse_saga_id)]
    pub(crate) parent: Option<SagaId>,
    /// Only stalled sagas: running or compensating, not waiting for a signal, with
    /// nothing pending or in flight for them, or no progress for `--stalled-after`.
    #[arg(long)]
    pub(crate) stalled: bool,
    /// The page after this cursor (printed as `more: --cursor …` under a full page).
    #[arg(long, value_name = "C")]
    pub(crate) cursor: Option<String>,
    /// At most this many.
    #[arg(long, value_name = "K", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) limit: u32,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
}

/// A saga id argument.
#[derive(Debug, Args)]
pub(crate) struct SagaIdArg {
    /// The saga id (a UUID).
    #[arg(value_parser = parse_saga_id)]
    pub(crate) id: SagaId,
}
