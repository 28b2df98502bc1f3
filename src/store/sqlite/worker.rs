//! Workers: claim, start, and the writes a worker makes under its lease
//! token.

use std::time::Duration;

use sqlx::Row;

use sqlx::SqliteConnection;

use super::SqliteStore;
use super::rows::{self, event, job_cols, job_from_row, lease_lists, ms, now_ms};
use crate::job::{self, Job, State};
use crate::store::{
    ClaimRequest, LeaseRef, Outcome, Renewal, Result, StartOutcome, StartSpec, StoreError,
    WorkerBeat,
};

impl SqliteStore {
    pub(super) async fn do_claim(&self, req: &ClaimRequest) -> Result<Vec<Job>> {
        if req.limit == 0 || req.pipelines.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        let jobs = claim_in(&mut tx, now_ms(), req).await?;
        tx.commit().await?;
        Ok(jobs)
    }

    pub(super) async fn do_start(
        &self,
        lease: LeaseRef,
        spec: &StartSpec,
        worker: &str,
    ) -> Result<StartOutcome> {
        let mut tx = self.begin().await?;
        let started = start_in(&mut tx, now_ms(), lease, spec, worker).await?;
        tx.commit().await?;
        Ok(started)
    }

    pub(super) async fn do_unclaim(
        &self,
        lease: LeaseRef,
        delay: Duration,
        actor: &str,
        detail: &str,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE jobs SET state = 'queued', due_at = ?1 + ?2, lease_owner = NULL,
                 lease_token = NULL, lease_expires_at = NULL
             WHERE id = ?3 AND lease_token = ?4 AND state = 'leased'",
        )
        .bind(now)
        .bind(ms(delay))
        .bind(lease.id)
        .bind(lease.token)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::LeaseLost(lease.id));
        }
        event(
            &mut tx,
            lease.id,
            now,
            Some(State::Leased),
            State::Queued,
            actor,
            detail,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn do_fail_leased(
        &self,
        lease: LeaseRef,
        actor: &str,
        error: &str,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE jobs SET state = 'failed', last_error = ?1, finished_at = ?2,
                 lease_expires_at = NULL
             WHERE id = ?3 AND lease_token = ?4 AND state = 'leased'",
        )
        .bind(error)
        .bind(now)
        .bind(lease.id)
        .bind(lease.token)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::LeaseLost(lease.id));
        }
        event(
            &mut tx,
            lease.id,
            now,
            Some(State::Leased),
            State::Failed,
            actor,
            error,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn do_renew(
        &self,
        worker: &WorkerBeat,
        leases: &[LeaseRef],
        lease: Duration,
    ) -> Result<Vec<(LeaseRef, Renewal)>> {
        let pipelines = serde_json::to_string(&worker.pipelines)
            .map_err(|e| StoreError::Invalid(format!("bad pipeline list: {e}")))?;
        let (ids, tokens) = lease_lists(leases)?;
        let mut tx = self.begin_urgent().await?;
        let now = now_ms();
        sqlx::query(
            "INSERT INTO workers (id, host, pid, slots, busy, paused, pipelines, started_at,
                 heartbeat_at, gone)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, 0)
             ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid,
                 slots = excluded.slots, busy = excluded.busy, paused = excluded.paused,
                 pipelines = excluded.pipelines, heartbeat_at = excluded.heartbeat_at, gone = 0",
        )
        .bind(&worker.id)
        .bind(&worker.host)
        .bind(worker.pid)
        .bind(worker.slots)
        .bind(worker.busy)
        .bind(worker.paused)
        .bind(pipelines)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let rows = sqlx::query(
            "UPDATE jobs SET lease_expires_at = MAX(COALESCE(lease_expires_at, 0), ?1 + ?2)
             FROM json_each(?3) AS lease
             WHERE jobs.id = lease.value AND jobs.lease_token = ?4 ->> lease.key
               AND jobs.state IN ('leased', 'running')
             RETURNING id, lease_token, lease_expires_at,
                 cancel_requested_at IS NOT NULL AS cancel_requested",
        )
        .bind(now)
        .bind(ms(lease))
        .bind(&ids)
        .bind(&tokens)
        .fetch_all(&mut *tx)
        .await?;
        // Locks are never released by time; their expiry is only shown.
        sqlx::query(
            "UPDATE locks SET expires_at = (SELECT lease_expires_at FROM jobs
                                            WHERE jobs.id = locks.holder_job)
             WHERE holder_job IN (SELECT value FROM json_each(?))",
        )
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        let mut held = std::collections::HashMap::new();
        for row in &rows {
            let id: i64 = row.try_get("id")?;
            let token: i64 = row.try_get("lease_token")?;
            let expires: i64 = row.try_get("lease_expires_at")?;
            let cancel_requested: bool = row.try_get("cancel_requested")?;
            let remaining = Duration::from_millis(u64::try_from(expires - now).unwrap_or(0));
            held.insert(
                LeaseRef { id, token },
                Renewal::Held {
                    remaining,
                    cancel_requested,
                },
            );
        }
        Ok(leases
            .iter()
            .map(|l| (*l, held.get(l).copied().unwrap_or(Renewal::Lost)))
            .collect())
    }

    pub(super) async fn do_advance_step(
        &self,
        lease: LeaseRef,
        step: i32,
        checkpoints: &[(String, String)],
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        // max(): re-sending the same advance after a lost reply is harmless.
        let row = sqlx::query(
            "UPDATE jobs SET step = MAX(step, ?1 + 1)
             WHERE id = ?2 AND lease_token = ?3 AND state = 'running'
             RETURNING pipeline, COALESCE(target, '') AS target",
        )
        .bind(step)
        .bind(lease.id)
        .bind(lease.token)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Err(StoreError::LeaseLost(lease.id));
        };
        let pipeline: String = row.try_get("pipeline")?;
        let target: String = row.try_get("target")?;
        for (key, value) in checkpoints {
            sqlx::query(
                "INSERT INTO checkpoints (pipeline, target, key, value, job_id, updated_at)
                 VALUES (?, ?, ?, ?, ?, ?)
                 ON CONFLICT (pipeline, target, key) DO UPDATE SET value = excluded.value,
                     job_id = excluded.job_id, updated_at = excluded.updated_at",
            )
            .bind(&pipeline)
            .bind(&target)
            .bind(key)
            .bind(value)
            .bind(lease.id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn do_save_output(&self, lease: LeaseRef, tail: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let done = sqlx::query(
            "INSERT INTO job_output (job_id, tail, updated_at)
             SELECT id, ?1, ?2 FROM jobs WHERE id = ?3 AND lease_token = ?4 AND state = 'running'
             ON CONFLICT (job_id) DO UPDATE SET tail = excluded.tail,
                 updated_at = excluded.updated_at",
        )
        .bind(tail)
        .bind(now)
        .bind(lease.id)
        .bind(lease.token)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::LeaseLost(lease.id));
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn do_finish(
        &self,
        lease: LeaseRef,
        outcome: Outcome,
        actor: &str,
    ) -> Result<State> {
        let mut tx = self.begin().await?;
        let to = finish_in(&mut tx, now_ms(), lease, outcome, actor).await?;
        tx.commit().await?;
        Ok(to)
    }
}

/// The jobs a claim takes, as the CTE `pick (id, pipeline, target)`, in
/// claim order; binds ?1 now, ?2 the pipelines (JSON list), ?3 the limit,
/// ?4 the jobs (JSON list of ids) whose locks count as free once they
/// have succeeded: the engine's cycle finishes its jobs just before its
/// claim and hands their locks on in one statement after it. A listed job
/// that did not succeed (its lease was lost) keeps its lock here.
///
/// A bare `LIMIT ?` makes SQLite (3.51) plan for the bound value and so
/// recompile the whole statement at every claim (a fifth of the CPU of a
/// busy engine); a LIMIT expression keeps the prepared plan.
/// Candidates come from the claim index in claim order, already without
/// blocked targets; a window of twice the request (as on Postgres) leaves
/// room for same-target duplicates, of which `pick` keeps the first per
/// target: a targeted candidate with another of its target ahead of it in
/// claim order is dropped. A job without a target passes at once, which is
/// why this is not `ROW_NUMBER() OVER (PARTITION BY target …)`: the window
/// function sorted every candidate by target at every claim, targets or
/// none, and the claim then sorted them again (the cycle's writer ran 12 %
/// fewer instructions per untargeted job without it; bench/HISTORY.md,
/// session 24). With no queued job on a target (`target_queue` empty, one
/// probe per claim) there is no duplicate to drop, and the window is the
/// request: each candidate beyond it was a row read and materialized for
/// nothing (the writer's instructions per untargeted job −2.0 %; session
/// 27). `cand` is materialized so that the probe of `ahead` reads the
/// candidates, not the claim index again.
/// The leased-sibling probe is pinned to the per-target index (its
/// `state = 'leased'` implies the index's condition, so the partial index
/// applies): through the state index it would scan every leased job for
/// each candidate. It runs only when some job with a target is leased at
/// all, which an uncorrelated `EXISTS` on the state index answers once per
/// claim: the engine's cycle starts what it claims, so there is rarely one
/// (as on Postgres; with 100 targets the claim's VDBE operations per job
/// −2.3 %, the writer's instructions −0.5 %; bench/HISTORY.md, session
/// 43).
macro_rules! claim_picks {
    () => {
        "WITH cand AS MATERIALIZED (
            SELECT id, pipeline, target, priority, due_at FROM jobs INDEXED BY jobs_claim
            WHERE state = 'queued' AND due_at <= ?1
              AND pipeline IN (SELECT value FROM json_each(?2))
              AND (target IS NULL OR (
                  NOT EXISTS (SELECT 1 FROM locks l
                              WHERE l.target = jobs.target AND l.holder_job IS NOT NULL
                                AND l.holder_job NOT IN (
                                    SELECT h.id FROM jobs h
                                    WHERE h.id IN (SELECT value FROM json_each(?4))
                                      AND h.state = 'succeeded'))
                  AND (NOT EXISTS (SELECT 1 FROM jobs a INDEXED BY jobs_state
                                   WHERE a.state = 'leased' AND a.state <> 'queued'
                                     AND a.target IS NOT NULL)
                       OR NOT EXISTS (SELECT 1 FROM jobs o INDEXED BY jobs_target_active
                                      WHERE o.target = jobs.target AND o.state = 'leased'))))
            ORDER BY priority DESC, due_at, id
            LIMIT iif(EXISTS (SELECT 1 FROM target_queue), ?3 * 2 + 2, ?3)
        ), pick AS (
            SELECT id, pipeline, target FROM cand
            WHERE target IS NULL OR NOT EXISTS (
                SELECT 1 FROM cand ahead WHERE ahead.target = cand.target
                  AND (-ahead.priority, ahead.due_at, ahead.id)
                      < (-cand.priority, cand.due_at, cand.id))
            ORDER BY priority DESC, due_at, id
            LIMIT CAST(?3 AS INTEGER)
        )"
    };
}
pub(super) use claim_picks;

