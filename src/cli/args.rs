//! The command line: every command a script needs, each with `--json`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::job::State;

#[derive(Debug, Parser)]
#[command(
    name = "jobdeck",
    version,
    about = "A database-backed queue for long-running data jobs, with a live terminal console",
    after_help = "Without a command, jobdeck opens the console."
)]
pub struct Cli {
    /// Database URL: sqlite://PATH or postgres://USER@HOST/DB
    /// [default: [database] url of the config, else sqlite://jobdeck.db]
    #[arg(long, global = true, env = "JOBDECK_DB", value_name = "URL")]
    pub db: Option<String>,
    /// Config file [default: ./jobdeck.toml when present]
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply pending schema migrations (also done automatically on first use)
    Migrate,
    /// Add a job to the queue and print its id
    Enqueue(EnqueueArgs),
    /// List jobs
    Jobs(JobsArgs),
    /// Show one job with its event history
    Show {
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// Cancel jobs (a running job is stopped by its worker)
    Cancel(IdsArgs),
    /// Put jobs back in the queue (leased, stale, failed or cancelled ones)
    Requeue(IdsArgs),
    /// Lengthen the lease of leased or running jobs whose worker is alive
    Extend {
        #[arg(required = true)]
        ids: Vec<i64>,
        /// How much to add, e.g. 30s, 5m
        #[arg(long, value_parser = parse_duration)]
        by: Duration,
        #[arg(long)]
        json: bool,
    },
    /// Free the lock a stale job holds on TARGET
    Release {
        target: String,
        #[arg(long)]
        json: bool,
    },
    /// Held locks and their holders
    Locks(JsonFlag),
    /// Registered workers
    Workers(JsonFlag),
    /// Number of jobs per state
    Stats(JsonFlag),
    /// Run the engine headless (worker slots, heartbeat, reaper, scheduler)
    Worker(WorkerArgs),
    /// Wait until jobs finish: exit 0 if all succeeded, 1 otherwise, 124 on timeout
    Wait {
        #[arg(required = true)]
        ids: Vec<i64>,
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// List schedules with their next fire time and last skip
    Schedules(JsonFlag),
    /// Fire, pause or resume a schedule
    Schedule {
        #[command(subcommand)]
        action: ScheduleAction,
    },
    /// Open the live console (the default command)
    Console(ConsoleArgs),
    /// Open the console on a demo database with demo pipelines
    Demo(DemoArgs),
    /// Measure enqueue and processing throughput and pickup latency
    ///
    /// Runs in scratch databases and never touches the jobs of the one
    /// --db or JOBDECK_DB names: a fresh schema of that Postgres database,
    /// or a new directory beside that SQLite file (the same disk), or the
    /// temp directory without --db. They are dropped afterwards.
    Bench(super::bench::BenchArgs),
}

#[derive(Debug, Args)]
pub struct JsonFlag {
    /// Print one JSON document on stdout
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct IdsArgs {
    #[arg(required = true)]
    pub ids: Vec<i64>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    pub pipeline: String,
    #[arg(long)]
    pub target: Option<String>,
    /// An argument for the steps, KEY=VALUE (repeatable)
    #[arg(long = "arg", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub args: Vec<(String, String)>,
    /// Higher runs first
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Run after this delay, e.g. 30s
    #[arg(long = "in", value_name = "DURATION", value_parser = parse_duration, conflicts_with = "at")]
    pub delay: Option<Duration>,
    /// Run at this time (RFC 3339)
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub at: Option<chrono::DateTime<chrono::Utc>>,
    /// While a job with this key is unfinished, enqueue returns its id instead
    #[arg(long)]
    pub unique_key: Option<String>,
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub max_attempts: Option<i32>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct JobsArgs {
    /// Comma-separated states, e.g. queued,running
    #[arg(long, value_delimiter = ',', value_parser = parse_state)]
    pub state: Vec<State>,
    #[arg(long)]
    pub pipeline: Option<String>,
    #[arg(long)]
    pub target: Option<String>,
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub limit: u32,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Concurrent jobs [default: [workers] slots of the config, else 4]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub slots: Option<u32>,
    /// Do not run the cron scheduler on this node
    #[arg(long)]
    pub no_scheduler: bool,
    /// Exit 0 once no job is queued, leased or running
    #[arg(long)]
    pub exit_when_idle: bool,
}

#[derive(Debug, Subcommand)]
pub enum ScheduleAction {
    /// Fire a schedule now
    Run { name: String },
    /// Stop a schedule from firing
    Pause { name: String },
    /// Let a paused schedule fire again
    Resume { name: String },
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("invalid duration {s:?}: {e} (e.g. 30s, 5m, 1h)"))
}

fn parse_time(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| format!("invalid time {s:?}: {e} (e.g. 2026-01-31T12:00:00Z)"))
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("invalid argument {s:?}: expected KEY=VALUE")),
    }
}

