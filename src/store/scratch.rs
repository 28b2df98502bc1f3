//! Throwaway databases for the benchmarks, which must not touch real jobs:
//! Postgres schemas, and SQLite files in a directory of their own.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::sqlite::SqliteConnectOptions;

use super::url::{Backend, backend_of};
use super::{Result, StoreError, redact_url};

/// Create schema `name` and return a URL whose connections use it.
pub async fn create_pg_schema(url: &str, name: &str) -> Result<String> {
    run(url, &format!("CREATE SCHEMA {name}")).await?;
    let sep = if url.contains('?') { '&' } else { '?' };
    Ok(format!("{url}{sep}options=-c%20search_path%3D{name}"))
}

pub async fn drop_pg_schema(url: &str, name: &str) -> Result<()> {
    run(url, &format!("DROP SCHEMA IF EXISTS {name} CASCADE")).await
}

/// `db` when it names a Postgres database (the base of the scratch
/// schemas), `None` for SQLite or no URL; an unsupported URL is an error.
pub fn postgres_base(db: Option<&str>) -> Result<Option<&str>> {
    match db {
        Some(url) if backend_of(url)? == Backend::Postgres => Ok(Some(url)),
        _ => Ok(None),
    }
}

/// A new directory `name` beside the file of the SQLite URL `url` (the
/// same filesystem, so a benchmark measures the disk the URL names), or in
/// the system's temp directory without a URL. The file itself is never
/// opened.
pub fn sqlite_dir(url: Option<&str>, name: &str) -> Result<PathBuf> {
    let parent = match url {
        None => std::env::temp_dir(),
        Some(url) => {
            let opts = SqliteConnectOptions::from_str(url)
                .map_err(|e| StoreError::Invalid(format!("bad SQLite URL {url:?}: {e}")))?;
            match opts.get_filename().parent() {
                Some(p) if p != Path::new("") => p.to_path_buf(),
                _ => PathBuf::from("."),
            }
        }
    };
    // Not `create_dir_all`: a mistyped path is an error, not a new tree.
    let dir = parent.join(name);
    std::fs::create_dir(&dir)
        .map_err(|e| StoreError::Invalid(format!("cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}

async fn run(url: &str, sql: &str) -> Result<()> {
    if !sql
        .split_whitespace()
        .last()
        .is_some_and(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(StoreError::Invalid(format!("bad schema name in {sql:?}")));
    }
    let opts = PgConnectOptions::from_str(url)
        .map_err(|e| StoreError::Invalid(format!("bad Postgres URL {}: {e}", redact_url(url))))?;
    let mut conn = PgConnection::connect_with(&opts).await?;
    // The name was checked to be a plain identifier above.
    sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}
