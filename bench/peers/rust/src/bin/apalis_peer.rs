//! apalis 1.0 through its public API: bulk push N no-op tasks, run one
//! worker with concurrency C (parallelized on tokio) until all are Done,
//! then the one-at-a-time latency phase. Postgres uses `with_pubsub()`
//! (LISTEN/NOTIFY), SQLite the update-hook listener; both are apalis's own
//! low-latency modes. Everything else is apalis's default `Config`.

use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_postgres::PostgresStorage;
use apalis_sqlite::SqliteStorage;
use futures::stream;
use jobdeck_peer_bench::{Args, latency_phase, on_start, report, wait_started};
use sqlx::postgres::PgPoolOptions;

async fn noop(stamp: i64) -> Result<(), BoxDynError> {
    on_start(stamp);
    Ok(())
}

const LIMIT: Duration = Duration::from_secs(900);

#[tokio::main]
async fn main() {
    let a = match Args::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("apalis_peer: {e}");
            std::process::exit(2);
        }
    };
    let r = match a.backend.as_str() {
        "postgres" => postgres(&a).await,
        "sqlite" => sqlite(&a).await,
        other => Err(format!("unknown backend {other}")),
    };
    if let Err(e) = r {
        eprintln!("apalis_peer: {e}");
        std::process::exit(1);
    }
    // Workers keep running in the background; the report is out.
    std::process::exit(0);
}

fn tasks(n: usize) -> impl futures::Stream<Item = Task<i64>> + Unpin {
    stream::iter((0..n).map(|_| TaskBuilder::new(0i64).build()))
}

async fn postgres(a: &Args) -> Result<(), String> {
    let pool = PgPoolOptions::new()
        .connect(&a.url)
        .await
        .map_err(|e| e.to_string())?;
    PostgresStorage::setup(&pool)
        .await
        .map_err(|e| e.to_string())?;
    let mut sink: PostgresStorage<i64> = PostgresStorage::new(&pool);

    let t0 = Instant::now();
    sink.push_all(&mut tasks(a.jobs))
        .await
        .map_err(|e| e.to_string())?;
    let enqueue_s = t0.elapsed().as_secs_f64();

    let backend = PostgresStorage::<i64>::new(&pool).with_pubsub();
    let worker = WorkerBuilder::new("bench-worker")
        .backend(backend)
        .concurrency(a.concurrency)
        .parallelize(tokio::spawn)
        .build(noop);
    let t1 = Instant::now();
    tokio::spawn(worker.run());
    wait_started(a.jobs, LIMIT).await?;
    let done = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM apalis.jobs WHERE status = 'Done'")
            .fetch_one(&pool)
            .await
            .map_err(|e| e.to_string())
    };
    while (done().await? as usize) < a.jobs {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let process_s = t1.elapsed().as_secs_f64();

    let lat = latency_phase(a.latency_jobs, |stamp| {
        let mut s = sink.clone();
        async move { s.push(stamp).await }
    })
    .await?;
    report(
        "apalis-postgres",
        a,
        a.jobs as f64 / enqueue_s,
        a.jobs as f64 / process_s,
        lat,
    );
    Ok(())
}

async fn sqlite(a: &Args) -> Result<(), String> {
    let (pool, listener) =
        SqliteStorage::connect_with_callback(&a.url).map_err(|e| e.to_string())?;
    SqliteStorage::setup(&pool)
        .await
        .map_err(|e| e.to_string())?;
    let mut sink: SqliteStorage<i64> = SqliteStorage::new(&pool);

    let t0 = Instant::now();
    sink.push_all(&mut tasks(a.jobs))
        .await
        .map_err(|e| e.to_string())?;
    let enqueue_s = t0.elapsed().as_secs_f64();

    let backend = SqliteStorage::<i64>::new(&pool).with_callback(listener);
    let worker = WorkerBuilder::new("bench-worker")
        .backend(backend)
        .concurrency(a.concurrency)
        .parallelize(tokio::spawn)
        .build(noop);
    let t1 = Instant::now();
    tokio::spawn(worker.run());
    wait_started(a.jobs, LIMIT).await?;
    let done = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM Jobs WHERE status = 'Done'")
            .fetch_one(&pool)
            .await
            .map_err(|e| e.to_string())
    };
    while (done().await? as usize) < a.jobs {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let process_s = t1.elapsed().as_secs_f64();

    let lat = latency_phase(a.latency_jobs, |stamp| {
        let mut s = sink.clone();
        async move { s.push(stamp).await }
    })
    .await?;
    report(
        "apalis-sqlite",
        a,
        a.jobs as f64 / enqueue_s,
        a.jobs as f64 / process_s,
        lat,
    );
    Ok(())
}
