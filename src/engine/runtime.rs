//! The engine's main loop: write a cycle (finishes, claim, starts) whenever
//! jobs end or new work may wait, obey the handle, drain and stop; the
//! background loops (heartbeat, reaper, scheduler, notices) run beside it
//! until it stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::batch::Batcher;
use super::cycle::{self, FinishQueue, FinishReceiver, InFlight, Settled};
use super::registry::{JobSignal, Registry};
use super::retry::Backoff;
use super::{Control, EngineOptions, EngineStatus, heartbeat, job_run, notices, reaper, scheduler};
use crate::config::Config;
use crate::store::{LeaseRef, StartOutcome, StartSpec, Store, WorkerBeat};

/// What every part of a running engine shares.
#[derive(Debug)]
pub struct Ctx {
    pub store: Store,
    pub config: Arc<Config>,
    pub opts: EngineOptions,
    pub worker_id: String,
    pub registry: Arc<Registry>,
    pub wake: Arc<Notify>,
    /// Starts that did not happen with their claim, group-committed.
    pub starts: Batcher<(LeaseRef, StartSpec), StartOutcome>,
    /// Finishes, written by the main loop's next cycle.
    pub finishes: FinishQueue,
    specs: Vec<(String, StartSpec)>,
    status: watch::Sender<EngineStatus>,
    /// A publish of the slots' state is scheduled and has not read them yet.
    publish_pending: AtomicBool,
    paused: AtomicBool,
    slots: std::sync::atomic::AtomicUsize,
}

impl Ctx {
    pub fn new(
        store: Store,
        config: Arc<Config>,
        opts: EngineOptions,
        worker_id: String,
        slots: usize,
        status: watch::Sender<EngineStatus>,
    ) -> (Self, FinishReceiver) {
        let registry = Arc::new(Registry::default());
        let in_flight = |r: &Arc<Registry>| {
            let r = r.clone();
            move || r.len()
        };
        let starts = {
            let (store, worker) = (store.clone(), worker_id.clone());
            Batcher::new(
                in_flight(&registry),
                move |items: Arc<Vec<(LeaseRef, StartSpec)>>| {
                    let (store, worker) = (store.clone(), worker.clone());
                    async move { store.start_many(&items, &worker).await }
                },
            )
        };
        let (finishes, finish_rx) = FinishQueue::new();
        let specs = config
            .pipelines
            .iter()
            .map(|p| (p.name.clone(), start_spec(&config, p)))
            .collect();
        let ctx = Ctx {
            starts,
            finishes,
            specs,
            store,
            config,
            opts,
            worker_id,
            registry,
            wake: Arc::new(Notify::new()),
            status,
            publish_pending: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            slots: slots.into(),
        };
        (ctx, finish_rx)
    }

    /// What each pipeline's jobs get stamped with when they start, by name.
    pub fn start_specs(&self) -> Vec<(String, StartSpec)> {
        self.specs.clone()
    }

    pub fn slots(&self) -> usize {
        self.slots.load(Ordering::Relaxed)
    }

    pub fn lease(&self) -> Duration {
        self.config.workers.lease
    }

    /// This node's registration, sent with every heartbeat.
    pub fn beat(&self) -> WorkerBeat {
        WorkerBeat {
            id: self.worker_id.clone(),
            host: crate::job::hostname(),
            pid: std::process::id() as i64,
            slots: self.slots.load(Ordering::Relaxed) as i32,
            busy: self.registry.len() as i32,
            paused: self.paused.load(Ordering::Relaxed),
            pipelines: self.config.pipeline_names(),
        }
    }

