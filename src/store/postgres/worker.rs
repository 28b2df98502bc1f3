//! Workers' writes. Every worker write names the job by
//! `(id, lease_token, state)`; zero rows means the lease was lost.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::{PgConnection, Row};

use super::rows::{self, log_event};
use super::{PgStore, ms};
use crate::job::{self, Job, State};
use crate::store::{
    ClaimRequest, LeaseRef, Outcome, Renewal, Result, StartOutcome, StartSpec, StoreError,
    WorkerBeat,
};

/// Postgres text cannot hold NUL; process output and error text may.
pub(super) fn clean(s: &str) -> String {
    s.replace('\0', "")
}

impl PgStore {
    pub(super) async fn claim_jobs(&self, req: &ClaimRequest) -> Result<Vec<Job>> {
        let mut conn = self.pool.acquire().await?;
        claim_in(&mut conn, req).await
    }

    pub(super) async fn start_job(
        &self,
        lease: LeaseRef,
        spec: &StartSpec,
        worker: &str,
    ) -> Result<StartOutcome> {
        let mut tx = self.pool.begin().await?;
        let started = start_in(&mut tx, lease, spec, worker).await?;
        tx.commit().await?;
        Ok(started)
    }

    pub(super) async fn unclaim_job(
        &self,
        lease: LeaseRef,
        delay: Duration,
        actor: &str,
        detail: &str,
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE jobs SET state = 'queued', due_at = now() + $3 * interval '1 millisecond', \
                 lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL \
             WHERE id = $1 AND lease_token = $2 AND state = 'leased'",
        )
        .bind(lease.id)
        .bind(lease.token)
        .bind(ms(delay))
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::LeaseLost(lease.id));
        }
        log_event(
            &mut tx,
            lease.id,
            Some(State::Leased),
            State::Queued,
            actor,
            detail,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn fail_leased_job(
        &self,
        lease: LeaseRef,
        actor: &str,
        error: &str,
    ) -> Result<()> {
        let error = clean(error);
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE jobs SET state = 'failed', last_error = $3, finished_at = now(), \
                 lease_expires_at = NULL \
             WHERE id = $1 AND lease_token = $2 AND state = 'leased'",
        )
        .bind(lease.id)
        .bind(lease.token)
        .bind(&error)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::LeaseLost(lease.id));
        }
        log_event(
            &mut tx,
            lease.id,
            Some(State::Leased),
            State::Failed,
            actor,
            &error,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn renew_leases(
        &self,
        worker: &WorkerBeat,
        leases: &[LeaseRef],
        lease: Duration,
    ) -> Result<Vec<(LeaseRef, Renewal)>> {
        let ids: Vec<i64> = leases.iter().map(|l| l.id).collect();
        let tokens: Vec<i64> = leases.iter().map(|l| l.token).collect();
        let pipelines = serde_json::to_string(&worker.pipelines)
            .map_err(|e| StoreError::Invalid(format!("worker pipelines: {e}")))?;
        // One statement (so one implicit transaction and one round trip):
        // heartbeat, lease extension that never shortens, lock display times.
        // Job rows are locked in id order, as the batched starts and
        // finishes lock theirs, so a renewal and a batch cannot deadlock.
        let rows = sqlx::query(
            "WITH beat AS ( \
                 INSERT INTO workers AS w (id, host, pid, slots, busy, paused, pipelines, started_at, heartbeat_at, gone) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, now(), now(), false) \
                 ON CONFLICT (id) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, \
                     slots = EXCLUDED.slots, busy = EXCLUDED.busy, paused = EXCLUDED.paused, \
                     pipelines = EXCLUDED.pipelines, heartbeat_at = now(), gone = false \
             ), locked AS ( \
                 SELECT id FROM jobs WHERE id = ANY($8) ORDER BY id FOR NO KEY UPDATE \
             ), renewed AS ( \
                 UPDATE jobs j SET lease_expires_at = \
                     GREATEST(j.lease_expires_at, now() + $10 * interval '1 millisecond') \
                 FROM unnest($8::bigint[], $9::bigint[]) AS t(id, token), locked \
                 WHERE j.id = t.id AND locked.id = t.id AND j.lease_token = t.token \
                   AND j.state IN ('leased','running') \
                 RETURNING j.id, j.lease_token, j.target, j.lease_expires_at, \
                     j.cancel_requested_at IS NOT NULL AS cancel_requested \
             ), shown AS ( \
                 UPDATE locks l SET expires_at = r.lease_expires_at FROM renewed r \
                 WHERE l.target = r.target AND l.holder_job = r.id \
             ) \
             SELECT id, lease_token, \
                 (extract(epoch FROM lease_expires_at - now()) * 1000)::bigint AS remaining_ms, \
                 cancel_requested \
             FROM renewed",
        )
        .bind(&worker.id)
        .bind(&worker.host)
        .bind(worker.pid)
        .bind(worker.slots)
        .bind(worker.busy)
        .bind(worker.paused)
        .bind(&pipelines)
        .bind(&ids)
        .bind(&tokens)
        .bind(ms(lease))
        .fetch_all(&self.pool)
        .await?;
        let mut held = HashMap::with_capacity(rows.len());
        for r in &rows {
            let key = LeaseRef {
                id: r.try_get("id")?,
                token: r.try_get("lease_token")?,
            };
            let remaining: i64 = r.try_get("remaining_ms")?;
            held.insert(
                key,
                Renewal::Held {
                    remaining: Duration::from_millis(remaining.max(0) as u64),
                    cancel_requested: r.try_get("cancel_requested")?,
                },
            );
        }
        Ok(leases
            .iter()
            .map(|l| (*l, held.get(l).copied().unwrap_or(Renewal::Lost)))
            .collect())
    }

    pub(super) async fn advance_job_step(
        &self,
        lease: LeaseRef,
        step: i32,
        checkpoints: &[(String, String)],
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        // max(): re-sending after a connection error must not skip a step.
        let row = sqlx::query(
            "UPDATE jobs SET step = GREATEST(step, $3 + 1) \
             WHERE id = $1 AND lease_token = $2 AND state = 'running' \
             RETURNING pipeline, COALESCE(target, '') AS target",
        )
        .bind(lease.id)
        .bind(lease.token)
        .bind(step)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Err(StoreError::LeaseLost(lease.id));
        };
        if !checkpoints.is_empty() {
            // One row per key (the last value wins): an upsert may not touch
            // the same row twice in one statement.
            let mut last: Vec<(String, String)> = Vec::new();
            for (k, v) in checkpoints {
                match last.iter_mut().find(|(lk, _)| lk == k) {
                    Some(slot) => slot.1 = clean(v),
                    None => last.push((clean(k), clean(v))),
                }
            }
            let (keys, values): (Vec<String>, Vec<String>) = last.into_iter().unzip();
            sqlx::query(
                "INSERT INTO checkpoints (pipeline, target, key, value, job_id, updated_at) \
                 SELECT $1, $2, k, v, $3, now() FROM unnest($4::text[], $5::text[]) AS t(k, v) \
                 ON CONFLICT (pipeline, target, key) DO UPDATE SET value = EXCLUDED.value, \
                     job_id = EXCLUDED.job_id, updated_at = EXCLUDED.updated_at",
            )
            .bind(row.try_get::<String, _>("pipeline")?)
            .bind(row.try_get::<String, _>("target")?)
            .bind(lease.id)
            .bind(&keys)
            .bind(&values)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn save_job_output(&self, lease: LeaseRef, tail: &str) -> Result<()> {
        let saved: Option<i64> = sqlx::query_scalar(
            "INSERT INTO job_output (job_id, tail, updated_at) \
             SELECT id, $3, now() FROM jobs \
             WHERE id = $1 AND lease_token = $2 AND state = 'running' \
             ON CONFLICT (job_id) DO UPDATE SET tail = EXCLUDED.tail, updated_at = EXCLUDED.updated_at \
             RETURNING job_id",
        )
        .bind(lease.id)
        .bind(lease.token)
        .bind(clean(tail))
        .fetch_optional(&self.pool)
        .await?;
        saved.map(|_| ()).ok_or(StoreError::LeaseLost(lease.id))
    }

    pub(super) async fn finish_job(
        &self,
        lease: LeaseRef,
        outcome: Outcome,
        actor: &str,
    ) -> Result<State> {
        let mut tx = self.pool.begin().await?;
        let to = finish_in(&mut tx, lease, outcome, actor).await?;
        tx.commit().await?;
        Ok(to)
    }
}

/// How many candidates a claim of `limit` jobs locks: every row in the
/// window is locked (a tuple write), so it is small; twice the request
/// leaves room for a few same-target duplicates. The engine's statement
/// with locks opens this wide only while it meets them
/// (`lock_cycle::ClaimWindow`).
pub(super) fn claim_window(limit: i64) -> i64 {
    limit.saturating_mul(2).saturating_add(2)
}

/// The claim (with its events), on the caller's connection or inside its
/// transaction: the engine's cycle function (migrations 0003, 0007) with nothing
/// to finish and no start specs, so the jobs it takes stay leased. Its
/// statement locks a bounded window of candidates from the claim index,
/// skipping rows other claimers hold, and keeps the first job per target.
/// Both target checks there probe an index per candidate (OFFSET 0 keeps
/// them correlated probes of locks_pkey and jobs_target_active): hashed
/// over all locks or all leased jobs instead, they read every dead version
/// that lock and lease churn leaves until a vacuum (5 ms per claim after a
/// few thousand jobs on 100 targets, against 0.6 ms).
pub(super) async fn claim_in(conn: &mut PgConnection, req: &ClaimRequest) -> Result<Vec<Job>> {
    if req.limit == 0 || req.pipelines.is_empty() {
        return Ok(Vec::new());
    }
    let limit = i64::try_from(req.limit).unwrap_or(i64::MAX / 16);
    let rows = sqlx::query(concat!(
        "SELECT ",
        job_cols!(),
        " FROM jobdeck_cycle('{}', '{}', $1, $2, $3, $4, $5, '{}', '{}', '{}', '{}')"
    ))
    .bind(&req.worker)
    .bind(&req.pipelines)
    .bind(claim_window(limit))
    .bind(limit)
    .bind(ms(req.lease))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(rows::job).collect()
}

/// Take the lock (if the job has a target), count the attempt, write
/// `running`. Writes nothing when the answer is LockBusy or LeaseLost.
pub(super) async fn start_in(
    tx: &mut PgConnection,
    lease: LeaseRef,
    spec: &StartSpec,
    worker: &str,
) -> Result<StartOutcome> {
    let target: Option<Option<String>> = sqlx::query_scalar(
        "SELECT target FROM jobs WHERE id = $1 AND lease_token = $2 AND state = 'leased' \
         FOR UPDATE",
    )
    .bind(lease.id)
    .bind(lease.token)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(target) = target else {
        return Err(StoreError::LeaseLost(lease.id));
    };
    let lease_ms = ms(spec.lease);
    let fence = match &target {
        None => None,
        Some(target) => {
            // A row that stays held makes the WHERE false: no row back.
            let fence: Option<i64> = sqlx::query_scalar(
                "INSERT INTO locks AS l (target, fence, holder_job, holder_worker, acquired_at, expires_at) \
                 VALUES ($1, 1, $2, $3, now(), now() + $4 * interval '1 millisecond') \
                 ON CONFLICT (target) DO UPDATE SET fence = l.fence + 1, \
                     holder_job = EXCLUDED.holder_job, holder_worker = EXCLUDED.holder_worker, \
                     acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at \
                 WHERE l.holder_job IS NULL \
                 RETURNING fence",
            )
            .bind(target)
            .bind(lease.id)
            .bind(worker)
            .bind(lease_ms)
            .fetch_optional(&mut *tx)
            .await?;
            if fence.is_none() {
                let holder =
                    sqlx::query("SELECT holder_job, holder_worker FROM locks WHERE target = $1")
                        .bind(target)
                        .fetch_one(&mut *tx)
                        .await?;
                let holder_job: Option<i64> = holder.try_get("holder_job")?;
                let holder_worker: Option<String> = holder.try_get("holder_worker")?;
                let holder_job = holder_job.ok_or_else(|| {
                    StoreError::Database(format!(
                        "the lock on {target} changed while job {} started; try again",
                        lease.id
                    ))
                })?;
                return Ok(StartOutcome::LockBusy {
                    holder_job,
                    holder_worker,
                });
            }
            fence
        }
    };
    let attempt: i32 = sqlx::query_scalar(
        "UPDATE jobs SET state = 'running', attempt = attempt + 1, \
             lease_expires_at = now() + $2 * interval '1 millisecond', started_at = now(), \
             lock_fence = $3, on_stale = $4, backoff_ms = $5 \
         WHERE id = $1 RETURNING attempt",
    )
    .bind(lease.id)
    .bind(lease_ms)
    .bind(fence)
    .bind(spec.on_stale.as_str())
    .bind(ms(spec.backoff))
    .fetch_one(&mut *tx)
    .await?;
    let detail = crate::store::start_detail(attempt, fence);
    log_event(
        tx,
        lease.id,
        Some(State::Leased),
        State::Running,
        worker,
        &detail,
    )
    .await?;
    Ok(StartOutcome::Started { attempt, fence })
}

/// End a running job and release its lock by fence. Writes nothing when the
/// lease is lost.
pub(super) async fn finish_in(
    tx: &mut PgConnection,
    lease: LeaseRef,
    outcome: Outcome,
    actor: &str,
) -> Result<State> {
    let row = sqlx::query(
        "SELECT attempt, max_attempts, cancel_requested_at IS NOT NULL AS cancel_pending, \
             target, lock_fence, backoff_ms \
         FROM jobs WHERE id = $1 AND lease_token = $2 AND state = 'running' FOR UPDATE",
    )
    .bind(lease.id)
    .bind(lease.token)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Err(StoreError::LeaseLost(lease.id));
    };
    let attempt: i32 = row.try_get("attempt")?;
    let max_attempts: i32 = row.try_get("max_attempts")?;
    let cancel_pending: bool = row.try_get("cancel_pending")?;
    let target: Option<String> = row.try_get("target")?;
    let fence: Option<i64> = row.try_get("lock_fence")?;
    let backoff_ms: i64 = row.try_get("backoff_ms")?;
    let (mv, to, error) = outcome.decide(attempt, max_attempts, cancel_pending);
    job::check(lease.id, State::Running, mv)?;
    let error = error.as_deref().map(clean);
    if to == State::Queued {
        let base = Duration::from_millis(backoff_ms.max(0) as u64);
        let delay = job::backoff(base, attempt, rand::random::<f64>());
        sqlx::query(
            "UPDATE jobs SET state = 'queued', due_at = now() + $2 * interval '1 millisecond', \
                 lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, \
                 last_error = $3 \
             WHERE id = $1",
        )
        .bind(lease.id)
        .bind(ms(delay))
        .bind(&error)
        .execute(&mut *tx)
        .await?;
    } else {
        sqlx::query(
            "UPDATE jobs SET state = $2, finished_at = now(), lease_expires_at = NULL, \
                 last_error = COALESCE($3, last_error) \
             WHERE id = $1",
        )
        .bind(lease.id)
        .bind(to.as_str())
        .bind(&error)
        .execute(&mut *tx)
        .await?;
    }
    if let (Some(target), Some(fence)) = (&target, fence) {
        release_by_fence(tx, target, fence, lease.id).await?;
    }
    log_event(
        tx,
        lease.id,
        Some(State::Running),
        to,
        actor,
        error.as_deref().unwrap_or(""),
    )
    .await?;
    Ok(to)
}

/// Free `target`'s lock if `job` still holds it under `fence`; the fence
/// stays so the next holder's is larger.
pub(super) async fn release_by_fence(
    conn: &mut sqlx::PgConnection,
    target: &str,
    fence: i64,
    job: i64,
) -> Result<()> {
    sqlx::query(
        "UPDATE locks SET holder_job = NULL, holder_worker = NULL, acquired_at = NULL, \
             expires_at = NULL \
         WHERE target = $1 AND fence = $2 AND holder_job = $3",
    )
    .bind(target)
    .bind(fence)
    .bind(job)
    .execute(conn)
    .await?;
    Ok(())
}
