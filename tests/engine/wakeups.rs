//! A job enqueued by another process wakes an idle worker at once, not at
//! its next poll: Postgres through NOTIFY, SQLite through the database's
//! change counter (`PRAGMA data_version`).

use std::time::Duration;

use jobdeck::job::State;

use crate::harness::Env;
use crate::on_both_backends;
use crate::scripts::{pipeline, workers};

/// Far longer than the wake-up may take, so a pickup that waited for the
/// poll cannot pass.
const POLL: &str = "60s";

async fn another_process_wakes_an_idle_worker(env: Env) {
    let config = env.config(
        "w.toml",
        &[
            workers("10s", &format!("poll = \"{POLL}\"")),
            pipeline("p", "", "true"),
        ]
        .concat(),
    );
    let w = env.worker(&config, &["--no-scheduler"]);
    w.id(&env).await;
    // The worker's first claim (at start) has found nothing by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..3 {
        let out = env.cli(&["enqueue", "p", "--json"]).await;
        assert!(out.ok(), "enqueue: {}", out.stderr);
        let id = serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()["id"]
            .as_i64()
            .unwrap();
        // A third of the poll: a pickup that waited for it fails here.
        env.wait_state(id, State::Succeeded, Duration::from_secs(20))
            .await;
    }
}

on_both_backends!(another_process_wakes_an_idle_worker);
