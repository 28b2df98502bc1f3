//! The SQLite backend: one machine, many processes. WAL, synchronous=NORMAL,
//! every writing transaction opened with `BEGIN IMMEDIATE` so that it waits
//! for the write lock (busy_timeout) instead of failing mid-way.
//!
//! Times are integer milliseconds since the epoch from this machine's clock,
//! which is the database's clock for a file every process opens locally.

use std::collections::BTreeMap;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, SqliteConnection, SqlitePool};
use tokio::sync::{Mutex, RwLock};

use super::migrate::{APPLIED, Applied, needs_migrator};
use super::{
    Backend, BackendKind, CONNECT_TIMEOUT, CancelOutcome, ClaimRequest, CycleOutcome, CycleRequest,
    Enqueued, ExpireReport, FireResult, FireSlot, JobFilter, LeaseRef, LockInfo, NewJob,
    NoticeStream, Outcome, Renewal, Result, ScheduleDef, ScheduleInfo, StartOutcome, StartSpec,
    StoreError, WorkerBeat, WorkerInfo, redact_url,
};
use crate::job::{Event, Job, State};
use checkpoint::Checkpoints;
use write_lock::{WriteLock, WriteTurn};
use write_tx::{Gate, Held, Unbegun, WriteTx};

mod awake;
mod batch;
mod checkpoint;
mod cycle;
mod enqueue;
mod events;
mod notices;
mod operator;
mod read;
mod rows;
mod schedule;
mod worker;
mod write_lock;
mod write_tx;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// Below the supervisor's safety margin (lease/4 of the smallest sensible
/// lease), so a write never waits past the point where the lease matters.
const BUSY_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// The one connection this process's queued writers use, in turn:
    /// its page cache stays warm from one transaction to the next, where a
    /// pooled connection would re-read every page another connection
    /// changed. Writers of this process queue for it, in order, instead of
    /// all polling SQLite's write lock: busy_timeout retries are not fair,
    /// and under many concurrent writers one of them would starve past the
    /// timeout.
    writer: Arc<Mutex<SqliteConnection>>,
    url: String,
    /// Queued writers pass it shared, an urgent one (the heartbeat) takes
    /// it alone: it is next as soon as the write in progress ends, instead
    /// of polling SQLite's lock against a writer that takes it back within
    /// microseconds (a busy engine starved renewals past busy_timeout).
    gate: Arc<RwLock<()>>,
    /// The writing connection's checkpoints, done elsewhere.
    checkpoints: Arc<Checkpoints>,
    /// Other jobdeck processes' writers queue with ours here (`None` in
    /// memory).
    write_lock: Option<WriteLock>,
}

/// Apply pending migrations. SQLite has no advisory lock: two processes
/// opening a fresh file at once both start migrating, and the one that
/// loses fails on a table the other created. Each migration commits as a
/// whole, so the loser retries and finds it applied.
async fn migrate(pool: &SqlitePool) -> Result<()> {
    Ok(until_connect_timeout(|| MIGRATOR.run(pool), |_| true).await?)
}

/// Open a connection (or the pool's first), trying again while the file is
/// busy: processes opening a fresh file together all migrate it, and
/// opening sets the journal mode, which needs the file's lock; a process
/// could find it taken past its busy timeout.
async fn open_retrying<T, F>(url: &str, open: impl FnMut() -> F) -> Result<T>
where
    F: Future<Output = std::result::Result<T, sqlx::Error>>,
{
    until_connect_timeout(open, is_busy)
        .await
        .map_err(|e| StoreError::Unreachable(format!("cannot open {url}: {e}")))
}

/// `attempt` again every 100 ms while it fails with an error `retry`
/// accepts, for as long as a connection may take to open.
async fn until_connect_timeout<T, E, F>(
    mut attempt: impl FnMut() -> F,
    retry: impl Fn(&E) -> bool,
) -> std::result::Result<T, E>
where
    F: Future<Output = std::result::Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
    loop {
        match attempt().await {
            Err(e) if retry(&e) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            done => return done,
        }
    }
}

