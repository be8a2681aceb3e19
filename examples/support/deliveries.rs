//! `--record-deliveries`: what the whole-system tests read to check per-key order.
//!
//! Each message an agent handled is recorded in `agent_deliveries` ([`DDL`]), in the
//! agent's own transaction (a handling that failed or was rolled back leaves no row):
//! its destination, its ordering key, its outbox `seq` (its place in the enqueue
//! order), its id, and when the handling started and finished (microseconds of the
//! machine's clock, shared by every process on it; for a `CallingAgent`, from the
//! start of `call` to the end of `record`). Off unless asked for: the agents run
//! unwrapped in effect, and nothing is written.

#![allow(unreachable_pub, dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

use agentsaga::prelude::*;

/// The table (portable DDL).
pub const DDL: &str = "CREATE TABLE IF NOT EXISTS agent_deliveries (destination TEXT NOT NULL, msg_key TEXT, seq BIGINT NOT NULL, message_id TEXT NOT NULL, started_us BIGINT NOT NULL, finished_us BIGINT NOT NULL)";

const INSERT: &str = "INSERT INTO agent_deliveries (destination, msg_key, seq, message_id, started_us, finished_us) VALUES (?, ?, CAST(? AS BIGINT), ?, CAST(? AS BIGINT), CAST(? AS BIGINT))";

/// Records deliveries, or not.
#[derive(Debug, Clone, Copy)]
pub struct Deliveries {
    on: bool,
}

impl Deliveries {
    pub fn new(on: bool) -> Self {
        Self { on }
    }

    /// `agent`, its handlings recorded.
    pub fn agent<A: Agent>(self, agent: A) -> Recorded<A> {
        Recorded {
            inner: agent,
            on: self.on,
        }
    }

    /// `agent`, its handlings recorded.
    pub fn calling<A: CallingAgent>(self, agent: A) -> Recorded<A> {
        Recorded {
            inner: agent,
            on: self.on,
        }
    }
}

/// An agent whose handlings are recorded.
pub struct Recorded<A> {
    inner: A,
    on: bool,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

async fn record(ctx: &mut AgentContext<'_>, started_us: i64) -> Result<(), StepError> {
    let envelope = ctx.envelope();
    let destination = envelope.destination.clone();
    let key = envelope.key.clone().unwrap_or_default();
    let seq = envelope.seq.to_string();
    let id = envelope.id.to_string();
    let (started, finished) = (started_us.to_string(), now_us().to_string());
    let params = [destination.as_str(), &key, &seq, &id, &started, &finished];
    crate::support::exec(ctx.conn(), INSERT, &params).await?;
    Ok(())
}

#[async_trait::async_trait]
impl<A: Agent> Agent for Recorded<A> {
    type Command = A::Command;
    type Reply = A::Reply;

    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn handle(
        &self,
        ctx: &mut AgentContext<'_>,
        command: A::Command,
    ) -> Result<A::Reply, StepError> {
        let started = now_us();
        let reply = self.inner.handle(ctx, command).await?;
        if self.on {
            record(ctx, started).await?;
        }
        Ok(reply)
    }
}

#[async_trait::async_trait]
impl<A: CallingAgent> CallingAgent for Recorded<A> {
    type Command = A::Command;
    /// The inner output, and when `call` started.
    type Output = (A::Output, i64);
    type Reply = A::Reply;

    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn call(
        &self,
        ctx: &CallContext<'_>,
        command: &A::Command,
    ) -> Result<Self::Output, StepError> {
        let started = now_us();
        Ok((self.inner.call(ctx, command).await?, started))
    }

    async fn record(
        &self,
        ctx: &mut AgentContext<'_>,
        command: A::Command,
        (output, started): Self::Output,
    ) -> Result<A::Reply, StepError> {
        let reply = self.inner.record(ctx, command, output).await?;
        if self.on {
            record(ctx, started).await?;
        }
        Ok(reply)
    }
}
