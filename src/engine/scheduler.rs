//! Every node runs the scheduler. It upserts the configured schedules, then
//! fires due slots; the store fires each slot in one transaction guarded by
//! the slot it expected, so several nodes never fire one slot twice.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::retry::Backoff;
use super::runtime::Ctx;
use crate::config::{Overlap, Schedule};
use crate::store::{FireResult, FireSlot, ScheduleDef, ScheduleInfo};

/// Cron has one-second resolution; look at least this often.
const TICK: Duration = Duration::from_secs(1);

pub async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let mut backoff = Backoff::default();
    loop {
        match sync(&ctx).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!("scheduler: cannot store the schedules: {e}; retrying");
                tokio::select! { _ = stop.cancelled() => return, _ = backoff.wait() => {} }
            }
        }
    }
    let actor = format!("scheduler:{}", ctx.worker_id);
    loop {
        let wait = match tick(&ctx, &actor).await {
            Ok(wait) => wait,
            Err(e) => {
                tracing::warn!("scheduler: {e}; retrying");
                TICK
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn sync(ctx: &Ctx) -> crate::store::Result<()> {
    let now = ctx.store.now().await?;
    let defs: Vec<(ScheduleDef, Option<DateTime<Utc>>)> = ctx
        .config
        .schedules
        .iter()
        .map(|s| {
            let def = ScheduleDef {
                name: s.name.clone(),
                pipeline: s.pipeline.clone(),
                target: s.target.clone(),
                args: s.args.clone(),
                cron: s.cron.clone(),
                timezone: s.timezone.clone(),
                overlap_queue: s.overlap == Overlap::Queue,
                enabled: s.enabled,
                max_attempts: ctx.config.pipeline(&s.pipeline).map(|p| p.max_attempts),
            };
            (def, s.next_fire_after(now))
        })
        .collect();
    ctx.store.sync_schedules(&defs).await
}

/// Fire what is due; returns how long to sleep before the next look.
async fn tick(ctx: &Ctx, actor: &str) -> crate::store::Result<Duration> {
    let now = ctx.store.now().await?;
    let mut wait = TICK;
    for s in ctx.store.list_schedules().await? {
        if !s.def.enabled || s.paused {
            continue;
        }
        let Some(due) = s.next_fire_at else { continue };
        if due > now {
            let until = (due - now).to_std().unwrap_or_default();
            wait = wait.min(until.max(Duration::from_millis(5)));
            continue;
        }
        // Missed slots coalesce: the next fire is the first after now.
        let next = as_config(&s).next_fire_after(now);
        let slot = FireSlot::Due {
            expected_next: due,
            next,
        };
        match ctx.store.fire_schedule(s.id, slot, actor).await? {
            FireResult::Fired { job_id } => {
                tracing::info!("schedule {} fired job {job_id} (slot {due})", s.def.name);
                ctx.wake.notify_one();
            }
            FireResult::Skipped { blocking_job } => {
                tracing::info!(
                    "schedule {} skipped slot {due}: job {blocking_job} unfinished",
                    s.def.name
                )
            }
            FireResult::NotFired => {}
        }
    }
    Ok(wait)
}

/// The stored schedule as the config type, for its cron arithmetic.
fn as_config(s: &ScheduleInfo) -> Schedule {
    Schedule {
        name: s.def.name.clone(),
        pipeline: s.def.pipeline.clone(),
        target: s.def.target.clone(),
        args: s.def.args.clone(),
        cron: s.def.cron.clone(),
        timezone: s.def.timezone.clone(),
        overlap: if s.def.overlap_queue {
            Overlap::Queue
        } else {
            Overlap::Skip
        },
        enabled: s.def.enabled,
    }
}