/// SQLITE_BUSY, in any of its extended forms.
fn is_busy(e: &sqlx::Error) -> bool {
    let code = match e {
        sqlx::Error::Database(db) => db.code(),
        _ => None,
    };
    code.and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| c & 0xff == 5)
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
        // No ping before each use: it is a round trip through the
        // connection's thread, and a broken connection shows itself on its
        // first statement anyway (which every caller retries).
        let pool = open_retrying(url, || {
            SqlitePoolOptions::new()
                .max_connections(8)
                .test_before_acquire(false)
                .acquire_timeout(CONNECT_TIMEOUT)
                .connect_with(opts.clone())
        })
        .await?;
        // The table is absent on a fresh database: nothing applied.
        let applied: Option<Vec<Applied>> = sqlx::query_as(APPLIED).fetch_all(&pool).await.ok();
        if needs_migrator(&MIGRATOR, applied.as_deref())? {
            migrate(&pool).await?;
        }
        let write_lock = WriteLock::beside(opts.get_filename())?;
        let writer_opts = opts.pragma("wal_autocheckpoint", checkpoint::WRITER_AUTOCHECKPOINT);
        let writer = open_retrying(url, || writer_opts.connect()).await?;
        Ok(SqliteStore {
            write_lock,
            checkpoints: Checkpoints::new(pool.clone()),
            pool,
            writer: Arc::new(Mutex::new(writer)),
            url: url.to_string(),
            gate: Arc::new(RwLock::new(())),
        })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub fn kind(&self) -> BackendKind {
        BackendKind::Sqlite
    }

    /// This process's turn among all jobdeck writers of the file.
    async fn turn(&self) -> Result<Option<WriteTurn>> {
        match &self.write_lock {
            Some(lock) => Ok(Some(lock.turn().await?)),
            None => Ok(None),
        }
    }

    /// A writing transaction that holds the write lock from its first
    /// statement, so a read-then-write never fails with BUSY_SNAPSHOT.
    async fn begin(&self) -> Result<WriteTx> {
        let (conn, gate, turn) = self.queue_to_write().await?;
        WriteTx::begin(conn, gate, turn, Some(self.checkpoints.clone())).await
    }

    /// Like [`Self::begin`], for a caller that sends the `BEGIN IMMEDIATE`
    /// itself as the first statement of its first query.
    async fn begin_in_first_query(&self) -> Result<Unbegun> {
        let (conn, gate, turn) = self.queue_to_write().await?;
        Ok(WriteTx::unbegun(
            conn,
            gate,
            turn,
            Some(self.checkpoints.clone()),
        ))
    }

    /// The writing connection, once this process's earlier writers and
    /// other processes' writers are done.
    async fn queue_to_write(&self) -> Result<(Held, Gate, Option<WriteTurn>)> {
        let conn = Held::Writer(self.writer.clone().lock_owned().await);
        let gate = Gate::Shared(self.gate.clone().read_owned().await);
        let turn = self.turn().await?;
        Ok((conn, gate, turn))
    }

    /// Like [`Self::begin`] but without queueing behind this process's
    /// other writers: a heartbeat must not wait for a batch of claims or
    /// enqueues, only for the one write in progress.
    async fn begin_urgent(&self) -> Result<WriteTx> {
        let gate = Gate::Alone(self.gate.clone().write_owned().await);
        let turn = self.turn().await?;
        let conn = self.pool.acquire().await?;
        WriteTx::begin(Held::Pooled(conn), gate, turn, None).await
    }
}

#[async_trait]
impl Backend for SqliteStore {
    fn kind(&self) -> BackendKind {
        BackendKind::Sqlite
    }

    fn display_url(&self) -> String {
        redact_url(&self.url)
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        rows::to_time(rows::now_ms())
    }

    async fn notices(&self) -> Result<Option<NoticeStream>> {
        Ok(Some(notices::changes(&self.url).await?))
    }

    async fn enqueue(&self, job: NewJob, actor: &str) -> Result<Enqueued> {
        self.do_enqueue(job, actor).await
    }

