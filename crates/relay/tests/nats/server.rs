//! A throwaway `nats-server -js` per test, on a free loopback port with its store in a
//! temp dir; restartable on the same port and store.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `nats-server -js` of one test, stopped and its store removed when dropped.
pub(crate) struct Server {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Server {
    pub(crate) fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("agentsaga-nats-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the store dir");
        let child = spawn(port, &dir);
        Self { child, dir, port }
    }

    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server (SIGKILL) and starts it again on the same port and store.
    pub(crate) fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(self.port, &self.dir);
    }
}

/// Starts `nats-server -js` on `port` with its store in `dir`, and waits until it
/// listens.
fn spawn(port: u16, dir: &PathBuf) -> Child {
    let bin = std::env::var("AGENTSAGA_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
    let child = Command::new(&bin)
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{bin} does not start ({e}): install the package nats-server"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nats-server did not listen within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
