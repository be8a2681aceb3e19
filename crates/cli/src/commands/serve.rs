//! `agentsaga serve`: the console's router on an address.

use agentsaga_console::Console;

use crate::args::ServeArgs;

pub(super) async fn run(console: Console, args: ServeArgs) -> anyhow::Result<()> {
    let _ = (console, args);
    anyhow::bail!("`agentsaga serve` is not built yet")
}
