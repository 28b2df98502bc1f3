//! Jobs, their states and the one table of allowed transitions.
//!
//! Every store implementation asks [`check`] before it writes a state, so
//! the rules of DESIGN.md (which moves exist, who may make them, when an
//! attempt is counted, how stale jobs and pending cancels are resolved) live
//! here and nowhere else.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Queued,
    Leased,
    Running,
    Stale,
    Succeeded,
    Failed,
    Cancelled,
}

impl State {
    pub const ALL: [State; 7] = [
        State::Queued,
        State::Leased,
        State::Running,
        State::Stale,
        State::Succeeded,
        State::Failed,
        State::Cancelled,
    ];
    /// States in which a job still occupies the queue (and its unique key).
    pub const UNFINISHED: [State; 4] = [State::Queued, State::Leased, State::Running, State::Stale];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Leased => "leased",
            State::Running => "running",
            State::Stale => "stale",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, State::Succeeded | State::Failed | State::Cancelled)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for State {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        State::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                format!("unknown state {s:?} (expected one of queued, leased, running, stale, succeeded, failed, cancelled)")
            })
    }
}

/// What happens to a job whose lease ran out while it was running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StalePolicy {
    /// Wait for an operator and keep the target's lock (quarantine).
    #[default]
    Hold,
    /// Wait for an operator, free the lock.
    Release,
    /// Go straight back to the queue (an attempt used, backoff applied).
    Retry,
}

impl StalePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            StalePolicy::Hold => "hold",
            StalePolicy::Release => "release",
            StalePolicy::Retry => "retry",
        }
    }
}

impl FromStr for StalePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hold" => Ok(StalePolicy::Hold),
            "release" => Ok(StalePolicy::Release),
            "retry" => Ok(StalePolicy::Retry),
            _ => Err(format!(
                "unknown on_stale {s:?} (expected hold, release or retry)"
            )),
        }
    }
}

/// Every move a job can make. The store names the move it wants; [`check`]
/// says whether the job's current state allows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// A worker takes a queued job (new lease token).
    Claim,
    /// Lock taken, attempt counted, `running` written: side effects may begin.
    Start,
    /// The worker gives a leased job back: lock busy, or shutting down.
    Unclaim,
    /// Lock busy and the pipeline says `on_lock_busy = "fail"`.
    FailLockBusy,
    /// The last step succeeded.
    Succeed,
    /// A step failed, timed out or was interrupted: retry or fail.
    Fail,
    /// The worker stopped the process because a cancel was requested.
    StopCancelled,
    /// Reaper: a leased job's lease ran out before it started.
    ExpireLeased,
    /// Reaper: a running job's lease ran out (plus grace).
    ExpireRunning,
    /// Operator: cancel (queued/leased/stale now; running by request).
    Cancel,
    /// Operator: back to the queue with a fresh token.
    Requeue,
    /// Operator: lengthen the lease of a live worker's job.
    Extend,
    /// Operator: free the lock a stale job holds.
    ReleaseLock,
}

impl Move {
    pub fn name(self) -> &'static str {
        match self {
            Move::Claim => "claim",
            Move::Start => "start",
            Move::Unclaim => "unclaim",
            Move::FailLockBusy => "fail",
            Move::Succeed => "succeed",
            Move::Fail => "fail",
            Move::StopCancelled => "cancel",
            Move::ExpireLeased | Move::ExpireRunning => "expire",
            Move::Cancel => "cancel",
            Move::Requeue => "requeue",
            Move::Extend => "extend",
            Move::ReleaseLock => "release the lock of",
        }
    }

    /// The states this move may start from.
    pub fn from_states(self) -> &'static [State] {
        use State::*;
        match self {
            Move::Claim => &[Queued],
            Move::Start | Move::Unclaim | Move::FailLockBusy | Move::ExpireLeased => &[Leased],
            Move::Succeed | Move::Fail | Move::StopCancelled | Move::ExpireRunning => &[Running],
            Move::Cancel => &[Queued, Leased, Running, Stale],
            Move::Requeue => &[Leased, Stale, Failed, Cancelled],
            Move::Extend => &[Leased, Running],
            Move::ReleaseLock => &[Stale],
        }
    }
}

/// A refused transition, worded for an operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("job {id} is {state}: {reason}")]
pub struct Refused {
    pub id: i64,
    pub state: State,
    pub reason: String,
}