    /// Publish the slots' state to the handle, soon: every job's start, step
    /// and end asks for it, and each reading copies every running slot's
    /// status, so the requests made while other tasks are ready (a cycle's
    /// jobs start and end together) share one reading, taken once they
    /// have run. A request made after the reading began schedules another.
    pub fn publish(self: &Arc<Self>) {
        if self.publish_pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let ctx = self.clone();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            ctx.publish_pending.store(false, Ordering::Release);
            ctx.publish_now();
        });
    }

    fn publish_now(&self) {
        let (running, leased) = self.registry.occupancy();
        self.status.send_modify(|s| {
            s.running = running;
            s.leased = leased;
            s.paused = self.paused.load(Ordering::Relaxed);
            s.slots = self.slots.load(Ordering::Relaxed);
        });
    }

    /// Record (or clear) a background loop's database error for display.
    pub fn database_error(&self, err: Option<String>) {
        self.status.send_if_modified(|s| {
            if s.database_error != err {
                s.database_error = err;
                true
            } else {
                false
            }
        });
    }

    fn set_draining(&self, until: Option<Instant>) {
        self.status.send_modify(|s| s.draining_until = until);
    }
}

/// What a pipeline's jobs get stamped with when they start.
pub fn start_spec(config: &Config, pipeline: &crate::config::Pipeline) -> StartSpec {
    StartSpec {
        lease: config.workers.lease,
        on_stale: pipeline.on_stale,
        backoff: pipeline.backoff,
    }
}

pub async fn run(
    ctx: Arc<Ctx>,
    mut control: mpsc::UnboundedReceiver<Control>,
    mut finish_rx: FinishReceiver,
) {
    let background = CancellationToken::new();
    let mut loops = JoinSet::new();
    loops.spawn(heartbeat::run(ctx.clone(), background.clone()));
    loops.spawn(reaper::run(ctx.clone(), background.clone()));
    loops.spawn(notices::run(ctx.clone(), background.clone()));
    // A draining node fires no more schedules: the jobs it fired would
    // wait for another node, and the nodes still up fire the slots.
    let firing = background.child_token();
    if ctx.opts.scheduler {
        loops.spawn(scheduler::run(ctx.clone(), firing.clone()));
    }

    let mut jobs = JoinSet::new();
    let mut backoff = Backoff::default();
    let mut drain_deadline: Option<tokio::time::Instant> = None;
    let mut shutdown_sent = false;
    let mut finishes = Vec::new();
    let mut flight = InFlight::new(cycles_in_flight(&ctx));
    let mut answered: Option<Settled> = None;
    // A claim runs with every cycle that writes finishes, and otherwise
    // only when there may be new work: at start, on a wake-up (new job,
    // freed slot), at each poll, and while claims come back full.
    let mut claim_due = true;
    loop {
        while jobs.try_join_next().is_some() {}
        while let Some(settled) = answered.take().or_else(|| flight.try_settled()) {
            let signals = Drained {
                drain: drain_deadline.is_some(),
                shutdown: shutdown_sent,
            };
            claim_due |= settle(&ctx, settled, &mut jobs, &mut backoff, signals).await;
        }
        let claiming = !ctx.paused.load(Ordering::Relaxed) && drain_deadline.is_none();
        if flight.has_room() {
            cycle::gather(&mut finish_rx, &mut finishes, flight.running(&ctx)).await;
            let claim = if claiming && (claim_due || !finishes.is_empty()) {
                flight.claim_request(&ctx, finishes.len())
            } else {
                None
            };
            // A claim sent answers the due one; with no slot free and none
            // held by a cycle in flight, the jobs' finishes will claim. A
            // cycle in flight may free slots without filling them: then
            // the claim stays due.
            if claiming && (claim.is_some() || flight.holding() == 0) {
                claim_due = false;
            }
            if claim.is_some() || !finishes.is_empty() {
                flight.send(&ctx, std::mem::take(&mut finishes), claim);
            }
        }
        ctx.publish();
        if drain_deadline.is_some() && jobs.is_empty() && flight.is_empty() {
            break;
        }
        tokio::select! {
            c = control.recv() => {
                claim_due = true;
                match c {
                    Some(Control::Pause(p)) => ctx.paused.store(p, Ordering::Relaxed),
                    Some(Control::SetSlots(n)) => ctx.slots.store(n, Ordering::Relaxed),
                    Some(Control::Drain(grace)) if drain_deadline.is_none() => {
                        tracing::info!("draining: running jobs get {grace:?}");
                        let until = tokio::time::Instant::now() + grace;
                        drain_deadline = Some(until);
                        begin_drain(&ctx, &firing, until);
                    }
                    Some(Control::Drain(_)) => {}
                    Some(Control::Stop) | None => {
                        let now = tokio::time::Instant::now();
                        drain_deadline = Some(now);
                        begin_drain(&ctx, &firing, now);
                        ctx.registry.signal_all(JobSignal::Shutdown);
                        shutdown_sent = true;
                    }
                }
            }
            Some(f) = finish_rx.recv() => finishes.push(f),
            settled = flight.settled() => answered = Some(settled),
            // Only a drain waits for the tasks themselves: a task whose job
            // ends frees its slot through the cycle or `wake`, and waking
            // this loop for every task's exit besides cost a pass per job.
            Some(_) = jobs.join_next(), if drain_deadline.is_some() && !jobs.is_empty() => {}
            _ = ctx.wake.notified(), if claiming => claim_due = true,
            _ = tokio::time::sleep(ctx.config.workers.poll), if claiming => claim_due = true,
            _ = sleep_until(drain_deadline), if drain_deadline.is_some() && !shutdown_sent => {
                tracing::info!("drain grace over: stopping running jobs");
                ctx.registry.signal_all(JobSignal::Shutdown);
                shutdown_sent = true;
            }
        }
    }
    background.cancel();
    while loops.join_next().await.is_some() {}
    let (r, _) = super::retry::until_settled("deregister worker", || {
        let store = ctx.store.clone();
        let id = ctx.worker_id.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(2), store.worker_stopped(&id))
                .await
                .unwrap_or(Ok(()))
        }
    })
    .await;
    if let Err(e) = r {
        tracing::warn!("deregister worker: {e}");
    }
    // Read now, so that the status is current when `stopped` is set.
    ctx.publish_now();
    ctx.status.send_modify(|s| s.stopped = true);
    tracing::info!("engine stopped");
}

