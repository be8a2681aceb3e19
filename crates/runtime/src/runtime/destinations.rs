//! The destinations a runtime hosts (its agents', its sagas' orchestrators'), and the
//! remote ones it sends to another service (feature `nats`), checked before it starts.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use agentsaga_saga::Engine;

use crate::actors::AgentRunner;
use crate::{Error, Result};

/// The destinations this runtime consumes: one per agent, then the sagas'.
///
/// # Errors
/// [`Error::Config`] for two agents of one destination, nothing to host, or a
/// concurrency set for a destination no agent consumes.
pub(super) fn hosted(
    agents: &[Arc<dyn AgentRunner>],
    concurrency: &HashMap<String, usize>,
    engine: &Engine,
) -> Result<Vec<String>> {
    let mut destinations: Vec<String> = agents.iter().map(|a| a.destination().to_owned()).collect();
    let mut seen = HashSet::new();
    for d in &destinations {
        if !seen.insert(d) {
            return Err(Error::Config(format!("two agents for destination `{d}`")));
        }
    }
    destinations.extend(engine.orchestrator_destinations());
    if destinations.is_empty() {
        return Err(Error::Config(
            "nothing to host: add an agent or a saga".into(),
        ));
    }
    if let Some(unknown) = concurrency
        .keys()
        .find(|d| !agents.iter().any(|a| a.destination() == d.as_str()))
    {
        return Err(Error::Config(format!(
            "concurrency set for `{unknown}`, which no agent here consumes"
        )));
    }
    Ok(destinations)
}

/// Checks the remote destinations: each a NATS subject, none hosted here, none twice;
/// and the hosted ones, which the link receives, subjects too.
///
/// # Errors
/// [`Error::Config`] naming the first destination that cannot work.
#[cfg(feature = "nats")]
pub(super) fn check_remote(
    remote: &[String],
    hosted: &[String],
    link: Option<&crate::NatsLink>,
) -> Result<()> {
    let Some(link) = link else {
        return Ok(());
    };
    let mut seen = HashSet::new();
    for d in remote {
        link.check(d)?;
        if hosted.contains(d) {
            return Err(Error::Config(format!(
                "`{d}` is declared remote and is hosted here too: a destination is served \
                 by one service"
            )));
        }
        if !seen.insert(d) {
            return Err(Error::Config(format!("`{d}` is declared remote twice")));
        }
    }
    for d in hosted {
        link.check(d)?;
    }
    Ok(())
}
