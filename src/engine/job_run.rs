//! One claimed job, from start to finish: take the target's lock per
//! `on_lock_busy`, run the pipeline's steps from the job's current step,
//! advance after each success, and finish. Every write is fenced by the
//! lease token; once the job is lost nothing more is written.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use super::SlotStatus;
use super::registry::JobSignal;
use super::retry::{is_lost, until_settled};
use super::runtime::Ctx;
use super::steps::{self, StepContext};
use crate::config::{LockBusyPolicy, Pipeline};
use crate::engine::executor::{OutputTail, StepEnd, StopReason};
use crate::job::Job;
use crate::store::{LeaseRef, Outcome, StartOutcome, StoreError};

/// How long to wait between lock attempts under `on_lock_busy = "wait"`.
const LOCK_RETRY: Duration = Duration::from_millis(250);
/// Lock-busy requeue delay (DESIGN.md: 1 s ± jitter).
const LOCK_BUSY_DELAY: Duration = Duration::from_secs(1);

/// `started` is `Some((attempt, fence))` when the cycle that claimed the
/// job also started it.
pub async fn run(
    ctx: Arc<Ctx>,
    job: Job,
    started: Option<(i32, Option<i64>)>,
    mut signals: UnboundedReceiver<JobSignal>,
) {
    let id = job.id;
    if let Some(lease) = job.lease_ref() {
        match ctx.config.pipeline(&job.pipeline) {
            Some(pipeline) => run_claimed(&ctx, &job, started, pipeline, lease, &mut signals).await,
            // Claims only take pipelines this node knows; a config reload
            // could still race, so give the job back rather than guess.
            None => {
                unclaim(
                    &ctx,
                    lease,
                    Duration::ZERO,
                    "pipeline unknown to this worker",
                )
                .await
            }
        }
    }
    // A finished job's slot was reused by the cycle that wrote its finish;
    // any other end frees a slot the main loop has not seen yet.
    if ctx.registry.remove(id) {
        ctx.wake.notify_one();
    }
    ctx.publish();
}

async fn run_claimed(
    ctx: &Arc<Ctx>,
    job: &Job,
    started: Option<(i32, Option<i64>)>,
    pipeline: &Pipeline,
    lease: LeaseRef,
    signals: &mut UnboundedReceiver<JobSignal>,
) {
    let running = match started {
        Some(running) => Some(running),
        None => start(ctx, job, pipeline, lease, signals).await,
    };
    let Some((attempt, fence)) = running else {
        return;
    };
    let started = chrono::Utc::now();
    let tail = OutputTail::new();
    // Checkpoints and output come from commands; a pipeline of built-ins
    // needs neither (and saves a round trip and a task per job).
    let has_commands = pipeline
        .steps
        .iter()
        .any(|s| matches!(s.action, crate::config::StepAction::Command { .. }));
    let flusher = has_commands.then(|| spawn_output_flusher(ctx.clone(), lease, tail.clone()));
    let stop_flusher = || {
        if let Some(f) = &flusher {
            f.abort();
        }
    };
    let job_deadline = pipeline.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut checkpoints = if !has_commands {
        Vec::new()
    } else {
        match until_settled("read checkpoints", || {
            ctx.store.checkpoints(&job.pipeline, job.target.as_deref())
        })
        .await
        {
            (Ok(c), _) => c,
            (Err(e), _) => {
                tracing::warn!("job {}: cannot read checkpoints: {e}", job.id);
                Vec::new()
            }
        }
    };

    let mut outcome = Outcome::Succeeded;
    let first = job.step.max(0) as usize;
    for (index, step) in pipeline.steps.iter().enumerate().skip(first) {
        ctx.registry.set_running(
            job.id,
            Some(SlotStatus {
                job_id: job.id,
                pipeline: job.pipeline.clone(),
                target: job.target.clone(),
                step: index as i32,
                step_name: step.name.clone(),
                steps_total: pipeline.steps.len() as i32,
                started_at: started,
            }),
        );
        ctx.publish();
        let step_ctx = StepContext {
            ctx,
            job,
            attempt,
            fence,
            index,
            step,
            checkpoints: &checkpoints,
            tail: &tail,
            job_deadline,
        };
        let end = steps::run(step_ctx, signals).await;
        match end {
            StepEnd::Succeeded { checkpoints: new } => {
                // After the last step the finish is the guarded write that
                // records success; only its checkpoints need a write first.
                let last = index + 1 == pipeline.steps.len();
                let (r, _) = if last && new.is_empty() {
                    (Ok(()), false)
                } else {
                    until_settled("advance step", || {
                        ctx.store.advance_step(lease, index as i32, &new)
                    })
                    .await
                };
                if let Err(e) = r {
                    log_lost(job.id, &e);
                    stop_flusher();
                    return;
                }
                for (k, v) in new {
                    match checkpoints.iter_mut().find(|(key, _)| *key == k) {
                        Some(slot) => slot.1 = v,
                        None => checkpoints.push((k, v)),
                    }
                }
            }
            StepEnd::Failed { error, retry } => {
                outcome = Outcome::Failed {
                    error: format!("step {}: {error}", step.name),
                    retry,
                };
                break;
            }
            StepEnd::TimedOut { after } => {
                outcome = Outcome::Failed {
                    error: format!(
                        "step {}: timed out after {}",
                        step.name,
                        humantime::format_duration(after)
                    ),
                    retry: true,
                };
                break;
            }
            StepEnd::Stopped(StopReason::Cancel) => {
                outcome = Outcome::Cancelled;
                break;
            }
            StepEnd::Stopped(StopReason::Shutdown) => {
                outcome = Outcome::Failed {
                    error: format!("step {}: interrupted (worker shutting down)", step.name),
                    retry: true,
                };
                break;
            }
            StepEnd::Stopped(StopReason::LeaseLost) | StepEnd::Fenced => {
                tracing::warn!(
                    "job {}: lease lost during step {}; writing nothing more",
                    job.id,
                    step.name
                );
                stop_flusher();
                return;
            }
        }
    }
    stop_flusher();
    // The last lines matter most for a failure: save them before finishing.
    if tail.version() > 0 {
        let _ = ctx.store.save_output(lease, &tail.text()).await;
    }
    let (r, _) = until_settled("finish job", || ctx.finishes.call(lease, outcome.clone())).await;
    match r {
        Ok(state) => tracing::debug!("job {} {state}", job.id),
        // After an interrupted write, "lost" may mean our own finish
        // committed; either way the job is no longer ours to touch.
        Err(e) => log_lost(job.id, &e),
    }
}