/// RETURNING has no defined order: back to the claim's.
pub(super) fn sort_claim_order(jobs: &mut [Job]) {
    jobs.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then(a.due_at.cmp(&b.due_at))
            .then(a.id.cmp(&b.id))
    });
}

/// The claim statement and its events, inside the caller's transaction.
pub(super) async fn claim_in(
    tx: &mut SqliteConnection,
    now: i64,
    req: &ClaimRequest,
) -> Result<Vec<Job>> {
    if req.limit == 0 || req.pipelines.is_empty() {
        return Ok(Vec::new());
    }
    let pipelines = rows::to_json(&req.pipelines)?;
    let limit = i64::try_from(req.limit).unwrap_or(i64::MAX / 16);
    let rows = sqlx::query(concat!(
        claim_picks!(),
        "
        UPDATE jobs SET state = 'leased', lease_owner = ?5, lease_token = random(),
            lease_expires_at = ?1 + ?6
        WHERE id IN (SELECT id FROM pick)
        RETURNING ",
        job_cols!()
    ))
    .bind(now)
    .bind(pipelines)
    .bind(limit)
    .bind("[]")
    .bind(&req.worker)
    .bind(ms(req.lease))
    .fetch_all(&mut *tx)
    .await?;
    let mut jobs = rows.iter().map(job_from_row).collect::<Result<Vec<_>>>()?;
    sort_claim_order(&mut jobs);
    // One statement for the batch's events, in claim order.
    let ids = rows::to_json(&jobs.iter().map(|j| j.id).collect::<Vec<_>>())?;
    sqlx::query(
        "INSERT INTO job_events (job_id, at, from_state, to_state, actor, detail)
         SELECT value, ?, 'queued', 'leased', ?, '' FROM json_each(?) ORDER BY key",
    )
    .bind(now)
    .bind(&req.worker)
    .bind(ids)
    .execute(&mut *tx)
    .await?;
    Ok(jobs)
}

