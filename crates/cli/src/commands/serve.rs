//! `agentsaga serve`: the console's router on an address.

use std::time::Duration;

use agentsaga_console::Console;
use agentsaga_console::http::{self, HttpConfig};
use anyhow::Context as _;

use crate::args::ServeArgs;

/// How long the requests under way may take to finish once asked to stop.
const DRAIN: Duration = Duration::from_secs(5);

pub(super) async fn run(console: Console, args: ServeArgs) -> anyhow::Result<()> {
    let config = config(&args)?;
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.addr))?;
    let addr = listener.local_addr().context("the listening address")?;
    announce(&format!(
        "agentsaga console on http://{addr}/ (API: http://{addr}/api/v1/status); Ctrl-C stops it"
    ));
    if config.requires_token() {
        announce(&format!(
            "a token is required: a browser signs in once at http://{addr}/?token=<token>"
        ));
    }
    let app = http::router(console, config);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(http::serve(listener, app, async move {
        let _ = stop_rx.await;
    }));
    tokio::pin!(server);
    tokio::select! {
        res = &mut server => return served(res),
        () = stop_signal() => {}
    }
    let _ = stop_tx.send(());
    match tokio::time::timeout(DRAIN, &mut server).await {
        Ok(res) => served(res),
        // Requests still under way after the drain are cut off.
        Err(_) => Ok(()),
    }
}

/// Prints a line for whoever started the server. Unlike the other commands' output, a
/// closed stdout (`agentsaga serve | head -1`, a supervisor that read the address and
/// went away) does not end the server: the line is dropped.
fn announce(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

fn served(res: Result<std::io::Result<()>, tokio::task::JoinError>) -> anyhow::Result<()> {
    res.context("the server task failed")?
        .context("the server failed")
}

/// The tokens, checked: anything but a loopback address needs `--token`.
fn config(args: &ServeArgs) -> anyhow::Result<HttpConfig> {
    let nonempty = |t: &Option<String>, flag: &str| -> anyhow::Result<Option<String>> {
        match t {
            Some(t) if t.trim().is_empty() => anyhow::bail!("{flag} is empty"),
            other => Ok(other.clone()),
        }
    };
    let action_token = nonempty(&args.token, "--token (AGENTSAGA_ADMIN_TOKEN)")?;
    let read_token = nonempty(
        &args.read_token,
        "--read-token (AGENTSAGA_ADMIN_READ_TOKEN)",
    )?;
    if !args.addr.ip().is_loopback() && action_token.is_none() {
        anyhow::bail!(
            "refusing to serve the console on {}, which is not a loopback address, without \
             a token: pass --token TOKEN (or set AGENTSAGA_ADMIN_TOKEN), or listen on \
             127.0.0.1",
            args.addr
        );
    }
    Ok(HttpConfig {
        read_token,
        action_token,
        jaeger_url: args.jaeger_url.clone(),
        allowed_hosts: args.allow_hosts.clone(),
    })
}

/// Ctrl-C, or SIGTERM on Unix.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                () = ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    ctrl_c().await;
}

/// Ctrl-C; never, if it cannot be listened for.
async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}