/// Take the lock and write `running`; `None` when the job went elsewhere.
async fn start(
    ctx: &Arc<Ctx>,
    job: &Job,
    pipeline: &Pipeline,
    lease: LeaseRef,
    signals: &mut UnboundedReceiver<JobSignal>,
) -> Option<(i32, Option<i64>)> {
    let spec = super::runtime::start_spec(&ctx.config, pipeline);
    let waiting_since = tokio::time::Instant::now();
    loop {
        let (r, interrupted) = until_settled("start job", || ctx.starts.call((lease, spec))).await;
        let (holder_job, holder_worker) = match r {
            Ok(StartOutcome::Started { attempt, fence }) => return Some((attempt, fence)),
            Ok(StartOutcome::LockBusy {
                holder_job,
                holder_worker,
            }) => (holder_job, holder_worker),
            Err(e) if interrupted && is_lost(&e) => return reread_started(ctx, lease).await,
            Err(e) => {
                log_lost(job.id, &e);
                return None;
            }
        };
        let target = job.target.as_deref().unwrap_or_default();
        let holder = match &holder_worker {
            Some(w) => format!("job {holder_job} on {w}"),
            None => format!("job {holder_job}"),
        };
        match pipeline.on_lock_busy {
            LockBusyPolicy::Requeue => {
                let jitter = LOCK_BUSY_DELAY.mul_f64(0.8 + 0.4 * rand::random::<f64>());
                unclaim(
                    ctx,
                    lease,
                    jitter,
                    &format!("lock on {target} busy: held by {holder}"),
                )
                .await;
                return None;
            }
            LockBusyPolicy::Fail => {
                let error = format!("lock on {target} busy: held by {holder}");
                let (r, _) = until_settled("fail job", || {
                    ctx.store.fail_leased(lease, &ctx.worker_id, &error)
                })
                .await;
                if let Err(e) = r {
                    log_lost(job.id, &e);
                }
                return None;
            }
            LockBusyPolicy::Wait if waiting_since.elapsed() >= pipeline.lock_wait => {
                let detail = format!(
                    "lock on {target} still held by {holder} after {}",
                    humantime::format_duration(pipeline.lock_wait)
                );
                unclaim(ctx, lease, LOCK_BUSY_DELAY, &detail).await;
                return None;
            }
            LockBusyPolicy::Wait => {
                // The heartbeat keeps renewing this leased job meanwhile.
                let sleep = tokio::time::sleep(LOCK_RETRY);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        _ = &mut sleep => break,
                        s = signals.recv() => match s {
                            Some(JobSignal::Drain | JobSignal::Shutdown) => {
                                unclaim(ctx, lease, Duration::ZERO, "worker draining").await;
                                return None;
                            }
                            Some(JobSignal::LeaseLost) | None => return None,
                            Some(_) => {}
                        }
                    }
                }
            }
        }
    }
}

/// The start's answer was lost to a connection error: the job tells
/// whether it committed.
async fn reread_started(ctx: &Arc<Ctx>, lease: LeaseRef) -> Option<(i32, Option<i64>)> {
    let (r, _) = until_settled("re-read job", || ctx.store.get_job(lease.id)).await;
    match r {
        Ok(j) if j.lease_token == Some(lease.token) && j.state == crate::job::State::Running => {
            Some((j.attempt, j.lock_fence))
        }
        _ => None,
    }
}

async fn unclaim(ctx: &Arc<Ctx>, lease: LeaseRef, delay: Duration, detail: &str) {
    let (r, _) = until_settled("unclaim job", || {
        ctx.store.unclaim(lease, delay, &ctx.worker_id, detail)
    })
    .await;
    if let Err(e) = r {
        log_lost(lease.id, &e);
    }
}

fn log_lost(id: i64, e: &StoreError) {
    if is_lost(e) {
        tracing::warn!("job {id}: {e}");
    } else {
        tracing::error!("job {id}: {e}");
    }
}

/// Save the output tail every second while it changes, so every console
/// can show it live.
fn spawn_output_flusher(
    ctx: Arc<Ctx>,
    lease: LeaseRef,
    tail: OutputTail,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut saved = tail.version();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let v = tail.version();
            if v != saved && ctx.store.save_output(lease, &tail.text()).await.is_ok() {
                saved = v;
            }
        }
    })
}
