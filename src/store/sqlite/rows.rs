//! Conversions between SQLite rows (integer milliseconds, JSON text) and the
//! store's types, and the few statements every operation shares.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteRow;

use crate::job::{Job, StalePolicy, State};
use crate::store::columns::InOrder;
use crate::store::{Result, StoreError};

/// The columns of [`job_from_row`], for `SELECT` and `RETURNING` alike.
macro_rules! job_cols {
    () => {
        "id, pipeline, target, args, state, priority, due_at, attempt, max_attempts, step, \
         lease_owner, lease_token, lease_expires_at, lock_fence, unique_key, \
         cancel_requested_at, last_error, on_stale, schedule_id, created_at, started_at, \
         finished_at"
    };
}
pub(super) use job_cols;

/// "The job is unfinished" as SQL: written exactly as the conditions of
/// the partial indexes over unfinished jobs (migration 0008), since SQLite
/// uses such an index only for a query whose WHERE implies its condition,
/// and as comparisons, not `state IN (…)`, which SQLite codes as a
/// temporary b-tree.
macro_rules! unfinished_cond {
    () => {
        "(state = 'queued' OR state = 'leased' OR state = 'running' OR state = 'stale')"
    };
}
pub(super) use unfinished_cond;

pub(super) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// A duration in milliseconds, saturating so that absurd inputs cannot
/// overflow the time arithmetic done in SQL.
pub(super) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis())
        .unwrap_or(i64::MAX / 4)
        .min(i64::MAX / 4)
}

/// Leases as two JSON lists of the same length, their ids and their
/// tokens: `json_each(ids) AS lease` joined to `jobs.id = lease.value AND
/// jobs.lease_token = tokens ->> lease.key` (SQLite parses `tokens` once
/// per statement), where a list of pairs had each pair's text parsed
/// again at every `->>`.
pub(super) fn lease_lists(leases: &[crate::store::LeaseRef]) -> Result<(String, String)> {
    Ok((
        to_json(&leases.iter().map(|l| l.id).collect::<Vec<_>>())?,
        to_json(&leases.iter().map(|l| l.token).collect::<Vec<_>>())?,
    ))
}

/// The lease of a row whose first columns are `id, lease_token`.
pub(super) fn lease_of(row: &SqliteRow) -> Result<crate::store::LeaseRef> {
    let mut c = InOrder::new(row);
    Ok(crate::store::LeaseRef {
        id: c.get("id")?,
        token: c.get("lease_token")?,
    })
}

/// A list bound as one JSON parameter, read back with `json_each`.
pub(super) fn to_json<T: serde::Serialize + ?Sized>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| StoreError::Invalid(format!("bad JSON list: {e}")))
}

pub(super) fn to_time(ms: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Database(format!("time {ms} ms is out of range")))
}

pub(super) fn opt_time(ms: Option<i64>) -> Result<Option<DateTime<Utc>>> {
    ms.map(to_time).transpose()
}

pub(super) fn state(s: &str) -> Result<State> {
    State::from_str(s).map_err(StoreError::Database)
}

pub(super) fn json_map(text: &str) -> Result<serde_json::Map<String, serde_json::Value>> {
    serde_json::from_str(text).map_err(|e| StoreError::Database(format!("bad args JSON: {e}")))
}

/// A row selected with `job_cols!`, read in its order.
pub(super) fn job_from_row(row: &SqliteRow) -> Result<Job> {
    let mut c = InOrder::new(row);
    Ok(Job {
        id: c.get("id")?,
        pipeline: c.get("pipeline")?,
        target: c.get("target")?,
        args: json_map(c.get("args")?)?,
        state: state(c.get("state")?)?,
        priority: c.get("priority")?,
        due_at: to_time(c.get("due_at")?)?,
        attempt: c.get("attempt")?,
        max_attempts: c.get("max_attempts")?,
        step: c.get("step")?,
        lease_owner: c.get("lease_owner")?,
        lease_token: c.get("lease_token")?,
        lease_expires_at: opt_time(c.get("lease_expires_at")?)?,
        lock_fence: c.get("lock_fence")?,
        unique_key: c.get("unique_key")?,
        cancel_requested_at: opt_time(c.get("cancel_requested_at")?)?,
        last_error: c.get("last_error")?,
        on_stale: StalePolicy::from_str(c.get("on_stale")?).map_err(StoreError::Database)?,
        schedule_id: c.get("schedule_id")?,
        created_at: to_time(c.get("created_at")?)?,
        started_at: opt_time(c.get("started_at")?)?,
        finished_at: opt_time(c.get("finished_at")?)?,
    })
}

/// Append one row to the job's history.
pub(super) async fn event(
    conn: &mut SqliteConnection,
    job_id: i64,
    at: i64,
    from: Option<State>,
    to: State,
    actor: &str,
    detail: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO job_events (job_id, at, from_state, to_state, actor, detail) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(job_id)
    .bind(at)
    .bind(from.map(State::as_str))
    .bind(to.as_str())
    .bind(actor)
    .bind(detail)
    .execute(conn)
    .await?;
    Ok(())
}

/// Free `target`'s lock if `job` still holds it under `fence`; the fence
/// stays so the next holder gets a larger one.
pub(super) async fn release_lock_by_fence(
    conn: &mut SqliteConnection,
    target: Option<&str>,
    fence: Option<i64>,
    job: i64,
) -> Result<()> {
    let (Some(target), Some(fence)) = (target, fence) else {
        return Ok(());
    };
    sqlx::query(
        "UPDATE locks SET holder_job = NULL, holder_worker = NULL, acquired_at = NULL, \
         expires_at = NULL WHERE target = ? AND fence = ? AND holder_job = ?",
    )
    .bind(target)
    .bind(fence)
    .bind(job)
    .execute(conn)
    .await?;
    Ok(())
}

/// The job's state, or `NotFound`.
pub(super) async fn job_state(conn: &mut SqliteConnection, id: i64) -> Result<State> {
    let s: Option<String> = sqlx::query_scalar("SELECT state FROM jobs WHERE id = ?")
        .bind(id)
        .fetch_optional(conn)
        .await?;
    state(&s.ok_or(StoreError::NotFound(id))?)
}