fn parse_state(s: &str) -> Result<State, String> {
    s.parse()
}

#[derive(Debug, Args, Clone)]
pub struct ConsoleArgs {
    /// Watch only: no key changes anything
    #[arg(long)]
    pub readonly: bool,
    /// Do not run jobs on this node; only watch the cluster
    #[arg(long)]
    pub no_workers: bool,
    /// How often the panes refresh
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub refresh: Duration,
    /// Concurrent jobs on this node [default: [workers] slots of the config]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub slots: Option<u32>,
}

impl Default for ConsoleArgs {
    fn default() -> Self {
        ConsoleArgs {
            readonly: false,
            no_workers: false,
            refresh: Duration::from_millis(500),
            slots: None,
        }
    }
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub refresh: Duration,
}

/// `jobdeck bench --scale`: claim and console-read costs at 10,000 rows
/// against a million (see `bench_scale.rs`).
#[derive(Debug, Args, Clone)]
pub struct ScaleArgs {
    /// Measure claim and console-snapshot costs at 10,000 rows and at
    /// 1,000,000 finished + 100,000 queued jobs (fresh scratch databases:
    /// SQLite temp files, or schemas of the Postgres database given with --db)
    #[arg(long)]
    pub scale: bool,
    /// Finished jobs at the large size
    #[arg(long, default_value_t = 1_000_000, requires = "scale",
          value_parser = clap::value_parser!(u64).range(0..=50_000_000))]
    pub scale_finished: u64,
    /// Queued jobs at the large size
    #[arg(long, default_value_t = 100_000, requires = "scale",
          value_parser = clap::value_parser!(u64).range(1..=50_000_000))]
    pub scale_queued: u64,
    /// Rows at the small size, in the same finished:queued ratio (at most a
    /// tenth of the large size)
    #[arg(long, default_value_t = 10_000, requires = "scale",
          value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub scale_base: u64,
    /// Datasets the targeted half of the jobs is spread over
    #[arg(long, default_value_t = 1_000, requires = "scale",
          value_parser = clap::value_parser!(u32).range(10..=10_000_000))]
    pub scale_targets: u32,
    /// Timed claims per size
    #[arg(long, default_value_t = 200, requires = "scale",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub scale_claims: u32,
    /// Timed repetitions of each console query per size (most take well
    /// under a millisecond: fewer leave the medians at the mercy of noise)
    #[arg(long, default_value_t = 200, requires = "scale",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub scale_reps: u32,
    /// Also print the plans of the claim and the snapshot queries at the
    /// large size (Postgres: EXPLAIN ANALYZE, BUFFERS through auto_explain;
    /// needs a superuser)
    #[arg(long, requires = "scale")]
    pub explain: bool,
    /// Keep the scratch databases (and say where) for a closer look
    #[arg(long, requires = "scale")]
    pub scale_keep: bool,
}
