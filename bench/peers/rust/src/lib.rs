//! What the apalis and River harnesses share: arguments, the job counter,
//! the latency phase and the JSON report that bench/run.sh reads.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub struct Args {
    pub backend: String,
    pub url: String,
    pub jobs: usize,
    pub concurrency: usize,
    pub latency_jobs: usize,
}

impl Args {
    pub fn parse() -> Result<Self, String> {
        let mut a = Args {
            backend: "postgres".into(),
            url: String::new(),
            jobs: 20_000,
            concurrency: 8,
            latency_jobs: 200,
        };
        let mut it = std::env::args().skip(1);
        while let Some(key) = it.next() {
            let val = it.next().ok_or(format!("{key} needs a value"))?;
            let num = || {
                val.parse::<usize>()
                    .map_err(|_| format!("{key}: not a number: {val}"))
            };
            match key.as_str() {
                "--backend" => a.backend = val.clone(),
                "--url" => a.url = val.clone(),
                "--jobs" => a.jobs = num()?,
                "--concurrency" => a.concurrency = num()?,
                "--latency-jobs" => a.latency_jobs = num()?,
                _ => return Err(format!("unknown argument {key}")),
            }
        }
        if a.url.is_empty() {
            return Err("--url is required".into());
        }
        Ok(a)
    }
}

/// Jobs whose handler has run, across all workers.
pub static STARTED: AtomicUsize = AtomicUsize::new(0);
static LATENCIES_MS: Mutex<Vec<f64>> = Mutex::new(Vec::new());

pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Called at the start of every handler. `stamp` is the enqueue time in
/// µs carried in the job's payload, 0 for bulk jobs.
pub fn on_start(stamp: i64) {
    if stamp > 0 {
        let ms = (now_us() - stamp) as f64 / 1000.0;
        LATENCIES_MS.lock().unwrap().push(ms);
    }
    STARTED.fetch_add(1, Ordering::SeqCst);
}

/// Waits until `n` handlers have started, or fails after `limit`.
pub async fn wait_started(n: usize, limit: Duration) -> Result<(), String> {
    let t = Instant::now();
    while STARTED.load(Ordering::SeqCst) < n {
        if t.elapsed() > limit {
            return Err(format!(
                "timeout: {} of {n} jobs started",
                STARTED.load(Ordering::SeqCst)
            ));
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    Ok(())
}

/// Adds `n` jobs one at a time into idle workers: each waits for the
/// previous one to start, then a pause, so no job queues behind another.
pub async fn latency_phase<F, Fut, E>(n: usize, mut enqueue: F) -> Result<Vec<f64>, String>
where
    F: FnMut(i64) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    LATENCIES_MS.lock().unwrap().clear();
    for _ in 0..n {
        let before = STARTED.load(Ordering::SeqCst);
        enqueue(now_us())
            .await
            .map_err(|e| format!("enqueue: {e}"))?;
        wait_started(before + 1, Duration::from_secs(30)).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(std::mem::take(&mut *LATENCIES_MS.lock().unwrap()))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// One JSON line in the shape of `jobdeck bench --json`.
pub fn report(backend: &str, a: &Args, enqueue_per_s: f64, process_per_s: f64, mut lat: Vec<f64>) {
    lat.sort_by(|x, y| x.total_cmp(y));
    let latency = if lat.is_empty() {
        "null".to_string()
    } else {
        format!(
            "{{\"p50\":{:.3},\"p95\":{:.3},\"p99\":{:.3}}}",
            percentile(&lat, 50.0),
            percentile(&lat, 95.0),
            percentile(&lat, 99.0)
        )
    };
    println!(
        "{{\"backend\":\"{backend}\",\"jobs\":{},\"slots\":{},\"enqueue_per_s\":{enqueue_per_s:.1},\"process_per_s\":{process_per_s:.1},\"latency_ms\":{latency}}}",
        a.jobs, a.concurrency
    );
}
