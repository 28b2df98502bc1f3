//! Why a queued job is still waiting, in the words the Queued pane shows.

use chrono::{DateTime, Utc};

use super::Snapshot;
use crate::console::fmt::short_duration;
use crate::job::Job;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// Its target is locked by another job.
    BlockedBy(i64),
    /// A failed attempt is backing off.
    Retry(chrono::Duration),
    /// Scheduled for later.
    Due(chrono::Duration),
    /// No worker that is still alive knows the pipeline.
    NoWorker(String),
    /// Due, unblocked: the next free slot takes it.
    Ready,
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wait::BlockedBy(id) => write!(f, "blocked by #{id}"),
            Wait::Retry(d) => write!(f, "retry in {}", short_duration(*d)),
            Wait::Due(d) => write!(f, "due in {}", short_duration(*d)),
            Wait::NoWorker(p) => write!(f, "no live worker runs {p}"),
            Wait::Ready => f.write_str("ready"),
        }
    }
}

/// The first reason that keeps `job` from being claimed, most specific
/// first: a lock names the job to look at; timing comes next; a missing
/// worker is checked last because it only matters once the job is due.
pub fn why_waiting(job: &Job, snap: &Snapshot, now: DateTime<Utc>) -> Wait {
    if let Some(lock) = job.target.as_deref().and_then(|t| snap.lock_of(t))
        && lock.job_id != job.id
    {
        return Wait::BlockedBy(lock.job_id);
    }
    let until = job.due_at - now;
    if until > chrono::Duration::zero() {
        return if job.attempt > 0 {
            Wait::Retry(until)
        } else {
            Wait::Due(until)
        };
    }
    let served = snap
        .workers
        .iter()
        .any(|w| !w.gone && w.pipelines.contains(&job.pipeline));
    if !served {
        return Wait::NoWorker(job.pipeline.clone());
    }
    Wait::Ready
}
