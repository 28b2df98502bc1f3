//! `jobdeck bench --scale`: does a claim, and does the console's refresh,
//! cost the same with a million finished and a hundred thousand queued jobs
//! in the table as with ten thousand? (Issue 6: within 1.5×.)
//!
//! Two scratch databases are seeded (store::seed), a small one and a large
//! one with the same finished:queued ratio, the same targets and the same
//! active set. Each query then runs on both in alternation, so a change in
//! the machine's load hits both sizes alike, and the medians are compared.
//! A claim takes up to 8 jobs; the same jobs are then put back (not timed),
//! so every claim sees the same queue. A read is timed in bursts of calls
//! (`BURST_MS`), so that what is compared is the query, not the wake-ups
//! of the threads that carry it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use super::args::ScaleArgs;
use crate::console::snapshot::PANE_LIMIT;
use crate::console::snapshot::fetch::{self, FetchRequest, HIST_BUCKET, HIST_BUCKETS};
use crate::job::State;
use crate::store::seed::{self, SeedDb, SeedPlan};
use crate::store::{self, BackendKind, ClaimRequest, JobFilter, JobOrder, Store};

/// Issue 6: a query may cost at most this much more at the large size.
const MAX_RATIO: f64 = 1.5;
/// Untimed calls before the timed ones: statement preparation and the
/// first page reads are not what is being compared.
const WARMUP: u32 = 20;
/// A timed sample of a read is a burst of back-to-back calls lasting about
/// this long at the small size (its warm-up median says how many calls),
/// averaged. A call of a few dozen microseconds is mostly the hand-offs
/// between the caller's thread and the driver's, whose cost swings with
/// whether the other thread was asleep: single calls of `list_schedules`,
/// which reads three rows of a table that does not grow, came out 0.6× to
/// 2.1× "slower" at the large size from run to run.
const BURST_MS: f64 = 1.0;
/// At most this many calls per sample.
const MAX_BURST: u32 = 64;
const CLAIM_LIMIT: usize = 8;
const CLAIM_WORKER: &str = "scale-bench";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Query {
    Claim,
    Counts,
    Queued,
    Leased,
    Running,
    Stale,
    Finished,
    Locks,
    Workers,
    Schedules,
    Histogram,
    Snapshot,
}

impl Query {
    /// The claim, then every store call of the console's periodic fetch
    /// (`console/snapshot/fetch.rs`) one by one, then the fetch as a whole
    /// (its calls run concurrently there).
    const ALL: [Query; 12] = [
        Query::Claim,
        Query::Counts,
        Query::Queued,
        Query::Leased,
        Query::Running,
        Query::Stale,
        Query::Finished,
        Query::Locks,
        Query::Workers,
        Query::Schedules,
        Query::Histogram,
        Query::Snapshot,
    ];

    fn name(self) -> &'static str {
        match self {
            Query::Claim => "claim (limit 8)",
            Query::Counts => "count_by_state",
            Query::Queued => "list queued (claim order)",
            Query::Leased => "list leased",
            Query::Running => "list running",
            Query::Stale => "list stale",
            Query::Finished => "list finished (recent first)",
            Query::Locks => "list_locks",
            Query::Workers => "list_workers",
            Query::Schedules => "list_schedules",
            Query::Histogram => "finished_histogram",
            Query::Snapshot => "snapshot (whole fetch)",
        }
    }
}

/// One size: its store, a side connection for rewinds, and how it was made.
struct Side {
    store: Store,
    seed: SeedDb,
    plan: SeedPlan,
    jobs: i64,
    seed_s: f64,
}

#[derive(Debug, Serialize)]
struct SizeReport {
    finished: u64,
    queued: u64,
    targets: u32,
    /// Rows in `jobs`, with the running and stale ones.
    jobs: i64,
    seed_s: f64,
}

#[derive(Debug, Serialize)]
struct QueryReport {
    query: &'static str,
    small_ms: f64,
    large_ms: f64,
    small_p95_ms: f64,
    large_p95_ms: f64,
    /// Calls per timed sample (`BURST_MS`); 1 for the claim.
    calls: u32,
    ratio: f64,
    pass: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    backend: BackendKind,
    max_ratio: f64,
    claims: u32,
    reps: u32,
    claim_mode: &'static str,
    /// Jobs an average timed claim returned, per size.
    claimed_per_call: [f64; 2],
    small: SizeReport,
    large: SizeReport,
    queries: Vec<QueryReport>,
    pass: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    plans: Option<Vec<String>>,
}