    async fn enqueue_many(&self, jobs: Vec<NewJob>, actor: &str) -> Result<Vec<i64>> {
        self.do_enqueue_many(jobs, actor).await
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Vec<Job>> {
        self.do_claim(req).await
    }

    async fn start(&self, lease: LeaseRef, spec: &StartSpec, worker: &str) -> Result<StartOutcome> {
        self.do_start(lease, spec, worker).await
    }

    async fn start_many(
        &self,
        items: &[(LeaseRef, StartSpec)],
        worker: &str,
    ) -> Result<Vec<Result<StartOutcome>>> {
        self.do_start_many(items, worker).await
    }

    async fn unclaim(
        &self,
        lease: LeaseRef,
        delay: Duration,
        actor: &str,
        detail: &str,
    ) -> Result<()> {
        self.do_unclaim(lease, delay, actor, detail).await
    }

    async fn fail_leased(&self, lease: LeaseRef, actor: &str, error: &str) -> Result<()> {
        self.do_fail_leased(lease, actor, error).await
    }

    async fn renew(
        &self,
        worker: &WorkerBeat,
        leases: &[LeaseRef],
        lease: Duration,
    ) -> Result<Vec<(LeaseRef, Renewal)>> {
        self.do_renew(worker, leases, lease).await
    }

    async fn advance_step(
        &self,
        lease: LeaseRef,
        step: i32,
        checkpoints: &[(String, String)],
    ) -> Result<()> {
        self.do_advance_step(lease, step, checkpoints).await
    }

    async fn save_output(&self, lease: LeaseRef, tail: &str) -> Result<()> {
        self.do_save_output(lease, tail).await
    }

    async fn finish(&self, lease: LeaseRef, outcome: Outcome, actor: &str) -> Result<State> {
        self.do_finish(lease, outcome, actor).await
    }

    async fn finish_many(
        &self,
        items: &[(LeaseRef, Outcome)],
        actor: &str,
    ) -> Result<Vec<Result<State>>> {
        self.do_finish_many(items, actor).await
    }

    async fn cycle(&self, req: &CycleRequest, worker: &str) -> Result<CycleOutcome> {
        self.do_cycle(req, worker).await
    }

    async fn cancel(&self, id: i64, actor: &str) -> Result<CancelOutcome> {
        self.do_cancel(id, actor).await
    }

    async fn requeue(&self, id: i64, actor: &str) -> Result<()> {
        self.do_requeue(id, actor).await
    }

    async fn extend(
        &self,
        id: i64,
        by: Duration,
        worker_alive: Duration,
        actor: &str,
    ) -> Result<DateTime<Utc>> {
        self.do_extend(id, by, worker_alive, actor).await
    }

    async fn release_lock(&self, target: &str, actor: &str) -> Result<i64> {
        self.do_release_lock(target, actor).await
    }

    async fn expire_leases(&self, grace: Duration, actor: &str) -> Result<ExpireReport> {
        self.do_expire_leases(grace, actor).await
    }

    async fn mark_gone_workers(&self, silent_for: Duration) -> Result<Vec<String>> {
        self.do_mark_gone_workers(silent_for).await
    }

    async fn prune_finished(&self, age: Duration) -> Result<u64> {
        self.do_prune_finished(age).await
    }

    async fn worker_stopped(&self, id: &str) -> Result<()> {
        self.do_worker_stopped(id).await
    }

    async fn list_workers(&self) -> Result<Vec<WorkerInfo>> {
        self.do_list_workers().await
    }

    async fn get_job(&self, id: i64) -> Result<Job> {
        self.do_get_job(id).await
    }

    async fn job_events(&self, id: i64) -> Result<Vec<Event>> {
        self.do_job_events(id).await
    }

    async fn job_output(&self, id: i64) -> Result<Option<String>> {
        self.do_job_output(id).await
    }

    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        self.do_list_jobs(filter).await
    }

    async fn count_by_state(&self) -> Result<BTreeMap<State, i64>> {
        self.do_count_by_state().await
    }

    async fn list_locks(&self) -> Result<Vec<LockInfo>> {
        self.do_list_locks().await
    }

    async fn checkpoints(
        &self,
        pipeline: &str,
        target: Option<&str>,
    ) -> Result<Vec<(String, String)>> {
        self.do_checkpoints(pipeline, target).await
    }

    async fn finished_histogram(&self, bucket: Duration, buckets: usize) -> Result<Vec<u64>> {
        self.do_finished_histogram(bucket, buckets).await
    }

    async fn sync_schedules(&self, defs: &[(ScheduleDef, Option<DateTime<Utc>>)]) -> Result<()> {
        self.do_sync_schedules(defs).await
    }

    async fn list_schedules(&self) -> Result<Vec<ScheduleInfo>> {
        self.do_list_schedules().await
    }

    async fn fire_schedule(&self, id: i64, slot: FireSlot, actor: &str) -> Result<FireResult> {
        self.do_fire_schedule(id, slot, actor).await
    }

    async fn set_schedule_paused(&self, name: &str, paused: bool) -> Result<()> {
        self.do_set_schedule_paused(name, paused).await
    }
}
