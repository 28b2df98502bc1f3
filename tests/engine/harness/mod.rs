//! One test environment per test: a fresh database (a SQLite file or a
//! Postgres schema), a temp directory for configs, the ledger and job logs,
//! and helpers to run the real `jobdeck` binary against them.

#![allow(dead_code)]

mod process;
pub mod proxy;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use jobdeck::job::{Event, Job, State};
use jobdeck::store::{NewJob, Store};
use tokio::sync::Semaphore;

pub use process::{Cli, Worker, alive};

/// Env var naming the Postgres server the tests run against.
pub const PG_ENV: &str = "JOBDECK_TEST_POSTGRES";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
}

/// The machine has two cores: at most two engine tests at a time, so that
/// lease timings are not distorted by a pile of parallel workers. A heavy
/// test takes both permits.
static GATE: Semaphore = Semaphore::const_new(2);

/// `on_both_backends!(test_fn)` (or `(test_fn, permits = 2)`) defines module
/// `test_fn` with a `sqlite` and a `postgres` test running `test_fn(env)`.
#[macro_export]
macro_rules! on_both_backends {
    ($test:ident) => {
        $crate::on_both_backends!($test, permits = 1);
    };
    ($test:ident, permits = $p:expr) => {
        mod $test {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                $crate::harness::run_on(
                    $crate::harness::Kind::Sqlite,
                    $p,
                    stringify!($test),
                    super::$test,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                $crate::harness::run_on(
                    $crate::harness::Kind::Postgres,
                    $p,
                    stringify!($test),
                    super::$test,
                )
                .await;
            }
        }
    };
}

/// `on_postgres!(test_fn)`: a `postgres` test only, for what SQLite has no
/// equivalent of (a network between worker and database).
#[macro_export]
macro_rules! on_postgres {
    ($test:ident) => {
        mod $test {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                $crate::harness::run_on(
                    $crate::harness::Kind::Postgres,
                    1,
                    stringify!($test),
                    super::$test,
                )
                .await;
            }
        }
    };
}

/// Runs `test` in a fresh environment of `kind`; a Postgres test without
/// `JOBDECK_TEST_POSTGRES` says so and passes, one with an unreachable
/// server fails.
pub async fn run_on<F, Fut>(kind: Kind, permits: u32, name: &str, test: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(env) = Env::new(kind, name).await else {
        return;
    };
    let _permit = GATE
        .acquire_many(permits)
        .await
        .expect("gate is never closed");
    let schema = env.schema.clone();
    test(env).await;
    if let Some(schema) = schema {
        drop_schema(&schema).await;
    }
}

pub struct Env {
    pub kind: Kind,
    pub name: String,
    pub dir: tempfile::TempDir,
    /// The URL every process of this test uses.
    pub url: String,
    pub store: Store,
    /// The jobdeck binary every process of this test runs.
    bin: PathBuf,
    schema: Option<String>,
    workers: AtomicU32,
}

static SCHEMAS: AtomicU32 = AtomicU32::new(0);