/// Where the two scratch databases live, so they can be removed whatever
/// happens in between.
enum Scratch {
    Sqlite(std::path::PathBuf),
    Postgres { base: String, schemas: Vec<String> },
}

impl Scratch {
    /// Where the databases are, for `--scale-keep`.
    fn describe(&self) -> String {
        match self {
            Scratch::Sqlite(dir) => format!("{}/{{small,large}}.db", dir.display()),
            Scratch::Postgres { schemas, .. } => format!("schemas {}", schemas.join(", ")),
        }
    }

    async fn remove(&self) -> Result<()> {
        match self {
            Scratch::Sqlite(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Scratch::Postgres { base, schemas } => {
                for s in schemas {
                    store::scratch::drop_pg_schema(base, s).await?;
                }
            }
        }
        Ok(())
    }
}

pub async fn run(db: Option<String>, a: ScaleArgs, json: bool) -> Result<i32> {
    let (small, large) = sizes(&a);
    let pg_base = store::scratch::postgres_base(db.as_deref())?.map(str::to_string);
    anyhow::ensure!(
        !a.explain || pg_base.is_some(),
        "--explain needs a Postgres --db (it reads the plans through auto_explain); \
         SQLite's are in BENCHMARKS.md"
    );
    let mut scratch = match &pg_base {
        Some(base) => Scratch::Postgres {
            base: base.clone(),
            schemas: Vec::new(),
        },
        None => Scratch::Sqlite(store::scratch::sqlite_dir(
            db.as_deref(),
            &format!("jobdeck-scale-{}", std::process::id()),
        )?),
    };
    let result = measure(&mut scratch, small, large, &a).await;
    let removed = if a.scale_keep {
        eprintln!(
            "jobdeck: kept the scratch databases: {}",
            scratch.describe()
        );
        Ok(())
    } else {
        scratch.remove().await
    };
    let report = result?;
    removed?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_human(&report);
    }
    Ok(0)
}

/// The large size as asked; the small one with the same ratio, at most a
/// tenth of the large (so the comparison means something at smoke-test
/// sizes too).
fn sizes(a: &ScaleArgs) -> (SeedPlan, SeedPlan) {
    let total = a.scale_finished + a.scale_queued;
    let base = a.scale_base.min(total / 10).max(1);
    let finished = (base as f64 * a.scale_finished as f64 / total as f64).round() as u64;
    let small = SeedPlan {
        finished,
        queued: (base - finished).max(1),
        targets: a.scale_targets,
    };
    let large = SeedPlan {
        finished: a.scale_finished,
        queued: a.scale_queued,
        targets: a.scale_targets,
    };
    (small, large)
}

async fn measure(
    scratch: &mut Scratch,
    small: SeedPlan,
    large: SeedPlan,
    a: &ScaleArgs,
) -> Result<Report> {
    let small = side(scratch, "small", small).await?;
    let large = side(scratch, "large", large).await?;
    let sides = [&small, &large];

    let claim = ClaimRequest {
        worker: CLAIM_WORKER.into(),
        pipelines: seed::PIPELINES.iter().map(|p| p.to_string()).collect(),
        limit: CLAIM_LIMIT,
        lease: Duration::from_secs(30),
    };
    let mut claimed = [0usize; 2];
    let mut queries = Vec::new();
    for q in Query::ALL {
        let n = if q == Query::Claim {
            a.scale_claims
        } else {
            a.scale_reps
        };
        let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut calls = 1;
        for rep in 0..WARMUP + n {
            if rep == WARMUP {
                // A claim takes jobs: each of its samples is one call.
                if q != Query::Claim {
                    calls = burst(&mut times[0]);
                }
                times = [Vec::new(), Vec::new()];
            }
            // Alternate which size goes first, so neither always follows
            // the other's cache footprint.
            let order = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                let (ms, got) = run_sample(sides[i], q, &claim, calls)
                    .await
                    .with_context(|| format!("{} on the {} database", q.name(), size_name(i)))?;
                times[i].push(ms);
                if rep >= WARMUP {
                    claimed[i] += got;
                }
            }
        }
        let [s, l] = times.map(|mut t| {
            t.sort_by(f64::total_cmp);
            (percentile(&t, 0.5), percentile(&t, 0.95))
        });
        let ratio = l.0 / s.0.max(1e-6);
        queries.push(QueryReport {
            query: q.name(),
            small_ms: s.0,
            large_ms: l.0,
            small_p95_ms: s.1,
            large_p95_ms: l.1,
            calls,
            ratio,
            pass: ratio <= MAX_RATIO,
        });
    }
    anyhow::ensure!(
        claimed.iter().all(|&c| c > 0),
        "the timed claims took no job: the seeded queue is not claimable"
    );
    let plans = if a.explain {
        Some(explain(scratch, &large, &claim).await?)
    } else {
        None
    };
    for s in sides {
        s.seed.close().await;
    }
    let per_call = |i: usize| claimed[i] as f64 / f64::from(a.scale_claims);
    Ok(Report {
        backend: small.store.kind(),
        max_ratio: MAX_RATIO,
        claims: a.scale_claims,
        reps: a.scale_reps,
        claim_mode: "claim up to 8, then put the same jobs back (not timed)",
        claimed_per_call: [per_call(0), per_call(1)],
        pass: queries.iter().all(|q| q.pass),
        small: size_report(&small),
        large: size_report(&large),
        queries,
        plans,
    })
}

