//! Bulk seeding for `jobdeck bench --scale`: a million finished jobs and a
//! hundred thousand queued ones in seconds, written with set-based SQL
//! straight into the tables (no events, no per-job round trips), plus the
//! small rewinds and plan look-ups the scale bench needs between
//! measurements. Never used on a real database: the bench points it at a
//! scratch file or schema of its own.
//!
//! The rows look like one busy cluster whose history is longer at the
//! larger size: jobs finish at a fixed rate (a million a week: 90 %
//! succeeded, 7 % failed, 3 % cancelled) and queued ones arrived at a fixed
//! rate (a hundred thousand an hour; 5 % of them retries backing off, 5 % at
//! a higher priority), so the last minutes look the same at every size and
//! only the amount of history differs. Half of all jobs are on one of
//! `targets` datasets, and the active set is constant: 8 running and 2 stale
//! jobs, each holding its target's lock, so locked targets have queued jobs
//! waiting behind them.

use std::str::FromStr;
use std::time::{Duration, Instant};

use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use super::url::{Backend as BackendKind, backend_of};
use super::{Result, StoreError, redact_url};

/// The pipelines every seeded job belongs to (a claim must ask for them).
pub const PIPELINES: [&str; 4] = ["sync", "verify", "retention", "harvest"];
/// The live worker that owns the seeded running jobs.
pub const WORKER: &str = "scale-node-a";
/// Running and stale jobs, each holding a lock: the same at every size,
/// since a cluster's active set does not grow with its history.
pub const RUNNING: i64 = 8;
pub const STALE: i64 = 2;

/// A job finishes every 604.8 ms (a million a week), in tenths of a ms.
const FINISH_EVERY_TENTH_MS: i64 = 6048;
/// A queued job arrived every 36 ms (a hundred thousand an hour).
const QUEUE_EVERY_MS: i64 = 36;

#[derive(Debug, Clone, Copy)]
pub struct SeedPlan {
    pub finished: u64,
    pub queued: u64,
    /// Datasets the targeted half of the jobs is spread over (at least
    /// `RUNNING + STALE`, so every active job has a target of its own).
    pub targets: u32,
}

#[derive(Debug, Clone, Copy)]
pub struct Seeded {
    /// Rows in `jobs` afterwards.
    pub jobs: i64,
    pub took: Duration,
}

/// A direct connection to a scratch database, beside the store's own.
#[derive(Debug, Clone)]
pub enum SeedDb {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl SeedDb {
    /// Open `url`; its schema must already be migrated (connect a store to
    /// it first).
    pub async fn open(url: &str) -> Result<Self> {
        let bad = |e: sqlx::Error| StoreError::Invalid(format!("bad URL {}: {e}", redact_url(url)));
        // A bulk insert of a million rows is slow by design: no warning.
        Ok(match backend_of(url)? {
            BackendKind::Sqlite => SeedDb::Sqlite(
                SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(
                        SqliteConnectOptions::from_str(url)
                            .map_err(bad)?
                            .disable_statement_logging(),
                    )
                    .await?,
            ),
            BackendKind::Postgres => SeedDb::Postgres(
                PgPoolOptions::new()
                    .max_connections(1)
                    .connect_with(
                        PgConnectOptions::from_str(url)
                            .map_err(bad)?
                            .disable_statement_logging(),
                    )
                    .await?,
            ),
        })
    }

    pub async fn close(&self) {
        match self {
            SeedDb::Sqlite(p) => p.close().await,
            SeedDb::Postgres(p) => p.close().await,
        }
    }

    /// Insert the plan's jobs, locks, workers and schedules into an empty
    /// database. Postgres is then vacuumed and analyzed, as autovacuum would
    /// after a bulk load; SQLite gets no statistics, as jobdeck never runs
    /// ANALYZE on its files.
    pub async fn seed(&self, plan: &SeedPlan) -> Result<Seeded> {
        if plan.targets < (RUNNING + STALE) as u32 {
            return Err(StoreError::Invalid(format!(
                "seeding needs at least {} targets (got {})",
                RUNNING + STALE,
                plan.targets
            )));
        }
        let finished = i64::try_from(plan.finished).unwrap_or(i64::MAX);
        let queued = i64::try_from(plan.queued).unwrap_or(i64::MAX);
        let targets = i64::from(plan.targets);
        let t0 = Instant::now();
        let jobs = match self {
            SeedDb::Sqlite(pool) => sqlite_seed(pool, finished, queued, targets).await?,
            SeedDb::Postgres(pool) => pg_seed(pool, finished, queued, targets).await?,
        };
        Ok(Seeded {
            jobs,
            took: t0.elapsed(),
        })
    }

