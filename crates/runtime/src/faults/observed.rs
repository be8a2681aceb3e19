//! Random faults from a seed, and the journal of the effects the agents committed
//! (feature `testing`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use agentsaga_core::{Envelope, MessageId};
use agentsaga_saga::{SagaId, protocol};

use super::{Fault, lock};

/// Draws a fault for a saga's deliveries, from a seed: the `n`-th delivery of a
/// step's command (or compensation) in a saga draws the same fault for the same seed,
/// whatever else runs at the same time, so a seed replays its saga's path.
#[derive(Debug)]
pub(crate) struct Chaos {
    seed: u64,
    /// Out of 1,000 deliveries, how many are faulted.
    per_mille: u64,
    /// Deliveries so far, per saga, step, and command (`false`) or compensation.
    seen: HashMap<(SagaId, usize, bool), u64>,
    drawn: BTreeMap<&'static str, u64>,
}

impl Chaos {
    /// Faults about `rate` (0 to 1) of the deliveries, drawn from `seed`.
    pub(crate) fn new(seed: u64, rate: f64) -> Self {
        // A rate is a fraction of 1,000: the cast cannot lose anything that matters.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let per_mille = (rate.clamp(0.0, 1.0) * 1000.0).round() as u64;
        Self {
            seed,
            per_mille,
            seen: HashMap::new(),
            drawn: BTreeMap::new(),
        }
    }

    /// This delivery's fault, if it draws one: only a saga's commands and
    /// compensations are faulted.
    pub(crate) fn draw(&mut self, env: &Envelope) -> Option<Fault> {
        let (step, undo) = match protocol::Outbound::parse(env)? {
            protocol::Outbound::Command { step } => (step, false),
            protocol::Outbound::Compensation { step } => (step, true),
        };
        let saga = protocol::saga_id(env).ok()?;
        let n = self.seen.entry((saga, step, undo)).or_default();
        *n += 1;
        let at = (u64::try_from(step).unwrap_or(u64::MAX) << 33) ^ (u64::from(undo) << 32) ^ *n;
        let h = mix(self.seed ^ mix(at));
        if h % 1000 >= self.per_mille {
            return None;
        }
        let why = format!("a random fault (seed {})", self.seed);
        let (kind, fault) = match (h >> 16) % 5 {
            0 => ("retryable", Fault::Retryable(why)),
            1 => ("fatal", Fault::Fatal(why)),
            2 => ("timed out", Fault::TimedOut),
            3 => ("dead letter", Fault::DeadLetter(why)),
            _ => ("twice", Fault::Twice),
        };
        *self.drawn.entry(kind).or_default() += 1;
        Some(fault)
    }

    /// The faults drawn so far, by kind.
    pub(crate) fn drawn(&self) -> Vec<(String, u64)> {
        self.drawn
            .iter()
            .map(|(k, n)| ((*k).to_owned(), *n))
            .collect()
    }
}

/// SplitMix64's finaliser: a fixed, well-spread hash, so that a seed means the same
/// faults in every version of this crate's dependencies.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What one agent committed: a saga step's command done or its compensation
/// (undo) done ([`TestRuntime::ledger`](crate::testing::TestRuntime::ledger)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The step's index in its saga.
    pub idx: usize,
    /// The step's name.
    pub step: String,
    /// The agent's destination.
    pub destination: String,
    /// Done or undone.
    pub action: Action,
}

/// What an [`Entry`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The step's command: its agent's effects committed.
    Done,
    /// Its compensation: the undo's effects committed.
    Undone,
}

/// The effects the agents committed, in commit order: each delivery whose work
/// succeeded and whose transaction (effects, inbox record, answer) committed. Kept
/// only once [`start`](Self::start)ed (a test runtime's). An effect is noted before
/// its commit and settled after it; one a crash cut short between the two is
/// settled by its inbox record ([`unsettled`](Self::unsettled)).
#[derive(Debug, Default)]
pub(crate) struct Journal {
    on: AtomicBool,
    effects: Mutex<Vec<Effect>>,
}

/// One effect: its saga (if a saga sent it), its message, its destination, its ledger
/// entry (a saga's command or compensation), and whether it committed.
#[derive(Debug)]
struct Effect {
    saga: Option<SagaId>,
    message: MessageId,
    destination: String,
    entry: Option<Entry>,
    committed: Option<bool>,
}

/// An effect noted and not yet settled ([`Journal::noted`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark(Option<usize>);

impl Journal {
    pub(crate) fn start(&self) {
        self.on.store(true, Ordering::Release);
    }

    /// `env`'s work succeeded and its commit begins.
    pub(crate) fn noted(&self, env: &Envelope) -> Mark {
        if !self.on.load(Ordering::Acquire) {
            return Mark(None);
        }
        let entry = protocol::Outbound::parse(env).map(|o| {
            let (idx, action) = match o {
                protocol::Outbound::Command { step } => (step, Action::Done),
                protocol::Outbound::Compensation { step } => (step, Action::Undone),
            };
            Entry {
                idx,
                step: env
                    .header(protocol::STEP_NAME)
                    .unwrap_or_default()
                    .to_owned(),
                destination: env.destination.clone(),
                action,
            }
        });
        let mut effects = lock(&self.effects);
        effects.push(Effect {
            saga: protocol::saga_id(env).ok(),
            message: env.id,
            destination: env.destination.clone(),
            entry,
            committed: None,
        });
        Mark(Some(effects.len() - 1))
    }

    /// Whether the effect at `mark` committed.
    pub(crate) fn settle(&self, mark: Mark, committed: bool) {
        if let Mark(Some(at)) = mark
            && let Some(effect) = lock(&self.effects).get_mut(at)
        {
            effect.committed = Some(committed);
        }
    }

    /// The effects noted and never settled (a crash came between), each with its
    /// destination and message: settle them by whether the inbox has the message.
    pub(crate) fn unsettled(&self) -> Vec<(Mark, String, MessageId)> {
        lock(&self.effects)
            .iter()
            .enumerate()
            .filter(|(_, e)| e.committed.is_none())
            .map(|(at, e)| (Mark(Some(at)), e.destination.clone(), e.message))
            .collect()
    }

    /// Saga `id`'s entries, in commit order.
    pub(crate) fn of(&self, id: SagaId) -> Vec<Entry> {
        lock(&self.effects)
            .iter()
            .filter(|e| e.committed == Some(true) && e.saga == Some(id))
            .filter_map(|e| e.entry.clone())
            .collect()
    }

    /// How many effects `destination`'s agent committed.
    pub(crate) fn at(&self, destination: &str) -> u64 {
        let n = lock(&self.effects)
            .iter()
            .filter(|e| e.committed == Some(true) && e.destination == destination)
            .count();
        u64::try_from(n).unwrap_or(u64::MAX)
    }
}
