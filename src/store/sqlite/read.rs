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
        let text = filter.text.as_deref().filter(|t| !t.is_empty());
        let text_id = text.and_then(|t| t.trim_start_matches('#').parse::<i64>().ok());
        let limit = if filter.limit == 0 { 100 } else { filter.limit };
        let sql = format!(
            "SELECT {} FROM jobs {}
             WHERE {}
               AND (?1 IS NULL OR pipeline = ?1)
               AND (?2 IS NULL OR target = ?2)
               AND (?3 IS NULL OR instr(pipeline, ?3) > 0 OR instr(COALESCE(target, ''), ?3) > 0
                    OR id = ?4)
             ORDER BY {} LIMIT ?5",
            job_cols!(),
            list_index(filter),
            state_terms(filter),
            match filter.order {
                JobOrder::Newest => "id DESC",
                JobOrder::ClaimOrder => "priority DESC, due_at, id",
                JobOrder::RecentlyFinished => "finished_at DESC NULLS LAST, id DESC",
            }
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
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
        // Kept by triggers (migration 0002): counting the table itself
        // walked every job, a tenth of a second at a million rows.
        let rows = sqlx::query("SELECT state, n FROM job_state_counts")
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
                 COALESCE((SELECT queued FROM target_queue t WHERE t.target = l.target), 0)
                     AS waiting
             FROM locks l INDEXED BY locks_held JOIN jobs j ON j.id = l.holder_job
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

/// The state condition, with the states written out: states are a closed
/// set of fixed words, and only a literal `state = 'queued'` lets SQLite use
/// the partial claim index (a bound list hid every index: a full scan). A
/// list of finished states also says `finished_at IS NOT NULL` (always true
/// for them), which the partial index on `finished_at` requires, and a list
/// without `queued` says `state <> 'queued'`, which the state index
/// requires (migration 0006).
fn state_terms(filter: &JobFilter) -> String {
    let quoted: Vec<String> = filter
        .states
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    let mut terms = match quoted.as_slice() {
        [] => "1".to_string(),
        [one] => format!("state = {one}"),
        many => format!("state IN ({})", many.join(",")),
    };
    if filter.finished_only() {
        terms.push_str(" AND finished_at IS NOT NULL");
    }
    if !filter.states.is_empty() && !filter.states.contains(&State::Queued) {
        terms.push_str(" AND state <> 'queued'");
    }
    terms
}

/// The index that serves a pane in its own order, so the LIMIT stops the
/// walk after a page of rows. Without statistics SQLite prefers the state
/// index, then sorts every job of the state (100,000 queued, a million
/// finished). With a pipeline or target filter the planner chooses.
fn list_index(filter: &JobFilter) -> &'static str {
    if filter.pipeline.is_some() || filter.target.is_some() {
        return "";
    }
    match filter.order {
        JobOrder::ClaimOrder if filter.states == [State::Queued] => "INDEXED BY jobs_claim",
        JobOrder::RecentlyFinished if filter.finished_only() => "INDEXED BY jobs_finished",
        _ => "",
    }
}
