//! The throwaway PostgreSQL server of a test binary.

use std::fs::{self, File, OpenOptions};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sqlx::Connection;
use sqlx::postgres::PgConnection;
use uuid::Uuid;

use super::unique_temp_dir;
use super::watchdog::{self, shell_quote};

/// The directory holding the PostgreSQL binaries when `AGENTSAGA_PG_BIN` is unset.
const DEFAULT_PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// How long to wait for the server to accept TCP connections after `pg_ctl start`.
const TCP_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The per-process throwaway PostgreSQL server, started on first use.
///
/// Startup is synchronous (it runs `initdb` and `pg_ctl`); calling this from
/// within a tokio runtime blocks the calling thread for a few seconds the
/// first time only.
///
/// # Panics
///
/// If the server cannot be set up or started, with the reason (and the server
/// log where there is one). If the PostgreSQL binaries are missing, the
/// message says to install the `postgresql` package.
pub fn pg_server() -> &'static PgServer {
    static SERVER: OnceLock<PgServer> = OnceLock::new();
    SERVER.get_or_init(PgServer::launch)
}

/// A throwaway PostgreSQL server: its own data directory in a fresh temporary
/// directory, listening on `127.0.0.1:<port>`, user `postgres`, trust
/// authentication. Obtain it with [`pg_server`].
#[derive(Debug)]
pub struct PgServer {
    /// The TCP port the server listens on (on 127.0.0.1).
    port: u16,
    /// The temporary directory holding everything (data dir, logs, socket).
    dir: PathBuf,
    /// The data directory (`<dir>/data`).
    data: PathBuf,
    /// The directory with `initdb`, `pg_ctl` and `postgres`.
    bin: PathBuf,
    /// Whether server commands must run as the `postgres` user via `runuser`.
    as_root: bool,
}

