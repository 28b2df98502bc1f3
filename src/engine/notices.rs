//! Database push notifications: claim at once when a job is enqueued
//! anywhere (Postgres LISTEN/NOTIFY; on SQLite any other connection's
//! commit, seen through its change counter), stop a cancelled job at once
//! (Postgres only: on SQLite the heartbeat carries cancel requests). The
//! claim loop's poll stays the backstop.

use std::sync::Arc;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::registry::JobSignal;
use super::retry::Backoff;
use super::runtime::Ctx;
use crate::store::Notice;

pub async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let mut backoff = Backoff::default();
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            s = ctx.store.notices() => s,
        };
        let mut stream = match stream {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!("listen for notifications: {e}; retrying");
                tokio::select! { _ = stop.cancelled() => return, _ = backoff.wait() => continue }
            }
        };
        backoff.reset();
        // A notice may have been missed while (re)connecting.
        ctx.wake.notify_one();
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                n = stream.next() => n,
            };
            match next {
                Some(Ok(Notice::JobsAvailable)) => ctx.wake.notify_one(),
                Some(Ok(Notice::CancelRequested(id))) => confirm_cancel(&ctx, id),
                Some(Err(e)) => {
                    tracing::warn!("notifications: {e}; reconnecting");
                    break;
                }
                None => break,
            }
        }
        tokio::select! { _ = stop.cancelled() => return, _ = backoff.wait() => {} }
    }
}

/// A cancel notice is only a hint: Postgres channels span the whole
/// database, so a job with the same id in another schema (another cluster,
/// a parallel test) wakes us too. Stop the job only if its own row, under
/// our lease, asks for it; the heartbeat remains the backstop.
fn confirm_cancel(ctx: &Arc<Ctx>, id: i64) {
    let Some(lease) = ctx.registry.leases().into_iter().find(|l| l.id == id) else {
        return;
    };
    let ctx = ctx.clone();
    tokio::spawn(async move {
        if let Ok(job) = ctx.store.get_job(id).await
            && job.lease_token == Some(lease.token)
            && job.cancel_requested_at.is_some()
        {
            ctx.registry.signal(id, JobSignal::Cancel);
        }
    });
}
