//! Producers: one job (deduplicated by unique key) or a batch.

use super::SqliteStore;
use super::WriteTx;
use super::rows::{event, ms, now_ms, unfinished_cond};
use crate::job::{self, State};
use crate::store::{Enqueued, NewJob, Result, StoreError};

/// The checks every enqueue makes: returns max_attempts and the args as
/// JSON text.
fn validate(job: &NewJob) -> Result<(i32, String)> {
    if job.pipeline.trim().is_empty() {
        return Err(StoreError::Invalid("a job needs a pipeline".into()));
    }
    let max_attempts = job.max_attempts.unwrap_or(job::DEFAULT_MAX_ATTEMPTS);
    if max_attempts < 1 {
        return Err(StoreError::Invalid(format!(
            "max_attempts must be at least 1 (got {max_attempts})"
        )));
    }
    let args = serde_json::to_string(&job.args)
        .map_err(|e| StoreError::Invalid(format!("args are not valid JSON: {e}")))?;
    Ok((max_attempts, args))
}

/// Insert one validated job and its first event inside `tx`.
async fn insert(
    tx: &mut WriteTx,
    job: &NewJob,
    max_attempts: i32,
    args: &str,
    now: i64,
    actor: &str,
) -> Result<i64> {
    let due = match (job.run_at, job.delay) {
        (Some(at), _) => at.timestamp_millis(),
        (None, Some(delay)) => now.saturating_add(ms(delay)),
        (None, None) => now,
    };
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (pipeline, target, args, state, priority, due_at, max_attempts, \
         unique_key, created_at) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(&job.pipeline)
    .bind(&job.target)
    .bind(args)
    .bind(job.priority)
    .bind(due)
    .bind(max_attempts)
    .bind(&job.unique_key)
    .bind(now)
    .fetch_one(&mut **tx)
    .await?;
    event(tx, id, now, None, State::Queued, actor, "enqueued").await?;
    Ok(id)
}

impl SqliteStore {
    pub(super) async fn do_enqueue(&self, job: NewJob, actor: &str) -> Result<Enqueued> {
        let (max_attempts, args) = validate(&job)?;
        let mut tx = self.begin().await?;
        let now = now_ms();
        if let Some(key) = &job.unique_key {
            // BEGIN IMMEDIATE makes look-up and insert one step; the partial
            // unique index would refuse a duplicate anyway.
            let existing: Option<i64> = sqlx::query_scalar(concat!(
                "SELECT id FROM jobs WHERE unique_key = ? AND ",
                unfinished_cond!()
            ))
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(id) = existing {
                return Ok(Enqueued {
                    id,
                    deduplicated: true,
                });
            }
        }
        let id = insert(&mut tx, &job, max_attempts, &args, now, actor).await?;
        tx.commit().await?;
        Ok(Enqueued {
            id,
            deduplicated: false,
        })
    }

    /// All or nothing, in one transaction; ids in input order.
    pub(super) async fn do_enqueue_many(&self, jobs: Vec<NewJob>, actor: &str) -> Result<Vec<i64>> {
        let mut checked = Vec::with_capacity(jobs.len());
        for (i, job) in jobs.iter().enumerate() {
            if job.unique_key.is_some() {
                return Err(StoreError::Invalid(format!(
                    "job #{} of the batch has a unique key; enqueue it on its own",
                    i + 1
                )));
            }
            checked.push(validate(job)?);
        }
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        let now = now_ms();
        // One INSERT for the rows and one for their events: a bulk enqueue
        // costs two statements, not two per job.
        let rows: Vec<serde_json::Value> = jobs
            .iter()
            .zip(&checked)
            .map(|(job, (max_attempts, args))| {
                let due = match (job.run_at, job.delay) {
                    (Some(at), _) => at.timestamp_millis(),
                    (None, Some(delay)) => now.saturating_add(ms(delay)),
                    (None, None) => now,
                };
                serde_json::json!([
                    job.pipeline,
                    job.target,
                    args,
                    job.priority,
                    due,
                    max_attempts
                ])
            })
            .collect();
        let mut ids: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO jobs (pipeline, target, args, state, priority, due_at, max_attempts, created_at)
             SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
                    json_extract(value, '$[2]'), 'queued', json_extract(value, '$[3]'),
                    json_extract(value, '$[4]'), json_extract(value, '$[5]'), ?1
             FROM json_each(?2) ORDER BY key
             RETURNING id",
        )
        .bind(now)
        .bind(serde_json::Value::Array(rows).to_string())
        .fetch_all(&mut *tx)
        .await?;
        // Ids grow in insertion order; RETURNING's own order is unspecified.
        ids.sort_unstable();
        sqlx::query(
            "INSERT INTO job_events (job_id, at, from_state, to_state, actor, detail)
             SELECT value, ?, NULL, 'queued', ?, 'enqueued' FROM json_each(?) ORDER BY key",
        )
        .bind(now)
        .bind(actor)
        .bind(serde_json::to_string(&ids).map_err(|e| StoreError::Invalid(e.to_string()))?)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(ids)
    }
}
