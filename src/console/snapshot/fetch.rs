//! Fetching snapshots: one round of bounded queries, and the background task
//! that repeats it every refresh and publishes the result on a watch channel.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::{Detail, PANE_LIMIT, Snapshot};
use crate::job::State;
use crate::store::{JobFilter, JobOrder, Store, StoreError};

/// The sparkline's bucket and how many buckets it spans.
pub const HIST_BUCKET: Duration = Duration::from_secs(5);
pub const HIST_BUCKETS: usize = 30;

/// A fetch that has not answered by then counts as a failure, so a hung
/// database shows in the header instead of freezing the panes' age.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// What the operator currently asks to see, beyond the fixed panes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchRequest {
    /// Text filter on id, pipeline or target (`/`).
    pub filter: Option<String>,
    /// The job whose detail view is open.
    pub detail: Option<i64>,
}

fn jobs(states: &[State], order: JobOrder, req: &FetchRequest) -> JobFilter {
    JobFilter {
        states: states.to_vec(),
        text: req.filter.clone().filter(|t| !t.is_empty()),
        limit: PANE_LIMIT,
        order,
        ..JobFilter::default()
    }
}

/// One snapshot: the rows each pane can show, counts, locks, workers,
/// schedules, the histogram and (when open) the detail view's job.
pub async fn fetch(store: &Store, req: &FetchRequest) -> Result<Snapshot, StoreError> {
    let s = store.as_ref();
    let (queued, leased, running, stale, finished) = (
        jobs(&[State::Queued], JobOrder::ClaimOrder, req),
        jobs(&[State::Leased], JobOrder::Newest, req),
        jobs(&[State::Running], JobOrder::Newest, req),
        jobs(&[State::Stale], JobOrder::Newest, req),
        jobs(
            &[State::Succeeded, State::Failed, State::Cancelled],
            JobOrder::RecentlyFinished,
            req,
        ),
    );
    let local_before = Utc::now();
    let (db_now, counts, queued, leased, running, stale, finished) = tokio::try_join!(
        s.now(),
        s.count_by_state(),
        s.list_jobs(&queued),
        s.list_jobs(&leased),
        s.list_jobs(&running),
        s.list_jobs(&stale),
        s.list_jobs(&finished),
    )?;
    let (locks, workers, schedules, histogram) = tokio::try_join!(
        s.list_locks(),
        s.list_workers(),
        s.list_schedules(),
        s.finished_histogram(HIST_BUCKET, HIST_BUCKETS),
    )?;
    let detail = match req.detail {
        Some(id) => {
            let (job, events, output) =
                tokio::try_join!(s.get_job(id), s.job_events(id), s.job_output(id))?;
            Some(Detail {
                job,
                events,
                output,
            })
        }
        None => None,
    };
    Ok(Snapshot {
        db_now: Some(db_now),
        clock_skew: db_now - local_before,
        counts,
        queued,
        leased,
        running,
        stale,
        finished,
        locks,
        workers,
        schedules,
        histogram,
        detail,
        error: None,
    })
}

/// The header's wording of a failed fetch.
pub fn unreachable(e: &StoreError) -> String {
    match e {
        StoreError::Unreachable(m) => format!("database unreachable: {m}"),
        other => format!("database unreachable: {other}"),
    }
}

/// Fetch every `refresh` (or at once when nudged or when the request
/// changes) and publish on the returned channel. A failed fetch keeps the
/// last good rows, sets `error`, and is retried at the next tick: the
/// console never exits because the database went away.
pub fn spawn_fetcher(
    store: Store,
    refresh: Duration,
    mut requests: watch::Receiver<FetchRequest>,
    nudge: Arc<Notify>,
) -> (watch::Receiver<Snapshot>, JoinHandle<()>) {
    let (tx, rx) = watch::channel(Snapshot::default());
    let task = tokio::spawn(async move {
        loop {
            let req = requests.borrow_and_update().clone();
            let result = tokio::time::timeout(FETCH_TIMEOUT, fetch(&store, &req)).await;
            match result {
                Ok(Ok(snap)) => {
                    tx.send_replace(snap);
                }
                Ok(Err(e)) => tx.send_modify(|s| s.error = Some(unreachable(&e))),
                Err(_) => tx.send_modify(|s| {
                    s.error = Some(format!(
                        "database unreachable: no answer within {}s",
                        FETCH_TIMEOUT.as_secs()
                    ))
                }),
            }
            tokio::select! {
                _ = tokio::time::sleep(refresh) => {}
                _ = nudge.notified() => {}
                changed = requests.changed() => if changed.is_err() { break },
                _ = tx.closed() => break,
            }
        }
    });
    (rx, task)
}
