//! `jobdeck console` and `jobdeck demo`: the TUI with this node's engine.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::args::{ConsoleArgs, DemoArgs};
use crate::config::{self, Config};
use crate::console::{self, ConsoleOptions};
use crate::engine::{self, EngineOptions};
use crate::job::operator_actor;
use crate::store::{NewJob, Store};

/// The demo's pipelines, embedded so `jobdeck demo` works from any directory.
const DEMO_CONFIG: &str = include_str!("../../assets/demo.toml");
const DEMO_DB: &str = "sqlite://jobdeck-demo.db";
/// The console drains faster than a headless worker: someone is waiting.
const CONSOLE_DRAIN: Duration = Duration::from_secs(5);

pub async fn console(store: Store, config: Config, a: ConsoleArgs) -> Result<i32> {
    let _log = super::logging::to_file(&super::data_dir(), "console.log")?;
    let config = Arc::new(config);
    let engine = (!a.no_workers).then(|| {
        engine::start(
            store.clone(),
            config.clone(),
            EngineOptions {
                slots: a.slots.map(|s| s as usize),
                scheduler: true,
                log_dir: super::data_dir().join("logs"),
            },
        )
    });
    let node_id = engine.as_ref().map(|e| e.worker_id()).unwrap_or_else(|| {
        format!(
            "{}-{} (watching)",
            crate::job::hostname(),
            std::process::id()
        )
    });
    console::run(ConsoleOptions {
        store,
        engine,
        config,
        refresh: a.refresh,
        readonly: a.readonly,
        node_id,
        drain_grace: CONSOLE_DRAIN,
    })
    .await?;
    Ok(0)
}

pub fn demo_config() -> Result<Config> {
    Ok(config::parse(DEMO_CONFIG, "assets/demo.toml")?)
}

pub fn demo_url(db: Option<&str>) -> String {
    db.unwrap_or(DEMO_DB).to_string()
}

/// Fill the queue so every pane moves at once: a burst of jobs contending
/// for the same targets, and one job that hangs and goes stale.
pub async fn seed_demo(store: &Store) -> Result<()> {
    let actor = operator_actor();
    let targets = [
        "dataset-a",
        "dataset-b",
        "dataset-c",
        "dataset-d",
        "dataset-e",
        "dataset-f",
    ];
    for (i, t) in targets.iter().cycle().take(14).enumerate() {
        let job = NewJob {
            pipeline: "dataset".into(),
            target: Some(t.to_string()),
            priority: (i % 3) as i32,
            ..NewJob::default()
        };
        store.enqueue(job, &actor).await?;
    }
    let stuck = NewJob {
        pipeline: "stuck".into(),
        target: Some("dataset-stuck".into()),
        priority: 10,
        unique_key: Some("demo-stuck".into()),
        ..NewJob::default()
    };
    store.enqueue(stuck, &actor).await?;
    Ok(())
}

pub async fn demo(store: Store, config: Config, a: DemoArgs) -> Result<i32> {
    seed_demo(&store).await?;
    console(
        store,
        config,
        ConsoleArgs {
            readonly: false,
            no_workers: false,
            refresh: a.refresh,
            slots: None,
        },
    )
    .await
}
