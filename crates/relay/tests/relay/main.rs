//! The relay against real databases: every test body runs on SQLite and PostgreSQL.

mod support;

mod breaker;
mod cluster;
mod delivery;
mod in_process;
mod order;
mod shutdown;
