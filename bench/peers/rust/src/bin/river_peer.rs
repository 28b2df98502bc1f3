//! River's Rust client (riverqueue 0.5) through its public API: bulk
//! `insert_many` N no-op jobs, run one client with a queue of C workers until
//! River shows them all `completed`, then the one-at-a-time latency phase.
//! The fetch cooldown is lowered from River's 100 ms default to its 1 ms
//! minimum: at 100 ms one client fetches at most 10 times a second, which
//! caps 8 workers far below what the database allows. All else is default.

use std::str::FromStr;
use std::time::{Duration, Instant};

use jobdeck_peer_bench::{Args, latency_phase, on_start, report, wait_started};
use riverqueue::migrate::{PostgresMigrator, SqliteMigrator};
use riverqueue::sqlx::postgres::PgPoolOptions;
use riverqueue::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use riverqueue::{Client, Job, JobArgs, QueueConfig, WorkContext, WorkOutcome, Workers};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Deserialize, JobArgs, Serialize)]
#[river(kind = "noop")]
struct Noop {
    stamp: i64,
}

async fn noop(_ctx: WorkContext, job: Job<Noop>) -> Result<WorkOutcome, std::io::Error> {
    on_start(job.args.stamp);
    Ok(WorkOutcome::Complete)
}

const LIMIT: Duration = Duration::from_secs(900);
const COOLDOWN: Duration = Duration::from_millis(1);

#[tokio::main]
async fn main() {
    let a = match Args::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("river_peer: {e}");
            std::process::exit(2);
        }
    };
    let r = match a.backend.as_str() {
        "postgres" => postgres(&a).await,
        "sqlite" => sqlite(&a).await,
        other => Err(format!("unknown backend {other}")),
    };
    if let Err(e) = r {
        eprintln!("river_peer: {e}");
        std::process::exit(1);
    }
    std::process::exit(0);
}

fn workers() -> Result<Workers, String> {
    let mut w = Workers::new();
    w.add_fn(noop).map_err(|e| e.to_string())?;
    Ok(w)
}

/// Bulk insert, process, wait for the database to show every job completed
/// (River finalises completions asynchronously), then the latency phase.
async fn drive<F, Fut>(label: &str, a: &Args, client: Client, completed: F) -> Result<(), String>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<i64, String>>,
{
    let t0 = Instant::now();
    for chunk in (0..a.jobs).collect::<Vec<_>>().chunks(5_000) {
        client
            .insert_many(chunk.iter().map(|_| Noop { stamp: 0 }))
            .await
            .map_err(|e| e.to_string())?;
    }
    let enqueue_s = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut run = client.start().map_err(|e| e.to_string())?;
    wait_started(a.jobs, LIMIT).await?;
    while (completed().await? as usize) < a.jobs {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let process_s = t1.elapsed().as_secs_f64();

    let lat = latency_phase(a.latency_jobs, |stamp| {
        let c = client.clone();
        async move { c.insert(Noop { stamp }).await.map(|_| ()) }
    })
    .await?;
    let _ = tokio::time::timeout(Duration::from_secs(10), run.stop()).await;
    report(
        label,
        a,
        a.jobs as f64 / enqueue_s,
        a.jobs as f64 / process_s,
        lat,
    );
    Ok(())
}

async fn postgres(a: &Args) -> Result<(), String> {
    let pool = PgPoolOptions::new()
        .connect(&a.url)
        .await
        .map_err(|e| e.to_string())?;
    PostgresMigrator::new(pool.clone())
        .migrate_up()
        .await
        .map_err(|e| e.to_string())?;
    let client = Client::builder(pool.clone())
        .workers(workers()?)
        .fetch_cooldown(COOLDOWN)
        .queue("default", QueueConfig::new(a.concurrency))
        .build()
        .map_err(|e| e.to_string())?;
    let completed = || async {
        riverqueue::sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM river_job WHERE state = 'completed'",
        )
        .fetch_one(&pool)
        .await
        .map_err(|e| e.to_string())
    };
    drive("river-postgres", a, client, completed).await
}

async fn sqlite(a: &Args) -> Result<(), String> {
    // WAL and a busy timeout, as River's own SQLite example sets them.
    let options = SqliteConnectOptions::from_str(&a.url)
        .map_err(|e| e.to_string())?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .connect_with(options)
        .await
        .map_err(|e| e.to_string())?;
    SqliteMigrator::new(pool.clone())
        .migrate_up()
        .await
        .map_err(|e| e.to_string())?;
    let client = Client::builder(pool.clone())
        .workers(workers()?)
        .fetch_cooldown(COOLDOWN)
        .queue("default", QueueConfig::new(a.concurrency))
        .build()
        .map_err(|e| e.to_string())?;
    let completed = || async {
        riverqueue::sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM river_job WHERE state = 'completed'",
        )
        .fetch_one(&pool)
        .await
        .map_err(|e| e.to_string())
    };
    drive("river-sqlite", a, client, completed).await
}
