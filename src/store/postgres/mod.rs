//! The Postgres backend: several machines, one database. Claims use
//! `FOR UPDATE SKIP LOCKED`; every lease time is the database's `now()`
//! (a node's clock never enters lease math). Producers and operators wake
//! workers with `NOTIFY jobdeck_jobs` / `NOTIFY jobdeck_cancel`.
//!
//! Submodules: `rows` (decoding and shared helpers), `worker` (the fenced
//! writes of a worker), `batch` (group commits and the engine's cycle),
//! `engine_conn` (the cycles' own connections), `operator` (cancel, requeue,
//! extend, release, reaper), `reads` (console and CLI queries), `schedules`.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use super::migrate::{APPLIED, Applied, needs_migrator};
use super::{
    Backend, BackendKind, CONNECT_TIMEOUT, CancelOutcome, ClaimRequest, CycleOutcome, CycleRequest,
    Enqueued, ExpireReport, FireResult, FireSlot, JobFilter, LeaseRef, LockInfo, NewJob,
    NoticeStream, Outcome, Renewal, Result, ScheduleDef, ScheduleInfo, StartOutcome, StartSpec,
    StoreError, WorkerBeat, WorkerInfo, redact_url,
};
use crate::job::{Event, Job, State};
use engine_conn::EngineConn;
use lean_cycle::LeanMode;
use lock_cycle::ClaimWindow;

/// The job columns every job-returning query selects, in the shape
/// `rows::job` decodes (JSON as text: the crate has no sqlx `json` feature).
macro_rules! job_cols {
    () => {
        "id, pipeline, target, args::text AS args, state, priority, due_at, attempt, \
         max_attempts, step, lease_owner, lease_token, lease_expires_at, lock_fence, \
         unique_key, cancel_requested_at, last_error, on_stale, schedule_id, created_at, \
         started_at, finished_at"
    };
}

/// A row in the shape of `job_cols!` that carries only the id, the target,
/// the lease token and the given state: all the store reads of the cycle
/// statements' successes (`'succeeded'`) and of the queued jobs the lean
/// claim passes over (`'queued'`). 8 whole rows per cycle (their JSON
/// turned to text and sent) cost the server for nothing.
macro_rules! brief_cols {
    ($state:literal) => {
        concat!(
            "id, NULL, target, NULL, ",
            $state,
            ", NULL, NULL, NULL, \
             NULL, NULL, NULL, lease_token, NULL, NULL, \
             NULL, NULL, NULL, NULL, NULL, NULL, \
             NULL, NULL"
        )
    };
}

mod batch;
mod engine_conn;
mod enqueue;
mod lean_cycle;
mod lock_cycle;
mod notices;
mod operator;
mod reads;
mod rows;
mod schedules;
mod worker;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

/// New queued jobs (payload: the pipeline).
pub const JOBS_CHANNEL: &str = "jobdeck_jobs";
/// Cancel requests for running jobs (payload: the job id).
pub const CANCEL_CHANNEL: &str = "jobdeck_cancel";

#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    url: String,
    engine: Arc<EngineConn>,
    lean: Arc<LeanMode>,
    window: Arc<ClaimWindow>,
}

impl PgStore {
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_sized(url, 16).await
    }

    /// A pool of up to `max_connections` (the pool opens them as needed).
    pub async fn connect_sized(url: &str, max_connections: u32) -> Result<Self> {
        let shown = redact_url(url);
        let opts = PgConnectOptions::from_str(url).map_err(|e| {
            StoreError::Invalid(format!("bad Postgres URL {shown}: {}", strip(&e, url)))
        })?;
        // No ping before each use: it would add a round trip to every
        // transaction, and a connection the server dropped fails its first
        // statement instead, which every caller retries.
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .test_before_acquire(false)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_lazy_with(opts.clone());
        // The table is absent on a fresh database: nothing applied. The
        // check warms the connection the command's first statement then
        // finds in a pool of one (`store::connect_one_shot`).
        let check = async {
            let applied: Option<Vec<Applied>> = sqlx::query_as(APPLIED).fetch_all(&pool).await.ok();
            Ok(applied)
        };
        // The probe runs beside the check, not before it, so a command waits
        // for one connection's set-up instead of two; when the probe fails,
        // the check (and the pool's retries) is dropped with it.
        let ((), applied) = tokio::try_join!(probe(&opts, url), check)?;
        if needs_migrator(&MIGRATOR, applied.as_deref())? {
            MIGRATOR.run(&pool).await?;
        }
        Ok(PgStore {
            pool,
            url: url.to_string(),
            engine: Arc::default(),
            lean: Arc::default(),
            window: Arc::default(),
        })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn kind(&self) -> BackendKind {
        BackendKind::Postgres
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// A listener on both wake-up channels, on its own connection (same
    /// options as the pool, so a test schema's search_path carries over).
    /// `recv()` reconnects transparently, but notifications sent while the
    /// connection was down are lost: keep the slow poll, or use `try_recv()`,
    /// whose `Ok(None)` after a reconnect is the cue to poll at once.
    pub async fn listen(&self) -> Result<PgListener> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen_all([JOBS_CHANNEL, CANCEL_CHANNEL]).await?;
        Ok(listener)
    }
}

