//! Helpers shared by the integration tests: stores on both backends, and a
//! macro that writes a contract test once and runs it on each.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{ClaimRequest, LeaseRef, NewJob, StartOutcome, StartSpec, Store};

/// Env var naming the Postgres server the contract tests run against.
pub const PG_ENV: &str = "JOBDECK_TEST_POSTGRES";

pub const OPERATOR: &str = "operator:test@host";

/// The built binary, run in `dir` with its data there and no database
/// from the environment.
pub fn jobdeck_in(dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_jobdeck"));
    cmd.current_dir(dir)
        .env_remove("JOBDECK_DB")
        .env("JOBDECK_DATA_DIR", dir.join("data"));
    cmd
}

/// Runs `bench/<script>` with python3 on `text`, written to a temporary
/// file named `file_name` (the scripts read tables out of such files).
pub fn bench_script_on(script: &str, file_name: &str, text: &str) -> Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join(file_name);
    std::fs::write(&file, text).expect("write the script's input");
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("bench")
        .join(script);
    Command::new("python3")
        .arg(&path)
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("python3 runs bench/{script}: {e}"))
}

/// Expect `what` to have succeeded and printed one JSON value.
pub fn stdout_json(out: Output, what: &str) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// A store on a fresh SQLite file. Keep the directory alive for the test.
pub async fn sqlite_store() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("create a temp dir");
    let url = format!("sqlite://{}", dir.path().join("jobdeck.db").display());
    let store = jobdeck::store::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("open {url}: {e}"));
    (store, dir)
}

/// A store in a fresh schema of the `JOBDECK_TEST_POSTGRES` database, or
/// `None` (with a note on stderr) when the variable is unset. A set but
/// unreachable server panics: a contract test must never pass by skipping.
pub async fn postgres_store() -> Option<Store> {
    postgres_store_named().await.map(|(store, _)| store)
}

static SCHEMA_COUNTER: AtomicU32 = AtomicU32::new(0);

/// The server named by [`PG_ENV`]; `None` (with a note on stderr naming
/// `tests`) when the variable is unset.
pub fn postgres_url(tests: &str) -> Option<String> {
    match std::env::var(PG_ENV) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            eprintln!("{tests} did not run: {PG_ENV} unset");
            None
        }
    }
}

/// Like [`postgres_store`], also naming the schema so it can be dropped.
pub async fn postgres_store_named() -> Option<(Store, String)> {
    let base = postgres_url("postgres contract tests")?;
    let schema = format!(
        "t_{}_{}_{:08x}",
        std::process::id(),
        SCHEMA_COUNTER.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>()
    );
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&base)
        .await
        .unwrap_or_else(|e| panic!("{PG_ENV} is set but the server is unreachable: {e}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .unwrap_or_else(|e| panic!("create schema {schema}: {e}"));
    admin.close().await;
    // Every connection of the store's pool starts with this search_path, so
    // the migrations and all queries stay inside the schema.
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
    let store = jobdeck::store::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect to {PG_ENV} in schema {schema}: {e}"));
    Some((store, schema))
}

/// Drop a test schema after a passing test (a failing one keeps its data
/// for a look).
pub async fn drop_schema(schema: &str) {
    let Ok(base) = std::env::var(PG_ENV) else {
        return;
    };
    if let Ok(admin) = sqlx::PgPool::connect(&base).await {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE"
        )))
        .execute(&admin)
        .await;
        admin.close().await;
    }
}

/// `contract_test!(name, |store| async move { … })` defines module `name`
/// with one test per backend running the same body.
#[macro_export]
macro_rules! contract_test {
    ($name:ident, |$store:ident| $body:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                let (store, _dir) = $crate::common::sqlite_store().await;
                let run = |$store: jobdeck::store::Store| $body;
                run(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                let Some((store, schema)) = $crate::common::postgres_store_named().await else {
                    return;
                };
                let run = |$store: jobdeck::store::Store| $body;
                run(store).await;
                $crate::common::drop_schema(&schema).await;
            }
        }
    };
}

/// A job of `pipeline` on `target`, due now.
pub fn new_job(pipeline: &str, target: Option<&str>) -> NewJob {
    NewJob {
        pipeline: pipeline.into(),
        target: target.map(Into::into),
        ..NewJob::default()
    }
}

