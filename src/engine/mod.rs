//! The engine: worker slots, step executor, supervisor, heartbeat, reaper
//! and scheduler. `jobdeck worker` runs it headless; the console embeds it
//! through [`EngineHandle`]. The engine never knows the console exists.

mod batch;
mod cycle;
pub mod executor;
mod heartbeat;
mod job_run;
mod notices;
mod output;
mod reaper;
mod registry;
pub mod retry;
mod runtime;
mod scheduler;
mod steps;
pub mod supervisor;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, watch};

use crate::config::Config;
use crate::store::Store;

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
    /// The last database error of a background loop (they keep retrying);
    /// cleared by the next success.
    pub database_error: Option<String>,
    pub running: Vec<SlotStatus>,
    /// Leased but not yet started.
    pub leased: usize,
    /// Set once the engine has fully stopped.
    pub stopped: bool,
}

impl EngineStatus {
    pub fn busy(&self) -> usize {
        self.running.len() + self.leased
    }
}

#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Overrides `[workers] slots`.
    pub slots: Option<usize>,
    /// Run the cron scheduler on this node.
    pub scheduler: bool,
    /// Where each job's output log goes (`job-<id>.log`).
    pub log_dir: PathBuf,
}

/// Start the engine on `store` with the pipelines of `config`.
pub fn start(store: Store, config: Arc<Config>, opts: EngineOptions) -> EngineHandle {
    let slots = opts.slots.unwrap_or(config.workers.slots).max(1);
    let worker_id = format!(
        "{}-{}-{:04x}",
        crate::job::hostname(),
        std::process::id(),
        rand::random::<u16>()
    );
    let (status_tx, status_rx) = watch::channel(EngineStatus {
        worker_id: worker_id.clone(),
        slots,
        ..EngineStatus::default()
    });
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    let (ctx, finish_rx) = runtime::Ctx::new(store, config, opts, worker_id, slots, status_tx);
    let ctx = Arc::new(ctx);
    tokio::spawn(runtime::run(ctx.clone(), control_rx, finish_rx));
    EngineHandle {
        control: control_tx,
        status: status_rx,
        wake: ctx.wake.clone(),
    }
}

/// Control of a running engine. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    control: mpsc::UnboundedSender<Control>,
    status: watch::Receiver<EngineStatus>,
    wake: Arc<tokio::sync::Notify>,
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
    pub fn worker_id(&self) -> String {
        self.status.borrow().worker_id.clone()
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
    /// Claim now: a job was just enqueued in this process.
    pub fn wake(&self) {
        self.wake.notify_one();
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
    /// Resolves once the engine has fully stopped.
    pub async fn stopped(&self) {
        let mut rx = self.status.clone();
        let _ = rx.wait_for(|s| s.stopped).await;
    }
}
