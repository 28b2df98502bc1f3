//! `jobdeck bench`: enqueue no-op jobs in bulk, run the real engine (the
//! same code path as `jobdeck worker`) until all are done, then measure
//! enqueue→start latency with jobs enqueued one at a time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::config;
use crate::engine::{self, EngineHandle, EngineOptions};
use crate::job::State;
use crate::store::{self, BackendKind, JobFilter, NewJob, Store};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Jobs to enqueue and process
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub jobs: u32,
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub slots: u32,
    /// Engine cycles sent before the first answers (`[workers] cycles_in_flight`)
    #[arg(long, default_value_t = config::DEFAULT_CYCLES_IN_FLIGHT as u32, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub cycles_in_flight: u32,
    /// How long the engine polls for a cycle's answer before it sleeps
    /// (`[workers] busy_poll`; 0s = sleep at once)
    #[arg(long, default_value = "0s", value_parser = super::args::parse_duration)]
    pub busy_poll: std::time::Duration,
    /// Spread jobs over this many targets (0 = no targets, no locks)
    #[arg(long, default_value_t = 0)]
    pub targets: u32,
    /// Jobs enqueued one at a time for the latency phase
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub latency_jobs: u32,
    /// Skip the latency phase
    #[arg(long)]
    pub no_latency: bool,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub scale: super::args::ScaleArgs,
}

#[derive(Debug, Serialize)]
struct Report {
    backend: BackendKind,
    jobs: u32,
    slots: u32,
    targets: u32,
    enqueue_per_s: f64,
    process_per_s: f64,
    latency_ms: Option<Latency>,
}

#[derive(Debug, Serialize)]
struct Latency {
    p50: f64,
    p95: f64,
    p99: f64,
}

/// The bench's own pipeline: one built-in no-op step.
const BENCH_CONFIG: &str = r#"
[workers]
lease = "30s"
poll = "200ms"

[[pipeline]]
name = "bench"
[[pipeline.step]]
name = "noop"
builtin = "noop"
"#;

/// Runs in a scratch database, never in the one `--db` (or `JOBDECK_DB`)
/// names: a fresh schema of a Postgres database, a fresh file in a new
/// directory beside a SQLite file (the same disk), or in the temp
/// directory without `--db`; all dropped afterwards.
pub async fn run(db: Option<String>, a: BenchArgs) -> Result<i32> {
    if a.scale.scale {
        return super::bench_scale::run(db, a.scale, a.json).await;
    }
    let name = format!("jobdeck-bench-{}", std::process::id());
    let pg_base = store::scratch::postgres_base(db.as_deref())?;
    let scratch = store::scratch::sqlite_dir(db.as_deref().filter(|_| pg_base.is_none()), &name)?;
    let result = match pg_base {
        Some(base) => {
            let schema = name.replace('-', "_");
            in_pg_schema(base, &schema, &a, &scratch).await
        }
        None => {
            let url = format!("sqlite://{}", scratch.join("bench.db").display());
            bench(&url, &a, &scratch).await
        }
    };
    let _ = std::fs::remove_dir_all(&scratch);
    let report = result?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_human(&report);
    }
    Ok(0)
}

async fn in_pg_schema(
    base: &str,
    schema: &str,
    a: &BenchArgs,
    scratch: &std::path::Path,
) -> Result<Report> {
    let url = store::scratch::create_pg_schema(base, schema).await?;
    let result = bench(&url, a, scratch).await;
    store::scratch::drop_pg_schema(base, schema).await?;
    result
}

async fn bench(url: &str, a: &BenchArgs, scratch: &std::path::Path) -> Result<Report> {
    let store = super::connect_for_slots(url, a.slots as usize).await?;
    let mut config = config::parse(BENCH_CONFIG, "bench")?;
    config.workers.cycles_in_flight = a.cycles_in_flight as usize;
    config.workers.busy_poll = a.busy_poll;
    let config = Arc::new(config);
    let target = |i: u32| (a.targets > 0).then(|| format!("t{}", i % a.targets));

    let jobs: Vec<NewJob> = (0..a.jobs)
        .map(|i| NewJob {
            pipeline: "bench".into(),
            target: target(i),
            ..NewJob::default()
        })
        .collect();
    let t0 = Instant::now();
    for chunk in jobs.chunks(5_000) {
        store.enqueue_many(chunk.to_vec(), "bench").await?;
    }
    let enqueue_s = t0.elapsed().as_secs_f64();

    let opts = EngineOptions {
        slots: Some(a.slots as usize),
        scheduler: false,
        log_dir: scratch.join("logs"),
    };
    let t1 = store.now().await?;
    let engine = engine::start(store.clone(), config, opts);
    wait_succeeded(&store, a.jobs as i64).await?;
    let process_s = (last_finished(&store).await? - t1)
        .num_microseconds()
        .unwrap_or(1) as f64
        / 1e6;

    let latency = if a.no_latency {
        None
    } else {
        Some(latency(&store, &engine, a, a.jobs as i64).await?)
    };
    engine.stop().await;
    Ok(Report {
        backend: store.kind(),
        jobs: a.jobs,
        slots: a.slots,
        targets: a.targets,
        enqueue_per_s: a.jobs as f64 / enqueue_s,
        process_per_s: a.jobs as f64 / process_s,
        latency_ms: latency,
    })
}

