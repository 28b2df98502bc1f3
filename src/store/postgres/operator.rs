//! Operators' moves (cancel, requeue, extend, release a lock) and the
//! reaper's (expired leases, silent workers, pruning). Each locks the job
//! row first, then asks `job::check` whether the move is allowed.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use super::rows::{self, log_event, notify};
use super::worker::release_by_fence;
use super::{CANCEL_CHANNEL, JOBS_CHANNEL, PgStore, ms};
use crate::job::{self, Move, StalePolicy, State};
use crate::store::{CancelOutcome, ExpireReport, Result, StoreError};

/// The job row, locked for the rest of the transaction.
async fn lock_job(conn: &mut PgConnection, id: i64) -> Result<PgRow> {
    sqlx::query(
        "SELECT state, pipeline, attempt, max_attempts, cancel_requested_at IS NOT NULL AS cancel_pending, \
             target, lock_fence, lease_owner, lease_token, on_stale, backoff_ms \
         FROM jobs WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound(id))
}

/// Free the lock `row`'s job holds, if it holds one.
async fn release_held(conn: &mut PgConnection, id: i64, row: &PgRow) -> Result<()> {
    let target: Option<String> = row.try_get("target")?;
    let fence: Option<i64> = row.try_get("lock_fence")?;
    if let (Some(target), Some(fence)) = (target, fence) {
        release_by_fence(conn, &target, fence, id).await?;
    }
    Ok(())
}

impl PgStore {
    pub(super) async fn cancel_job(&self, id: i64, actor: &str) -> Result<CancelOutcome> {
        let mut tx = self.pool.begin().await?;
        let row = lock_job(&mut tx, id).await?;
        let from = rows::state(row.try_get("state")?)?;
        job::check(id, from, Move::Cancel)?;
        if from == State::Running {
            // The worker stops the process and ends the job itself; only the
            // first request's time is kept.
            sqlx::query(
                "UPDATE jobs SET cancel_requested_at = COALESCE(cancel_requested_at, now()) \
                 WHERE id = $1",
            )
            .bind(id)
            .execute(&mut *tx)
            .await?;
            log_event(&mut tx, id, Some(from), from, actor, "cancel requested").await?;
            notify(&mut tx, CANCEL_CHANNEL, &id.to_string()).await?;
            tx.commit().await?;
            return Ok(CancelOutcome::Requested);
        }
        sqlx::query(
            "UPDATE jobs SET state = 'cancelled', lease_owner = NULL, lease_token = NULL, \
                 lease_expires_at = NULL, cancel_requested_at = COALESCE(cancel_requested_at, now()), \
                 finished_at = now() \
             WHERE id = $1",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if from == State::Stale {
            release_held(&mut tx, id, &row).await?;
        }
        log_event(
            &mut tx,
            id,
            Some(from),
            State::Cancelled,
            actor,
            "cancelled",
        )
        .await?;
        tx.commit().await?;
        Ok(CancelOutcome::Cancelled)
    }

    pub(super) async fn requeue_job(&self, id: i64, actor: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let row = lock_job(&mut tx, id).await?;
        let from = rows::state(row.try_get("state")?)?;
        job::check(id, from, Move::Requeue)?;
        // A new token: whoever held the old lease is refused from now on.
        let updated = sqlx::query(
            "UPDATE jobs SET state = 'queued', due_at = now(), \
                 lease_token = nextval('lease_tokens'), lease_owner = NULL, lease_expires_at = NULL, \
                 cancel_requested_at = NULL, finished_at = NULL, \
                 max_attempts = GREATEST(max_attempts, attempt + 1) \
             WHERE id = $1",
        )
        .bind(id)
        .execute(&mut *tx)
        .await;
        if let Err(e) = &updated
            && rows::is_unique_violation(e, "jobs_unique_key")
        {
            return Err(StoreError::Invalid(format!(
                "job {id}: another unfinished job has the same unique key; cancel it first"
            )));
        }
        updated?;
        if from == State::Stale {
            release_held(&mut tx, id, &row).await?;
        }
        log_event(&mut tx, id, Some(from), State::Queued, actor, "requeued").await?;
        let pipeline: String = row.try_get("pipeline")?;
        notify(&mut tx, JOBS_CHANNEL, &pipeline).await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn extend_lease(
        &self,
        id: i64,
        by: Duration,
        worker_alive: Duration,
        actor: &str,
    ) -> Result<DateTime<Utc>> {
        let mut tx = self.pool.begin().await?;
        let row = lock_job(&mut tx, id).await?;
        let state = rows::state(row.try_get("state")?)?;
        job::check(id, state, Move::Extend)?;
        let owner: Option<String> = row.try_get("lease_owner")?;
        let owner = owner.unwrap_or_default();
        let alive: Option<bool> = sqlx::query_scalar(
            "SELECT NOT gone AND heartbeat_at >= now() - $2 * interval '1 millisecond' \
             FROM workers WHERE id = $1",
        )
        .bind(&owner)
        .bind(ms(worker_alive))
        .fetch_optional(&mut *tx)
        .await?;
        if alive != Some(true) {
            return Err(StoreError::Invalid(format!(
                "job {id}: its worker {owner} is gone; requeue or cancel it instead"
            )));
        }
        let expiry: DateTime<Utc> = sqlx::query_scalar(
            "UPDATE jobs SET lease_expires_at = \
                 GREATEST(lease_expires_at, now()) + $2 * interval '1 millisecond' \
             WHERE id = $1 RETURNING lease_expires_at",
        )
        .bind(id)
        .bind(ms(by))
        .fetch_one(&mut *tx)
        .await?;
        let detail = format!("lease extended by {}", humantime::format_duration(by));
        log_event(&mut tx, id, Some(state), state, actor, &detail).await?;
        tx.commit().await?;
        Ok(expiry)
    }

    pub(super) async fn release_target_lock(&self, target: &str, actor: &str) -> Result<i64> {
        let not_locked = || StoreError::Invalid(format!("target {target} is not locked"));
        let holder: Option<Option<i64>> =
            sqlx::query_scalar("SELECT holder_job FROM locks WHERE target = $1")
                .bind(target)
                .fetch_optional(&self.pool)
                .await?;
        let holder = holder.flatten().ok_or_else(not_locked)?;
        // Job row first, lock row second: the order every other writer uses.
        let mut tx = self.pool.begin().await?;
        let row = lock_job(&mut tx, holder).await?;
        let state = rows::state(row.try_get("state")?)?;
        job::check(holder, state, Move::ReleaseLock)?;
        let released = sqlx::query(
            "UPDATE locks SET holder_job = NULL, holder_worker = NULL, acquired_at = NULL, \
                 expires_at = NULL \
             WHERE target = $1 AND holder_job = $2",
        )
        .bind(target)
        .bind(holder)
        .execute(&mut *tx)
        .await?;
        if released.rows_affected() == 0 {
            return Err(not_locked());
        }
        let detail = format!("lock on {target} released");
        log_event(&mut tx, holder, Some(state), state, actor, &detail).await?;
        tx.commit().await?;
        Ok(holder)
    }

    pub(super) async fn expire_job_leases(
        &self,
        grace: Duration,
        actor: &str,
    ) -> Result<ExpireReport> {
        let grace = ms(grace);
        let candidates = sqlx::query(
            "SELECT id, lease_token, state FROM jobs \
             WHERE (state = 'leased' AND lease_expires_at < now()) \
                OR (state = 'running' AND lease_expires_at < now() - $1 * interval '1 millisecond') \
             ORDER BY id",
        )
        .bind(grace)
        .fetch_all(&self.pool)
        .await?;
        let mut report = ExpireReport::default();
        for c in &candidates {
            let id: i64 = c.try_get("id")?;
            let token: Option<i64> = c.try_get("lease_token")?;
            let state = rows::state(c.try_get("state")?)?;
            let Some(to) = self.expire_one(id, token, state, grace, actor).await? else {
                continue;
            };
            let list = match (state, to) {
                (State::Leased, _) => &mut report.requeued,
                (_, State::Stale) => &mut report.stale,
                (_, State::Queued) => &mut report.retried,
                _ => &mut report.finished,
            };
            list.push(id);
        }
        Ok(report)
    }

    /// One job's expiry in its own transaction; `None` when the job was
    /// renewed, finished or taken over since the scan.
    async fn expire_one(
        &self,
        id: i64,
        token: Option<i64>,
        state: State,
        grace: i64,
        actor: &str,
    ) -> Result<Option<State>> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "SELECT attempt, max_attempts, cancel_requested_at IS NOT NULL AS cancel_pending, \
                 target, lock_fence, lease_owner, on_stale, backoff_ms \
             FROM jobs \
             WHERE id = $1 AND lease_token IS NOT DISTINCT FROM $2 AND state = $3 \
               AND lease_expires_at < now() - $4 * interval '1 millisecond' \
             FOR UPDATE",
        )
        .bind(id)
        .bind(token)
        .bind(state.as_str())
        .bind(if state == State::Running { grace } else { 0 })
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let owner: Option<String> = row.try_get("lease_owner")?;
        let owner = owner.unwrap_or_else(|| "?".into());
        if state == State::Leased {
            job::check(id, state, Move::ExpireLeased)?;
            sqlx::query(
                "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_token = NULL, \
                     lease_expires_at = NULL WHERE id = $1",
            )
            .bind(id)
            .execute(&mut *tx)
            .await?;
            let detail = format!("lease of {owner} expired before start");
            log_event(&mut tx, id, Some(state), State::Queued, actor, &detail).await?;
            tx.commit().await?;
            return Ok(Some(State::Queued));
        }
        job::check(id, state, Move::ExpireRunning)?;
        let attempt: i32 = row.try_get("attempt")?;
        let max_attempts: i32 = row.try_get("max_attempts")?;
        let cancel_pending: bool = row.try_get("cancel_pending")?;
        let policy: StalePolicy = row
            .try_get::<&str, _>("on_stale")?
            .parse()
            .map_err(StoreError::Database)?;
        let to = job::after_stale(policy, attempt, max_attempts, cancel_pending);
        let detail = format!("lease of {owner} expired; worker presumed dead");
        match to {
            State::Stale => {
                sqlx::query("UPDATE jobs SET state = 'stale' WHERE id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
            }
            State::Queued => {
                let backoff_ms: i64 = row.try_get("backoff_ms")?;
                let base = Duration::from_millis(backoff_ms.max(0) as u64);
                let delay = job::backoff(base, attempt, rand::random::<f64>());
                sqlx::query(
                    "UPDATE jobs SET state = 'queued', \
                         due_at = now() + $2 * interval '1 millisecond', \
                         lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, \
                         last_error = $3 \
                     WHERE id = $1",
                )
                .bind(id)
                .bind(ms(delay))
                .bind(&detail)
                .execute(&mut *tx)
                .await?;
            }
            _ => {
                sqlx::query(
                    "UPDATE jobs SET state = $2, finished_at = now(), lease_expires_at = NULL, \
                         last_error = $3 \
                     WHERE id = $1",
                )
                .bind(id)
                .bind(to.as_str())
                .bind(&detail)
                .execute(&mut *tx)
                .await?;
            }
        }
        if !job::stale_keeps_lock(policy, to) {
            release_held(&mut tx, id, &row).await?;
        }
        log_event(&mut tx, id, Some(state), to, actor, &detail).await?;
        tx.commit().await?;
        Ok(Some(to))
    }

    pub(super) async fn mark_workers_gone(&self, silent_for: Duration) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "UPDATE workers SET gone = true \
             WHERE NOT gone AND heartbeat_at < now() - $1 * interval '1 millisecond' \
             RETURNING id",
        )
        .bind(ms(silent_for))
        .fetch_all(&self.pool)
        .await?)
    }

    pub(super) async fn prune_finished_jobs(&self, age: Duration) -> Result<u64> {
        let pruned: i64 = sqlx::query_scalar(
            "WITH gone AS ( \
                 DELETE FROM jobs \
                 WHERE state IN ('succeeded','failed','cancelled') \
                   AND finished_at < now() - $1 * interval '1 millisecond' \
                 RETURNING id \
             ), events AS ( \
                 DELETE FROM job_events WHERE job_id IN (SELECT id FROM gone) \
             ), output AS ( \
                 DELETE FROM job_output WHERE job_id IN (SELECT id FROM gone) \
             ) \
             SELECT count(*) FROM gone",
        )
        .bind(ms(age))
        .fetch_one(&self.pool)
        .await?;
        Ok(pruned.max(0) as u64)
    }
}
