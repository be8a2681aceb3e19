//! `agentsaga serve`: the binary serves the console on a loopback port against a fresh
//! SQLite database and stops on SIGINT, with the remote destinations given `--nats`;
//! a non-loopback address without a token is refused.

mod common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use agentsaga_core::testing::{Backend, fresh_url};
use serde_json::Value;

use common::{exited, expect_failure, ok, run_cmd, wait_for};

/// How long the server may take to answer, or to stop.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// `agentsaga --database-url <url> serve <args>`, with no token or database from the
/// environment.
fn serve_cmd(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentsaga"));
    cmd.env_remove("DATABASE_URL")
        .env_remove("AGENTSAGA_ADMIN_TOKEN")
        .env_remove("AGENTSAGA_ADMIN_READ_TOKEN")
        .env_remove("AGENTSAGA_JAEGER_URL")
        .env_remove("AGENTSAGA_NATS")
        .args(["--database-url", url, "serve"])
        .args(args);
    cmd
}

/// A running `agentsaga serve`, killed if the test fails before stopping it.
struct Server {
    child: Child,
    /// `127.0.0.1:PORT`, from the line it printed.
    addr: String,
}

impl Server {
    /// Spawns it on port 0 and reads the address it printed (within 30 s).
    fn start(url: &str, args: &[&str]) -> Self {
        let mut all = vec!["--addr", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let mut child = serve_cmd(url, &all)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn agentsaga serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            // Keep reading what it prints, as a terminal would.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .map(str::to_owned);
        let Some(addr) = addr else {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait");
            panic!(
                "agentsaga serve printed no address: {line:?}, stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        assert!(addr.starts_with("127.0.0.1:"), "{line}");
        Self { child, addr }
    }

    /// One `GET`: the raw response, empty if the connection was refused, or reset
    /// before any.
    fn get_once(&self, path: &str, token: Option<&str>) -> Vec<u8> {
        let Ok(mut stream) = TcpStream::connect(&self.addr) else {
            return Vec::new();
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        // One write: a request that reaches the server in pieces may be answered (401)
        // before its rest arrives, and the close then resets the connection.
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\n{auth}Connection: close\r\n\r\n",
            self.addr
        );
        stream.write_all(request.as_bytes()).expect("write");
        let mut response = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => response.extend_from_slice(&buf[..n]),
                // A server that closes right after answering may reset the connection;
                // what it answered was read already.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("read: {e}"),
            }
        }
        response
    }

    /// `GET path` (with `Authorization: Bearer token`, if given): the status code and
    /// the body.
    fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        // A GET is safe to repeat: a connection refused or reset before any answer (not
        // listening yet; seen under a loaded machine, on the 401 path) is tried again.
        let mut response = Vec::new();
        wait_for(&format!("an answer to GET {path}"), ANSWER_WITHIN, || {
            response = self.get_once(path, token);
            !response.is_empty()
        });
        let response = String::from_utf8(response).expect("a UTF-8 response");
        let (head, body) = response.split_once("\r\n\r\n").expect("a response");
        let code = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status in {head}"));
        (code, body.to_owned())
    }