impl Env {
    async fn new(kind: Kind, name: &str) -> Option<Env> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("jobdeck-{name}-"))
            .tempdir()
            .expect("create a temp dir");
        let (url, schema) = match kind {
            Kind::Sqlite => (
                format!("sqlite://{}", dir.path().join("jobdeck.db").display()),
                None,
            ),
            Kind::Postgres => {
                let Some(base) = pg_base() else {
                    eprintln!(
                        "engine test {name}: the Postgres variant did not run: {PG_ENV} unset"
                    );
                    return None;
                };
                let schema = create_schema(&base).await;
                (in_schema(&base, &schema), Some(schema))
            }
        };
        let store = jobdeck::store::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("open the test database {url}: {e}"));
        let bin = process::pin_binary(dir.path());
        Some(Env {
            bin,
            kind,
            name: name.to_string(),
            dir,
            url,
            store,
            schema,
            workers: AtomicU32::new(0),
        })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The file step scripts append to (`$LEDGER` in every worker).
    pub fn ledger(&self) -> PathBuf {
        self.path("ledger")
    }

    /// The ledger's lines, split into words.
    pub fn ledger_lines(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(self.ledger())
            .unwrap_or_default()
            .lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect())
            .collect()
    }

    /// Ledger lines starting with `word` whose second word is job `id`.
    pub fn ledger_of(&self, word: &str, id: i64) -> Vec<Vec<String>> {
        let id = id.to_string();
        self.ledger_lines()
            .into_iter()
            .filter(|l| l.first().is_some_and(|w| w == word) && l.get(1) == Some(&id))
            .collect()
    }

    /// Writes `toml` as a config file and returns its path.
    pub fn config(&self, file: &str, toml: &str) -> PathBuf {
        let path = self.path(file);
        std::fs::write(&path, toml).expect("write the config");
        path
    }

    /// Starts `jobdeck worker` on this test's database.
    pub fn worker(&self, config: &Path, args: &[&str]) -> Worker {
        self.worker_on(&self.url, config, args)
    }

    /// Starts `jobdeck worker` on `url` (e.g. through a proxy).
    pub fn worker_on(&self, url: &str, config: &Path, args: &[&str]) -> Worker {
        let n = self.workers.fetch_add(1, Ordering::Relaxed) + 1;
        Worker::spawn(self, n, url, config, args)
    }

    /// Runs a jobdeck command on this test's database.
    pub async fn cli(&self, args: &[&str]) -> Cli {
        Cli::run(self, args).await
    }

    /// Runs a jobdeck command with `--json` and parses its output.
    pub async fn cli_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.cli(&all).await;
        assert!(out.ok(), "jobdeck {args:?} failed: {}", out.stderr);
        serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("jobdeck {args:?}: not JSON ({e}): {}", out.stdout))
    }

    pub async fn enqueue(
        &self,
        pipeline: &str,
        target: Option<&str>,
        args: &[(&str, &str)],
    ) -> i64 {
        let job = NewJob {
            pipeline: pipeline.into(),
            target: target.map(Into::into),
            args: args
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
                .collect(),
            ..NewJob::default()
        };
        self.store
            .enqueue(job, "operator:test@host")
            .await
            .expect("enqueue")
            .id
    }

    pub async fn job(&self, id: i64) -> Job {
        self.store
            .get_job(id)
            .await
            .unwrap_or_else(|e| panic!("read job {id}: {e}"))
    }

    pub async fn events(&self, id: i64) -> Vec<Event> {
        self.store
            .job_events(id)
            .await
            .unwrap_or_else(|e| panic!("read events of job {id}: {e}"))
    }

    /// Waits until job `id` is in `state`; returns it.
    pub async fn wait_state(&self, id: i64, state: State, within: Duration) -> Job {
        eventually(&format!("job {id} to be {state}"), within, async || {
            let job = self.job(id).await;
            (job.state == state).then_some(job)
        })
        .await
    }

    /// Runs one SQL statement on the test's database (fault injection only:
    /// states the engine cannot be driven into by its API).
    pub async fn sql(&self, sql: &str) {
        match self.kind {
            Kind::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url)
                    .await
                    .expect("open sqlite");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
                    .execute(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                pool.close().await;
            }
            Kind::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url)
                    .await
                    .expect("open postgres");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
                    .execute(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                pool.close().await;
            }
        }
    }
}

