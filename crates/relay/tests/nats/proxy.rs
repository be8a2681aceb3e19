//! A TCP proxy of the tests' own on 127.0.0.1, between a client and `nats-server`:
//! it can throttle the link (bytes per second, each direction) and cut it (every
//! connection closed, new ones closed at once) and restore it, or take it down (its
//! port refuses connections, as a host that is away does) and up again, so that a test
//! can put a slow or broken network between a service and its broker or its peer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A proxy to one upstream address; stops (every connection closed) when dropped.
pub(crate) struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    rate: Arc<AtomicU64>,
    frozen: Arc<AtomicBool>,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `upstream` (`127.0.0.1:<port>`), unthrottled, the link up.
    pub(crate) async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
        let addr = listener.local_addr().unwrap();
        let rate = Arc::new(AtomicU64::new(0));
        let frozen = Arc::new(AtomicBool::new(false));
        let (cut, _) = watch::channel(false);
        let task = tokio::spawn(accept(
            listener,
            upstream,
            Link {
                rate: Arc::clone(&rate),
                frozen: Arc::clone(&frozen),
            },
            cut.clone(),
        ));
        Self {
            addr,
            upstream,
            rate,
            frozen,
            cut,
            task,
        }
    }

    /// A proxy to the server whose URL is `url` (`nats://127.0.0.1:<port>`).
    pub(crate) async fn to_url(url: &str) -> Self {
        let host = url.trim_start_matches("nats://");
        Self::start(host.parse().expect("an address")).await
    }

    /// The URL a NATS client connects to, through the proxy.
    pub(crate) fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// At most `bytes_per_second` each way on each connection (0: as fast as it goes).
    pub(crate) fn throttle(&self, bytes_per_second: u64) {
        self.rate.store(bytes_per_second, Relaxed);
    }

    /// Cuts the link: every connection is closed, and new ones are closed at once.
    pub(crate) fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Restores the link: new connections go through again.
    pub(crate) fn restore(&self) {
        self.cut.send_replace(false);
    }

    /// Freezes the link, as a peer stopped with `SIGSTOP` looks from the network: the
    /// connections stay open, nothing goes through either way (new ones are taken and
    /// held too), until [`thaw`](Self::thaw); then what was held flows on.
    #[allow(dead_code, reason = "the promise suite's, not every binary's")]
    pub(crate) fn freeze(&self) {
        self.frozen.store(true, Relaxed);
    }

    /// Ends a [`freeze`](Self::freeze).
    #[allow(dead_code, reason = "the promise suite's, not every binary's")]
    pub(crate) fn thaw(&self) {
        self.frozen.store(false, Relaxed);
    }

    /// Takes the link down: every connection closed, and the port refuses new ones
    /// (a host away), until [`up`](Self::up).
    #[allow(dead_code, reason = "the promise suite's, not every binary's")]
    pub(crate) fn down(&self) {
        self.cut.send_replace(true);
        self.task.abort();
    }

    /// Brings the link up again on the same port.
    #[allow(dead_code, reason = "the promise suite's, not every binary's")]
    pub(crate) async fn up(&mut self) {
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                // The aborted accept loop may not have let go of the port yet.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        self.cut.send_replace(false);
        self.task = tokio::spawn(accept(
            listener,
            self.upstream,
            Link {
                rate: Arc::clone(&self.rate),
                frozen: Arc::clone(&self.frozen),
            },
            self.cut.clone(),
        ));
    }

    /// Its address on 127.0.0.1.
    #[allow(dead_code, reason = "the promise suite's, not every binary's")]
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut.send_replace(true);
        self.task.abort();
    }
}

/// What every connection of a proxy shares: its rate and whether it is frozen.
#[derive(Clone)]
struct Link {
    rate: Arc<AtomicU64>,
    frozen: Arc<AtomicBool>,
}

impl Link {
    async fn while_frozen(&self) {
        while self.frozen.load(Relaxed) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, link: Link, cut: watch::Sender<bool>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *cut.borrow() {
            drop(client);
            continue;
        }
        let Ok(server) = TcpStream::connect(upstream).await else {
            continue;
        };
        let (link, mut cut) = (link.clone(), cut.subscribe());
        tokio::spawn(async move {
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::select! {
                () = pipe(cr, sw, link.clone()) => {}
                () = pipe(sr, cw, link) => {}
                _ = cut.wait_for(|c| *c) => {}
            }
            // Both halves dropped: the connection is closed each way.
        });
    }
}

/// Copies `from` to `to` at most the link's rate in bytes per second (read now), holding
/// what it has while the link is frozen, until either ends.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: Link,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        link.while_frozen().await;
        let limit = link.rate.load(Relaxed);
        // Small chunks when throttled: at most 1/20 s of the rate at a time.
        let chunk = if limit == 0 {
            buf.len()
        } else {
            usize::try_from(limit / 20)
                .unwrap_or(usize::MAX)
                .clamp(1, buf.len())
        };
        let n = match from.read(&mut buf[..chunk]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        link.while_frozen().await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if limit > 0 {
            let secs = n as f64 / limit as f64;
            tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        }
    }
}
