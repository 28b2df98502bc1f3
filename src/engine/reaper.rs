//! Every node runs the reaper: expired leases go back to the queue or to
//! stale (per the job's `on_stale`), silent workers are marked gone, old
//! finished jobs are pruned. Each decision is its own transaction in the
//! store, so several reapers at once are harmless.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::runtime::Ctx;

const PRUNE_EVERY: Duration = Duration::from_secs(60);

pub async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let workers = &ctx.config.workers;
    let every = workers.reaper_every();
    let actor = format!("reaper:{}", ctx.worker_id);
    let mut last_prune: Option<tokio::time::Instant> = None;
    loop {
        match ctx.store.expire_leases(workers.stale_grace(), &actor).await {
            Ok(report) => {
                for id in &report.requeued {
                    tracing::info!("job {id}: lease expired before start; requeued");
                }
                for id in report
                    .stale
                    .iter()
                    .chain(&report.retried)
                    .chain(&report.finished)
                {
                    tracing::warn!("job {id}: lease expired while running; worker presumed dead");
                }
                if !report.requeued.is_empty() || !report.retried.is_empty() {
                    ctx.wake.notify_one();
                }
            }
            Err(e) => tracing::warn!("reaper: {e}; retrying"),
        }
        match ctx.store.mark_gone_workers(workers.lease * 3).await {
            Ok(gone) => {
                for w in gone {
                    tracing::warn!("worker {w}: no heartbeat for 3 leases; marked gone");
                }
            }
            Err(e) => tracing::warn!("reaper: {e}; retrying"),
        }
        if last_prune.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
            match ctx.store.prune_finished(workers.retention).await {
                Ok(n) if n > 0 => tracing::info!("pruned {n} finished jobs"),
                Ok(_) => {}
                Err(e) => tracing::warn!("prune: {e}; retrying"),
            }
            last_prune = Some(tokio::time::Instant::now());
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
