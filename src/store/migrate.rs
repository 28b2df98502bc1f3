//! Refuse a schema newer than this binary before applying migrations.

use sqlx::migrate::Migrator;

use super::{Result, StoreError};

/// `applied`: the highest migration version found in the database (`None` on
/// a fresh database).
pub fn check_version(migrator: &Migrator, applied: Option<i64>) -> Result<()> {
    let known = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    match applied {
        Some(found) if found > known => Err(StoreError::SchemaTooNew { found, known }),
        _ => Ok(()),
    }
}
