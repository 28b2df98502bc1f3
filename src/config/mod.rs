//! `jobdeck.toml`: the database, the worker pool, the pipelines and the
//! schedules. See `assets/jobdeck.toml` for every key with its default.
//!
//! Loading is strict: an unknown key, a wrong type or an impossible value is
//! an error naming the file, the line, where in the file (pipeline, step,
//! schedule) and the key, on one line, because a typo silently ignored in a
//! job queue means work that never runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::job::StalePolicy;

mod locate;
mod raw;
mod schedule;
mod template;
mod validate;

pub use template::substitute;

pub const DEFAULT_SLOTS: usize = 4;
pub const DEFAULT_CYCLES_IN_FLIGHT: usize = 1;
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
pub const DEFAULT_POLL: Duration = Duration::from_millis(200);
/// Off: the engine's thread sleeps as soon as a cycle is sent.
pub const DEFAULT_BUSY_POLL: Duration = Duration::ZERO;
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(30);
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(60);
pub const DEFAULT_TIMEZONE: &str = "UTC";

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub database: DatabaseConfig,
    pub workers: WorkersConfig,
    pub pipelines: Vec<Pipeline>,
    pub schedules: Vec<Schedule>,
    /// The file this was loaded from (`None` when parsed from text).
    pub source: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DatabaseConfig {
    pub url: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkersConfig {
    /// Jobs run at once by this process: the global concurrency cap.
    pub slots: usize,
    /// Engine cycles (one commit each: the finishes of the jobs that
    /// ended, the claim and start of the next) sent before the first is
    /// answered, each for its share of the slots. One puts the most jobs
    /// in a commit; more overlap one cycle's commit with another's work
    /// at the price of more commits per job, which pays only where a
    /// cycle's cost grows fast with its jobs and cores sit idle (every
    /// case measured in bench/HISTORY.md ran faster with one). Postgres
    /// only: SQLite has one writer.
    pub cycles_in_flight: usize,
    /// How long the engine's thread keeps polling for a cycle's answer
    /// instead of sleeping until it comes (zero: it sleeps at once). A
    /// thread woken from sleep costs each cycle tens of microseconds,
    /// which short jobs on Postgres feel; polling keeps a core busy
    /// while cycles are in flight.
    pub busy_poll: Duration,
    pub lease: Duration,
    /// How often an idle worker looks for due jobs.
    pub poll: Duration,
    /// SIGTERM → SIGKILL delay when a step is stopped.
    pub kill_grace: Duration,
    /// How long a stopping worker lets running jobs finish.
    pub drain_grace: Duration,
    /// Finished jobs older than this are pruned.
    pub retention: Duration,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        WorkersConfig {
            slots: DEFAULT_SLOTS,
            cycles_in_flight: DEFAULT_CYCLES_IN_FLIGHT,
            busy_poll: DEFAULT_BUSY_POLL,
            lease: DEFAULT_LEASE,
            poll: DEFAULT_POLL,
            kill_grace: DEFAULT_KILL_GRACE,
            drain_grace: DEFAULT_DRAIN_GRACE,
            retention: DEFAULT_RETENTION,
        }
    }
}

impl WorkersConfig {
    /// Three renewals per lease: one lost round trip still leaves two.
    pub fn renew_every(&self) -> Duration {
        self.lease / 3
    }

    /// Often enough that a dead worker's job is noticed soon after its lease
    /// ends, without polling the database hard for long leases.
    pub fn reaper_every(&self) -> Duration {
        (self.lease / 3).min(Duration::from_secs(5))
    }

    /// Extra wait past a running job's expiry before calling it stale, so
    /// the owner's self-fencing supervisor has surely killed the step.
    pub fn stale_grace(&self) -> Duration {
        (self.lease / 10).max(Duration::from_secs(2))
    }

    /// How much earlier than the lease's end the supervisor kills a step it
    /// cannot see renewed, to absorb clock and scheduling slop.
    pub fn supervisor_margin(&self) -> Duration {
        self.lease / 4
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    pub name: String,
    pub max_attempts: i32,
    /// First retry delay; doubles per attempt (see `job::backoff`).
    pub backoff: Duration,
    /// Limit for a whole run of the pipeline.
    pub timeout: Option<Duration>,
    pub on_lock_busy: LockBusyPolicy,
    /// With `on_lock_busy = "wait"`: how long to keep retrying the lock.
    pub lock_wait: Duration,
    pub on_stale: StalePolicy,
    pub steps: Vec<Step>,
}

impl Pipeline {
    /// Whether some step's command uses `{target}`: jobs without a target
    /// would fail at that step.
    pub fn needs_target(&self) -> bool {
        self.command_argvs()
            .any(|argv| template::placeholders(argv).0)
    }

    /// The `{arg.NAME}` names the steps' commands use.
    pub fn arg_names(&self) -> BTreeSet<String> {
        self.command_argvs()
            .flat_map(|argv| template::placeholders(argv).1)
            .collect()
    }