fn size_name(i: usize) -> &'static str {
    if i == 0 { "small" } else { "large" }
}

fn size_report(s: &Side) -> SizeReport {
    SizeReport {
        finished: s.plan.finished,
        queued: s.plan.queued,
        targets: s.plan.targets,
        jobs: s.jobs,
        seed_s: s.seed_s,
    }
}

/// Make, migrate and seed one scratch database.
async fn side(scratch: &mut Scratch, name: &str, plan: SeedPlan) -> Result<Side> {
    let url = match scratch {
        Scratch::Sqlite(dir) => format!("sqlite://{}", dir.join(format!("{name}.db")).display()),
        Scratch::Postgres { base, schemas } => {
            let schema = format!("jobdeck_scale_{name}_{}", std::process::id());
            let url = store::scratch::create_pg_schema(base, &schema).await?;
            schemas.push(schema);
            url
        }
    };
    let store = super::connect(&url).await?;
    let seed = SeedDb::open(&url).await?;
    let seeded = seed
        .seed(&plan)
        .await
        .with_context(|| format!("seeding the {name} database"))?;
    Ok(Side {
        store,
        seed,
        plan,
        jobs: seeded.jobs,
        seed_s: seeded.took.as_secs_f64(),
    })
}

fn pane(states: &[State], order: JobOrder) -> JobFilter {
    JobFilter {
        states: states.to_vec(),
        limit: PANE_LIMIT,
        order,
        ..JobFilter::default()
    }
}

/// Calls per sample for a query whose warm-up calls took `warmup` ms
/// each: enough for about `BURST_MS`.
fn burst(warmup: &mut [f64]) -> u32 {
    warmup.sort_by(f64::total_cmp);
    let median = percentile(warmup, 0.5);
    if median <= 0.0 {
        return MAX_BURST;
    }
    (BURST_MS / median).ceil().clamp(1.0, f64::from(MAX_BURST)) as u32
}

/// One timed sample of `calls` calls: milliseconds per call, and the jobs
/// they claimed (0 for reads), which are then put back, untimed.
async fn run_sample(
    side: &Side,
    q: Query,
    claim: &ClaimRequest,
    calls: u32,
) -> Result<(f64, usize)> {
    let t0 = Instant::now();
    let mut claimed = Vec::new();
    for _ in 0..calls {
        claimed.extend(call(side, q, claim).await?);
    }
    let ms = t0.elapsed().as_secs_f64() * 1000.0 / f64::from(calls.max(1));
    side.seed.put_back(&claimed).await?;
    Ok((ms, claimed.len()))
}

