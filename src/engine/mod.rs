//! The engine: worker slots, step executor, supervisor, heartbeat, reaper
//! and scheduler. `jobdeck worker` runs it headless; the console embeds it
//! through [`EngineHandle`]. The engine never knows the console exists.

pub mod supervisor;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

/// What one busy slot is doing.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotStatus {
    pub job_id: i64,
    pub pipeline: String,
    pub target: Option<String>,
    /// 0-based index of the step being run, and its name.
    pub step: i32,
    pub step_name: String,
    pub steps_total: i32,
    pub started_at: DateTime<Utc>,
}

/// A snapshot of this node's engine, published on every change.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineStatus {
    pub worker_id: String,
    pub slots: usize,
    pub paused: bool,
    /// Set while draining: when running jobs will be stopped.
    pub draining_until: Option<Instant>,
    /// Whether the last database round trip failed (the engine keeps retrying).
    pub database_error: Option<String>,
    pub running: Vec<SlotStatus>,
    /// Leased but not yet started.
    pub leased: usize,
}

impl EngineStatus {
    pub fn busy(&self) -> usize {
        self.running.len() + self.leased
    }
}

/// Control of a running engine. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    control: tokio::sync::mpsc::UnboundedSender<Control>,
    status: watch::Receiver<EngineStatus>,
}

#[derive(Debug)]
enum Control {
    Pause(bool),
    SetSlots(usize),
    Drain(Duration),
    Stop,
}

impl EngineHandle {
    pub fn status(&self) -> EngineStatus {
        self.status.borrow().clone()
    }
    /// A receiver that changes whenever the status does.
    pub fn subscribe(&self) -> watch::Receiver<EngineStatus> {
        self.status.clone()
    }
    /// Stop (or resume) claiming new jobs; running jobs go on.
    pub fn set_paused(&self, paused: bool) {
        let _ = self.control.send(Control::Pause(paused));
    }
    /// Change the number of slots (at least 1). Extra running jobs finish.
    pub fn set_slots(&self, slots: usize) {
        let _ = self.control.send(Control::SetSlots(slots.max(1)));
    }
    /// Stop claiming, hand leased jobs back, give running jobs `grace`, then
    /// stop them (they take the retry path). Resolves when all slots are idle.
    pub async fn drain(&self, grace: Duration) {
        let _ = self.control.send(Control::Drain(grace));
        self.stopped().await;
    }
    /// Stop at once: running steps are stopped and take the retry path.
    pub async fn stop(&self) {
        let _ = self.control.send(Control::Stop);
        self.stopped().await;
    }
    async fn stopped(&self) {
        let mut rx = self.status.clone();
        // The engine drops its sender when it has fully stopped.
        while rx.changed().await.is_ok() {}
    }
}