    /// Put claimed jobs back exactly as they were queued (lease cleared, no
    /// event): a rewind between two timed claims, not an operator requeue.
    pub async fn put_back(&self, ids: &[i64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        match self {
            SeedDb::Sqlite(pool) => {
                let ids = serde_json::to_string(ids)
                    .map_err(|e| StoreError::Database(format!("bad id list: {e}")))?;
                sqlx::query(
                    "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_token = NULL,
                         lease_expires_at = NULL
                     WHERE state = 'leased' AND id IN (SELECT value FROM json_each(?))",
                )
                .bind(ids)
                .execute(pool)
                .await?;
            }
            SeedDb::Postgres(pool) => {
                sqlx::query(
                    "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_token = NULL, \
                         lease_expires_at = NULL \
                     WHERE state = 'leased' AND id = ANY($1)",
                )
                .bind(ids)
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }
}

async fn sqlite_seed(pool: &SqlitePool, finished: i64, queued: i64, targets: i64) -> Result<i64> {
    let now = chrono::Utc::now().timestamp_millis();
    let mut tx = pool.begin().await?;
    // Finished jobs, oldest first, so ids and finish times rise together
    // as they do in a real table. Durations and waits vary with i.
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 WHERE ?1 > 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1),
         t AS (SELECT i, ?2 - (?1 - i) * ?3 / 10 AS fin, i % 100 AS r FROM n)
         INSERT INTO jobs (pipeline, target, args, state, priority, due_at, attempt, max_attempts,
             step, lease_owner, lease_token, lease_expires_at, lock_fence, last_error, on_stale,
             backoff_ms, created_at, started_at, finished_at)
         SELECT
             CASE i % 4 WHEN 0 THEN 'sync' WHEN 1 THEN 'verify' WHEN 2 THEN 'retention'
                 ELSE 'harvest' END,
             CASE WHEN i % 2 = 0 THEN 'dataset-' || ((i / 2) % ?4) END,
             '{}',
             CASE WHEN r < 90 THEN 'succeeded' WHEN r < 97 THEN 'failed' ELSE 'cancelled' END,
             0,
             fin - 1000 - i % 60000 - i % 5000,
             CASE WHEN r < 90 THEN 1 + (i % 10 = 0) WHEN r < 97 THEN 3 ELSE 1 END,
             3,
             CASE WHEN r < 90 THEN 3 ELSE i % 3 END,
             'scale-node-' || char(97 + i % 3),
             i,
             NULL,
             CASE WHEN i % 2 = 0 THEN 1 + i / (2 * ?4) END,
             CASE WHEN r >= 90 AND r < 97 THEN 'step ' || (i % 3) || ': exit status 1' END,
             'hold',
             5000,
             fin - 1000 - i % 60000 - i % 5000,
             fin - 1000 - i % 60000,
             fin
         FROM t",
    )
    .bind(finished)
    .bind(now)
    .bind(FINISH_EVERY_TENTH_MS)
    .bind(targets)
    .execute(&mut *tx)
    .await?;
    // Queued jobs: most due now, 5 % retries backing off up to 10 minutes,
    // 5 % at priority 1.
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 WHERE ?1 > 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1),
         t AS (SELECT i, ?2 - (?1 - i) * ?3 AS created, i % 100 AS r FROM n)
         INSERT INTO jobs (pipeline, target, args, state, priority, due_at, attempt, max_attempts,
             step, last_error, on_stale, backoff_ms, created_at)
         SELECT
             CASE i % 4 WHEN 0 THEN 'sync' WHEN 1 THEN 'verify' WHEN 2 THEN 'retention'
                 ELSE 'harvest' END,
             CASE WHEN i % 2 = 0 THEN 'dataset-' || ((i / 2) % ?4) END,
             '{}', 'queued',
             CASE WHEN r >= 95 THEN 1 ELSE 0 END,
             CASE WHEN r BETWEEN 50 AND 54 THEN ?2 + (i % 600) * 1000 ELSE created END,
             CASE WHEN r BETWEEN 50 AND 54 THEN 1 ELSE 0 END,
             3,
             CASE WHEN r BETWEEN 50 AND 54 THEN 1 ELSE 0 END,
             CASE WHEN r BETWEEN 50 AND 54 THEN 'step 1: exit status 1' END,
             'hold', 5000, created
         FROM t",
    )
    .bind(queued)
    .bind(now)
    .bind(QUEUE_EVERY_MS)
    .bind(targets)
    .execute(&mut *tx)
    .await?;
    // The active set on datasets 0..9: running, then stale (lease run out,
    // `hold` keeps the lock).
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 + ?2 - 1)
         INSERT INTO jobs (pipeline, target, args, state, priority, due_at, attempt, max_attempts,
             step, lease_owner, lease_token, lease_expires_at, lock_fence, on_stale, backoff_ms,
             created_at, started_at)
         SELECT 'sync', 'dataset-' || i, '{}',
             CASE WHEN i < ?1 THEN 'running' ELSE 'stale' END,
             0, ?3 - 60000, 1, 3, i % 3, ?4, 1000000000 + i,
             CASE WHEN i < ?1 THEN ?3 + 30000 ELSE ?3 - 20000 END,
             1000 + i, 'hold', 5000, ?3 - 60000, ?3 - 50000
         FROM n",
    )
    .bind(RUNNING)
    .bind(STALE)
    .bind(now)
    .bind(WORKER)
    .execute(&mut *tx)
    .await?;
    // One lock row per dataset ever locked; the active jobs hold theirs.
    // The holders are found through `jobs_target_active`, whose condition
    // the join must imply word for word (migration 0008): with `state IN
    // ('running','stale')` SQLite scanned every job for every dataset, and
    // a 1.1M-row seed took two minutes.
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 - 1)
         INSERT INTO locks (target, fence, holder_job, holder_worker, acquired_at, expires_at)
         SELECT 'dataset-' || i, COALESCE(j.lock_fence, 1 + i % 7), j.id, j.lease_owner,
             j.started_at, j.lease_expires_at
         FROM n LEFT JOIN jobs j ON j.target = 'dataset-' || i
             AND (j.state = 'leased' OR j.state = 'running' OR j.state = 'stale')
             AND j.state <> 'leased'",
    )
    .bind(targets)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO workers (id, host, pid, slots, busy, paused, pipelines, started_at,
             heartbeat_at, gone)
         VALUES (?1, 'scale-host-a', 4242, 8, 8, 0, ?3, ?2 - 86400000, ?2, 0),
                ('scale-node-b', 'scale-host-b', 4343, 8, 0, 0, ?3, ?2 - 86400000,
                 ?2 - 3600000, 1)",
    )
    .bind(WORKER)
    .bind(now)
    .bind(pipelines_json())
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO schedules (name, pipeline, target, args, cron, timezone, overlap_queue,
             enabled, max_attempts, paused, next_fire_at)
         VALUES ('nightly-sync', 'sync', 'dataset-0', '{}', '0 30 2 * * *', 'UTC', 0, 1, 3, 0,
                 ?1 + 3600000),
                ('hourly-verify', 'verify', NULL, '{}', '0 0 * * * *', 'UTC', 0, 1, 3, 0,
                 ?1 + 600000),
                ('weekly-retention', 'retention', NULL, '{}', '0 0 3 * * SUN', 'UTC', 1, 1, 3, 1,
                 ?1 + 86400000)",
    )
    .bind(now)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    // A live database checkpoints its WAL every thousand pages; a bulk load
    // leaves one of gigabytes whose index every later read would search.
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(pool)
        .await?;
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM jobs")
        .fetch_one(pool)
        .await?)
}