impl PgServer {
    /// The TCP port the server listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Admin URL (database `postgres`).
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Create a fresh database and return its URL.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached (after a few retries) or the database
    /// cannot be created.
    pub async fn fresh_database_url(&self) -> String {
        let name = format!("t_{}", Uuid::now_v7().simple());
        let admin_url = self.admin_url();
        let mut conn = connect_with_retry(&admin_url).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(r#"CREATE DATABASE "{name}""#)))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("agentsaga testing: CREATE DATABASE {name} failed: {e}"));
        if let Err(e) = conn.close().await {
            panic!("agentsaga testing: closing the admin connection failed: {e}");
        }
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Stop the server (`pg_ctl stop -m fast`) and start it again on the same
    /// port and data directory, for tests of "the database goes away".
    /// Blocks until the server accepts connections again.
    ///
    /// # Panics
    ///
    /// If stopping or starting fails.
    pub fn restart(&self) {
        self.stop();
        self.start();
    }

    /// Stop the server (`pg_ctl stop -m fast`, waiting for the shutdown), for
    /// outage tests; [`start`](Self::start) brings it back.
    ///
    /// # Panics
    ///
    /// If `pg_ctl stop` fails.
    pub fn stop(&self) {
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", "60", "-m", "fast", "stop"]);
        self.run_logged(cmd, "pg_ctl stop");
    }

    /// Start the (stopped) server again on the same port and data directory.
    /// Blocks until it accepts TCP connections.
    ///
    /// # Panics
    ///
    /// If `pg_ctl start` fails or the server does not accept connections
    /// within 30 seconds; the message includes the server log.
    pub fn start(&self) {
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(["-w", "-t", "60", "-o"])
            .arg(format!(
                "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c synchronous_commit=off \
                 -c full_page_writes=off -c max_connections=300 -c shared_buffers=64MB",
                self.port,
                self.dir.display()
            ))
            .arg("start");
        self.run_logged(cmd, "pg_ctl start");
        self.wait_for_tcp();
    }

    /// Set up a data directory, start the server and its watchdog.
    fn launch() -> PgServer {
        let bin = std::env::var_os("AGENTSAGA_PG_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_PG_BIN));
        for tool in ["initdb", "pg_ctl", "postgres"] {
            if !bin.join(tool).is_file() {
                panic!(
                    "agentsaga testing: PostgreSQL binary {} not found. The tests need a local \
                     PostgreSQL server: install the `postgresql` package (e.g. `apt-get install -y \
                     postgresql`), or set AGENTSAGA_PG_BIN to the directory holding initdb, \
                     pg_ctl and postgres.",
                    bin.join(tool).display()
                );
            }
        }
        let as_root = running_as_root();
        let dir = unique_temp_dir("agentsaga-pg");
        if as_root {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .stdin(Stdio::null())
                .status()
                .unwrap_or_else(|e| panic!("agentsaga testing: cannot run chown: {e}"));
            if !status.success() {
                panic!(
                    "agentsaga testing: `chown -R postgres:postgres {}` failed ({status}); running \
                     as root, the PostgreSQL server needs a `postgres` user (install the \
                     `postgresql` package)",
                    dir.display()
                );
            }
        }
        let server = PgServer {
            port: free_port(),
            data: dir.join("data"),
            dir,
            bin,
            as_root,
        };

        let mut initdb = server.pg_command("initdb");
        initdb.arg("-D").arg(&server.data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        server.run_logged(initdb, "initdb");

        server.start();
        server.spawn_watchdog();
        server
    }

    /// Start the watchdog that stops the server and removes its directory once this
    /// process has gone.
    fn spawn_watchdog(&self) {
        let pg_ctl = self.bin.join("pg_ctl");
        let prefix = if self.as_root {
            "runuser -u postgres -- "
        } else {
            ""
        };
        watchdog::spawn(&format!(
            "{prefix}{pg_ctl} -D {data} -m immediate stop; rm -rf {dir}",
            pg_ctl = shell_quote(&pg_ctl),
            data = shell_quote(&self.data),
            dir = shell_quote(&self.dir),
        ))
        .unwrap_or_else(|e| panic!("agentsaga testing: cannot spawn the watchdog: {e}"));
    }

    /// A command running the PostgreSQL tool `tool`, as `postgres` when root.
    fn pg_command(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        let mut cmd = if self.as_root {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        };
        // A directory the `postgres` user can enter.
        cmd.current_dir(&self.dir);
        cmd
    }

    /// Run `cmd` with its output appended to `<dir>/commands.log` (a file,
    /// not a pipe: the server daemonised by `pg_ctl start` must hold no pipe
    /// of ours); panic with the logs if it fails.
    fn run_logged(&self, mut cmd: Command, what: &str) {
        let log_path = self.dir.join("commands.log");
        let out = open_append(&log_path);
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("agentsaga testing: cannot clone a file handle: {e}"));
        let status = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .status()
            .unwrap_or_else(|e| panic!("agentsaga testing: cannot run {what} ({cmd:?}): {e}"));
        if !status.success() {
            panic!(
                "agentsaga testing: {what} failed ({status}): {cmd:?}\n--- {} ---\n{}\n--- {} ---\n{}",
                log_path.display(),
                read_lossy(&log_path),
                self.dir.join("log").display(),
                read_lossy(&self.dir.join("log")),
            );
        }
    }

    /// Wait until a TCP connection to the server succeeds, at most 30 seconds.
    fn wait_for_tcp(&self) {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + TCP_READY_TIMEOUT;
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "agentsaga testing: PostgreSQL does not accept connections on {addr} after \
                     {TCP_READY_TIMEOUT:?}\n--- server log ---\n{}",
                    read_lossy(&self.dir.join("log"))
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Connect to `url`, retrying for a while in case the server is still coming up.
async fn connect_with_retry(url: &str) -> PgConnection {
    const ATTEMPTS: u32 = 50;
    let mut attempt = 1;
    loop {
        match PgConnection::connect(url).await {
            Ok(conn) => return conn,
            Err(e) if attempt >= ATTEMPTS => {
                panic!("agentsaga testing: cannot connect to {url} after {ATTEMPTS} attempts: {e}")
            }
            Err(_) => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Whether this process runs as root (`id -u` prints `0`).
fn running_as_root() -> bool {
    let out = Command::new("id")
        .arg("-u")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("agentsaga testing: cannot run `id -u`: {e}"));
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// A free TCP port on 127.0.0.1 (bound, read, released).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("agentsaga testing: cannot bind 127.0.0.1:0: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("agentsaga testing: no local address: {e}"))
        .port()
}

/// Open `path` for appending, creating it.
fn open_append(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("agentsaga testing: cannot open {}: {e}", path.display()))
}

/// The content of `path`, or a note why it cannot be read.
fn read_lossy(path: &Path) -> String {
    match fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}
