//! `agentsaga mcp`: the console's tools over the Model Context Protocol, on stdio
//! (`agentsaga_console::mcp`). Stdout carries nothing but protocol messages; an error
//! that ends the session goes to stderr as every command's does.
//!
//! The CLI hosts no saga definitions: `start_saga` answers `not_found` here, as its
//! description says; a runtime's process serving the same tools can start its sagas.

use agentsaga_console::Console;

pub(super) async fn run(console: Console) -> anyhow::Result<()> {
    agentsaga_console::mcp::serve_stdio(console).await?;
    Ok(())
}