/// A bench whose jobs stop finishing for this long gives up: the engine
/// retries a failing cycle forever, as a worker should, but a benchmark
/// that never ends measures nothing.
const STALL_LIMIT: Duration = Duration::from_secs(60);

/// Wait until `n` jobs succeeded. Polled slowly so the bench's own counting
/// does not compete with the engine; the caller takes the end time from the
/// jobs' own `finished_at`. Fails when none finishes for `stall_limit`.
async fn wait_succeeded(store: &Store, n: i64) -> Result<()> {
    wait_succeeded_within(store, n, STALL_LIMIT).await
}

async fn wait_succeeded_within(store: &Store, n: i64, stall_limit: Duration) -> Result<()> {
    let mut last = (-1, tokio::time::Instant::now());
    loop {
        let counts = store.count_by_state().await?;
        let done = counts.get(&State::Succeeded).copied().unwrap_or(0);
        let bad = counts.get(&State::Failed).copied().unwrap_or(0);
        anyhow::ensure!(bad == 0, "{bad} bench jobs failed");
        if done >= n {
            return Ok(());
        }
        if done != last.0 {
            last = (done, tokio::time::Instant::now());
        }
        anyhow::ensure!(
            last.1.elapsed() < stall_limit,
            "no bench job finished in {} ({done} of {n} done); the engine's errors are logged above",
            humantime::format_duration(stall_limit)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// When the last job finished, by the database's clock.
async fn last_finished(store: &Store) -> Result<chrono::DateTime<chrono::Utc>> {
    let filter = JobFilter {
        states: vec![State::Succeeded],
        limit: 1,
        order: crate::store::JobOrder::RecentlyFinished,
        ..JobFilter::default()
    };
    let last = store.list_jobs(&filter).await?;
    last.first()
        .and_then(|j| j.finished_at)
        .context("no finished job to time")
}

/// Enqueue jobs one at a time into an idle engine and read back, from the
/// database's own timestamps, how long each waited to start.
async fn latency(
    store: &Store,
    engine: &EngineHandle,
    a: &BenchArgs,
    already: i64,
) -> Result<Latency> {
    for i in 0..a.latency_jobs {
        let job = NewJob {
            pipeline: "bench".into(),
            target: (a.targets > 0).then(|| format!("t{}", i % a.targets)),
            ..NewJob::default()
        };
        store.enqueue(job, "bench").await?;
        // A producer in this process wakes the engine directly, as the
        // console's enqueue does; other processes rely on NOTIFY or polling.
        engine.wake();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_succeeded(store, already + a.latency_jobs as i64).await?;
    let filter = JobFilter {
        states: vec![State::Succeeded],
        limit: a.latency_jobs as usize,
        ..JobFilter::default()
    };
    let mut waits: Vec<f64> = store
        .list_jobs(&filter)
        .await?
        .iter()
        .filter_map(|j| {
            j.started_at
                .map(|s| (s - j.created_at).num_microseconds().unwrap_or(0) as f64 / 1000.0)
        })
        .collect();
    waits.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        waits
            .get(((waits.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Ok(Latency {
        p50: pct(0.50),
        p95: pct(0.95),
        p99: pct(0.99),
    })
}

fn print_human(r: &Report) {
    println!(
        "backend {:?}, {} jobs, {} slots, {} targets",
        r.backend, r.jobs, r.slots, r.targets
    );
    println!("enqueue    {:>10.0} jobs/s", r.enqueue_per_s);
    println!("process    {:>10.0} jobs/s", r.process_per_s);
    if let Some(l) = &r.latency_ms {
        println!(
            "enqueue→start latency  p50 {:.1} ms  p95 {:.1} ms  p99 {:.1} ms",
            l.p50, l.p95, l.p99
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_bench_whose_jobs_stop_finishing_gives_up() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("b.db").display());
        let store = crate::store::connect(&url).await.unwrap();
        let job = NewJob {
            pipeline: "bench".into(),
            ..Default::default()
        };
        store.enqueue(job, "bench").await.unwrap();
        // No engine runs: the job stays queued.
        let err = wait_succeeded_within(&store, 1, Duration::from_millis(500))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no bench job finished in 500ms (0 of 1 done)"),
            "{err}"
        );
    }
}
