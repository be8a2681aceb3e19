//! An operator's pause of a saga: [`Paused`].

use serde::{Deserialize, Serialize};

/// Who paused a saga, why and when (`Engine::pause`). A paused saga sends nothing new:
/// the commands already sent are delivered and their answers recorded, and what would
/// go next (the next stage, a step sent again after a retryable failure or a timeout
/// past the pivot, a compensation) waits until it is resumed (`Engine::resume`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Paused {
    /// Who paused it (an operator's name, `console`, `mcp`).
    pub by: String,
    /// Why.
    pub reason: String,
    /// When, Unix ms.
    pub at_ms: i64,
}
