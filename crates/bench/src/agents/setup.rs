//! What the agents bench's parts share: its options (the rate-limited shape reads them
//! too) and the steps of its saga (the phases are taken per step).

use crate::common::Common;

/// `agents` options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(super) common: Common,
    /// Sagas per run, all started at once (default 500; --quick: 100).
    #[arg(long)]
    pub(super) sagas: Option<usize>,
    /// How long each agent's outside call waits, in ms.
    #[arg(long, default_value_t = 500)]
    pub(super) call_ms: u64,
    /// Instead: sagas calling a provider limited to this many requests a minute
    /// (`agents/limited.rs`; 1,000 sagas, --quick: 100).
    #[arg(long)]
    pub(super) rate_limit: Option<u32>,
    /// With --rate-limit: how long each call takes once the provider took it, in ms.
    #[arg(long, default_value_t = 100)]
    pub(super) limited_call_ms: u64,
}

/// (step name, agent destination), in order; the last is the pivot.
pub(super) const STEPS: [(&str, &str); 3] = [
    ("step_a", "agent_a"),
    ("step_b", "agent_b"),
    ("step_c", "agent_c"),
];