/// One call of `q`: the ids of the jobs it claimed (none for reads).
async fn call(side: &Side, q: Query, claim: &ClaimRequest) -> Result<Vec<i64>> {
    let s = side.store.as_ref();
    let mut claimed = Vec::new();
    match q {
        Query::Claim => claimed = s.claim(claim).await?.iter().map(|j| j.id).collect(),
        Query::Counts => drop(s.count_by_state().await?),
        Query::Queued => drop(
            s.list_jobs(&pane(&[State::Queued], JobOrder::ClaimOrder))
                .await?,
        ),
        Query::Leased => drop(
            s.list_jobs(&pane(&[State::Leased], JobOrder::Newest))
                .await?,
        ),
        Query::Running => drop(
            s.list_jobs(&pane(&[State::Running], JobOrder::Newest))
                .await?,
        ),
        Query::Stale => drop(
            s.list_jobs(&pane(&[State::Stale], JobOrder::Newest))
                .await?,
        ),
        Query::Finished => drop(
            s.list_jobs(&pane(
                &[State::Succeeded, State::Failed, State::Cancelled],
                JobOrder::RecentlyFinished,
            ))
            .await?,
        ),
        Query::Locks => drop(s.list_locks().await?),
        Query::Workers => drop(s.list_workers().await?),
        Query::Schedules => drop(s.list_schedules().await?),
        Query::Histogram => drop(s.finished_histogram(HIST_BUCKET, HIST_BUCKETS).await?),
        Query::Snapshot => drop(fetch::fetch(&side.store, &FetchRequest::default()).await?),
    }
    Ok(claimed)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

/// The plans Postgres actually ran for one claim and one console refresh
/// at the large size: a second store on the same schema whose sessions
/// load auto_explain and send each plan back as a notice, captured here.
async fn explain(scratch: &Scratch, large: &Side, claim: &ClaimRequest) -> Result<Vec<String>> {
    let Scratch::Postgres { base, schemas } = scratch else {
        anyhow::bail!("--explain needs Postgres");
    };
    let schema = schemas.last().context("no large schema")?;
    let options = [
        format!("search_path={schema}"),
        "session_preload_libraries=auto_explain".into(),
        "auto_explain.log_min_duration=0".into(),
        "auto_explain.log_analyze=on".into(),
        "auto_explain.log_buffers=on".into(),
        "auto_explain.log_level=notice".into(),
        "auto_explain.log_nested_statements=on".into(),
    ]
    .map(|o| format!("-c%20{}", o.replace('=', "%3D")))
    .join("%20");
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options={options}");
    let store = super::connect(&url)
        .await
        .context("auto_explain session (needs a superuser)")?;
    let notices = Arc::new(Mutex::new(Vec::new()));
    let dispatch = tracing::Dispatch::new(tracing_subscriber::layer::SubscriberExt::with(
        tracing_subscriber::registry(),
        Capture(notices.clone()),
    ));
    let probe = async {
        let jobs = store.claim(claim).await?;
        large
            .seed
            .put_back(&jobs.iter().map(|j| j.id).collect::<Vec<_>>())
            .await?;
        fetch::fetch(&store, &FetchRequest::default()).await?;
        anyhow::Ok(())
    };
    tracing::instrument::WithSubscriber::with_subscriber(probe, dispatch).await?;
    let plans = std::mem::take(&mut *notices.lock().unwrap_or_else(|p| p.into_inner()));
    anyhow::ensure!(
        !plans.is_empty(),
        "auto_explain sent no plans (is it installed on the server?)"
    );
    Ok(plans)
}

/// Keeps the message of every Postgres notice (auto_explain's plans).
struct Capture(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if event.metadata().target() != "sqlx::postgres::notice" {
            return;
        }
        struct Message(Option<String>);
        impl tracing::field::Visit for Message {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "message" {
                    self.0 = Some(value.to_string());
                }
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" && self.0.is_none() {
                    self.0 = Some(format!("{value:?}"));
                }
            }
        }
        let mut m = Message(None);
        event.record(&mut m);
        if let Some(text) = m.0 {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).push(text);
        }
    }
}

fn print_human(r: &Report) {
    let size = |s: &SizeReport| {
        format!(
            "{} finished + {} queued ({} rows, seeded in {:.1}s)",
            s.finished, s.queued, s.jobs, s.seed_s
        )
    };
    println!("backend {:?}", r.backend);
    println!("small: {}", size(&r.small));
    println!("large: {}", size(&r.large));
    println!(
        "{} claims ({}; {:.1} / {:.1} jobs per claim), {} samples per query \
         (a read's sample: `calls` calls back to back, about {BURST_MS} ms); medians per call",
        r.claims, r.claim_mode, r.claimed_per_call[0], r.claimed_per_call[1], r.reps
    );
    println!();
    println!(
        "{:<30} {:>10} {:>10} {:>7} {:>6}  check (≤ {}×)",
        "query", "small ms", "large ms", "ratio", "calls", r.max_ratio
    );
    for q in &r.queries {
        println!(
            "{:<30} {:>10.3} {:>10.3} {:>6.2}× {:>6}  {}",
            q.query,
            q.small_ms,
            q.large_ms,
            q.ratio,
            q.calls,
            if q.pass { "PASS" } else { "FAIL" }
        );
    }
    println!();
    println!("overall: {}", if r.pass { "PASS" } else { "FAIL" });
    if let Some(plans) = &r.plans {
        for p in plans {
            println!("\n{p}");
        }
    }
}
