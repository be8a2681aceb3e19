//! (feature `nats`) The builder's side of a NATS link: which destinations go to other
//! services (see the module [`remote`](crate::remote)).

use super::builder::RuntimeBuilder;

impl RuntimeBuilder {
    /// Sends what this runtime writes for `destination` to the
    /// service that hosts it, over NATS JetStream, and receives what is published for
    /// this runtime's own destinations (see the module [`remote`](crate::remote)).
    /// Give every remote destination the same link.
    pub fn remote(mut self, destination: impl Into<String>, link: &crate::NatsLink) -> Self {
        self.remote.push(destination.into());
        self.nats = Some(link.clone());
        self
    }

    /// [`remote`](Self::remote) for the replies to saga `name` at
    /// `version` (its orchestrator's destination): how a service whose agents serve
    /// another service's saga answers it.
    pub fn remote_saga(self, name: &str, version: i32, link: &crate::NatsLink) -> Self {
        self.remote(
            agentsaga_saga::orchestrator_destination(name, version),
            link,
        )
    }
}
