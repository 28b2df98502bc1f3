//! Operator moves (cancel, requeue, extend, release a lock) and the reaper's
//! housekeeping (expired leases, silent workers, pruning).

use std::time::Duration;

use sqlx::Row;

use super::SqliteStore;
use super::rows::{self, event, ms, now_ms};
use crate::job::{self, Move, StalePolicy, State};
use crate::store::{CancelOutcome, ExpireReport, Result, StoreError};

impl SqliteStore {
    pub(super) async fn do_cancel(&self, id: i64, actor: &str) -> Result<CancelOutcome> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let row = sqlx::query("SELECT state, target, lock_fence FROM jobs WHERE id = ?")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound(id))?;
        let from = rows::state(row.try_get("state")?)?;
        job::check(id, from, Move::Cancel)?;
        if from == State::Running {
            // The worker learns of the request at its next renewal and stops
            // the process; the first request's time is kept.
            sqlx::query(
                "UPDATE jobs SET cancel_requested_at = COALESCE(cancel_requested_at, ?) \
                 WHERE id = ?",
            )
            .bind(now)
            .bind(id)
            .execute(&mut *tx)
            .await?;
            event(
                &mut tx,
                id,
                now,
                Some(from),
                from,
                actor,
                "cancel requested",
            )
            .await?;
            tx.commit().await?;
            return Ok(CancelOutcome::Requested);
        }
        sqlx::query(
            "UPDATE jobs SET state = 'cancelled', lease_owner = NULL, lease_token = NULL,
                 lease_expires_at = NULL, cancel_requested_at = COALESCE(cancel_requested_at, ?1),
                 finished_at = ?1
             WHERE id = ?2",
        )
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let target: Option<String> = row.try_get("target")?;
        let fence: Option<i64> = row.try_get("lock_fence")?;
        rows::release_lock_by_fence(&mut tx, target.as_deref(), fence, id).await?;
        event(
            &mut tx,
            id,
            now,
            Some(from),
            State::Cancelled,
            actor,
            "cancelled",
        )
        .await?;
        tx.commit().await?;
        Ok(CancelOutcome::Cancelled)
    }

    pub(super) async fn do_requeue(&self, id: i64, actor: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let row = sqlx::query("SELECT state, target, lock_fence FROM jobs WHERE id = ?")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound(id))?;
        let from = rows::state(row.try_get("state")?)?;
        job::check(id, from, Move::Requeue)?;
        // A fresh token: whoever held the old one can no longer write.
        sqlx::query(
            "UPDATE jobs SET state = 'queued', due_at = ?1, lease_token = random(),
                 lease_owner = NULL, lease_expires_at = NULL, cancel_requested_at = NULL,
                 finished_at = NULL, max_attempts = MAX(max_attempts, attempt + 1)
             WHERE id = ?2",
        )
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let target: Option<String> = row.try_get("target")?;
        let fence: Option<i64> = row.try_get("lock_fence")?;
        rows::release_lock_by_fence(&mut tx, target.as_deref(), fence, id).await?;
        event(
            &mut tx,
            id,
            now,
            Some(from),
            State::Queued,
            actor,
            "requeued",
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn do_extend(
        &self,
        id: i64,
        by: Duration,
        worker_alive: Duration,
        actor: &str,
    ) -> Result<chrono::DateTime<chrono::Utc>> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let row = sqlx::query(
            "SELECT j.state, j.lease_owner,
                 w.id IS NOT NULL AND w.gone = 0 AND w.heartbeat_at >= ?1 AS alive
             FROM jobs j LEFT JOIN workers w ON w.id = j.lease_owner
             WHERE j.id = ?2",
        )
        .bind(now.saturating_sub(ms(worker_alive)))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound(id))?;
        let from = rows::state(row.try_get("state")?)?;
        job::check(id, from, Move::Extend)?;
        let owner: Option<String> = row.try_get("lease_owner")?;
        let alive: bool = row.try_get("alive")?;
        if !alive {
            let owner = owner.as_deref().unwrap_or("(none)");
            return Err(StoreError::Invalid(format!(
                "job {id}: its worker {owner} is gone; requeue or cancel it instead"
            )));
        }
        let expires: i64 = sqlx::query_scalar(
            "UPDATE jobs SET lease_expires_at = MAX(COALESCE(lease_expires_at, ?1), ?1) + ?2
             WHERE id = ?3 RETURNING lease_expires_at",
        )
        .bind(now)
        .bind(ms(by))
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
        let detail = format!("lease extended by {}", humantime::format_duration(by));
        event(&mut tx, id, now, Some(from), from, actor, &detail).await?;
        tx.commit().await?;
        rows::to_time(expires)
    }

    pub(super) async fn do_release_lock(&self, target: &str, actor: &str) -> Result<i64> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let holder: Option<Option<i64>> =
            sqlx::query_scalar("SELECT holder_job FROM locks WHERE target = ?")
                .bind(target)
                .fetch_optional(&mut *tx)
                .await?;
        let Some(Some(job_id)) = holder else {
            return Err(StoreError::Invalid(format!(
                "target {target} is not locked"
            )));
        };
        let st = rows::job_state(&mut tx, job_id).await?;
        job::check(job_id, st, Move::ReleaseLock)?;
        sqlx::query(
            "UPDATE locks SET holder_job = NULL, holder_worker = NULL, acquired_at = NULL, \
             expires_at = NULL WHERE target = ? AND holder_job = ?",
        )
        .bind(target)
        .bind(job_id)
        .execute(&mut *tx)
        .await?;
        let detail = format!("lock on {target} released");
        event(&mut tx, job_id, now, Some(st), st, actor, &detail).await?;
        tx.commit().await?;
        Ok(job_id)
    }

    pub(super) async fn do_expire_leases(
        &self,
        grace: Duration,
        actor: &str,
    ) -> Result<ExpireReport> {
        let now = now_ms();
        let candidates = sqlx::query(
            // Only the expired leases, from their index (whose condition
            // the first term repeats, as SQLite requires): any expired
            // lease is older than now, a running one's also by the grace.
            "SELECT id, lease_token, state FROM jobs INDEXED BY jobs_lease_expiry
             WHERE state IN ('leased','running') AND lease_expires_at < ?1
               AND (state = 'leased' OR lease_expires_at < ?1 - ?2)
             ORDER BY id",
        )
        .bind(now)
        .bind(ms(grace))
        .fetch_all(&self.pool)
        .await?;
        let mut report = ExpireReport::default();
        for c in &candidates {
            let id: i64 = c.try_get("id")?;
            let token: Option<i64> = c.try_get("lease_token")?;
            let st = rows::state(c.try_get("state")?)?;
            self.expire_one(id, token, st, grace, actor, &mut report)
                .await?;
        }
        Ok(report)
    }

    /// One job's expiry in its own transaction, re-checked there: a renewal
    /// or a finish that landed after the scan wins.
    async fn expire_one(
        &self,
        id: i64,
        token: Option<i64>,
        from: State,
        grace: Duration,
        actor: &str,
        report: &mut ExpireReport,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let cutoff = if from == State::Running {
            now.saturating_sub(ms(grace))
        } else {
            now
        };
        let row = sqlx::query(
            "SELECT lease_owner, attempt, max_attempts, on_stale, backoff_ms, target, lock_fence,
                 cancel_requested_at IS NOT NULL AS cancel_pending
             FROM jobs WHERE id = ?1 AND lease_token IS ?2 AND state = ?3
                 AND lease_expires_at < ?4",
        )
        .bind(id)
        .bind(token)
        .bind(from.as_str())
        .bind(cutoff)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(());
        };
        let owner: Option<String> = row.try_get("lease_owner")?;
        let owner = owner.unwrap_or_else(|| "(none)".into());
        if from == State::Leased {
            job::check(id, from, Move::ExpireLeased)?;
            sqlx::query(
                "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_token = NULL,
                     lease_expires_at = NULL WHERE id = ?",
            )
            .bind(id)
            .execute(&mut *tx)
            .await?;
            let detail = format!("lease of {owner} expired before start");
            event(&mut tx, id, now, Some(from), State::Queued, actor, &detail).await?;
            tx.commit().await?;
            report.requeued.push(id);
            return Ok(());
        }
        job::check(id, from, Move::ExpireRunning)?;
        let attempt: i32 = row.try_get("attempt")?;
        let max_attempts: i32 = row.try_get("max_attempts")?;
        let policy: String = row.try_get("on_stale")?;
        let policy: StalePolicy = policy.parse().map_err(StoreError::Database)?;
        let cancel_pending: bool = row.try_get("cancel_pending")?;
        let backoff_ms: i64 = row.try_get("backoff_ms")?;
        let target: Option<String> = row.try_get("target")?;
        let fence: Option<i64> = row.try_get("lock_fence")?;
        let detail = format!("lease of {owner} expired; worker presumed dead");
        let to = job::after_stale(policy, attempt, max_attempts, cancel_pending);
        match to {
            State::Stale => {
                sqlx::query("UPDATE jobs SET state = 'stale' WHERE id = ?")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                report.stale.push(id);
            }
            State::Queued => {
                let delay = job::backoff(
                    Duration::from_millis(u64::try_from(backoff_ms).unwrap_or(0)),
                    attempt,
                    rand::random::<f64>(),
                );
                sqlx::query(
                    "UPDATE jobs SET state = 'queued', due_at = ?1, lease_owner = NULL,
                         lease_token = NULL, lease_expires_at = NULL, last_error = ?2
                     WHERE id = ?3",
                )
                .bind(now.saturating_add(ms(delay)))
                .bind(&detail)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                report.retried.push(id);
            }
            _ => {
                // Failed (attempts used up) or cancelled (a cancel was pending).
                let error = (to == State::Failed).then_some(&detail);
                sqlx::query(
                    "UPDATE jobs SET state = ?1, finished_at = ?2, lease_expires_at = NULL,
                         last_error = COALESCE(?3, last_error)
                     WHERE id = ?4",
                )
                .bind(to.as_str())
                .bind(now)
                .bind(error)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                report.finished.push(id);
            }
        }
        if !job::stale_keeps_lock(policy, to) {
            rows::release_lock_by_fence(&mut tx, target.as_deref(), fence, id).await?;
        }
        event(&mut tx, id, now, Some(from), to, actor, &detail).await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn do_mark_gone_workers(&self, silent_for: Duration) -> Result<Vec<String>> {
        let mut tx = self.begin().await?;
        let cutoff = now_ms().saturating_sub(ms(silent_for));
        let ids: Vec<String> = sqlx::query_scalar(
            "UPDATE workers SET gone = 1 WHERE gone = 0 AND heartbeat_at < ? RETURNING id",
        )
        .bind(cutoff)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let mut ids = ids;
        ids.sort();
        Ok(ids)
    }

    pub(super) async fn do_worker_stopped(&self, id: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        sqlx::query("UPDATE workers SET gone = 1, busy = 0 WHERE id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn do_prune_finished(&self, age: Duration) -> Result<u64> {
        let mut tx = self.begin().await?;
        let cutoff = now_ms().saturating_sub(ms(age));
        const OLD: &str = "SELECT id FROM jobs \
             WHERE state IN ('succeeded','failed','cancelled') AND finished_at < ?";
        for table in ["job_events", "job_output"] {
            let sql = format!("DELETE FROM {table} WHERE job_id IN ({OLD})");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(cutoff)
                .execute(&mut *tx)
                .await?;
        }
        let done = sqlx::query(
            "DELETE FROM jobs WHERE state IN ('succeeded','failed','cancelled') AND finished_at < ?",
        )
        .bind(cutoff)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }
}