/// What a drain starts, whether its grace is long or none: no more
/// schedule fires, the status shows the deadline, the jobs are told.
fn begin_drain(ctx: &Ctx, firing: &CancellationToken, until: tokio::time::Instant) {
    firing.cancel();
    ctx.set_draining(Some(until.into_std()));
    ctx.registry.signal_all(JobSignal::Drain);
}

/// The configured cycles in flight, as many as the backend runs side by
/// side.
fn cycles_in_flight(ctx: &Ctx) -> usize {
    let wanted = ctx.config.workers.cycles_in_flight;
    let most = ctx.store.max_cycles_in_flight();
    if wanted > most {
        tracing::info!("cycles_in_flight = {wanted}: this database runs {most} at a time");
    }
    wanted.min(most)
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Signals a job claimed by a cycle still in flight when the node began
/// to drain or stop has missed.
#[derive(Debug, Clone, Copy)]
struct Drained {
    drain: bool,
    shutdown: bool,
}

/// Take a cycle's answer: run the jobs it claimed. True when its claim
/// came back full (more may wait) or failed (to be retried).
async fn settle(
    ctx: &Arc<Ctx>,
    settled: Settled,
    jobs: &mut JoinSet<()>,
    backoff: &mut Backoff,
    missed: Drained,
) -> bool {
    match settled.claimed {
        Ok(claimed) => {
            ctx.database_error(None);
            backoff.reset();
            let full = settled.limit > 0 && claimed.len() == settled.limit;
            for c in claimed {
                let Some(lease) = c.job.lease_ref() else {
                    continue;
                };
                let signals = ctx.registry.add(lease);
                if missed.drain {
                    ctx.registry.signal(lease.id, JobSignal::Drain);
                }
                if missed.shutdown {
                    ctx.registry.signal(lease.id, JobSignal::Shutdown);
                }
                // Boxed: the future is about 2 KB, and the task would
                // otherwise copy it whole at each hand-over inside spawn.
                let run = Box::pin(job_run::run(ctx.clone(), c.job, c.started, signals));
                jobs.spawn(run);
            }
            full
        }
        Err(e) => {
            tracing::warn!("claim: {e}; retrying");
            ctx.database_error(Some(e.to_string()));
            backoff.wait().await;
            true
        }
    }
}
