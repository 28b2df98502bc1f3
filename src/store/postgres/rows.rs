//! Decoding rows into the crate's types, and the small writes every
//! transaction shares (events, notifications).

use std::str::FromStr;

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use crate::job::{Event, Job, StalePolicy, State};
use crate::store::columns::InOrder;
use crate::store::{Result, StoreError};

pub(super) fn state(s: &str) -> Result<State> {
    State::from_str(s).map_err(StoreError::Database)
}

fn json_map(id: i64, s: &str) -> Result<serde_json::Map<String, serde_json::Value>> {
    serde_json::from_str(s)
        .map_err(|e| StoreError::Database(format!("job {id}: args are not a JSON object: {e}")))
}

/// A row selected with `job_cols!()`, read in its order.
pub(super) fn job(r: &PgRow) -> Result<Job> {
    let mut c = InOrder::new(r);
    let id: i64 = c.get("id")?;
    Ok(Job {
        id,
        pipeline: c.get("pipeline")?,
        target: c.get("target")?,
        args: json_map(id, c.get::<&str>("args")?)?,
        state: state(c.get("state")?)?,
        priority: c.get("priority")?,
        due_at: c.get("due_at")?,
        attempt: c.get("attempt")?,
        max_attempts: c.get("max_attempts")?,
        step: c.get("step")?,
        lease_owner: c.get("lease_owner")?,
        lease_token: c.get("lease_token")?,
        lease_expires_at: c.get("lease_expires_at")?,
        lock_fence: c.get("lock_fence")?,
        unique_key: c.get("unique_key")?,
        cancel_requested_at: c.get("cancel_requested_at")?,
        last_error: c.get("last_error")?,
        on_stale: StalePolicy::from_str(c.get("on_stale")?).map_err(StoreError::Database)?,
        schedule_id: c.get("schedule_id")?,
        created_at: c.get("created_at")?,
        started_at: c.get("started_at")?,
        finished_at: c.get("finished_at")?,
    })
}

pub(super) fn event(r: &PgRow) -> Result<Event> {
    let from: Option<&str> = r.try_get("from_state")?;
    Ok(Event {
        id: r.try_get("id")?,
        job_id: r.try_get("job_id")?,
        at: r.try_get("at")?,
        from: from.map(state).transpose()?,
        to: state(r.try_get("to_state")?)?,
        actor: r.try_get("actor")?,
        detail: r.try_get("detail")?,
    })
}

/// Append one row to the job's history (every state change does).
pub(super) async fn log_event(
    conn: &mut PgConnection,
    job_id: i64,
    from: Option<State>,
    to: State,
    actor: &str,
    detail: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO job_events (job_id, from_state, to_state, actor, detail) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(job_id)
    .bind(from.map(State::as_str))
    .bind(to.as_str())
    .bind(actor)
    .bind(detail)
    .execute(conn)
    .await?;
    Ok(())
}

/// Queue a notification; Postgres delivers it only if the transaction
/// commits, so listeners never wake for a write that was rolled back.
pub(super) async fn notify(conn: &mut PgConnection, channel: &str, payload: &str) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(channel)
        .bind(payload)
        .execute(conn)
        .await?;
    Ok(())
}

/// Whether `e` is a unique violation of the named index.
pub(super) fn is_unique_violation(e: &sqlx::Error, index: &str) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            db.code().as_deref() == Some("23505") && db.constraint() == Some(index)
        }
        _ => false,
    }
}
