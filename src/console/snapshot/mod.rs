//! What one refresh saw: the rows each pane can show plus cluster counts.
//! The draw code reads only this, so it never waits on the database.

pub mod fetch;
pub mod why;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::job::{Event, Job, State};
use crate::store::{LockInfo, ScheduleInfo, WorkerInfo};

/// Rows fetched per pane: more than any terminal shows, few enough that a
/// database with a million jobs stays cheap to watch.
pub const PANE_LIMIT: usize = 200;

/// The detail view's job, with its history and output tail.
#[derive(Debug, Clone, PartialEq)]
pub struct Detail {
    pub job: Job,
    pub events: Vec<Event>,
    pub output: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    /// The database's clock when the snapshot was taken.
    pub db_now: Option<DateTime<Utc>>,
    /// Database clock minus this machine's clock, so that lease countdowns
    /// drawn between refreshes follow the database's time.
    pub clock_skew: chrono::Duration,
    pub counts: BTreeMap<State, i64>,
    pub queued: Vec<Job>,
    pub leased: Vec<Job>,
    pub running: Vec<Job>,
    pub stale: Vec<Job>,
    pub finished: Vec<Job>,
    pub locks: Vec<LockInfo>,
    pub workers: Vec<WorkerInfo>,
    pub schedules: Vec<ScheduleInfo>,
    /// Finished jobs per interval, oldest first.
    pub histogram: Vec<u64>,
    pub detail: Option<Detail>,
    /// Set when the last fetch failed; the other fields are the last good ones.
    pub error: Option<String>,
}

impl Snapshot {
    pub fn count(&self, state: State) -> i64 {
        self.counts.get(&state).copied().unwrap_or(0)
    }

    /// Whether `target` is locked, and by which job.
    pub fn lock_of(&self, target: &str) -> Option<&LockInfo> {
        self.locks.iter().find(|l| l.target == target)
    }

    pub fn worker(&self, id: &str) -> Option<&WorkerInfo> {
        self.workers.iter().find(|w| w.id == id)
    }

    /// Any job in the snapshot, wherever it is shown.
    pub fn job(&self, id: i64) -> Option<&Job> {
        [
            &self.queued,
            &self.leased,
            &self.running,
            &self.stale,
            &self.finished,
        ]
        .into_iter()
        .flatten()
        .find(|j| j.id == id)
        .or_else(|| self.detail.as_ref().map(|d| &d.job).filter(|j| j.id == id))
    }
}