/// Whether `mv` may be applied to job `id` in `state`; the error explains
/// what the operator can do instead.
pub fn check(id: i64, state: State, mv: Move) -> Result<(), Refused> {
    if mv.from_states().contains(&state) {
        return Ok(());
    }
    let reason = match (mv, state) {
        (Move::Requeue, State::Running) => "cancel it first".to_string(),
        (Move::Requeue, State::Queued) => "it is already queued".to_string(),
        (Move::Requeue, State::Succeeded) => "it succeeded; enqueue a new job instead".to_string(),
        (Move::Cancel, s) if s.is_terminal() => "it has already finished".to_string(),
        (Move::Extend, _) => "only leased and running jobs have a lease to extend".to_string(),
        (Move::ReleaseLock, _) => "only a stale job's lock can be released by hand".to_string(),
        (mv, _) => format!(
            "cannot {} it (allowed from {})",
            mv.name(),
            mv.from_states()
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Err(Refused { id, state, reason })
}

/// Where a running job goes when its run ends without success.
/// A pending cancel always wins; otherwise retry while attempts remain.
pub fn after_failure(attempt: i32, max_attempts: i32, cancel_pending: bool) -> State {
    if cancel_pending {
        State::Cancelled
    } else if attempt < max_attempts {
        State::Queued
    } else {
        State::Failed
    }
}

/// Where a running job goes when the reaper finds its lease expired.
pub fn after_stale(
    policy: StalePolicy,
    attempt: i32,
    max_attempts: i32,
    cancel_pending: bool,
) -> State {
    if cancel_pending {
        State::Cancelled
    } else if policy == StalePolicy::Retry {
        after_failure(attempt, max_attempts, false)
    } else {
        State::Stale
    }
}

/// Whether a job that ends the reaper's decision in `to` keeps its lock.
pub fn stale_keeps_lock(policy: StalePolicy, to: State) -> bool {
    to == State::Stale && policy == StalePolicy::Hold
}

/// Retry delay after `attempt` failed: base × 2^(attempt−1), ±10 % jitter,
/// capped at one hour.
pub fn backoff(base: Duration, attempt: i32, jitter_unit: f64) -> Duration {
    const CAP: Duration = Duration::from_secs(3600);
    let exp = (attempt.max(1) - 1).min(30) as u32;
    let raw = base.saturating_mul(2u32.saturating_pow(exp)).min(CAP);
    // jitter_unit in [0,1) maps to a factor in [0.9, 1.1)
    let factor = 0.9 + 0.2 * jitter_unit.clamp(0.0, 1.0);
    raw.mul_f64(factor).min(CAP)
}

pub const DEFAULT_MAX_ATTEMPTS: i32 = 3;
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: i64,
    pub pipeline: String,
    pub target: Option<String>,
    pub args: serde_json::Map<String, serde_json::Value>,
    pub state: State,
    pub priority: i32,
    pub due_at: DateTime<Utc>,
    pub attempt: i32,
    pub max_attempts: i32,
    /// Index (0-based) of the next step to run.
    pub step: i32,
    pub lease_owner: Option<String>,
    pub lease_token: Option<i64>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub lock_fence: Option<i64>,
    pub unique_key: Option<String>,
    pub cancel_requested_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub on_stale: StalePolicy,
    pub schedule_id: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: i64,
    pub job_id: i64,
    pub at: DateTime<Utc>,
    pub from: Option<State>,
    pub to: State,
    pub actor: String,
    pub detail: String,
}

/// `operator:USER@HOST` for the person running this process.
pub fn operator_actor() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
        })
        .unwrap_or_else(|| "unknown".into());
    format!("operator:{user}@{}", hostname())
}

pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_explain_what_to_do() {
        let e = check(42, State::Running, Move::Requeue).unwrap_err();
        assert_eq!(e.to_string(), "job 42 is running: cancel it first");
        assert!(check(1, State::Succeeded, Move::Cancel).is_err());
        assert!(check(1, State::Queued, Move::Start).is_err());
        assert!(check(1, State::Running, Move::Claim).is_err());
        assert!(check(1, State::Queued, Move::Extend).is_err());
        assert!(check(1, State::Running, Move::ReleaseLock).is_err());
        assert!(check(1, State::Stale, Move::Requeue).is_ok());
    }

    #[test]
    fn cancel_beats_retry_and_stale() {
        assert_eq!(after_failure(1, 3, true), State::Cancelled);
        assert_eq!(after_failure(1, 3, false), State::Queued);
        assert_eq!(after_failure(3, 3, false), State::Failed);
        assert_eq!(after_stale(StalePolicy::Hold, 1, 3, true), State::Cancelled);
        assert_eq!(after_stale(StalePolicy::Hold, 1, 3, false), State::Stale);
        assert_eq!(after_stale(StalePolicy::Retry, 1, 3, false), State::Queued);
        assert_eq!(after_stale(StalePolicy::Retry, 3, 3, false), State::Failed);
        assert!(stale_keeps_lock(StalePolicy::Hold, State::Stale));
        assert!(!stale_keeps_lock(StalePolicy::Release, State::Stale));
    }

    #[test]
    fn backoff_doubles_with_jitter_and_cap() {
        let b = Duration::from_secs(5);
        assert_eq!(backoff(b, 1, 0.5), Duration::from_secs(5));
        assert_eq!(backoff(b, 3, 0.5), Duration::from_secs(20));
        assert!(backoff(b, 2, 0.0) >= Duration::from_secs(9));
        assert!(backoff(b, 2, 0.999) < Duration::from_secs(11));
        assert_eq!(backoff(b, 40, 0.99), Duration::from_secs(3600));
    }
}
