//! Producers: one job (deduplicated by unique key) or a batch.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use super::lean_cycle::fold_state_counts;
use super::rows::notify;
use super::{JOBS_CHANNEL, PgStore, ms};
use crate::job::DEFAULT_MAX_ATTEMPTS;
use crate::store::{Enqueued, NewJob, Result, StoreError};

/// The checks both entry points share; returns the job's max_attempts.
fn validate(job: &NewJob) -> Result<i32> {
    if job.pipeline.trim().is_empty() {
        return Err(StoreError::Invalid("a job needs a pipeline".into()));
    }
    let max_attempts = job.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
    if max_attempts < 1 {
        return Err(StoreError::Invalid(format!(
            "max_attempts must be at least 1 (got {max_attempts})"
        )));
    }
    Ok(max_attempts)
}

/// Bulk enqueues of at least this many jobs refresh the table's statistics.
const ANALYZE_AFTER: usize = 1_000;

impl PgStore {
    /// A new job is one statement (row, event and notification, one
    /// round trip with its commit); a unique key that is taken costs a
    /// look-up of its holder.
    pub(super) async fn enqueue_job(&self, mut job: NewJob, actor: &str) -> Result<Enqueued> {
        let max_attempts = validate(&job)?;
        let args = serde_json::Value::Object(std::mem::take(&mut job.args)).to_string();
        // The unique index arbitrates races: a conflicting insert waits for
        // the other transaction, then does nothing. The holder may finish
        // between our insert and our look-up, hence the few rounds.
        for _ in 0..5 {
            if let Some(id) = self.insert_logged(&job, &args, max_attempts, actor).await? {
                return Ok(Enqueued {
                    id,
                    deduplicated: false,
                });
            }
            let holder: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM jobs WHERE unique_key = $1 \
                 AND state IN ('queued','leased','running','stale')",
            )
            .bind(&job.unique_key)
            .fetch_optional(&self.pool)
            .await?;
            if let Some(id) = holder {
                return Ok(Enqueued {
                    id,
                    deduplicated: true,
                });
            }
        }
        Err(StoreError::Database(format!(
            "enqueue of unique key {:?} kept racing with other writers; try again",
            job.unique_key.unwrap_or_default()
        )))
    }

    /// Insert the job with its `enqueued` event, count it and wake the
    /// workers, in one statement; `None` when its unique key is taken.
    ///
    /// The statement counts its own job, so that a new backend (every
    /// `jobdeck enqueue` is a new process) does not compile the count
    /// trigger's PL/pgSQL before its job exists (migration 0013): it sets
    /// `jobdeck.cycle_counts` for its own transaction, in the insert's
    /// input so that the setting is on before the trigger's `WHEN` is
    /// read at the insert's end. It runs on the pool in autocommit, so the
    /// setting ends with it. One enqueue in 16 then folds the counts, as
    /// the trigger did; the job is committed and announced by then.
    async fn insert_logged(
        &self,
        job: &NewJob,
        args: &str,
        max_attempts: i32,
        actor: &str,
    ) -> Result<Option<i64>> {
        let id = sqlx::query_scalar(
            "WITH counting AS MATERIALIZED ( \
                 SELECT set_config('jobdeck.cycle_counts', 'on', true) \
             ), added AS ( \
                 INSERT INTO jobs (pipeline, target, args, state, priority, due_at, max_attempts, unique_key) \
                 SELECT $1, $2, $3::jsonb, 'queued', $4, \
                        COALESCE($5, now() + $6 * interval '1 millisecond'), $7, $8 \
                 FROM counting \
                 ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL \
                     AND state IN ('queued','leased','running','stale') DO NOTHING \
                 RETURNING id, pipeline \
             ), logged AS ( \
                 INSERT INTO job_events (job_id, from_state, to_state, actor, detail) \
                 SELECT id, NULL, 'queued', $9, 'enqueued' FROM added \
             ), counted AS ( \
                 INSERT INTO job_state_deltas (state, n) \
                 SELECT 'queued', count(*) FROM added HAVING count(*) > 0 \
             ) \
             SELECT added.id FROM added, pg_notify($10, added.pipeline)",
        )
        .bind(&job.pipeline)
        .bind(&job.target)
        .bind(args)
        .bind(job.priority)
        .bind(job.run_at)
        .bind(ms(job.delay.unwrap_or_default()))
        .bind(max_attempts)
        .bind(&job.unique_key)
        .bind(actor)
        .bind(JOBS_CHANNEL)
        .fetch_optional(&self.pool)
        .await?;
        if rand::random::<f64>() < 1.0 / 16.0 {
            fold_state_counts(&self.pool).await;
        }
        Ok(id)
    }

    /// Many jobs in one transaction of three statements, whatever their
    /// number (ids first, so they come back in input order).
    pub(super) async fn enqueue_jobs(&self, jobs: Vec<NewJob>, actor: &str) -> Result<Vec<i64>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let n = jobs.len();
        let mut pipelines = Vec::with_capacity(n);
        let mut targets: Vec<Option<String>> = Vec::with_capacity(n);
        let mut args = Vec::with_capacity(n);
        let mut priorities = Vec::with_capacity(n);
        let mut run_ats: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(n);
        let mut delays = Vec::with_capacity(n);
        let mut max_attempts = Vec::with_capacity(n);
        for (i, job) in jobs.into_iter().enumerate() {
            max_attempts.push(validate(&job)?);
            if job.unique_key.is_some() {
                return Err(StoreError::Invalid(format!(
                    "job #{} of the batch has a unique key; enqueue it on its own",
                    i + 1
                )));
            }
            args.push(serde_json::Value::Object(job.args).to_string());
            pipelines.push(job.pipeline);
            targets.push(job.target);
            priorities.push(job.priority);
            run_ats.push(job.run_at);
            delays.push(ms(job.delay.unwrap_or_default()));
        }
        let mut tx = self.pool.begin().await?;
        let mut ids: Vec<i64> = sqlx::query_scalar(
            "SELECT nextval(pg_get_serial_sequence('jobs', 'id')) FROM generate_series(1, $1)",
        )
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await?;
        ids.sort_unstable();
        sqlx::query(
            "WITH added AS ( \
                 INSERT INTO jobs (id, pipeline, target, args, state, priority, due_at, max_attempts) \
                 SELECT id, pipeline, target, args::jsonb, 'queued', priority, \
                     COALESCE(run_at, now() + delay_ms * interval '1 millisecond'), max_attempts \
                 FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::int[], \
                             $6::timestamptz[], $7::bigint[], $8::int[]) \
                     AS t(id, pipeline, target, args, priority, run_at, delay_ms, max_attempts) \
                 RETURNING id \
             ) \
             INSERT INTO job_events (job_id, from_state, to_state, actor, detail) \
             SELECT id, NULL, 'queued', $9, 'enqueued' FROM added ORDER BY id",
        )
        .bind(&ids)
        .bind(&pipelines)
        .bind(&targets)
        .bind(&args)
        .bind(&priorities)
        .bind(&run_ats)
        .bind(&delays)
        .bind(&max_attempts)
        .bind(actor)
        .execute(&mut *tx)
        .await?;
        for pipeline in pipelines.iter().collect::<BTreeSet<_>>() {
            notify(&mut tx, JOBS_CHANNEL, pipeline).await?;
        }
        tx.commit().await?;
        if n >= ANALYZE_AFTER {
            // A bulk load leaves the planner's statistics behind until
            // autovacuum comes by (if it is on at all): the claim then
            // sorts the whole queue on every call instead of walking its
            // index. Failing to analyze (no privilege) costs only speed.
            if let Err(e) = sqlx::query("ANALYZE jobs").execute(&self.pool).await {
                tracing::debug!("analyze after a bulk enqueue: {e}");
            }
        }
        Ok(ids)
    }
}
