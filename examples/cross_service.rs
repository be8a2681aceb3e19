//! Two services, two databases, one NATS JetStream between them: a shop runs the
//! `order` saga and two of its agents; the payments service, another process with its
//! own SQLite file, serves the saga's `charge` step (and its refund).
//!
//! ```sh
//! nats-server -js &                                                  # a broker
//! cargo run --example cross_service -- payments --nats nats://127.0.0.1:4222 &
//! cargo run --example cross_service -- shop --nats nats://127.0.0.1:4222 --sagas 100
//! ```
//!
//! Each order is reserved (`stock`, the shop's), charged (`payments`, the payments
//! service's) and shipped (`ship`, the shop's; every fourth order cannot be shipped,
//! which refunds the charge there and releases the stock here). Every agent records
//! what it did in its own database's `effects` table, in the transaction of its inbox
//! record: an effect applied twice would show as two rows. Kill either process with
//! `kill -9` at any moment, or restart the broker, and run it again (the shop with
//! `--sagas 0` finishes what it started): every saga ends, every effect happens once.
//! See docs/remote.md.

use std::time::Duration;

use agentsaga::prelude::*;
use agentsaga::runtime::{NatsConnect, NatsLink};
use clap::{Parser, Subcommand};

#[path = "support/mod.rs"]
mod support;

#[path = "support/orders.rs"]
mod orders;

use orders::{DDL, Order, Recorder, order_saga};

#[derive(Parser)]
#[command(about = "A saga in one service, one of its agents in another, over NATS JetStream")]
struct Args {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// The shop: starts `--sagas` orders and waits until every order has ended.
    Shop {
        /// The NATS server, with JetStream (a secured one: `nats://USER:PASSWORD@host`,
        /// or the `AGENTSAGA_NATS_*` variables of docs/remote.md).
        #[arg(long, default_value = "nats://127.0.0.1:4222")]
        nats: String,
        /// How long the broker waits for this service's acknowledgement before it
        /// delivers again, in milliseconds (after a crash, what it held comes back then).
        #[arg(long, default_value_t = 5000)]
        ack_wait_ms: u64,
        #[command(flatten)]
        common: support::CommonArgs,
    },
    /// The payments service: serves `payments` until stopped (Ctrl-C, SIGTERM).
    Payments {
        /// The NATS server, with JetStream (a secured one: `nats://USER:PASSWORD@host`,
        /// or the `AGENTSAGA_NATS_*` variables of docs/remote.md).
        #[arg(long, default_value = "nats://127.0.0.1:4222")]
        nats: String,
        /// Its database (default: a SQLite file in the working directory).
        #[arg(long)]
        database_url: Option<String>,
        /// Relay lease, in milliseconds: how soon a killed process's claims return.
        #[arg(long, default_value_t = 5000)]
        lease_ms: u64,
        /// As the shop's `--ack-wait-ms`.
        #[arg(long, default_value_t = 5000)]
        ack_wait_ms: u64,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Args::parse().role {
        Role::Shop {
            nats,
            ack_wait_ms,
            common,
        } => shop(&link(&nats, "shop", ack_wait_ms).await?, &common).await,
        Role::Payments {
            nats,
            database_url,
            lease_ms,
            ack_wait_ms,
        } => {
            payments(
                &link(&nats, "payments", ack_wait_ms).await?,
                database_url,
                lease_ms,
            )
            .await
        }
    }
}

/// The link to the broker at `nats`, with the credentials and TLS its user info and the
/// `AGENTSAGA_NATS_*` variables give (docs/remote.md, "A secured broker").
async fn link(nats: &str, service: &str, ack_wait_ms: u64) -> anyhow::Result<NatsLink> {
    Ok(NatsLink::connect(NatsConnect::from_env(nats), service)
        .await?
        .ack_wait(Duration::from_millis(ack_wait_ms)))
}

async fn shop(link: &NatsLink, common: &support::CommonArgs) -> anyhow::Result<()> {
    let telemetry = support::init_telemetry("shop")?;
    common.validate()?;
    let url = common.url("shop.db");
    let runtime = Runtime::builder()
        .database(&url)
        .agent(Recorder("stock"))
        .agent(Recorder("ship"))
        .saga(order_saga()?)
        .remote("payments", link);
    let runtime = support::configure(runtime, common).start().await?;
    support::run(
        runtime,
        common,
        &url,
        DDL,
        // Keyed: a shop killed while starting starts each order once when run again.
        support::Saga::named("order").keyed(|n| format!("order-{n}")),
        |n| Order { n },
    )
    .await?;
    telemetry.shutdown().await;
    Ok(())
}

async fn payments(link: &NatsLink, url: Option<String>, lease_ms: u64) -> anyhow::Result<()> {
    let telemetry = support::init_telemetry("payments")?;
    let url = url.unwrap_or_else(|| "sqlite://payments.db".into());
    // Its table first: the agent writes to it from its first command on.
    let store = Store::connect(&url).await?;
    support::create_tables(&store, DDL).await?;
    let runtime = Runtime::builder()
        .store(store)
        .agent(Recorder("payments"))
        .remote_saga("order", 1, link)
        .relay_config(
            RelayConfig::default()
                .lease(Duration::from_millis(lease_ms))
                .poll_interval(Duration::from_millis(100)),
        )
        .start()
        .await?;
    eprintln!(
        "payments: serving `payments` on {url}, answering saga order v1 over {}",
        link.url()
    );
    stopped().await;
    runtime.shutdown().await;
    telemetry.shutdown().await;
    Ok(())
}

/// Ctrl-C or SIGTERM.
async fn stopped() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
