//! Reads for the console and the CLI. Each is one statement served from an
//! index; none takes row locks.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::Row;

use super::rows;
use super::{PgStore, ms};
use crate::job::{Event, Job, State};
use crate::store::{JobFilter, JobOrder, LockInfo, Result, StoreError, WorkerInfo};

const DEFAULT_LIST_LIMIT: usize = 100;

impl PgStore {
    pub(super) async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let rows = sqlx::query(
            "SELECT id, host, pid, slots, busy, paused, pipelines::text AS pipelines, \
                 started_at, heartbeat_at, gone \
             FROM workers ORDER BY heartbeat_at DESC, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let id: String = r.try_get("id")?;
                let pipelines: &str = r.try_get("pipelines")?;
                let pipelines = serde_json::from_str(pipelines).map_err(|e| {
                    StoreError::Database(format!("worker {id}: bad pipelines list: {e}"))
                })?;
                Ok(WorkerInfo {
                    id,
                    host: r.try_get("host")?,
                    pid: r.try_get("pid")?,
                    slots: r.try_get("slots")?,
                    busy: r.try_get("busy")?,
                    paused: r.try_get("paused")?,
                    pipelines,
                    started_at: r.try_get("started_at")?,
                    heartbeat_at: r.try_get("heartbeat_at")?,
                    gone: r.try_get("gone")?,
                })
            })
            .collect()
    }

    pub(super) async fn job(&self, id: i64) -> Result<Job> {
        let row = sqlx::query(concat!("SELECT ", job_cols!(), " FROM jobs WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound(id))?;
        rows::job(&row)
    }

    pub(super) async fn events(&self, id: i64) -> Result<Vec<Event>> {
        let rows = sqlx::query(
            "SELECT id, job_id, at, from_state, to_state, actor, detail \
             FROM job_events WHERE job_id = $1 ORDER BY id",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(rows::event).collect()
    }

    pub(super) async fn output(&self, id: i64) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT tail FROM job_output WHERE job_id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Only the conditions the filter uses, states written out: a
    /// catch-all statement (`cardinality($1) = 0 OR state = ANY($1)`, `$2 IS
    /// NULL OR …`) was served from an index only by a custom plan, planned
    /// anew at every call; its generic plan read all 1.1 million rows (230
    /// ms), and `plan_cache_mode = force_generic_plan` would have chosen it.
    pub(super) async fn jobs(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        use std::fmt::Write;
        let text = filter.text.as_deref().filter(|t| !t.is_empty());
        let mut sql = String::from(concat!("SELECT ", job_cols!(), " FROM jobs WHERE "));
        // States are a closed set of fixed words: safe to inline.
        let states: Vec<String> = filter
            .states
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        match states.as_slice() {
            [] => sql.push_str("true"),
            [one] => {
                let _ = write!(sql, "state = {one}");
            }
            many => {
                let _ = write!(sql, "state IN ({})", many.join(", "));
            }
        }
        if filter.finished_only() {
            sql.push_str(" AND finished_at IS NOT NULL");
        }
        let mut n = 0;
        let mut param = || {
            n += 1;
            n
        };
        if filter.pipeline.is_some() {
            let _ = write!(sql, " AND pipeline = ${}", param());
        }
        if filter.target.is_some() {
            let _ = write!(sql, " AND target = ${}", param());
        }
        if text.is_some() {
            let t = param();
            let _ = write!(
                sql,
                " AND (strpos(pipeline, ${t}) > 0 OR strpos(COALESCE(target, ''), ${t}) > 0 \
                 OR id::text = ${t})"
            );
        }
        let order = match filter.order {
            JobOrder::Newest => "id DESC",
            JobOrder::ClaimOrder => "priority DESC, due_at, id",
            JobOrder::RecentlyFinished => "finished_at DESC NULLS LAST, id DESC",
        };
        let _ = write!(sql, " ORDER BY {order} LIMIT ${}", param());
        let limit = match filter.limit {
            0 => DEFAULT_LIST_LIMIT,
            n => n,
        };
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        if let Some(p) = &filter.pipeline {
            query = query.bind(p);
        }
        if let Some(t) = &filter.target {
            query = query.bind(t);
        }
        if let Some(t) = text {
            query = query.bind(t);
        }
        let rows = query
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(rows::job).collect()
    }

    pub(super) async fn state_counts(&self) -> Result<BTreeMap<State, i64>> {
        // Appended by triggers (migration 0002): counting the table itself
        // read every job, a fifth of a second at a million rows.
        let rows =
            sqlx::query("SELECT state, sum(n)::bigint AS n FROM job_state_deltas GROUP BY state")
                .fetch_all(&self.pool)
                .await?;
        let mut counts: BTreeMap<State, i64> = State::ALL.into_iter().map(|s| (s, 0)).collect();
        for r in &rows {
            counts.insert(rows::state(r.try_get("state")?)?, r.try_get("n")?);
        }
        Ok(counts)
    }

    pub(super) async fn locks(&self) -> Result<Vec<LockInfo>> {
        let rows = sqlx::query(
            "SELECT l.target, l.fence, l.holder_job, j.state, l.holder_worker, \
                 COALESCE(l.acquired_at, now()) AS acquired_at, l.expires_at, \
                 (SELECT count(*) FROM jobs q WHERE q.target = l.target AND q.state = 'queued') \
                     AS waiting \
             FROM locks l JOIN jobs j ON j.id = l.holder_job \
             WHERE l.holder_job IS NOT NULL ORDER BY l.target",
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
                    acquired_at: r.try_get("acquired_at")?,
                    expires_at: r.try_get("expires_at")?,
                    waiting: r.try_get("waiting")?,
                })
            })
            .collect()
    }

    pub(super) async fn checkpoint_values(
        &self,
        pipeline: &str,
        target: Option<&str>,
    ) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as(
            "SELECT key, value FROM checkpoints WHERE pipeline = $1 AND target = $2 ORDER BY key",
        )
        .bind(pipeline)
        .bind(target.unwrap_or(""))
        .fetch_all(&self.pool)
        .await?)
    }

    pub(super) async fn histogram(&self, bucket: Duration, buckets: usize) -> Result<Vec<u64>> {
        let bucket_ms = ms(bucket);
        if buckets == 0 || bucket_ms == 0 {
            return Ok(vec![0; buckets]);
        }
        let n = i64::try_from(buckets).unwrap_or(i64::MAX);
        // Bucket 0 = the most recent `bucket` of time; reversed below.
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT ago, count(*) FROM ( \
                 SELECT GREATEST(0, floor(extract(epoch FROM now() - finished_at) * 1000 / $1))::bigint \
                     AS ago \
                 FROM jobs \
                 WHERE finished_at IS NOT NULL \
                   AND finished_at > now() - $1 * $2 * interval '1 millisecond' \
             ) b WHERE ago < $2 GROUP BY ago",
        )
        .bind(bucket_ms)
        .bind(n)
        .fetch_all(&self.pool)
        .await?;
        let mut out = vec![0u64; buckets];
        for (ago, count) in rows {
            if let Ok(ago) = usize::try_from(ago)
                && ago < buckets
            {
                out[buckets - 1 - ago] = count.max(0) as u64;
            }
        }
        Ok(out)
    }
}
