//! `agentsaga`: the operator CLI over agentsaga's own tables (outbox, inbox, sagas),
//! on SQLite and PostgreSQL. See `docs/cli.md`.
//!
//! Exit codes: 0 success, 1 a runtime error (database, unknown id or schedule, an action
//! the saga's state refuses), 2 a usage error (unknown flag, malformed id, duration,
//! state or schedule).
//! Every error is one line on stderr, starting with `error: `.

/// `print!` that ends the process quietly when stdout is closed (`agentsaga … | head`)
/// instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => { $crate::write_out(format_args!($($arg)*)) };
}

/// `println!`, as [`out!`].
macro_rules! outln {
    () => { $crate::write_out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

mod args;
mod commands;
mod db;
mod format;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;
use clap::error::ErrorKind;

fn main() -> ExitCode {
    let cli = match args::Cli::try_parse().and_then(args::Cli::checked) {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", format::one_line(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}

/// Prints clap's message: in full for help, version and usage mistakes; as one line
/// for a malformed value (an id, a duration, a state), which is all there is to say.
fn usage_error(e: &clap::Error) -> ExitCode {
    match e.kind() {
        ErrorKind::ValueValidation | ErrorKind::InvalidValue => {
            let text = e.render().to_string();
            let line = text.lines().next().unwrap_or("error: invalid value");
            eprintln!("{line}");
        }
        _ => {
            let _ = e.print();
        }
    }
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}

/// Writes to stdout. A reader that went away (a closed pipe) ends the process with
/// success: whatever it wanted, it has; any other write error is reported and fails it.
fn write_out(args: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write the output: {e}");
        std::process::exit(1);
    }
}
