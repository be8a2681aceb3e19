//! A headless chromium driven over the DevTools protocol (a websocket of JSON).

use super::*;

// ---------------------------------------------------------------------------------------
// The browser and a small DevTools protocol client.

/// Headless chromium, killed (its whole process group) when dropped.
pub(crate) struct Browser {
    child: Child,
    profile: PathBuf,
    pub(crate) ws_url: String,
}

fn on_path(bin: &str) -> Option<PathBuf> {
    if bin.contains('/') {
        return Path::new(bin).is_file().then(|| PathBuf::from(bin));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

impl Browser {
    /// The browser, or `None` when there is none and none is required: the test is then
    /// not run, and says so where the person running the suite sees it.
    pub(crate) fn launch() -> Option<Self> {
        let bin = std::env::var("AGENTSAGA_CHROMIUM").unwrap_or_else(|_| "chromium".into());
        let Some(exe) = on_path(&bin) else {
            let why = format!(
                "`{bin}` is not installed: this test drives Debian's headless chromium \
                 (`apt-get install -y chromium`, as scripts/test does when run as root), or \
                 the browser named by AGENTSAGA_CHROMIUM"
            );
            let required = |v: &str| std::env::var(v).is_ok_and(|v| v == "true" || v == "1");
            if required("CI") || required("AGENTSAGA_REQUIRE_BROWSER") {
                panic!("{why} (required: CI=true or AGENTSAGA_REQUIRE_BROWSER=1)");
            }
            // Straight to the terminal: the test harness captures `eprintln!` of a
            // passing test, and a skipped test must not pass unseen.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "\nconsole_in_a_real_browser: NOT RUN. {why}. Under CI=true it fails.\n"
            );
            return None;
        };
        static N: AtomicU64 = AtomicU64::new(0);
        let profile = std::env::temp_dir().join(format!(
            "agentsaga-chromium-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&profile).unwrap();
        let mut child = Command::new(&exe)
            .args([
                "--headless",
                // As root (CI) chromium's sandbox cannot start; it only ever opens
                // this test's own pages.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--hide-scrollbars",
                "--mute-audio",
                "--window-size=1200,900",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
        // Its stderr says where DevTools listens; keep draining it afterwards.
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + WAIT;
        let mut seen = Vec::new();
        let ws_url = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(url) = line.strip_prefix("DevTools listening on ") {
                        break url.trim().to_owned();
                    }
                    seen.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "{} did not say where DevTools listens within {WAIT:?}; its stderr:\n{}",
                        exe.display(),
                        seen.join("\n")
                    );
                }
            }
        };
        Some(Browser {
            child,
            profile,
            ws_url,
        })
    }
}

impl Browser {
    /// Waits (at most `limit`) for the browser to exit by itself, as it does after
    /// `Browser.close`, reaping its own processes.
    pub(crate) fn wait_exit(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The browser and its renderer, GPU and zygote processes: the group it leads.
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// One DevTools connection, with one tab attached (flat session mode).
pub(crate) struct Cdp {
    out: mpsc::UnboundedSender<Message>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>,
    events: mpsc::UnboundedReceiver<Value>,
    /// Every event read so far that says something went wrong on a page.
    errors: Vec<Value>,
    next: AtomicU64,
    session: Option<String>,
}

impl Cdp {
    pub(crate) async fn connect(ws_url: &str) -> Self {
        let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(ws_url))
            .await
            .expect("DevTools websocket within the time")
            .expect("DevTools websocket");
        let (mut sink, mut stream) = ws.split();
        let (out, mut out_rx) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                if sink.send(m).await.is_err() {
                    break;
                }
            }
        });
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>> = Arc::default();
        let (ev_tx, events) = mpsc::unbounded_channel();
        let waiting = pending.clone();
        tokio::spawn(async move {
            while let Some(Ok(msg)) = stream.next().await {
                let Message::Text(text) = msg else { continue };
                let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else {
                    continue;
                };
                match v.get("id").and_then(Value::as_u64) {
                    Some(id) => {
                        if let Some(tx) = waiting.lock().unwrap().remove(&id) {
                            let _ = tx.send(v);
                        }
                    }
                    None => {
                        let _ = ev_tx.send(v);
                    }
                }
            }
        });
        Cdp {
            out,
            pending,
            events,
            errors: Vec::new(),
            next: AtomicU64::new(1),
            session: None,
        }
    }

    /// Sends a command; its answer comes on the receiver.
    pub(crate) fn send(&self, method: &str, params: Value) -> oneshot::Receiver<Value> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        self.out
            .send(Message::text(msg.to_string()))
            .expect("DevTools connection open");
        rx
    }

    pub(crate) async fn answer(method: &str, rx: oneshot::Receiver<Value>) -> Result<Value, Value> {
        let v = tokio::time::timeout(WAIT, rx)
            .await
            .unwrap_or_else(|_| panic!("{method}: no answer within {WAIT:?}"))
            .unwrap_or_else(|_| panic!("{method}: the DevTools connection closed"));
        match v.get("error") {
            Some(e) => Err(e.clone()),
            None => Ok(v["result"].clone()),
        }
    }

    pub(crate) async fn call(&self, method: &str, params: Value) -> Value {
        let rx = self.send(method, params);
        Self::answer(method, rx)
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    /// A new tab, attached; its pages' errors are collected.
    pub(crate) async fn open_tab(&mut self) {
        let target = self
            .call("Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let attached = self
            .call(
                "Target.attachToTarget",
                json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await;
        self.session = Some(attached["sessionId"].as_str().unwrap().to_owned());
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            self.call(domain, json!({})).await;
        }
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1200, "height": 900, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
    }

    /// Notes an event if it reports an error on a page.
    pub(crate) fn note(&mut self, ev: &Value) {
        let bad = match ev["method"].as_str() {
            Some("Runtime.exceptionThrown") => true,
            Some("Runtime.consoleAPICalled") => ev["params"]["type"] == "error",
            Some("Log.entryAdded") => ev["params"]["entry"]["level"] == "error",
            _ => false,
        };
        if bad {
            self.errors.push(ev["params"].clone());
        }
    }

    /// The next event `method`, within `limit`.
    pub(crate) async fn event(&mut self, method: &str, limit: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let ev = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("no {method} within {limit:?}"))
                .expect("DevTools connection open");
            self.note(&ev);
            if ev["method"] == method {
                return ev;
            }
        }
    }

    /// The errors the pages reported so far.
    pub(crate) fn page_errors(&mut self) -> Vec<Value> {
        while let Ok(ev) = self.events.try_recv() {
            self.note(&ev);
        }
        self.errors.clone()
    }

    /// `expr`'s value, or the exception it threw (also while a page is being replaced).
    pub(crate) async fn try_eval(&self, expr: &str) -> Result<Value, Value> {
        let rx = self.send(
            "Runtime.evaluate",
            json!({ "expression": expr, "returnByValue": true }),
        );
        let r = Self::answer("Runtime.evaluate", rx).await?;
        match r.get("exceptionDetails") {
            Some(e) => Err(e.clone()),
            None => Ok(r["result"]["value"].clone()),
        }
    }

    pub(crate) async fn eval(&self, expr: &str) -> Value {
        self.try_eval(expr)
            .await
            .unwrap_or_else(|e| panic!("`{expr}` threw: {e}"))
    }

    /// Waits (at most `limit`) until `expr` is true on the page.
    pub(crate) async fn wait_for(&mut self, expr: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if self.try_eval(expr).await == Ok(Value::Bool(true)) {
                return;
            }
            if Instant::now() >= deadline {
                let at = self.try_eval("location.href").await;
                let text = self
                    .try_eval("document.body && document.body.innerText")
                    .await;
                panic!("not true within {limit:?}: {expr}\nthe page at {at:?}:\n{text:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Opens `url` and waits until it has loaded.
    pub(crate) async fn navigate(&mut self, url: &str) {
        let r = self.call("Page.navigate", json!({ "url": url })).await;
        assert!(r.get("errorText").is_none(), "{url}: {r}");
        self.wait_for(
            &format!(
                "location.href === {} && document.readyState === 'complete'",
                json!(url)
            ),
            WAIT,
        )
        .await;
        let title = self.eval("document.title").await;
        assert!(
            !title.as_str().unwrap_or("").starts_with("Error"),
            "{url} is an error page: {}",
            self.eval("document.body.innerText").await
        );
    }

    /// Clicks `selector`, answers the `confirm()` it opens (accept or dismiss), and
    /// returns the dialog's question.
    pub(crate) async fn click_and_answer(&mut self, selector: &str, accept: bool) -> String {
        // The click returns only once the dialog is answered: send it, then answer.
        let click = self.send(
            "Runtime.evaluate",
            json!({ "expression": format!("document.querySelector({}).click()", json!(selector)) }),
        );
        let dialog = self.event("Page.javascriptDialogOpening", WAIT).await;
        assert_eq!(dialog["params"]["type"], "confirm", "{dialog}");
        self.call("Page.handleJavaScriptDialog", json!({ "accept": accept }))
            .await;
        Self::answer("Runtime.evaluate", click)
            .await
            .unwrap_or_else(|e| panic!("click {selector}: {e}"));
        dialog["params"]["message"].as_str().unwrap().to_owned()
    }

    /// The page's screenshot into the target directory's `tmp/` (to look at).
    pub(crate) async fn save_screenshot(&self, name: &str) {
        let png = self.screenshot(1200).await;
        std::fs::write(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name), png).unwrap();
    }

    /// The whole page as a PNG, `width` pixels wide.
    pub(crate) async fn screenshot(&self, width: u64) -> Vec<u8> {
        let height = self
            .eval("document.documentElement.scrollHeight")
            .await
            .as_u64()
            .unwrap();
        let shot = self
            .call(
                "Page.captureScreenshot",
                json!({
                    "format": "png",
                    "captureBeyondViewport": true,
                    "clip": { "x": 0, "y": 0, "width": width, "height": height, "scale": 1 }
                }),
            )
            .await;
        let png = base64_decode(shot["data"].as_str().unwrap());
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
        png
    }

    pub(crate) async fn close_browser(&mut self) {
        self.session = None;
        let rx = self.send("Browser.close", json!({}));
        let _ = tokio::time::timeout(Duration::from_secs(5), rx).await;
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let digit = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3 + 3);
    for chunk in bytes.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | digit(c) << (18 - 6 * i));
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}