    fn command_argvs(&self) -> impl Iterator<Item = &[String]> {
        self.steps.iter().filter_map(|s| match &s.action {
            StepAction::Command { run, .. } => Some(run.as_slice()),
            StepAction::Builtin(_) => None,
        })
    }
}

/// What a job does when its target's lock is taken at start (a rare race:
/// claims already skip locked targets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockBusyPolicy {
    /// Back to the queue after a short delay; not an attempt.
    #[default]
    Requeue,
    /// Stay leased and retry the lock for up to `lock_wait`.
    Wait,
    /// Fail the job, naming the holder.
    Fail,
}

impl LockBusyPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            LockBusyPolicy::Requeue => "requeue",
            LockBusyPolicy::Wait => "wait",
            LockBusyPolicy::Fail => "fail",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub name: String,
    pub action: StepAction,
    pub timeout: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StepAction {
    /// An argv run directly (no shell); `{target}` and `{arg.NAME}` are
    /// filled in by [`substitute`].
    Command {
        run: Vec<String>,
        cwd: Option<PathBuf>,
        env: BTreeMap<String, String>,
    },
    Builtin(Builtin),
}

/// Steps that run inside the worker, for demos and tests.
#[derive(Debug, Clone, PartialEq)]
pub enum Builtin {
    Noop,
    /// Sleep, then fail with `fail_probability`.
    Sleep {
        duration: Duration,
        fail_probability: f64,
    },
    /// Fail with `probability` (1.0 unless set), else succeed at once.
    Fail {
        probability: f64,
    },
    /// Never return: the way to show a stale job in the demo.
    Hang,
}

impl Builtin {
    pub fn name(&self) -> &'static str {
        match self {
            Builtin::Noop => "noop",
            Builtin::Sleep { .. } => "sleep",
            Builtin::Fail { .. } => "fail",
            Builtin::Hang => "hang",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub name: String,
    pub pipeline: String,
    pub target: Option<String>,
    pub args: serde_json::Map<String, serde_json::Value>,
    /// 6 fields (with seconds) or 5 (seconds = 0).
    pub cron: String,
    /// IANA name, e.g. `Europe/Paris`.
    pub timezone: String,
    pub overlap: Overlap,
    pub enabled: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// Fire nothing while the previous job of the schedule is unfinished.
    #[default]
    Skip,
    /// Always fire.
    Queue,
}

impl Schedule {
    /// The first fire time strictly after `t`, computed in the schedule's
    /// time zone (so "0 0 2 * * *" follows daylight saving). `None` when the
    /// cron or time zone is invalid (a loaded config has neither) or the
    /// pattern never matches again.
    pub fn next_fire_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        schedule::next_fire_after(&self.cron, &self.timezone, t)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::default_empty()
    }
}

impl Config {
    /// Every default, no pipeline, no schedule: what runs without a file.
    pub fn default_empty() -> Config {
        Config {
            database: DatabaseConfig::default(),
            workers: WorkersConfig::default(),
            pipelines: Vec::new(),
            schedules: Vec::new(),
            source: None,
        }
    }

    pub fn pipeline(&self, name: &str) -> Option<&Pipeline> {
        self.pipelines.iter().find(|p| p.name == name)
    }

    /// In file order.
    pub fn pipeline_names(&self) -> Vec<String> {
        self.pipelines.iter().map(|p| p.name.clone()).collect()
    }
}

/// A config that cannot be used: `FILE:LINE: where: key: problem`, on one
/// line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    origin: String,
    line: Option<usize>,
    message: String,
}

impl ConfigError {
    fn new(origin: &str, line: Option<usize>, message: impl Into<String>) -> Self {
        // One line, always: multi-line parser messages would break the
        // `file:line: …` shape that editors and log readers expect.
        let message: String = message.into();
        let message = message
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        ConfigError {
            origin: origin.to_string(),
            line,
            message,
        }
    }

    /// 1-based line of the offending key or value, when known.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The problem without the `file:line:` prefix.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.origin, line, self.message),
            None => write!(f, "{}: {}", self.origin, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Read and parse `path`; errors name the path as given.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(&origin, None, format!("cannot read the file: {e}")))?;
    let mut config = parse(&text, &origin)?;
    config.source = Some(path.to_path_buf());
    Ok(config)
}

/// Parse a config from `text`; `origin` names it in errors (a file name).
pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
    let located = |e: locate::Located| {
        let line = e.offset.map(|o| locate::line_of(text, o));
        ConfigError::new(origin, line, e.message)
    };
    let tree = locate::parse_tree(text).map_err(located)?;
    let raw: raw::RawConfig =
        toml::from_str(text).map_err(|e| located(locate::explain(&tree, &e)))?;
    validate::build(raw, text).map_err(located)
}
