//! The transports under the suite: HTTP, and NATS JetStream.

use std::net::SocketAddr;
use std::sync::Arc;

use agentsaga_core::testing::NatsServer;
use agentsaga_relay::http::{self, HttpTransport, OUTBOX_PATH, ReceiverConfig};
use agentsaga_relay::nats::{NatsReceiver, NatsReceiverConfig, NatsTransport};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::*;

async fn start_relay(
    a: &Store,
    transport: impl agentsaga_relay::Transport,
    config: RelayConfig,
) -> Relay {
    Relay::start(
        a.clone(),
        vec![DEST.to_owned(), BAD.to_owned()],
        Arc::new(transport),
        config,
    )
    .await
    .expect("start the relay")
}

/// Waits a moment before binding again (the port not yet let go of).
async fn port_not_free_yet(_e: &std::io::Error) {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

const TOKEN: &str = "promise-suite-token-0123";

/// B's HTTP receiver, served until stopped.
struct Served {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Served {
    fn serve(listener: TcpListener, b: &Store) -> Self {
        let app = http::router(b.clone(), ReceiverConfig::new(TOKEN)).expect("the router");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
                .expect("serve");
        });
        Self { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(5), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

/// A's relay POSTs to B's receiver (`agentsaga_relay::http`), through the proxy.
pub(crate) struct Http {
    b: Store,
    addr: SocketAddr,
    served: Option<Served>,
    proxy: Proxy,
    relay: Relay,
}

impl Crossing for Http {
    async fn start(a: &Store, b: &Store, config: RelayConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let served = Served::serve(listener, b);
        let proxy = Proxy::start(addr).await;
        let transport = HttpTransport::new(TOKEN)
            .route(DEST, format!("http://{}{OUTBOX_PATH}", proxy.addr()))
            .timeout(Duration::from_secs(2));
        let relay = start_relay(a, transport, config).await;
        Self {
            b: b.clone(),
            addr,
            served: Some(served),
            proxy,
            relay,
        }
    }

    fn relay(&self) -> &Relay {
        &self.relay
    }

    fn link(&self) -> &Proxy {
        &self.proxy
    }

    async fn away(&mut self) {
        self.proxy.down();
        if let Some(s) = self.served.take() {
            s.stop().await;
        }
    }

    async fn back(&mut self) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    port_not_free_yet(&e).await;
                }
                Err(e) => panic!("rebind B's port: {e}"),
            }
        };
        self.served = Some(Served::serve(listener, &self.b));
        self.proxy.up().await;
    }

    async fn crash_receiver(&mut self) {
        // Every connection dropped at once, mid-request; the server gone, then back.
        self.proxy.down();
        if let Some(s) = self.served.take() {
            s.task.abort();
            let _ = s.task.await; // its listener closed
        }
        self.back().await;
    }

    async fn stop(self) {
        self.relay.shutdown().await;
        if let Some(s) = self.served {
            s.stop().await;
        }
    }
}

/// A's relay publishes to a JetStream stream; B's receiver consumes it. Both reach the
/// broker through the proxy.
pub(crate) struct Nats {
    server: NatsServer,
    proxy: Proxy,
    b: Store,
    receiver: Option<NatsReceiver>,
    relay: Relay,
}

/// B's receiver, consuming [`DEST`] through `proxy`.
async fn receive(proxy: &Proxy, b: &Store) -> NatsReceiver {
    NatsReceiver::start(
        proxy.url(),
        b.clone(),
        NatsReceiverConfig::new("AGENTSAGA", "svc-b")
            .destinations([DEST])
            .batch_size(4)
            .ack_wait(Duration::from_secs(2))
            .fetch_wait(Duration::from_millis(500)),
    )
    .await
    .expect("start the receiver")
}

impl Crossing for Nats {
    async fn start(a: &Store, b: &Store, config: RelayConfig) -> Self {
        let server = NatsServer::start();
        let proxy = Proxy::to_url(&server.url()).await;
        let transport = NatsTransport::connect(proxy.url())
            .await
            .expect("connect to the broker")
            .timeout(Duration::from_secs(1));
        transport
            .ensure_stream("AGENTSAGA", Duration::from_secs(120))
            .await
            .expect("the stream");
        let receiver = Some(receive(&proxy, b).await);
        let relay = start_relay(a, transport, config).await;
        Self {
            server,
            proxy,
            b: b.clone(),
            receiver,
            relay,
        }
    }

    fn relay(&self) -> &Relay {
        &self.relay
    }

    fn link(&self) -> &Proxy {
        &self.proxy
    }

    async fn away(&mut self) {
        self.server.stop();
    }

    async fn back(&mut self) {
        self.server.resume();
    }

    async fn crash_receiver(&mut self) {
        // Its tasks aborted where they stand (a batch committed and not acknowledged,
        // maybe), its connection with them; a new one on B's store.
        drop(self.receiver.take());
        self.receiver = Some(receive(&self.proxy, &self.b).await);
    }

    async fn stop(self) {
        self.relay.shutdown().await;
        if let Some(r) = self.receiver {
            tokio::time::timeout(DEADLINE, r.stop())
                .await
                .expect("the receiver stops");
        }
        drop(self.server);
    }
}
