//! `agentsaga mcp`: the console's tools over the Model Context Protocol, on stdio
//! (`agentsaga_console::mcp`). Stdout carries nothing but protocol messages; an error
//! that ends the session goes to stderr as every command's does.
//!
//! The CLI hosts no saga definitions: `start_saga` answers `not_found` here, as its
//! description says; a runtime's process serving the same tools can start its sagas.

//!
//! Read-only unless `--allow` names actions; a wait that is a person's decision is
//! never signalled here (`agentsaga_console::mcp`).

use agentsaga_console::Console;
use agentsaga_console::mcp::{self, McpServer};

use crate::args::McpArgs;

pub(super) async fn run(console: Console, args: McpArgs) -> anyhow::Result<()> {
    mcp::serve_stdio(McpServer::new(console).allow(args.allow)).await?;
    Ok(())
}
