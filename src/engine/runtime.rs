//! The engine's main loop: claim into free slots, obey the handle, drain
//! and stop; the background loops (heartbeat, reaper, scheduler, notices)
//! run beside it until it stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::batch::Batcher;
use super::registry::{JobSignal, Registry};
use super::retry::Backoff;
use super::{Control, EngineOptions, EngineStatus, heartbeat, job_run, notices, reaper, scheduler};
use crate::config::Config;
use crate::job::State;
use crate::store::{ClaimRequest, LeaseRef, Outcome, StartOutcome, StartSpec, Store, WorkerBeat};

/// What every part of a running engine shares.
#[derive(Debug)]
pub struct Ctx {
    pub store: Store,
    pub config: Arc<Config>,
    pub opts: EngineOptions,
    pub worker_id: String,
    pub registry: Arc<Registry>,
    pub wake: Arc<Notify>,
    /// Starts and finishes of this node's slots, group-committed.
    pub starts: Batcher<(LeaseRef, StartSpec), StartOutcome>,
    pub finishes: Batcher<(LeaseRef, Outcome), State>,
    status: watch::Sender<EngineStatus>,
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
    ) -> Self {
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
        let finishes = {
            let (store, worker) = (store.clone(), worker_id.clone());
            Batcher::new(
                in_flight(&registry),
                move |items: Arc<Vec<(LeaseRef, Outcome)>>| {
                    let (store, worker) = (store.clone(), worker.clone());
                    async move { store.finish_many(&items, &worker).await }
                },
            )
        };
        Ctx {
            starts,
            finishes,
            store,
            config,
            opts,
            worker_id,
            registry,
            wake: Arc::new(Notify::new()),
            status,
            paused: AtomicBool::new(false),
            slots: slots.into(),
        }
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

    /// Publish the slots' state to the handle.
    pub fn publish(&self) {
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

pub async fn run(ctx: Arc<Ctx>, mut control: mpsc::UnboundedReceiver<Control>) {
    let background = CancellationToken::new();
    let mut loops = JoinSet::new();
    loops.spawn(heartbeat::run(ctx.clone(), background.clone()));
    loops.spawn(reaper::run(ctx.clone(), background.clone()));
    loops.spawn(notices::run(ctx.clone(), background.clone()));
    if ctx.opts.scheduler {
        loops.spawn(scheduler::run(ctx.clone(), background.clone()));
    }

    let mut jobs = JoinSet::new();
    let mut backoff = Backoff::default();
    let mut drain_deadline: Option<tokio::time::Instant> = None;
    let mut shutdown_sent = false;
    loop {
        // Jobs of one finish batch end together: reap all that are done so
        // the next claim fills every free slot in one statement.
        tokio::task::yield_now().await;
        while jobs.try_join_next().is_some() {}
        let claiming = !ctx.paused.load(Ordering::Relaxed) && drain_deadline.is_none();
        let mut batch_full = false;
        if claiming {
            gather_free_slots(&ctx, &mut jobs).await;
            match claim(&ctx, &mut jobs).await {
                Ok(full) => {
                    batch_full = full;
                    backoff.reset();
                }
                Err(e) => {
                    tracing::warn!("claim: {e}; retrying");
                    ctx.database_error(Some(e.to_string()));
                    backoff.wait().await;
                    continue;
                }
            }
        }
        ctx.publish();
        if drain_deadline.is_some() && jobs.is_empty() {
            break;
        }
        let poll = if batch_full {
            Duration::ZERO
        } else {
            ctx.config.workers.poll
        };
        tokio::select! {
            c = control.recv() => match c {
                Some(Control::Pause(p)) => ctx.paused.store(p, Ordering::Relaxed),
                Some(Control::SetSlots(n)) => ctx.slots.store(n, Ordering::Relaxed),
                Some(Control::Drain(grace)) if drain_deadline.is_none() => {
                    tracing::info!("draining: running jobs get {grace:?}");
                    let until = tokio::time::Instant::now() + grace;
                    drain_deadline = Some(until);
                    ctx.set_draining(Some(until.into_std()));
                    ctx.registry.signal_all(JobSignal::Drain);
                }
                Some(Control::Drain(_)) => {}
                Some(Control::Stop) | None => {
                    let now = tokio::time::Instant::now();
                    drain_deadline = Some(now);
                    ctx.set_draining(Some(now.into_std()));
                    ctx.registry.signal_all(JobSignal::Drain);
                    ctx.registry.signal_all(JobSignal::Shutdown);
                    shutdown_sent = true;
                }
            },
            Some(_) = jobs.join_next(), if !jobs.is_empty() => {}
            _ = ctx.wake.notified(), if claiming => {}
            _ = tokio::time::sleep(poll), if claiming => {}
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
    ctx.publish();
    ctx.status.send_modify(|s| s.stopped = true);
    tracing::info!("engine stopped");
}

/// While fewer than half the slots are free and jobs are finishing, wait
/// up to `CLAIM_GATHER` for more to finish, so that one claim (and the
/// start batch after it) covers several slots instead of one each.
async fn gather_free_slots(ctx: &Ctx, jobs: &mut JoinSet<()>) {
    const CLAIM_GATHER: Duration = Duration::from_millis(2);
    let slots = ctx.slots.load(Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + CLAIM_GATHER;
    loop {
        let free = slots.saturating_sub(ctx.registry.len());
        if free == 0 || free * 2 >= slots || jobs.is_empty() {
            return;
        }
        match tokio::time::timeout_at(deadline, jobs.join_next()).await {
            Ok(Some(_)) => while jobs.try_join_next().is_some() {},
            _ => return,
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Claim into the free slots; true when the batch filled them (more may wait).
async fn claim(ctx: &Arc<Ctx>, jobs: &mut JoinSet<()>) -> crate::store::Result<bool> {
    let slots = ctx.slots.load(Ordering::Relaxed);
    let free = slots.saturating_sub(ctx.registry.len());
    if free == 0 || ctx.config.pipelines.is_empty() {
        return Ok(false);
    }
    let req = ClaimRequest {
        worker: ctx.worker_id.clone(),
        pipelines: ctx.config.pipeline_names(),
        limit: free,
        lease: ctx.lease(),
    };
    let claimed = ctx.store.claim(&req).await?;
    ctx.database_error(None);
    let full = claimed.len() == free;
    for job in claimed {
        let Some(lease) = job.lease_ref() else {
            continue;
        };
        let signals = ctx.registry.add(lease);
        jobs.spawn(job_run::run(ctx.clone(), job, signals));
    }
    Ok(full)
}
