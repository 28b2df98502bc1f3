//! The SQLite backend: one machine, many processes. WAL, synchronous=NORMAL,
//! every writing transaction opened with `BEGIN IMMEDIATE` so that it waits
//! for the write lock (busy_timeout) instead of failing mid-way.

use std::str::FromStr;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::{BackendKind, CONNECT_TIMEOUT, Result, StoreError, redact_url};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// Below the supervisor's safety margin (lease/4 of the smallest sensible
/// lease), so a write never waits past the point where the lease matters.
const BUSY_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    url: String,
}

impl SqliteStore {
    pub async fn connect(url: &str) -> Result<Self> {
        let opts = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Invalid(format!("bad SQLite URL {url:?}: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(false);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_with(opts)
            .await
            .map_err(|e| StoreError::Unreachable(format!("cannot open {url}: {e}")))?;
        // The table is absent on a fresh database: no version applied.
        let applied: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations")
            .fetch_one(&pool)
            .await
            .ok()
            .flatten();
        super::migrate::check_version(&MIGRATOR, applied)?;
        MIGRATOR.run(&pool).await?;
        Ok(SqliteStore {
            pool,
            url: url.to_string(),
        })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub fn kind(&self) -> BackendKind {
        BackendKind::Sqlite
    }
}

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{
    Backend, CancelOutcome, ClaimRequest, Enqueued, ExpireReport, FireResult, FireSlot, JobFilter,
    LeaseRef, LockInfo, NewJob, Outcome, Renewal, ScheduleDef, ScheduleInfo, StartOutcome,
    StartSpec, WorkerBeat, WorkerInfo,
};
use crate::job::{Event, Job, State};

#[async_trait]
impl Backend for SqliteStore {
    fn kind(&self) -> BackendKind {
        BackendKind::Sqlite
    }

    fn display_url(&self) -> String {
        redact_url(&self.url)
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        todo!()
    }

    async fn enqueue(&self, _job: NewJob, _actor: &str) -> Result<Enqueued> {
        todo!()
    }

    async fn claim(&self, _req: &ClaimRequest) -> Result<Vec<Job>> {
        todo!()
    }

    async fn start(
        &self,
        _lease: LeaseRef,
        _spec: &StartSpec,
        _worker: &str,
    ) -> Result<StartOutcome> {
        todo!()
    }

    async fn unclaim(
        &self,
        _lease: LeaseRef,
        _delay: Duration,
        _actor: &str,
        _detail: &str,
    ) -> Result<()> {
        todo!()
    }

    async fn fail_leased(&self, _lease: LeaseRef, _actor: &str, _error: &str) -> Result<()> {
        todo!()
    }

    async fn renew(
        &self,
        _worker: &WorkerBeat,
        _leases: &[LeaseRef],
        _lease: Duration,
    ) -> Result<Vec<(LeaseRef, Renewal)>> {
        todo!()
    }

    async fn advance_step(
        &self,
        _lease: LeaseRef,
        _step: i32,
        _checkpoints: &[(String, String)],
    ) -> Result<()> {
        todo!()
    }

    async fn save_output(&self, _lease: LeaseRef, _tail: &str) -> Result<()> {
        todo!()
    }

    async fn finish(&self, _lease: LeaseRef, _outcome: Outcome, _actor: &str) -> Result<State> {
        todo!()
    }

    async fn cancel(&self, _id: i64, _actor: &str) -> Result<CancelOutcome> {
        todo!()
    }

    async fn requeue(&self, _id: i64, _actor: &str) -> Result<()> {
        todo!()
    }

    async fn extend(
        &self,
        _id: i64,
        _by: Duration,
        _worker_alive: Duration,
        _actor: &str,
    ) -> Result<DateTime<Utc>> {
        todo!()
    }

    async fn release_lock(&self, _target: &str, _actor: &str) -> Result<i64> {
        todo!()
    }

    async fn expire_leases(&self, _grace: Duration, _actor: &str) -> Result<ExpireReport> {
        todo!()
    }

    async fn mark_gone_workers(&self, _silent_for: Duration) -> Result<Vec<String>> {
        todo!()
    }

    async fn prune_finished(&self, _age: Duration) -> Result<u64> {
        todo!()
    }

    async fn worker_stopped(&self, _id: &str) -> Result<()> {
        todo!()
    }

    async fn list_workers(&self) -> Result<Vec<WorkerInfo>> {
        todo!()
    }

    async fn get_job(&self, _id: i64) -> Result<Job> {
        todo!()
    }

    async fn job_events(&self, _id: i64) -> Result<Vec<Event>> {
        todo!()
    }

    async fn job_output(&self, _id: i64) -> Result<Option<String>> {
        todo!()
    }

    async fn list_jobs(&self, _filter: &JobFilter) -> Result<Vec<Job>> {
        todo!()
    }

    async fn count_by_state(&self) -> Result<BTreeMap<State, i64>> {
        todo!()
    }

    async fn list_locks(&self) -> Result<Vec<LockInfo>> {
        todo!()
    }

    async fn checkpoints(
        &self,
        _pipeline: &str,
        _target: Option<&str>,
    ) -> Result<Vec<(String, String)>> {
        todo!()
    }

    async fn finished_histogram(&self, _bucket: Duration, _buckets: usize) -> Result<Vec<u64>> {
        todo!()
    }

    async fn sync_schedules(&self, _defs: &[(ScheduleDef, Option<DateTime<Utc>>)]) -> Result<()> {
        todo!()
    }

    async fn list_schedules(&self) -> Result<Vec<ScheduleInfo>> {
        todo!()
    }

    async fn fire_schedule(&self, _id: i64, _slot: FireSlot, _actor: &str) -> Result<FireResult> {
        todo!()
    }

    async fn set_schedule_paused(&self, _name: &str, _paused: bool) -> Result<()> {
        todo!()
    }
}
