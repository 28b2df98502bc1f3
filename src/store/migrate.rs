//! What opening a store does about the schema: refuse one newer than this
//! binary, and run the migrator only when the database lacks something.

use sqlx::migrate::Migrator;

use super::{Result, StoreError};

/// The rows of `_sqlx_migrations`, in version order: version, checksum,
/// success. Both backends read them with this statement.
pub const APPLIED: &str =
    "SELECT version, checksum, success FROM _sqlx_migrations ORDER BY version";

/// One row of [`APPLIED`].
pub type Applied = (i64, Vec<u8>, bool);

/// What to do with a database whose migrations table holds `applied`
/// (`None`: no table, a fresh database).
///
/// Nothing, when it holds exactly this binary's migrations, each applied
/// with the same checksum: the migrator would find nothing to run and
/// nothing to refuse, and its lock, table check and listing cost every
/// one-shot command (`jobdeck enqueue`, `jobdeck stats`…) a few round
/// trips (bench/cli_ab.py; bench/HISTORY.md, session 34). Otherwise the
/// migrator runs, and it is the one that applies what is missing or
/// refuses an edited or failed migration; a schema newer than this
/// binary is refused here first.
pub fn needs_migrator(migrator: &Migrator, applied: Option<&[Applied]>) -> Result<bool> {
    let Some(applied) = applied else {
        return Ok(true);
    };
    let known = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    if let Some(&(found, ..)) = applied.iter().max_by_key(|(v, ..)| *v)
        && found > known
    {
        return Err(StoreError::SchemaTooNew { found, known });
    }
    let mut ups = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration());
    let same = applied.iter().all(|(version, checksum, success)| {
        ups.next()
            .is_some_and(|m| *success && m.version == *version && *m.checksum == checksum[..])
    });
    Ok(!(same && ups.next().is_none()))
}

#[cfg(test)]
mod tests {
    use super::*;

    static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

    /// The rows a database fully migrated by this binary holds.
    fn all_applied() -> Vec<Applied> {
        MIGRATOR
            .iter()
            .map(|m| (m.version, m.checksum.to_vec(), true))
            .collect()
    }

    #[test]
    fn only_a_database_holding_exactly_these_migrations_skips_the_migrator() {
        let current = all_applied();
        assert!(current.len() > 2, "the test needs a few migrations");
        assert!(!needs_migrator(&MIGRATOR, Some(&current)).unwrap());
        assert!(needs_migrator(&MIGRATOR, None).unwrap(), "fresh database");

        let lacking_the_last = &current[..current.len() - 1];
        assert!(needs_migrator(&MIGRATOR, Some(lacking_the_last)).unwrap());

        let mut edited = current.clone();
        edited[1].1[0] ^= 1;
        assert!(needs_migrator(&MIGRATOR, Some(&edited)).unwrap());

        let mut failed = current.clone();
        failed[1].2 = false;
        assert!(needs_migrator(&MIGRATOR, Some(&failed)).unwrap());

        let mut unknown = current.clone();
        unknown.insert(0, (0, vec![0], true));
        assert!(needs_migrator(&MIGRATOR, Some(&unknown)).unwrap());
    }

    #[test]
    fn a_newer_schema_is_refused_before_anything_runs() {
        let mut newer = all_applied();
        newer.push((9999, vec![0], true));
        match needs_migrator(&MIGRATOR, Some(&newer)) {
            Err(StoreError::SchemaTooNew { found: 9999, known }) => {
                assert_eq!(known, MIGRATOR.iter().map(|m| m.version).max().unwrap());
            }
            other => panic!("expected SchemaTooNew, got {other:?}"),
        }
    }
}
