//! Renews every lease this node holds in one round trip every lease/3,
//! registers the worker, and tells each job what the renewal said: the
//! lease left (for its supervisor's deadline), a cancel request, or loss.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::registry::JobSignal;
use super::runtime::Ctx;
use crate::store::Renewal;

pub async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let every = ctx.config.workers.renew_every();
    // Retry a failed renewal sooner than a full period: the lease is running out.
    let retry = (every / 4).max(Duration::from_millis(100));
    loop {
        let leases = ctx.registry.leases();
        let sent = Instant::now();
        let wait = match ctx.store.renew(&ctx.beat(), &leases, ctx.lease()).await {
            Ok(results) => {
                ctx.database_error(None);
                let elapsed = sent.elapsed();
                for (lease, renewal) in results {
                    match renewal {
                        // A job that finished while the renewal was in
                        // flight is gone from the registry: nothing lost.
                        Renewal::Lost => {
                            if ctx.registry.signal(lease.id, JobSignal::LeaseLost) {
                                tracing::warn!("job {}: lease lost at renewal", lease.id);
                            }
                        }
                        Renewal::Held {
                            remaining,
                            cancel_requested,
                        } => {
                            // Measured from when the renewal was sent: the
                            // answer may have taken a while to arrive.
                            let left = remaining.saturating_sub(elapsed);
                            ctx.registry.signal(lease.id, JobSignal::Deadline(left));
                            if cancel_requested {
                                ctx.registry.signal(lease.id, JobSignal::Cancel);
                            }
                        }
                    }
                }
                every
            }
            Err(e) => {
                tracing::warn!("lease renewal: {e}; retrying");
                ctx.database_error(Some(e.to_string()));
                retry
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
