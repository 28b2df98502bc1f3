//! The store API: every read and write of jobs, locks, workers, events,
//! schedules and checkpoints. One trait, one implementation per backend
//! (`sqlite.rs`, `postgres.rs`); all SQL lives below this module.
//!
//! Worker writes are fenced: they name the job by `(id, lease_token)` and
//! the state they expect, and a job that moved on answers
//! [`StoreError::LeaseLost`] instead of being changed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::job::{Event, Job, StalePolicy, State};

mod columns;
mod error;
mod migrate;
pub mod postgres;
pub mod scratch;
pub mod seed;
pub mod sqlite;
mod url;

pub use error::StoreError;
pub use url::{Backend as BackendKind, backend_of, redact_url};

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A shared handle on one database.
pub type Store = Arc<dyn Backend>;

/// Connect to `url` (`sqlite://path` or `postgres://…`), creating the SQLite
/// file when missing, and apply pending migrations. Answers within the
/// connect timeout with a one-line error that never contains the password.
pub async fn connect(url: &str) -> Result<Store> {
    connect_for_slots(url, DEFAULT_SLOTS).await
}

/// The slots [`connect`] sizes its pool for (a Postgres pool of 16).
const DEFAULT_SLOTS: usize = 12;

/// [`connect`] for a node that runs `slots` jobs at once: the Postgres pool
/// holds up to one connection per slot (a step's output and checkpoint
/// writes) plus `SPARE_CONNECTIONS`. SQLite's writes share one connection
/// whatever the slots.
pub async fn connect_for_slots(url: &str, slots: usize) -> Result<Store> {
    let pool = u32::try_from(slots)
        .unwrap_or(u32::MAX)
        .saturating_add(SPARE_CONNECTIONS);
    open(url, pool).await
}

/// A store for one command whose statements run one after another
/// (`jobdeck enqueue`, `stats`, `show`…). On Postgres its pool holds one
/// connection: sqlx checks a released connection with a round trip before
/// it is idle again, and a larger pool opened a new connection, a new
/// server process with cold caches, for a statement that came meanwhile
/// (bench/cli_ab.py; bench/HISTORY.md, session 34).
pub async fn connect_one_shot(url: &str) -> Result<Store> {
    open(url, 1).await
}

/// The store of `url`'s backend; `postgres_pool` sizes a Postgres pool.
async fn open(url: &str, postgres_pool: u32) -> Result<Store> {
    match url::backend_of(url)? {
        BackendKind::Sqlite => Ok(Arc::new(sqlite::SqliteStore::connect(url).await?)),
        BackendKind::Postgres => Ok(Arc::new(
            postgres::PgStore::connect_sized(url, postgres_pool).await?,
        )),
    }
}

/// Connections beside the slots' own: the engine's cycle, the batch of
/// delayed starts, the heartbeat, and the reaper, scheduler and reads.
pub const SPARE_CONNECTIONS: u32 = 4;

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Default)]
pub struct NewJob {
    pub pipeline: String,
    pub target: Option<String>,
    pub args: serde_json::Map<String, serde_json::Value>,
    /// Higher runs first.
    pub priority: i32,
    /// When it may run; `None` = now (database clock).
    pub run_at: Option<DateTime<Utc>>,
    /// Delay from the database's now; ignored when `run_at` is set.
    pub delay: Option<Duration>,
    pub unique_key: Option<String>,
    pub max_attempts: Option<i32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Enqueued {
    pub id: i64,
    pub deduplicated: bool,
}

/// A worker's lease on a job: every write it makes names both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseRef {
    pub id: i64,
    pub token: i64,
}

impl Job {
    /// The lease this job is held under, if any.
    pub fn lease_ref(&self) -> Option<LeaseRef> {
        self.lease_token
            .map(|token| LeaseRef { id: self.id, token })
    }
}

#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub worker: String,
    /// Only jobs of these pipelines are taken.
    pub pipelines: Vec<String>,
    pub limit: usize,
    pub lease: Duration,
}

