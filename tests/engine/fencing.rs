//! Self-fencing: a worker that cannot renew (frozen by SIGSTOP, or cut off
//! from Postgres by a proxy) has its step killed by the supervisor before
//! the lease runs out, and once it comes back it writes nothing for the job
//! another worker took over.

use std::time::Duration;

use jobdeck::job::State;

use crate::harness::proxy::Proxy;
use crate::harness::{Env, Kind, Worker, alive, eventually, now_ns, ns_of, pg_addr, url_via};
use crate::scripts::{pipeline, step_pid, workers};
use crate::{on_both_backends, on_postgres};

/// Attempt 1 writes `tick JOB NS` lines until it is killed; later attempts
/// succeed at once.
const TICKER: &str = r#"
echo "pid $JOBDECK_JOB_ID $JOBDECK_ATTEMPT $$ $(date +%s%N)" >> "$LEDGER"
if [ "$JOBDECK_ATTEMPT" = 1 ]; then
  while :; do echo "tick $JOBDECK_JOB_ID $(date +%s%N)" >> "$LEDGER"; sleep 0.05; done
fi
echo "done $JOBDECK_JOB_ID $JOBDECK_ATTEMPT" >> "$LEDGER"
"#;

fn config() -> String {
    [
        workers("3s", ""),
        pipeline("fence", "on_stale = \"retry\"", TICKER),
    ]
    .concat()
}

/// What the frozen (or cut off) worker A did, and what B did after it.
async fn lose_and_take_over(env: &Env, a: &Worker, a_id: &str, id: i64, pid: i32) {
    // Nothing renews the lease any more: its expiry is now fixed. (A renewal
    // already sent may still land; read after it would have.)
    tokio::time::sleep(Duration::from_millis(300)).await;
    let expiry = ns_of(
        env.job(id)
            .await
            .lease_expires_at
            .expect("a running job has a lease"),
    );
    let dead_at = eventually(
        "the supervisor to kill the step",
        Duration::from_secs(10),
        async || (!alive(pid)).then(now_ns),
    )
    .await;
    assert!(
        dead_at < expiry,
        "step {pid} died {} ms after the lease ended",
        (dead_at - expiry) / 1_000_000
    );
    let last_tick: i128 = env
        .ledger_of("tick", id)
        .last()
        .and_then(|l| l.get(2)?.parse().ok())
        .expect("the step ticked");
    assert!(
        last_tick < expiry,
        "the step wrote {} ms after the lease ended",
        (last_tick - expiry) / 1_000_000
    );
    assert!(alive(a.pid), "worker A itself lives on");

    // B's reaper retries the job after lease + grace; B runs attempt 2.
    let job = env
        .wait_state(id, State::Succeeded, Duration::from_secs(20))
        .await;
    assert_eq!(job.attempt, 2);
    let events = env.events(id).await;
    let b_run = events
        .iter()
        .rev()
        .find(|e| e.to == State::Running)
        .expect("a start event");
    assert_ne!(b_run.actor, a_id, "another worker ran attempt 2");
}

/// Nothing written by A for job `id` after `lost_at`.
async fn assert_silent(env: &Env, a_id: &str, id: i64, lost_at: i128) {
    let late: Vec<_> = env
        .events(id)
        .await
        .into_iter()
        .filter(|e| e.actor.contains(a_id) && ns_of(e.at) > lost_at)
        .collect();
    assert!(
        late.is_empty(),
        "worker A wrote after losing job {id}: {late:?}"
    );
    let job = env.job(id).await;
    assert_eq!(
        job.state,
        State::Succeeded,
        "A did not touch the finished job"
    );
    assert_eq!(crate::scripts::count(env, "done", id), 1);
}

async fn frozen_worker_fences_itself(env: Env) {
    let config = env.config("worker.toml", &config());
    let a = env.worker(&config, &["--slots", "2", "--no-scheduler"]);
    let id = env.enqueue("fence", Some("t"), &[]).await;
    let pid = step_pid(&env, id, 1).await;
    let a_id = a.id(&env).await;

    let frozen_at = now_ns();
    a.signal(nix::sys::signal::Signal::SIGSTOP);
    let _b = env.worker(&config, &["--slots", "2", "--no-scheduler"]);
    lose_and_take_over(&env, &a, &a_id, id, pid).await;

    a.signal(nix::sys::signal::Signal::SIGCONT);
    // Give A time to notice: a heartbeat (every lease/3) and its executor's
    // report of the fenced step.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(alive(a.pid), "worker A survives its lost job");
    assert_silent(&env, &a_id, id, frozen_at).await;
}

on_both_backends!(frozen_worker_fences_itself);

/// Postgres only: A reaches the database through a proxy that the test
/// cuts, then restores.
async fn cut_off_worker_fences_itself(env: Env) {
    assert_eq!(env.kind, Kind::Postgres);
    let proxy = Proxy::start(pg_addr()).await;
    let config = env.config("worker.toml", &config());
    let a = env.worker_on(
        &url_via(&env, &proxy.addr),
        &config,
        &["--slots", "2", "--no-scheduler"],
    );
    let id = env.enqueue("fence", Some("t"), &[]).await;
    let pid = step_pid(&env, id, 1).await;
    let a_id = a.id(&env).await;

    let cut_at = now_ns();
    proxy.cut();
    let _b = env.worker(&config, &["--slots", "2", "--no-scheduler"]);
    lose_and_take_over(&env, &a, &a_id, id, pid).await;

    let restored_at = chrono::Utc::now();
    proxy.restore();
    // A is back once its heartbeat reaches the database again.
    eventually(
        "worker A to reconnect",
        Duration::from_secs(20),
        async || {
            let workers = env.store.list_workers().await.ok()?;
            workers
                .into_iter()
                .find(|w| w.id == a_id && w.heartbeat_at > restored_at)
                .map(|_| ())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_silent(&env, &a_id, id, cut_at).await;
}

on_postgres!(cut_off_worker_fences_itself);