    /// Sends SIGINT (Ctrl-C) and waits (10 s at most) for it to exit; its exit code.
    fn interrupt(mut self) -> Option<i32> {
        let sent = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(sent, "kill -INT");
        exited(
            &mut self.child,
            "agentsaga serve stops on SIGINT",
            ANSWER_WITHIN,
        )
        .code()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_the_api_and_stops_on_ctrl_c() {
    let url = fresh_url(Backend::Sqlite).await;
    ok(&url, &["migrate"]);

    let server = Server::start(&url, &[]);
    let (code, body) = server.get("/api/v1/status", None);
    assert_eq!(code, 200, "{body}");
    let status = json(&body);
    assert_eq!(status["backend"], "sqlite", "{status}");
    assert_eq!(status["sagas_total"], 0, "{status}");
    let (code, body) = server.get("/api/v1/sagas?bogus=1", None);
    assert_eq!(code, 400, "{body}");
    assert_eq!(json(&body)["error"]["kind"], "invalid");
    assert_eq!(server.interrupt(), Some(0), "a clean stop");

    // With a token: nothing without it.
    let server = Server::start(&url, &["--token", "s3cret"]);
    let (code, body) = server.get("/api/v1/status", None);
    assert_eq!(code, 401, "{body}");
    assert_eq!(json(&body)["error"]["kind"], "unauthorized");
    let (code, body) = server.get("/api/v1/status", Some("s3cret"));
    assert_eq!(code, 200, "{body}");
    assert_eq!(server.interrupt(), Some(0));
}

// Given a broker (`--nats`), the served console shows the remote destinations: here
// one that cannot be reached, said in the documents and on the page, the status
// answering all the same. Without one, there is no such document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_the_remote_destinations_given_a_broker() {
    let url = fresh_url(Backend::Sqlite).await;
    ok(&url, &["migrate"]);
    let server = Server::start(&url, &[]);
    let (code, body) = server.get("/api/v1/remote", None);
    assert_eq!(code, 404, "{body}");
    assert_eq!(server.interrupt(), Some(0));

    let server = Server::start(&url, &["--nats", "nats://127.0.0.1:1"]);
    let (code, body) = server.get("/api/v1/remote", None);
    assert_eq!(code, 200, "{body}");
    let doc = json(&body);
    assert_eq!(
        doc["broker"], "nats://127.0.0.1:1, stream AGENTSAGA",
        "{doc}"
    );
    let error = doc["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("unreachable: "), "{doc}");
    let (code, body) = server.get("/api/v1/status", None);
    assert_eq!(code, 200, "{body}");
    let status = json(&body);
    assert_eq!(status["remote"]["broker"], doc["broker"], "{status}");
    assert_eq!(status["sagas_total"], 0, "{status}");
    let (code, page) = server.get("/", None);
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("<h2>Remote destinations</h2>"), "{page}");
    assert_eq!(server.interrupt(), Some(0));
}

// Whoever started the server may stop reading its output once it has the address: the
// server keeps serving, its lines going nowhere. Here its stdout is a pipe closed before
// it starts, so that every line it prints meets a closed pipe; it answers only after
// printing them (it prints before it serves), so an answer shows it went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_serving_when_its_stdout_is_closed() {
    let url = fresh_url(Backend::Sqlite).await;
    ok(&url, &["migrate"]);
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    // A free port: the address is not read from what it prints.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .to_string();
    let child = serve_cmd(&url, &["--addr", &addr, "--token", "s3cret"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agentsaga serve");
    let server = Server { child, addr };
    let (code, body) = server.get("/api/v1/status", Some("s3cret"));
    assert_eq!(code, 200, "{body}");
    assert_eq!(server.interrupt(), Some(0), "a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_address_needs_a_token() {
    let url = fresh_url(Backend::Sqlite).await;
    ok(&url, &["migrate"]);
    for addr in ["0.0.0.0:0", "[::]:0", "192.0.2.1:7070"] {
        let line = expect_failure(&run_cmd(serve_cmd(&url, &["--addr", addr])), addr);
        assert!(line.contains("not a loopback address"), "{line}");
        assert!(line.contains("--token"), "{line}");
    }
    // A read token alone is not enough.
    let cmd = serve_cmd(&url, &["--addr", "0.0.0.0:0", "--read-token", "r"]);
    let line = expect_failure(&run_cmd(cmd), "read token only");
    assert!(line.contains("not a loopback address"), "{line}");
    // An empty token is no token.
    let cmd = serve_cmd(&url, &["--token", ""]);
    let line = expect_failure(&run_cmd(cmd), "empty token");
    assert!(line.contains("empty"), "{line}");
}
