//! `agentsaga mcp`: the Model Context Protocol over stdio.

use agentsaga_console::Console;

pub(super) async fn run(console: Console) -> anyhow::Result<()> {
    let _ = console;
    anyhow::bail!("`agentsaga mcp` is not built yet")
}
