//! The right to consume one destination: a receiver's worker holds its consumer's
//! [`Exclusive`] right of the database (see `Store::try_exclusive`) while it fetches
//! and stores, so that of the processes of one service sharing a database (replicas
//! on one PostgreSQL), one at a time stores a destination's messages, in stream order.
//! The others stand by, and one of them takes over when the holder stops, dies or
//! loses its database session; it then waits out what the holder left unacknowledged
//! before it fetches (the worker's session does).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use agentsaga_core::{Exclusive, Store};
use tokio::sync::watch;

use super::counters::Counters;

/// A destination's right, held: counted in the receiver's `holding` while it lives.
#[derive(Debug)]
pub(crate) struct Held {
    right: Exclusive,
    counters: Arc<Counters>,
}

impl Held {
    /// The right's name.
    pub(crate) fn name(&self) -> &str {
        self.right.name()
    }

    /// Whether it is still held (see `Exclusive::still_held`).
    pub(crate) async fn still_held(&mut self) -> bool {
        self.right.still_held().await
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.counters.holding.fetch_sub(1, Relaxed);
    }
}

/// How often a worker standing by asks for the right again.
const STAND_BY: Duration = Duration::from_secs(1);

/// The longest name a right can have.
pub(crate) const MAX_NAME: usize = 200;

/// The right's name for `consumer` of `stream`, one name per pair (two consumers never
/// share a right): `nats.<stream>.<consumer>` when both are made of ASCII letters,
/// digits, `_` and `-` only (the name it always had); else
/// `nats.x.<stream>.<consumer>`, each byte but ASCII letters, digits and `-` written
/// `_XX` (hex), so that `orders-eu` and `orders+eu`, or `paiement.é` and `paiement.è`,
/// get rights of their own. (The first form has three dot-separated parts, the second
/// four: they never meet.) It may be longer than [`MAX_NAME`]: the configuration
/// refuses such names.
pub(crate) fn name(stream: &str, consumer: &str) -> String {
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
    };
    if plain(stream) && plain(consumer) {
        return format!("nats.{stream}.{consumer}");
    }
    let escaped = |s: &str| {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(s.len());
        for b in s.bytes() {
            if b.is_ascii_alphanumeric() || b == b'-' {
                out.push(char::from(b));
            } else {
                let _ = write!(out, "_{b:02X}");
            }
        }
        out
    };
    format!("nats.x.{}.{}", escaped(stream), escaped(consumer))
}

/// The right `name`, once granted; `None` if `stop` turns true first.
pub(crate) async fn acquire(
    store: &Store,
    name: &str,
    counters: &Arc<Counters>,
    stop: &mut watch::Receiver<bool>,
) -> Option<Held> {
    let mut said = false;
    loop {
        if *stop.borrow() {
            return None;
        }
        match store.try_exclusive(name).await {
            Ok(Some(right)) => {
                if said {
                    tracing::info!(right = name, "NATS receiver: took over the destination");
                }
                counters.holding.fetch_add(1, Relaxed);
                return Some(Held {
                    right,
                    counters: counters.clone(),
                });
            }
            Ok(None) if !said => {
                said = true;
                tracing::info!(
                    right = name,
                    "NATS receiver: another process of this service receives the \
                     destination; standing by"
                );
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(
                right = name,
                error = %e,
                "NATS receiver: cannot ask for the right to receive; trying again"
            ),
        }
        tokio::select! {
            () = tokio::time::sleep(STAND_BY) => {}
            _ = stop.wait_for(|s| *s) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_holds_only_what_a_right_can_and_is_one_per_consumer() {
        assert_eq!(
            name("AGENTSAGA", "shop_saga_order_v1"),
            "nats.AGENTSAGA.shop_saga_order_v1"
        );
        assert_eq!(name("S", "pay/eu ü"), "nats.x.S.pay_2Feu_20_C3_BC");
        let names = [
            name("S", "svc_orders-eu"),
            name("S", "svc_orders+eu"),
            name("S", "svc_orders_2Beu"),
            name("S", "svc_paiement_é"),
            name("S", "svc_paiement_è"),
            name("S", "x.svc"),
            name("S.x", "svc"),
            name("x", "S.svc"),
            name("S", "x_2Esvc"),
        ];
        for (i, a) in names.iter().enumerate() {
            assert!(
                a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')),
                "{a}"
            );
            for b in &names[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
