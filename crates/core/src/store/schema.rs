//! The check both drivers run when they open a database: its schema is one this
//! build knows.

use crate::{Error, Result};

/// Refuses a database that a newer agentsaga migrated.
pub(crate) fn check_schema(applied: &[i64], migrator: &sqlx::migrate::Migrator) -> Result<()> {
    let Some(&found) = applied.last() else {
        return Ok(());
    };
    let known = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    if found > known {
        return Err(Error::SchemaTooNew { found, known });
    }
    Ok(())
}