pub fn claim_req(worker: &str, pipelines: &[&str], limit: usize, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        worker: worker.into(),
        pipelines: pipelines.iter().map(|p| p.to_string()).collect(),
        limit,
        lease,
    }
}

pub fn spec(lease: Duration, on_stale: StalePolicy) -> StartSpec {
    StartSpec {
        lease,
        on_stale,
        backoff: Duration::from_millis(100),
    }
}

/// Enqueue one job and return its id.
pub async fn enqueue(store: &Store, pipeline: &str, target: Option<&str>) -> i64 {
    enqueue_job(store, new_job(pipeline, target)).await
}

/// Enqueue `job` as the operator; its id.
pub async fn enqueue_job(store: &Store, job: NewJob) -> i64 {
    store.enqueue(job, OPERATOR).await.expect("enqueue").id
}

/// A job of `pipeline` without a target, due now, at `priority`.
pub async fn enqueue_at_priority(store: &Store, pipeline: &str, priority: i32) -> i64 {
    let job = NewJob {
        priority,
        ..new_job(pipeline, None)
    };
    enqueue_job(store, job).await
}

/// Claim exactly the job `id` (the only due one of its pipeline) for `worker`.
pub async fn claim_one(store: &Store, worker: &str, pipeline: &str, lease: Duration) -> LeaseRef {
    let jobs = store
        .claim(&claim_req(worker, &[pipeline], 1, lease))
        .await
        .expect("claim");
    assert_eq!(jobs.len(), 1, "expected one claimable job of {pipeline}");
    jobs[0]
        .lease_ref()
        .expect("a claimed job has a lease token")
}

/// Enqueue, claim and start a job; returns its lease and fence.
pub async fn running_job(
    store: &Store,
    worker: &str,
    pipeline: &str,
    target: Option<&str>,
    spec: StartSpec,
) -> (LeaseRef, Option<i64>) {
    let id = enqueue(store, pipeline, target).await;
    let lease = claim_one(store, worker, pipeline, spec.lease).await;
    assert_eq!(lease.id, id);
    match store.start(lease, &spec, worker).await.expect("start") {
        StartOutcome::Started { fence, .. } => (lease, fence),
        other => panic!("job {id} did not start: {other:?}"),
    }
}

/// A job's moves as (from, to, detail), oldest first.
pub async fn moves(store: &Store, id: i64) -> Vec<(Option<State>, State, String)> {
    store
        .job_events(id)
        .await
        .expect("job events")
        .into_iter()
        .map(|e| (e.from, e.to, e.detail))
        .collect()
}

/// The state counts that are not zero, in state order.
pub async fn nonzero_counts(store: &Store) -> Vec<(State, i64)> {
    let counts = store.count_by_state().await.expect("count by state");
    counts.into_iter().filter(|(_, n)| *n != 0).collect()
}

pub const LONG: Duration = Duration::from_secs(60);

pub fn worker_beat(id: &str) -> jobdeck::store::WorkerBeat {
    jobdeck::store::WorkerBeat {
        id: id.into(),
        host: "host-a".into(),
        pid: 4242,
        slots: 4,
        busy: 1,
        paused: false,
        pipelines: vec!["p".into()],
    }
}

/// Run raw SQL on the store's own database (same statement on both
/// backends). Only for states the API cannot reach deterministically, such
/// as the outcome of two concurrent Postgres claims.
pub async fn raw_exec(store: &Store, sql: String) {
    let url = store.display_url();
    match store.kind() {
        jobdeck::store::BackendKind::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&url).await.expect("open sqlite");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .expect("raw sql");
            pool.close().await;
        }
        jobdeck::store::BackendKind::Postgres => {
            let pool = sqlx::PgPool::connect(&url).await.expect("open postgres");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .expect("raw sql");
            pool.close().await;
        }
    }
}

/// A run's table of medians as `bench/run.sh` prints it, with only the
/// process/s column filled: what the history readers in bench/ parse.
pub fn run_table(rows: &[(&str, u32)]) -> String {
    let mut t = String::from(
        "```\nsystem / backend                              enqueue/s  process/s  p50 ms\n---\n",
    );
    for (label, per_s) in rows {
        t.push_str(&format!("{label:44} {:>10} {per_s:>10}    0.80\n", "-"));
    }
    t + "```\n"
}
