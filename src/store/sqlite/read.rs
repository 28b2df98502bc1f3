//! Reads for the console and the CLI; none of them writes.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::Row;

use super::SqliteStore;
use super::rows::{self, job_cols, job_from_row, ms, now_ms};
use crate::job::{Event, Job, State};
use crate::store::{JobFilter, JobOrder, LockInfo, Result, StoreError, WorkerInfo};

impl SqliteStore {
    pub(super) async fn do_get_job(&self, id: i64) -> Result<Job> {
        let row = sqlx::query(concat!("SELECT ", job_cols!(), " FROM jobs WHERE id = ?"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound(id))?;
        job_from_row(&row)
    }

    pub(super) async fn do_job_events(&self, id: i64) -> Result<Vec<Event>> {
        let rows = sqlx::query(
            "SELECT id, job_id, at, from_state, to_state, actor, detail
             FROM job_events WHERE job_id = ? ORDER BY id",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let from: Option<String> = r.try_get("from_state")?;
                Ok(Event {
                    id: r.try_get("id")?,
                    job_id: r.try_get("job_id")?,
                    at: rows::to_time(r.try_get("at")?)?,
                    from: from.as_deref().map(rows::state).transpose()?,
                    to: rows::state(r.try_get("to_state")?)?,
                    actor: r.try_get("actor")?,
                    detail: r.try_get("detail")?,
                })
            })
            .collect()
    }

    pub(super) async fn do_job_output(&self, id: i64) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT tail FROM job_output WHERE job_id = ?")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    pub(super) async fn do_list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        let states =
            serde_json::to_string(&filter.states.iter().map(|s| s.as_str()).collect::<Vec<_>>())
                .map_err(|e| StoreError::Invalid(format!("bad state list: {e}")))?;
        let text = filter.text.as_deref().filter(|t| !t.is_empty());
        let text_id = text.and_then(|t| t.trim_start_matches('#').parse::<i64>().ok());
        let limit = if filter.limit == 0 { 100 } else { filter.limit };
        let order = match filter.order {
            JobOrder::Newest => "id DESC",
            JobOrder::ClaimOrder => "priority DESC, due_at, id",
            JobOrder::RecentlyFinished => "finished_at DESC NULLS LAST, id DESC",
        };
        let sql = format!(
            "SELECT {} FROM jobs
             WHERE (?1 = '[]' OR state IN (SELECT value FROM json_each(?1)))
               AND (?2 IS NULL OR pipeline = ?2)
               AND (?3 IS NULL OR target = ?3)
               AND (?4 IS NULL OR instr(pipeline, ?4) > 0 OR instr(COALESCE(target, ''), ?4) > 0
                    OR id = ?5)
             ORDER BY {order} LIMIT ?6",
            job_cols!()
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(states)
            .bind(&filter.pipeline)
            .bind(&filter.target)
            .bind(text)
            .bind(text_id)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(job_from_row).collect()
    }

    pub(super) async fn do_count_by_state(&self) -> Result<BTreeMap<State, i64>> {
        let rows = sqlx::query("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")
            .fetch_all(&self.pool)
            .await?;
        let mut counts: BTreeMap<State, i64> = State::ALL.iter().map(|s| (*s, 0)).collect();
        for r in &rows {
            counts.insert(rows::state(r.try_get("state")?)?, r.try_get("n")?);
        }
        Ok(counts)
    }

    pub(super) async fn do_list_locks(&self) -> Result<Vec<LockInfo>> {
        let rows = sqlx::query(
            "SELECT l.target, l.fence, l.holder_job, j.state, l.holder_worker, l.acquired_at,
                 l.expires_at,
                 (SELECT COUNT(*) FROM jobs q INDEXED BY jobs_target_active
                  WHERE q.target = l.target AND q.state = 'queued'
                    AND q.state IN ('queued','leased','running','stale'))
                     AS waiting
             FROM locks l JOIN jobs j ON j.id = l.holder_job
             WHERE l.holder_job IS NOT NULL
             ORDER BY l.target",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(LockInfo {
                    target: r.try_get("target")?,
                    fence: r.try_get("fence")?,
                    job_id: r.try_get("holder_job")?,
                    job_state: rows::state(r.try_get("state")?)?,
                    worker_id: r.try_get("holder_worker")?,
                    acquired_at: rows::to_time(
                        r.try_get::<Option<i64>, _>("acquired_at")?.unwrap_or(0),
                    )?,
                    expires_at: rows::opt_time(r.try_get("expires_at")?)?,
                    waiting: r.try_get("waiting")?,
                })
            })
            .collect()
    }

    pub(super) async fn do_checkpoints(
        &self,
        pipeline: &str,
        target: Option<&str>,
    ) -> Result<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT key, value FROM checkpoints WHERE pipeline = ? AND target = ? ORDER BY key",
        )
        .bind(pipeline)
        .bind(target.unwrap_or(""))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("key")?, r.try_get("value")?)))
            .collect()
    }

    pub(super) async fn do_finished_histogram(
        &self,
        bucket: Duration,
        buckets: usize,
    ) -> Result<Vec<u64>> {
        let mut counts = vec![0u64; buckets];
        let width = ms(bucket);
        if width == 0 || buckets == 0 {
            return Ok(counts);
        }
        let now = now_ms();
        let n = i64::try_from(buckets).unwrap_or(i64::MAX / 2);
        let start = now.saturating_sub(width.saturating_mul(n));
        let rows = sqlx::query(
            "SELECT (finished_at - ?1) / ?2 AS k, COUNT(*) AS n FROM jobs
             WHERE finished_at IS NOT NULL AND finished_at >= ?1 AND finished_at <= ?3
             GROUP BY k",
        )
        .bind(start)
        .bind(width)
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        for r in &rows {
            let k: i64 = r.try_get("k")?;
            let c: i64 = r.try_get("n")?;
            // A job finished exactly now belongs to the newest bucket.
            let k = usize::try_from(k).unwrap_or(0).min(buckets - 1);
            counts[k] += u64::try_from(c).unwrap_or(0);
        }
        Ok(counts)
    }

    pub(super) async fn do_list_workers(&self) -> Result<Vec<WorkerInfo>> {
        let rows = sqlx::query(
            "SELECT id, host, pid, slots, busy, paused, pipelines, started_at, heartbeat_at, gone
             FROM workers ORDER BY heartbeat_at DESC, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let pipelines: String = r.try_get("pipelines")?;
                Ok(WorkerInfo {
                    id: r.try_get("id")?,
                    host: r.try_get("host")?,
                    pid: r.try_get("pid")?,
                    slots: r.try_get("slots")?,
                    busy: r.try_get("busy")?,
                    paused: r.try_get("paused")?,
                    pipelines: serde_json::from_str(&pipelines).map_err(|e| {
                        StoreError::Database(format!("bad pipelines JSON of a worker: {e}"))
                    })?,
                    started_at: rows::to_time(r.try_get("started_at")?)?,
                    heartbeat_at: rows::to_time(r.try_get("heartbeat_at")?)?,
                    gone: r.try_get("gone")?,
                })
            })
            .collect()
    }
}