async fn pg_seed(pool: &PgPool, finished: i64, queued: i64, targets: i64) -> Result<i64> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO jobs (pipeline, target, args, state, priority, due_at, attempt, max_attempts, \
             step, lease_owner, lease_token, lease_expires_at, lock_fence, last_error, on_stale, \
             backoff_ms, created_at, started_at, finished_at) \
         SELECT \
             (ARRAY['sync','verify','retention','harvest'])[1 + i % 4], \
             CASE WHEN i % 2 = 0 THEN 'dataset-' || ((i / 2) % $3) END, \
             '{}'::jsonb, \
             CASE WHEN r < 90 THEN 'succeeded' WHEN r < 97 THEN 'failed' ELSE 'cancelled' END, \
             0, \
             fin - (1000 + i % 60000 + i % 5000) * interval '1 millisecond', \
             CASE WHEN r < 90 THEN 1 + (i % 10 = 0)::int WHEN r < 97 THEN 3 ELSE 1 END, \
             3, \
             CASE WHEN r < 90 THEN 3 ELSE i % 3 END, \
             'scale-node-' || chr(97 + (i % 3)::int), \
             i, \
             NULL, \
             CASE WHEN i % 2 = 0 THEN 1 + i / (2 * $3) END, \
             CASE WHEN r >= 90 AND r < 97 THEN 'step ' || (i % 3) || ': exit status 1' END, \
             'hold', \
             5000, \
             fin - (1000 + i % 60000 + i % 5000) * interval '1 millisecond', \
             fin - (1000 + i % 60000) * interval '1 millisecond', \
             fin \
         FROM generate_series(1::bigint, $1) AS i, \
             LATERAL (SELECT now() - (($1 - i) * $2 / 10) * interval '1 millisecond' AS fin, \
                             i % 100 AS r) t",
    )
    .bind(finished)
    .bind(FINISH_EVERY_TENTH_MS)
    .bind(targets)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO jobs (pipeline, target, args, state, priority, due_at, attempt, max_attempts, \
             step, last_error, on_stale, backoff_ms, created_at) \
         SELECT \
             (ARRAY['sync','verify','retention','harvest'])[1 + i % 4], \
             CASE WHEN i % 2 = 0 THEN 'dataset-' || ((i / 2) % $3) END, \
             '{}'::jsonb, 'queued', \
             CASE WHEN r >= 95 THEN 1 ELSE 0 END, \
             CASE WHEN r BETWEEN 50 AND 54 THEN now() + (i % 600) * interval '1 second' \
                  ELSE created END, \
             CASE WHEN r BETWEEN 50 AND 54 THEN 1 ELSE 0 END, \
             3, \
             CASE WHEN r BETWEEN 50 AND 54 THEN 1 ELSE 0 END, \
             CASE WHEN r BETWEEN 50 AND 54 THEN 'step 1: exit status 1' END, \
             'hold', 5000, created \
         FROM generate_series(1::bigint, $1) AS i, \
             LATERAL (SELECT now() - (($1 - i) * $2) * interval '1 millisecond' AS created, \
                             i % 100 AS r) t",
    )
    .bind(queued)
    .bind(QUEUE_EVERY_MS)
    .bind(targets)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO jobs (pipeline, target, args, state, priority, due_at, attempt, max_attempts, \
             step, lease_owner, lease_token, lease_expires_at, lock_fence, on_stale, backoff_ms, \
             created_at, started_at) \
         SELECT 'sync', 'dataset-' || i, '{}'::jsonb, \
             CASE WHEN i < $1 THEN 'running' ELSE 'stale' END, \
             0, now() - interval '60 seconds', 1, 3, i % 3, $3, nextval('lease_tokens'), \
             CASE WHEN i < $1 THEN now() + interval '30 seconds' \
                  ELSE now() - interval '20 seconds' END, \
             1000 + i, 'hold', 5000, now() - interval '60 seconds', now() - interval '50 seconds' \
         FROM generate_series(0::bigint, $1 + $2 - 1) AS i",
    )
    .bind(RUNNING)
    .bind(STALE)
    .bind(WORKER)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO locks (target, fence, holder_job, holder_worker, acquired_at, expires_at) \
         SELECT 'dataset-' || i, COALESCE(j.lock_fence, 1 + i % 7), j.id, j.lease_owner, \
             j.started_at, j.lease_expires_at \
         FROM generate_series(0::bigint, $1 - 1) AS i \
             LEFT JOIN jobs j ON j.target = 'dataset-' || i AND j.state IN ('running','stale')",
    )
    .bind(targets)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO workers (id, host, pid, slots, busy, paused, pipelines, started_at, \
             heartbeat_at, gone) \
         VALUES ($1, 'scale-host-a', 4242, 8, 8, false, $2::jsonb, now() - interval '1 day', \
                 now(), false), \
                ('scale-node-b', 'scale-host-b', 4343, 8, 0, false, $2::jsonb, \
                 now() - interval '1 day', now() - interval '1 hour', true)",
    )
    .bind(WORKER)
    .bind(pipelines_json())
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO schedules (name, pipeline, target, args, cron, timezone, overlap_queue, \
             enabled, max_attempts, paused, next_fire_at) \
         VALUES ('nightly-sync', 'sync', 'dataset-0', '{}', '0 30 2 * * *', 'UTC', false, true, \
                 3, false, now() + interval '1 hour'), \
                ('hourly-verify', 'verify', NULL, '{}', '0 0 * * * *', 'UTC', false, true, 3, \
                 false, now() + interval '10 minutes'), \
                ('weekly-retention', 'retention', NULL, '{}', '0 0 3 * * SUN', 'UTC', true, \
                 true, 3, true, now() + interval '1 day')",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    // VACUUM cannot run inside a transaction block: one statement each.
    for table in ["jobs", "locks", "workers", "schedules"] {
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM (ANALYZE) {table}")))
            .execute(pool)
            .await?;
    }
    Ok(sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(pool)
        .await?)
}

fn pipelines_json() -> String {
    serde_json::to_string(&PIPELINES).unwrap_or_else(|_| "[]".into())
}