/// The per-pipeline settings a worker stamps on a job when it starts it, so
/// that any node's reaper can apply them later without the config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StartSpec {
    pub lease: Duration,
    pub on_stale: StalePolicy,
    pub backoff: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartOutcome {
    /// Lock taken (when the job has a target), attempt counted, running.
    Started { attempt: i32, fence: Option<i64> },
    /// Another job holds the target's lock; nothing was written.
    LockBusy {
        holder_job: i64,
        holder_worker: Option<String>,
    },
}

/// One engine cycle's writes, committed together: the finishes of the
/// jobs that ended, then a claim into the slots they (and any others) left
/// free, starting at once every claimed job that can start without waiting.
/// One commit per cycle instead of three is what lets a node of a few slots
/// run thousands of short jobs a second.
#[derive(Debug, Clone, Default)]
pub struct CycleRequest {
    pub finishes: Vec<(LeaseRef, Outcome)>,
    pub claim: Option<ClaimRequest>,
    /// Stamped on each claimed job at its start, by pipeline. A claimed job
    /// whose pipeline is not listed is left leased.
    pub specs: Vec<(String, StartSpec)>,
}

/// A job claimed in a cycle and, when its start needed no wait, started.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub job: Job,
    /// `Some((attempt, fence))` when the job is running; `None` when it is
    /// leased and still has to start (its target's lock was taken between
    /// the claim's check and the start, or its pipeline had no spec).
    pub started: Option<(i32, Option<i64>)>,
}

#[derive(Debug, Clone)]
pub struct CycleOutcome {
    /// Per finish, in request order: what `finish_many` would answer.
    pub finished: Vec<Result<State>>,
    /// In claim order.
    pub claimed: Vec<Claimed>,
}

/// A batch's starts grouped by spec, in first-seen order: each group
/// starts in set-based statements.
pub(crate) fn group_by_spec(items: &[(LeaseRef, StartSpec)]) -> Vec<(StartSpec, Vec<LeaseRef>)> {
    let mut groups: Vec<(StartSpec, Vec<LeaseRef>)> = Vec::new();
    for (lease, spec) in items {
        match groups.iter_mut().find(|(s, _)| s == spec) {
            Some((_, leases)) => leases.push(*lease),
            None => groups.push((*spec, vec![*lease])),
        }
    }
    groups
}

/// The successes of a batch of finishes: they finish in set-based statements.
pub(crate) fn successes(items: &[(LeaseRef, Outcome)]) -> Vec<LeaseRef> {
    items
        .iter()
        .filter(|(_, o)| *o == Outcome::Succeeded)
        .map(|(l, _)| *l)
        .collect()
}