/// Take the lock (if the job has a target), count the attempt, write
/// `running`. Writes nothing when the answer is LockBusy or LeaseLost.
pub(super) async fn start_in(
    tx: &mut SqliteConnection,
    now: i64,
    lease: LeaseRef,
    spec: &StartSpec,
    worker: &str,
) -> Result<StartOutcome> {
    let target: Option<Option<String>> = sqlx::query_scalar(
        "SELECT target FROM jobs WHERE id = ? AND lease_token = ? AND state = 'leased'",
    )
    .bind(lease.id)
    .bind(lease.token)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(target) = target else {
        return Err(StoreError::LeaseLost(lease.id));
    };
    let lease_ms = ms(spec.lease);
    let mut fence = None;
    if let Some(target) = &target {
        let got: Option<i64> = sqlx::query_scalar(
            "INSERT INTO locks (target, fence, holder_job, holder_worker, acquired_at, expires_at)
             VALUES (?1, 1, ?2, ?3, ?4, ?4 + ?5)
             ON CONFLICT (target) DO UPDATE SET fence = locks.fence + 1,
                 holder_job = excluded.holder_job, holder_worker = excluded.holder_worker,
                 acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
             WHERE locks.holder_job IS NULL
             RETURNING fence",
        )
        .bind(target)
        .bind(lease.id)
        .bind(worker)
        .bind(now)
        .bind(lease_ms)
        .fetch_optional(&mut *tx)
        .await?;
        match got {
            Some(f) => fence = Some(f),
            None => {
                let holder =
                    sqlx::query("SELECT holder_job, holder_worker FROM locks WHERE target = ?")
                        .bind(target)
                        .fetch_one(&mut *tx)
                        .await?;
                // Dropping the transaction rolls it back: nothing written.
                return Ok(StartOutcome::LockBusy {
                    holder_job: holder.try_get("holder_job")?,
                    holder_worker: holder.try_get("holder_worker")?,
                });
            }
        }
    }
    let attempt: i32 = sqlx::query_scalar(
        "UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_expires_at = ?1 + ?2,
             started_at = ?1, lock_fence = ?3, on_stale = ?4, backoff_ms = ?5
         WHERE id = ?6 AND lease_token = ?7 AND state = 'leased'
         RETURNING attempt",
    )
    .bind(now)
    .bind(lease_ms)
    .bind(fence)
    .bind(spec.on_stale.as_str())
    .bind(ms(spec.backoff))
    .bind(lease.id)
    .bind(lease.token)
    .fetch_one(&mut *tx)
    .await?;
    let detail = crate::store::start_detail(attempt, fence);
    event(
        tx,
        lease.id,
        now,
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
    tx: &mut SqliteConnection,
    now: i64,
    lease: LeaseRef,
    outcome: Outcome,
    actor: &str,
) -> Result<State> {
    let row = sqlx::query(
        "SELECT attempt, max_attempts, cancel_requested_at IS NOT NULL AS cancel_pending,
             backoff_ms, target, lock_fence
         FROM jobs WHERE id = ? AND lease_token = ? AND state = 'running'",
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
    let backoff_ms: i64 = row.try_get("backoff_ms")?;
    let target: Option<String> = row.try_get("target")?;
    let fence: Option<i64> = row.try_get("lock_fence")?;
    let (mv, to, error) = outcome.decide(attempt, max_attempts, cancel_pending);
    job::check(lease.id, State::Running, mv)?;
    let done = if to == State::Queued {
        let delay = job::backoff(
            Duration::from_millis(u64::try_from(backoff_ms).unwrap_or(0)),
            attempt,
            rand::random::<f64>(),
        );
        sqlx::query(
            "UPDATE jobs SET state = 'queued', due_at = ?1 + ?2, lease_owner = NULL,
                 lease_token = NULL, lease_expires_at = NULL,
                 last_error = COALESCE(?3, last_error)
             WHERE id = ?4 AND lease_token = ?5 AND state = 'running'",
        )
        .bind(now)
        .bind(ms(delay))
        .bind(&error)
        .bind(lease.id)
        .bind(lease.token)
        .execute(&mut *tx)
        .await?
    } else {
        sqlx::query(
            "UPDATE jobs SET state = ?1, finished_at = ?2, lease_expires_at = NULL,
                 last_error = COALESCE(?3, last_error)
             WHERE id = ?4 AND lease_token = ?5 AND state = 'running'",
        )
        .bind(to.as_str())
        .bind(now)
        .bind(&error)
        .bind(lease.id)
        .bind(lease.token)
        .execute(&mut *tx)
        .await?
    };
    if done.rows_affected() == 0 {
        return Err(StoreError::LeaseLost(lease.id));
    }
    rows::release_lock_by_fence(tx, target.as_deref(), fence, lease.id).await?;
    let detail = error.as_deref().unwrap_or("");
    event(tx, lease.id, now, Some(State::Running), to, actor, detail).await?;
    Ok(to)
}
