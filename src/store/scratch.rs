//! Throwaway Postgres schemas, for benchmarks that must not touch real jobs.

use std::str::FromStr;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

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
