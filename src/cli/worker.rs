//! `jobdeck worker`: the engine headless, logging to stderr.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio::signal::unix::{SignalKind, signal};

use super::args::WorkerArgs;
use crate::config::Config;
use crate::engine::{self, EngineOptions};
use crate::job::State;
use crate::store::Store;

/// Where job logs (and the console's log) go: `$JOBDECK_DATA_DIR`, else
/// `$XDG_STATE_HOME/jobdeck`, else `~/.local/state/jobdeck`.
pub fn data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("JOBDECK_DATA_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(d).join("jobdeck");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".local/state/jobdeck"),
        None => PathBuf::from(".jobdeck"),
    }
}

pub async fn run(store: Store, config: Config, a: WorkerArgs) -> Result<i32> {
    if config.pipelines.is_empty() {
        anyhow::bail!(
            "no pipelines: give a config file with [[pipeline]] entries (--config FILE or ./jobdeck.toml)"
        );
    }
    let drain_grace = config.workers.drain_grace;
    let opts = EngineOptions {
        slots: a.slots.map(|s| s as usize),
        scheduler: !a.no_scheduler,
        log_dir: data_dir().join("logs"),
    };
    let handle = engine::start(store.clone(), Arc::new(config), opts);
    tracing::info!("worker {} started", handle.worker_id());

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let idle = wait_idle(&store, a.exit_when_idle);
    tokio::pin!(idle);
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining (a second signal stops at once)"),
        _ = int.recv() => tracing::info!("SIGINT: draining (a second signal stops at once)"),
        _ = &mut idle => tracing::info!("no job queued, leased or running: exiting"),
    }
    let drain = handle.drain(drain_grace);
    tokio::pin!(drain);
    tokio::select! {
        _ = &mut drain => {}
        _ = term.recv() => { tracing::info!("second signal: stopping now"); handle.stop().await }
        _ = int.recv() => { tracing::info!("second signal: stopping now"); handle.stop().await }
    }
    Ok(0)
}

/// Resolves once the queue holds nothing queued, leased or running (stale
/// jobs wait for an operator); never when `enabled` is false.
async fn wait_idle(store: &Store, enabled: bool) {
    if !enabled {
        return std::future::pending().await;
    }
    let mut idle_checks = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        match store.count_by_state().await {
            Ok(counts) => {
                let busy: i64 = [State::Queued, State::Leased, State::Running]
                    .iter()
                    .map(|s| counts.get(s).copied().unwrap_or(0))
                    .sum();
                // Twice in a row, so a job between claim and start is not missed.
                idle_checks = if busy == 0 { idle_checks + 1 } else { 0 };
                if idle_checks >= 2 {
                    return;
                }
            }
            Err(e) => tracing::warn!("idle check: {e}; retrying"),
        }
    }
}