/// One item's answer inside a batch's transaction: a database error
/// spoils the whole transaction (the caller returns it, nothing is
/// written), any other answer is the item's own.
pub(crate) fn item_answer<T>(r: Result<T>) -> Result<Result<T>> {
    match r {
        Err(e) if e.is_transient() => Err(e),
        other => Ok(other),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Renewal {
    Lost,
    Held {
        /// Lease left after the renewal, by the database clock.
        remaining: Duration,
        cancel_requested: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// A step failed, timed out or was interrupted. `retry = false` skips
    /// the retry path (the failure cannot get better by itself).
    Failed {
        error: String,
        retry: bool,
    },
    /// The worker stopped the process for a cancel request.
    Cancelled,
}

/// The detail of a start's event, the same on every backend.
pub fn start_detail(attempt: i32, fence: Option<i64>) -> String {
    match fence {
        Some(f) => format!("attempt {attempt}, fence {f}"),
        None => format!("attempt {attempt}"),
    }
}

impl Outcome {
    /// The move and the state a running job takes for this outcome, by the
    /// rules of `job.rs` (a pending cancel beats a retry), and the error to
    /// record.
    pub fn decide(
        self,
        attempt: i32,
        max_attempts: i32,
        cancel_pending: bool,
    ) -> (crate::job::Move, State, Option<String>) {
        use crate::job::{Move, after_failure};
        match self {
            Outcome::Succeeded => (Move::Succeed, State::Succeeded, None),
            Outcome::Cancelled => (Move::StopCancelled, State::Cancelled, None),
            Outcome::Failed { error, retry } => {
                // A failure that cannot improve uses up the attempts at once.
                let max = if retry { max_attempts } else { attempt };
                (
                    Move::Fail,
                    after_failure(attempt, max, cancel_pending),
                    Some(error),
                )
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CancelOutcome {
    /// The job is cancelled now.
    Cancelled,
    /// The job is running: its worker will stop it and end it cancelled.
    Requested,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExpireReport {
    /// Leased jobs whose lease ran out before they started: back to queued.
    pub requeued: Vec<i64>,
    /// Running jobs moved to stale (hold or release).
    pub stale: Vec<i64>,
    /// Running jobs moved back to queued by `on_stale = "retry"`.
    pub retried: Vec<i64>,
    /// Running jobs that had a pending cancel, or ran out of attempts.
    pub finished: Vec<i64>,
}

#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub states: Vec<State>,
    pub pipeline: Option<String>,
    pub target: Option<String>,
    /// Matches id, pipeline or target (substring).
    pub text: Option<String>,
    pub limit: usize,
    pub order: JobOrder,
}

impl JobFilter {
    /// Only finished states: every such job has a `finished_at`, which the
    /// partial index on it (both backends) needs the query to say.
    pub fn finished_only(&self) -> bool {
        !self.states.is_empty() && self.states.iter().all(|s| s.is_terminal())
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum JobOrder {
    /// Newest id first.
    #[default]
    Newest,
    /// The order a claim takes them: priority, due time, id.
    ClaimOrder,
    /// Most recently finished first.
    RecentlyFinished,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LockInfo {
    pub target: String,
    pub fence: i64,
    pub job_id: i64,
    pub job_state: State,
    pub worker_id: Option<String>,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    /// Queued jobs of the same target waiting behind this lock.
    pub waiting: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerInfo {
    pub id: String,
    pub host: String,
    pub pid: i64,
    pub slots: i32,
    pub busy: i32,
    pub paused: bool,
    pub pipelines: Vec<String>,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    pub gone: bool,
}

/// A worker's registration and heartbeat.
#[derive(Debug, Clone)]
pub struct WorkerBeat {
    pub id: String,
    pub host: String,
    pub pid: i64,
    pub slots: i32,
    pub busy: i32,
    pub paused: bool,
    pub pipelines: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleDef {
    pub name: String,
    pub pipeline: String,
    pub target: Option<String>,
    pub args: serde_json::Map<String, serde_json::Value>,
    pub cron: String,
    pub timezone: String,
    /// `true`: fire even while the previous job is unfinished.
    pub overlap_queue: bool,
    pub enabled: bool,
    /// The pipeline's max_attempts, stamped on each fired job.
    pub max_attempts: Option<i32>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleInfo {
    pub id: i64,
    #[serde(flatten)]
    pub def: ScheduleDef,
    pub paused: bool,
    pub next_fire_at: Option<DateTime<Utc>>,
    pub last_fire_at: Option<DateTime<Utc>>,
    pub last_job_id: Option<i64>,
    pub last_skip_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "result")]
pub enum FireResult {
    Fired {
        job_id: i64,
    },
    /// overlap = skip and the previous job is unfinished.
    Skipped {
        blocking_job: i64,
    },
    /// Nothing fired: another node fired this slot first, the schedule
    /// changed, or it is paused or disabled (a due slot still moves on).
    NotFired,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireSlot {
    /// The slot `expected_next` is due; afterwards the schedule's next fire
    /// is `next` (the first cron time after now: missed slots coalesce).
    Due {
        expected_next: DateTime<Utc>,
        next: Option<DateTime<Utc>>,
    },
    /// An operator fires it now; the cron slot is untouched.
    Manual,
}

/// A wake-up pushed by the database (Postgres LISTEN/NOTIFY; SQLite:
/// another connection committed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// A job was enqueued or a schedule fired.
    JobsAvailable,
    /// An operator asked to cancel this running job.
    CancelRequested(i64),
}

pub type NoticeStream = futures::stream::BoxStream<'static, Result<Notice>>;

/// One implementation per database; the contract tests run against both.
#[async_trait]
pub trait Backend: Send + Sync + std::fmt::Debug {
    fn kind(&self) -> BackendKind;
    /// The URL with any password replaced by `***`.
    fn display_url(&self) -> String;
    /// The database's clock.
    async fn now(&self) -> Result<DateTime<Utc>>;
    /// Notifications of new jobs and cancel requests, where the database can
    /// tell them; `None` means poll.
    async fn notices(&self) -> Result<Option<NoticeStream>> {
        Ok(None)
    }

    // ---- producers ----
    async fn enqueue(&self, job: NewJob, actor: &str) -> Result<Enqueued>;
    /// Enqueue many jobs at once (no unique keys), returning their ids in
    /// order. Backends override this with a bulk insert.
    async fn enqueue_many(&self, jobs: Vec<NewJob>, actor: &str) -> Result<Vec<i64>> {
        let mut ids = Vec::with_capacity(jobs.len());
        for job in jobs {
            ids.push(self.enqueue(job, actor).await?.id);
        }
        Ok(ids)
    }

    // ---- workers (fenced by lease token) ----
    /// Up to `limit` due queued jobs of the given pipelines, in claim order,
    /// at most one per target and none whose target is locked or leased.
    async fn claim(&self, req: &ClaimRequest) -> Result<Vec<Job>>;
    async fn start(&self, lease: LeaseRef, spec: &StartSpec, worker: &str) -> Result<StartOutcome>;
    /// Start several jobs in one transaction (one commit): per job, the
    /// answer `start` would give. The outer error means nothing was written.
    async fn start_many(
        &self,
        items: &[(LeaseRef, StartSpec)],
        worker: &str,
    ) -> Result<Vec<Result<StartOutcome>>> {
        let mut out = Vec::with_capacity(items.len());
        for (lease, spec) in items {
            out.push(self.start(*lease, spec, worker).await);
        }
        Ok(out)
    }
    /// Give a leased (not started) job back to the queue after `delay`; not
    /// an attempt.
    async fn unclaim(
        &self,
        lease: LeaseRef,
        delay: Duration,
        actor: &str,
        detail: &str,
    ) -> Result<()>;
    /// `on_lock_busy = "fail"`: fail a leased job naming the holder.
    async fn fail_leased(&self, lease: LeaseRef, actor: &str, error: &str) -> Result<()>;
    /// Renew every listed lease to `max(expiry, now + lease)` in one round
    /// trip, and record the worker's heartbeat.
    async fn renew(
        &self,
        worker: &WorkerBeat,
        leases: &[LeaseRef],
        lease: Duration,
    ) -> Result<Vec<(LeaseRef, Renewal)>>;
    /// Step `step` (0-based) succeeded: the job resumes at `step + 1`, and
    /// the step's checkpoints are stored for (pipeline, target).
    async fn advance_step(
        &self,
        lease: LeaseRef,
        step: i32,
        checkpoints: &[(String, String)],
    ) -> Result<()>;
    /// Keep the last lines of the job's output where every console can read it.
    async fn save_output(&self, lease: LeaseRef, tail: &str) -> Result<()>;
    /// End a running job, release its lock by fence. Returns the new state.
    async fn finish(&self, lease: LeaseRef, outcome: Outcome, actor: &str) -> Result<State>;

    /// Finish several jobs in one transaction (one commit): per job, the
    /// answer `finish` would give. The outer error means nothing was written.
    async fn finish_many(
        &self,
        items: &[(LeaseRef, Outcome)],
        actor: &str,
    ) -> Result<Vec<Result<State>>> {
        let mut out = Vec::with_capacity(items.len());
        for (lease, outcome) in items {
            out.push(self.finish(*lease, outcome.clone(), actor).await);
        }
        Ok(out)
    }

    /// Finish, claim and start in one transaction (see [`CycleRequest`]).
    /// The outer error means nothing was written.
    async fn cycle(&self, req: &CycleRequest, worker: &str) -> Result<CycleOutcome>;
    /// The most cycles of one node the backend runs side by side; the
    /// engine sends up to `[workers] cycles_in_flight` of them.
    fn max_cycles_in_flight(&self) -> usize {
        1
    }

    // ---- operators ----
    async fn cancel(&self, id: i64, actor: &str) -> Result<CancelOutcome>;
    async fn requeue(&self, id: i64, actor: &str) -> Result<()>;
    /// Lengthen the lease by `by`; refused when the holder's worker is gone
    /// (no heartbeat within `worker_alive`).
    async fn extend(
        &self,
        id: i64,
        by: Duration,
        worker_alive: Duration,
        actor: &str,
    ) -> Result<DateTime<Utc>>;
    /// Free the lock a stale job holds on `target`. Returns the job id.
    async fn release_lock(&self, target: &str, actor: &str) -> Result<i64>;

    // ---- reaper ----
    /// Leased past expiry → queued; running past expiry + grace → per the
    /// job's `on_stale`, or cancelled when a cancel is pending. One
    /// transaction per job.
    async fn expire_leases(&self, grace: Duration, actor: &str) -> Result<ExpireReport>;
    /// Mark workers without a heartbeat for `silent_for` as gone.
    async fn mark_gone_workers(&self, silent_for: Duration) -> Result<Vec<String>>;
    /// Delete finished jobs (and their events and output) older than `age`.
    async fn prune_finished(&self, age: Duration) -> Result<u64>;

    // ---- workers registry ----
    async fn worker_stopped(&self, id: &str) -> Result<()>;
    async fn list_workers(&self) -> Result<Vec<WorkerInfo>>;

    // ---- reads ----
    async fn get_job(&self, id: i64) -> Result<Job>;
    async fn job_events(&self, id: i64) -> Result<Vec<Event>>;
    async fn job_output(&self, id: i64) -> Result<Option<String>>;
    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>>;
    async fn count_by_state(&self) -> Result<BTreeMap<State, i64>>;
    async fn list_locks(&self) -> Result<Vec<LockInfo>>;
    async fn checkpoints(
        &self,
        pipeline: &str,
        target: Option<&str>,
    ) -> Result<Vec<(String, String)>>;
    /// Finished jobs per bucket of `bucket` length over the last `buckets`
    /// buckets, oldest first (the console's throughput sparkline).
    async fn finished_histogram(&self, bucket: Duration, buckets: usize) -> Result<Vec<u64>>;

    // ---- schedules ----
    /// Upsert the configured schedules, each with its first fire time after
    /// now; `next_fire_at` is only reset for new schedules or a changed
    /// cron/timezone, and an operator's pause survives.
    async fn sync_schedules(&self, defs: &[(ScheduleDef, Option<DateTime<Utc>>)]) -> Result<()>;
    async fn list_schedules(&self) -> Result<Vec<ScheduleInfo>>;
    /// Fire schedule `id`: for a due slot only if its `next_fire_at` is still
    /// `expected_next` (so two nodes never fire one slot), moving it to
    /// `next`; or by hand, now. Honours the schedule's overlap rule.
    async fn fire_schedule(&self, id: i64, slot: FireSlot, actor: &str) -> Result<FireResult>;
    async fn set_schedule_paused(&self, name: &str, paused: bool) -> Result<()>;
}