impl Env {
    /// Rows of integers from `sql` (fault injection and facts the API does
    /// not expose, such as a fired job's slot).
    pub async fn query_ints(&self, sql: &str) -> Vec<Vec<i64>> {
        use sqlx::Row;
        fn ints<R: Row>(rows: Vec<R>) -> Vec<Vec<i64>>
        where
            usize: sqlx::ColumnIndex<R>,
            for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        {
            rows.iter()
                .map(|r| {
                    (0..r.len())
                        .map(|i| r.try_get::<i64, _>(i).expect("an integer column"))
                        .collect()
                })
                .collect()
        }
        match self.kind {
            Kind::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url)
                    .await
                    .expect("open sqlite");
                let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
                    .fetch_all(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                pool.close().await;
                ints(rows)
            }
            Kind::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url)
                    .await
                    .expect("open postgres");
                let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
                    .fetch_all(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                pool.close().await;
                ints(rows)
            }
        }
    }

    /// The SQL to make the start of jobs on `target` fail (and be retried)
    /// until [`Env::unblock_start`]: a worker then holds the job leased, not
    /// started, for as long as the test likes.
    pub async fn block_start(&self, target: &str) {
        let sql = match self.kind {
            Kind::Sqlite => format!(
                "CREATE TRIGGER test_block_start BEFORE UPDATE OF state ON jobs
                 WHEN NEW.state = 'running' AND NEW.target = '{target}'
                 BEGIN SELECT RAISE(ABORT, 'test: start blocked'); END;"
            ),
            Kind::Postgres => format!(
                "CREATE FUNCTION test_block_start() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RAISE EXCEPTION 'test: start blocked'; END $$;
                 CREATE TRIGGER test_block_start BEFORE UPDATE OF state ON jobs FOR EACH ROW
                 WHEN (NEW.state = 'running' AND NEW.target = '{target}')
                 EXECUTE FUNCTION test_block_start();"
            ),
        };
        self.sql(&sql).await;
    }

    pub async fn unblock_start(&self) {
        self.sql(match self.kind {
            Kind::Sqlite => "DROP TRIGGER test_block_start",
            Kind::Postgres => "DROP TRIGGER test_block_start ON jobs",
        })
        .await;
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        // A failed test keeps its directory (database, ledger, worker logs)
        // and shows the end of each worker's log.
        self.dir.disable_cleanup(true);
        eprintln!(
            "engine test {}: kept {}",
            self.name,
            self.dir.path().display()
        );
        for n in 1..=self.workers.load(Ordering::Relaxed) {
            let log = self.path(&format!("worker-{n}.log"));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(30)..];
            eprintln!("--- worker-{n}.log (last {} lines)", tail.len());
            for l in tail {
                eprintln!("{l}");
            }
        }
    }
}

/// Polls `check` every 100 ms until it answers `Some`; panics after `within`.
pub async fn eventually<T>(
    what: &str,
    within: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wall-clock now in nanoseconds since the epoch (same clock as `date +%s%N`).
pub fn now_ns() -> i128 {
    chrono::Utc::now()
        .timestamp_nanos_opt()
        .expect("time in range") as i128
}

pub fn ns_of(t: chrono::DateTime<chrono::Utc>) -> i128 {
    t.timestamp_nanos_opt().expect("time in range") as i128
}

fn pg_base() -> Option<String> {
    std::env::var(PG_ENV).ok().filter(|u| !u.trim().is_empty())
}

/// The base URL with its `host:port` replaced (to go through a proxy).
pub fn pg_base_via(addr: &str) -> String {
    let base = pg_base().expect("Postgres tests only");
    let start = base.find("://").map_or(0, |i| i + 3);
    let end = base[start..]
        .find(['/', '?'])
        .map_or(base.len(), |i| start + i);
    let host_start = base[start..end].rfind('@').map_or(start, |i| start + i + 1);
    format!("{}{addr}{}", &base[..host_start], &base[end..])
}

/// The `host:port` of the Postgres server.
pub fn pg_addr() -> String {
    let base = pg_base().expect("Postgres tests only");
    let start = base.find("://").map_or(0, |i| i + 3);
    let end = base[start..]
        .find(['/', '?'])
        .map_or(base.len(), |i| start + i);
    let authority = &base[start..end];
    let host = authority.rsplit('@').next().unwrap_or(authority);
    if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:5432")
    }
}

/// `base` with every connection starting in `schema`.
pub fn in_schema(base: &str, schema: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options=-c%20search_path%3D{schema}")
}

/// The Postgres URL of this test's schema through `addr`.
pub fn url_via(env: &Env, addr: &str) -> String {
    in_schema(
        &pg_base_via(addr),
        env.schema.as_deref().expect("Postgres tests only"),
    )
}

async fn create_schema(base: &str) -> String {
    let schema = format!(
        "engine_{}_{}_{:06x}",
        std::process::id(),
        SCHEMAS.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>() & 0xff_ffff
    );
    let admin = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(5))
        .connect(base)
        .await
        .unwrap_or_else(|e| panic!("{PG_ENV} is set but the server is unreachable: {e}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .unwrap_or_else(|e| panic!("create schema {schema}: {e}"));
    admin.close().await;
    schema
}

async fn drop_schema(schema: &str) {
    let Some(base) = pg_base() else { return };
    if let Ok(admin) = sqlx::PgPool::connect(&base).await {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE"
        )))
        .execute(&admin)
        .await;
        admin.close().await;
    }
}
