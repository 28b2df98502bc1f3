//! The jobs this node holds, shared by the slots, the heartbeat and the
//! notice listener.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::mpsc;

use super::SlotStatus;
use crate::store::LeaseRef;

/// What a job's task is told from outside.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JobSignal {
    /// The last renewal succeeded: this much lease is left.
    Deadline(Duration),
    /// An operator asked to cancel the job.
    Cancel,
    /// The renewal says the job is no longer ours.
    LeaseLost,
    /// The node drains: a job not started yet goes back to the queue.
    Drain,
    /// The node stops now: the running step is stopped.
    Shutdown,
}

#[derive(Debug)]
struct Entry {
    lease: LeaseRef,
    signals: mpsc::UnboundedSender<JobSignal>,
    /// `false` for a `hang` step: its lease is no longer renewed, as if its
    /// worker froze.
    renew: bool,
    running: Option<SlotStatus>,
}

#[derive(Debug, Default)]
pub struct Registry {
    jobs: Mutex<HashMap<i64, Entry>>,
}

impl Registry {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<i64, Entry>) -> T) -> T {
        // A poisoned lock means a panic elsewhere already; the map is still
        // consistent (every update is a single insert/remove/assign).
        let mut guard = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    pub fn add(&self, lease: LeaseRef) -> mpsc::UnboundedReceiver<JobSignal> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.with(|m| {
            m.insert(
                lease.id,
                Entry {
                    lease,
                    signals: tx,
                    renew: true,
                    running: None,
                },
            )
        });
        rx
    }

    /// Forget job `id`; false when it was already gone.
    pub fn remove(&self, id: i64) -> bool {
        self.with(|m| m.remove(&id).is_some())
    }

    pub fn len(&self) -> usize {
        self.with(|m| m.len())
    }

    /// How many jobs this node holds, leaving out those `skip` names.
    pub fn count_unless(&self, skip: impl Fn(i64) -> bool) -> usize {
        self.with(|m| m.keys().filter(|id| !skip(**id)).count())
    }

    pub fn set_running(&self, id: i64, slot: Option<SlotStatus>) {
        self.with(|m| {
            if let Some(e) = m.get_mut(&id) {
                e.running = slot;
            }
        });
    }

    pub fn stop_renewing(&self, id: i64) {
        self.with(|m| {
            if let Some(e) = m.get_mut(&id) {
                e.renew = false;
            }
        });
    }

    /// Leases to renew.
    pub fn leases(&self) -> Vec<LeaseRef> {
        self.with(|m| m.values().filter(|e| e.renew).map(|e| e.lease).collect())
    }

    /// Tell job `id` something; false when this node no longer holds it.
    pub fn signal(&self, id: i64, s: JobSignal) -> bool {
        self.with(|m| m.get(&id).is_some_and(|e| e.signals.send(s).is_ok()))
    }

    pub fn signal_all(&self, s: JobSignal) {
        self.with(|m| {
            for e in m.values() {
                let _ = e.signals.send(s);
            }
        });
    }

    /// (running slots, number of leased-not-started jobs)
    pub fn occupancy(&self) -> (Vec<SlotStatus>, usize) {
        self.with(|m| {
            let mut running: Vec<SlotStatus> =
                m.values().filter_map(|e| e.running.clone()).collect();
            running.sort_by_key(|s| s.job_id);
            let leased = m.len() - running.len();
            (running, leased)
        })
    }
}