/// One direct connection attempt, for its error: the pool retries a
/// refused connection until its timeout and then only says "timed out".
async fn probe(opts: &PgConnectOptions, url: &str) -> Result<()> {
    let unreachable = |why: String| StoreError::Unreachable(format!("{}: {why}", redact_url(url)));
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(opts)).await {
        Err(_) => Err(unreachable(format!(
            "no answer within {}s",
            CONNECT_TIMEOUT.as_secs()
        ))),
        // The server's own sentence, without the driver's source line.
        Ok(Err(sqlx::Error::Database(db))) => Err(unreachable(strip(&db.message(), url))),
        Ok(Err(e)) => Err(unreachable(strip(&e, url))),
        Ok(Ok(probe)) => {
            let _ = probe.close().await;
            Ok(())
        }
    }
}

/// An error message on one line, with the raw URL (and so the password)
/// taken out in case the driver quoted it.
fn strip(e: &dyn std::fmt::Display, url: &str) -> String {
    let msg = e.to_string().replace(url, &redact_url(url));
    msg.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Milliseconds for binding into `$n * interval '1 millisecond'`.
fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A cycle's start specs as the four array parameters both cycle
/// statements take, by pipeline: lease (ms), `on_stale`, backoff (ms).
struct SpecColumns<'a> {
    pipelines: Vec<&'a str>,
    lease_ms: Vec<i64>,
    on_stale: Vec<&'a str>,
    backoff_ms: Vec<i64>,
}

impl<'a> SpecColumns<'a> {
    fn of(specs: &'a [(String, StartSpec)]) -> Self {
        SpecColumns {
            pipelines: specs.iter().map(|(p, _)| p.as_str()).collect(),
            lease_ms: specs.iter().map(|(_, s)| ms(s.lease)).collect(),
            on_stale: specs.iter().map(|(_, s)| s.on_stale.as_str()).collect(),
            backoff_ms: specs.iter().map(|(_, s)| ms(s.backoff)).collect(),
        }
    }
}

#[async_trait]
impl Backend for PgStore {
    fn kind(&self) -> BackendKind {
        BackendKind::Postgres
    }

    fn display_url(&self) -> String {
        redact_url(&self.url)
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        Ok(sqlx::query_scalar("SELECT now()")
            .fetch_one(&self.pool)
            .await?)
    }

    async fn notices(&self) -> Result<Option<NoticeStream>> {
        Ok(Some(notices::stream(self.listen().await?)))
    }

    async fn enqueue(&self, job: NewJob, actor: &str) -> Result<Enqueued> {
        self.enqueue_job(job, actor).await
    }

