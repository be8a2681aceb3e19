//! A throwaway `nats-server -js` per test ([`NatsServer`]): a free loopback port, its
//! store in a temp dir, restartable on both, stopped and removed when dropped.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `nats-server -js` of one test (the binary `nats-server`, or the one
/// `AGENTSAGA_NATS_SERVER` names), listening on 127.0.0.1 only.
#[derive(Debug)]
pub struct NatsServer {
    child: Child,
    dir: PathBuf,
    port: u16,
    /// Given to the server besides its port and store (authentication, TLS).
    args: Vec<String>,
}

impl NatsServer {
    /// Starts one and waits until it listens.
    ///
    /// # Panics
    /// If no port is free, the binary does not start (the package `nats-server` is
    /// not installed), or it does not listen within 20 s.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts one given `args` besides its port and store (`--user ops --pass …`,
    /// `--auth TOKEN`, `--tls --tlscert … --tlskey …`), and waits until it listens.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_with(args: &[&str]) -> Self {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!(
            "agentsaga-nats-{}-{port}-{}",
            std::process::id(),
            uuid::Uuid::now_v7().simple()
        ));
        std::fs::create_dir_all(&dir).expect("the store dir");
        let child = spawn(port, &dir, &args);
        Self {
            child,
            dir,
            port,
            args,
        }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (SIGKILL) and leaves it down (a broker away) until
    /// [`resume`](Self::resume).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server stopped by [`stop`](Self::stop) again, on the same port and
    /// store.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn resume(&mut self) {
        self.child = spawn(self.port, &self.dir, &self.args);
    }

    /// Kills the server (SIGKILL) and starts it again on the same port and store.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(self.port, &self.dir, &self.args);
    }
}

/// Starts `nats-server -js` on `port` with its store in `dir` and `args`, and waits
/// until it listens.
fn spawn(port: u16, dir: &Path, args: &[String]) -> Child {
    let bin = std::env::var("AGENTSAGA_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
    let child = Command::new(&bin)
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{bin} does not start ({e}): install the package nats-server"));
    let mut child = child;
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nats-server did not listen within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Listening, and ours: a server that could not bind (another took the port
    // meanwhile) has exited, and the port answers for someone else.
    if let Some(status) = child.try_wait().expect("the server's status") {
        panic!("nats-server exited ({status}): port {port} was taken by another");
    }
    child
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
