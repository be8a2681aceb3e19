//! The running `agentsaga mcp`, spoken to as a client: requests, tool calls, the end.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common;

/// How long any one answer may take.
pub(crate) const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// The running `agentsaga mcp`, killed when dropped.
pub(crate) struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Every line it wrote to stdout so far.
    seen: Vec<String>,
    next_id: u64,
}

impl Server {
    /// `agentsaga mcp` with `allow` passed to `--allow` (none: read-only).
    pub(crate) fn spawn(url: &str, allow: &[&str]) -> Self {
        Self::spawn_with(url, allow, &[])
    }

    /// As [`spawn`](Self::spawn), `global` given before `mcp` (`--nats URL`).
    pub(crate) fn spawn_with(url: &str, allow: &[&str], global: &[&str]) -> Self {
        let mut args = vec!["--database-url", url];
        args.extend(global);
        args.push("mcp");
        let allow = allow.join(",");
        if !allow.is_empty() {
            args.extend(["--allow", &allow]);
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentsaga"))
            .env_remove("DATABASE_URL")
            .env_remove("AGENTSAGA_NATS")
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn agentsaga mcp");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
            next_id: 1,
        }
    }

    pub(crate) fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{message}").expect("write to the server");
        stdin.flush().expect("flush");
    }

    /// Sends request `method` and waits (bounded) for its response; notifications on
    /// the way are skipped. The response's `result`, or its `error` as `Err`.
    pub(crate) fn request(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + ANSWER_WITHIN;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => panic!("no answer to {method} in time"),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("the server closed stdout before answering {method}")
                }
            };
            self.seen.push(line.clone());
            let message: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not JSON on stdout ({e}): {line}"));
            assert_eq!(message["jsonrpc"], "2.0", "{line}");
            if message["id"] != json!(id) {
                assert!(message.get("method").is_some(), "unexpected: {line}");
                continue;
            }
            return match message.get("error") {
                Some(error) => Err(error.clone()),
                None => Ok(message["result"].clone()),
            };
        }
    }

    /// `tools/call` of `name`; its result.
    pub(crate) fn call(&mut self, name: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": arguments}))
            .unwrap_or_else(|e| panic!("{name}: protocol error {e}"))
    }

    /// A successful call's document (its structured content, also its text).
    pub(crate) fn doc(&mut self, name: &str, arguments: Value) -> Value {
        let result = self.call(name, arguments.clone());
        assert_eq!(
            result["isError"], false,
            "{name} {arguments} failed: {result}"
        );
        let doc = result["structuredContent"].clone();
        assert!(doc.is_object(), "{name}: {result}");
        let text = result["content"][0]["text"].as_str().expect("text content");
        assert_eq!(
            serde_json::from_str::<Value>(text).expect("text is JSON"),
            doc,
            "{name}: the text is the document"
        );
        doc
    }

    /// A call that failed as a tool error: its kind and message.
    pub(crate) fn error(&mut self, name: &str, arguments: Value) -> (String, String) {
        let result = self.call(name, arguments.clone());
        assert_eq!(
            result["isError"], true,
            "{name} {arguments} should fail: {result}"
        );
        // The admin API's error body.
        let body = &result["structuredContent"];
        let text = result["content"][0]["text"].as_str().expect("text content");
        assert_eq!(&serde_json::from_str::<Value>(text).expect("JSON"), body);
        assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
        let error = &body["error"];
        assert_eq!(error.as_object().map(|o| o.len()), Some(2), "{body}");
        let kind = error["kind"].as_str().expect("error kind").to_owned();
        let message = error["message"].as_str().expect("message").to_owned();
        assert!(!message.is_empty());
        (kind, message)
    }

    /// Closes stdin; the server ends by itself, successfully, having written nothing
    /// but JSON-RPC messages.
    pub(crate) fn finish(mut self) {
        drop(self.stdin.take());
        let status = common::exited(&mut self.child, "the server ends on EOF", ANSWER_WITHIN);
        assert!(status.success(), "exit status {status}");
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            let message: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not JSON on stdout ({e}): {line}"));
            assert_eq!(message["jsonrpc"], "2.0", "{line}");
        }
        assert!(!self.seen.is_empty());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The handshake, as a client opens a session.
pub(crate) fn open(mcp: &mut Server) -> Value {
    let init = mcp
        .request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "cli-test", "version": "0"},
            }),
        )
        .expect("initialize");
    mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    init
}