    async fn enqueue_many(&self, jobs: Vec<NewJob>, actor: &str) -> Result<Vec<i64>> {
        self.enqueue_jobs(jobs, actor).await
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Vec<Job>> {
        self.claim_jobs(req).await
    }

    async fn start(&self, lease: LeaseRef, spec: &StartSpec, worker: &str) -> Result<StartOutcome> {
        self.start_job(lease, spec, worker).await
    }

    async fn start_many(
        &self,
        items: &[(LeaseRef, StartSpec)],
        worker: &str,
    ) -> Result<Vec<Result<StartOutcome>>> {
        self.start_many_jobs(items, worker).await
    }

    async fn unclaim(
        &self,
        lease: LeaseRef,
        delay: Duration,
        actor: &str,
        detail: &str,
    ) -> Result<()> {
        self.unclaim_job(lease, delay, actor, detail).await
    }

    async fn fail_leased(&self, lease: LeaseRef, actor: &str, error: &str) -> Result<()> {
        self.fail_leased_job(lease, actor, error).await
    }

    async fn renew(
        &self,
        worker: &WorkerBeat,
        leases: &[LeaseRef],
        lease: Duration,
    ) -> Result<Vec<(LeaseRef, Renewal)>> {
        self.renew_leases(worker, leases, lease).await
    }

    async fn advance_step(
        &self,
        lease: LeaseRef,
        step: i32,
        checkpoints: &[(String, String)],
    ) -> Result<()> {
        self.advance_job_step(lease, step, checkpoints).await
    }

    async fn save_output(&self, lease: LeaseRef, tail: &str) -> Result<()> {
        self.save_job_output(lease, tail).await
    }

    async fn finish(&self, lease: LeaseRef, outcome: Outcome, actor: &str) -> Result<State> {
        self.finish_job(lease, outcome, actor).await
    }

    async fn finish_many(
        &self,
        items: &[(LeaseRef, Outcome)],
        actor: &str,
    ) -> Result<Vec<Result<State>>> {
        self.finish_many_jobs(items, actor).await
    }

    async fn cycle(&self, req: &CycleRequest, worker: &str) -> Result<CycleOutcome> {
        self.cycle_jobs(req, worker).await
    }

    /// Any number: each cycle in flight has a connection of its own.
    fn max_cycles_in_flight(&self) -> usize {
        usize::MAX
    }

    async fn cancel(&self, id: i64, actor: &str) -> Result<CancelOutcome> {
        self.cancel_job(id, actor).await
    }

    async fn requeue(&self, id: i64, actor: &str) -> Result<()> {
        self.requeue_job(id, actor).await
    }

    async fn extend(
        &self,
        id: i64,
        by: Duration,
        worker_alive: Duration,
        actor: &str,
    ) -> Result<DateTime<Utc>> {
        self.extend_lease(id, by, worker_alive, actor).await
    }

    async fn release_lock(&self, target: &str, actor: &str) -> Result<i64> {
        self.release_target_lock(target, actor).await
    }

    async fn expire_leases(&self, grace: Duration, actor: &str) -> Result<ExpireReport> {
        self.expire_job_leases(grace, actor).await
    }

    async fn mark_gone_workers(&self, silent_for: Duration) -> Result<Vec<String>> {
        self.mark_workers_gone(silent_for).await
    }

    async fn prune_finished(&self, age: Duration) -> Result<u64> {
        self.prune_finished_jobs(age).await
    }

    async fn worker_stopped(&self, id: &str) -> Result<()> {
        sqlx::query("UPDATE workers SET gone = true, busy = 0 WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn list_workers(&self) -> Result<Vec<WorkerInfo>> {
        self.workers().await
    }

    async fn get_job(&self, id: i64) -> Result<Job> {
        self.job(id).await
    }

    async fn job_events(&self, id: i64) -> Result<Vec<Event>> {
        self.events(id).await
    }

    async fn job_output(&self, id: i64) -> Result<Option<String>> {
        self.output(id).await
    }

    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        self.jobs(filter).await
    }

    async fn count_by_state(&self) -> Result<BTreeMap<State, i64>> {
        self.state_counts().await
    }

    async fn list_locks(&self) -> Result<Vec<LockInfo>> {
        self.locks().await
    }

    async fn checkpoints(
        &self,
        pipeline: &str,
        target: Option<&str>,
    ) -> Result<Vec<(String, String)>> {
        self.checkpoint_values(pipeline, target).await
    }

    async fn finished_histogram(&self, bucket: Duration, buckets: usize) -> Result<Vec<u64>> {
        self.histogram(bucket, buckets).await
    }

    async fn sync_schedules(&self, defs: &[(ScheduleDef, Option<DateTime<Utc>>)]) -> Result<()> {
        self.upsert_schedules(defs).await
    }

    async fn list_schedules(&self) -> Result<Vec<ScheduleInfo>> {
        self.schedules().await
    }

    async fn fire_schedule(&self, id: i64, slot: FireSlot, actor: &str) -> Result<FireResult> {
        self.fire(id, slot, actor).await
    }

    async fn set_schedule_paused(&self, name: &str, paused: bool) -> Result<()> {
        self.pause_schedule(name, paused).await
    }
}
