//! The ledger the steps write and the checks every scenario shares: runs on
//! one target never overlap, fences grow, each (job, attempt) starts once,
//! and every job's events form a path the state machine allows.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jobdeck::job::{Event, Move, State};

use crate::harness::Env;

/// The step of the ledger pipelines: a `start` line, a short pause, an `end`
/// line. `echo … >>` is one `write` in append mode, so lines never mix.
/// (No `${…}` in scripts: braces are jobdeck's placeholders.)
pub const LEDGER_STEP: &str = r#"
P=$JOBDECK_ARG_PAUSE; [ -n "$P" ] || P=$PAUSE; [ -n "$P" ] || P=0.02
T=$JOBDECK_TARGET; [ -n "$T" ] || T=-
F=$JOBDECK_FENCE; [ -n "$F" ] || F=0
echo "start $T $JOBDECK_JOB_ID $JOBDECK_ATTEMPT $F $(date +%s%N) $$" >> "$LEDGER"
sleep $P
echo "end $T $JOBDECK_JOB_ID $JOBDECK_ATTEMPT $F $(date +%s%N) $$" >> "$LEDGER"
"#;

/// A one-step `sh -c` pipeline.
pub fn pipeline(name: &str, settings: &str, script: &str) -> String {
    format!(
        "[[pipeline]]\nname = \"{name}\"\nbackoff = \"100ms\"\n{settings}\n\
         [[pipeline.step]]\nname = \"work\"\nrun = [\"sh\", \"-c\", '''{script}''']\n"
    )
}

/// One run of a step as the ledger saw it.
#[derive(Debug, Clone)]
pub struct Run {
    pub target: String,
    pub job: i64,
    pub attempt: i64,
    pub fence: i64,
    pub start: i128,
    pub end: Option<i128>,
    pub pid: i32,
}

/// The runs in the ledger, keyed by (job, attempt). Lines of other kinds
/// (`tick`, `pid`…) are ignored; a second `start` of one (job, attempt)
/// fails the test: an attempt is counted once, in the start transaction.
pub fn runs(env: &Env) -> BTreeMap<(i64, i64), Run> {
    let mut runs: BTreeMap<(i64, i64), Run> = BTreeMap::new();
    for line in env.ledger_lines() {
        let Some(kind) = line.first().filter(|w| *w == "start" || *w == "end") else {
            continue;
        };
        let [_, target, job, attempt, fence, ns, pid] = line.as_slice() else {
            panic!("malformed ledger line {line:?}");
        };
        let num = |s: &str| -> i128 {
            s.parse()
                .unwrap_or_else(|_| panic!("malformed ledger line {line:?}"))
        };
        let key = (num(job) as i64, num(attempt) as i64);
        if kind == "start" {
            let run = Run {
                target: target.clone(),
                job: key.0,
                attempt: key.1,
                fence: num(fence) as i64,
                start: num(ns),
                end: None,
                pid: num(pid) as i32,
            };
            let before = runs.insert(key, run);
            assert!(
                before.is_none(),
                "job {} attempt {} started twice",
                key.0,
                key.1
            );
        } else {
            let run = runs
                .get_mut(&key)
                .unwrap_or_else(|| panic!("end without start: {line:?}"));
            assert!(run.end.is_none(), "two ends for {key:?}");
            assert_eq!(num(pid) as i32, run.pid, "end by another process: {line:?}");
            run.end = Some(num(ns));
        }
    }
    runs
}

/// Per target, in start order: each run starts after the previous one
/// ended (a run without an end was killed: nothing after its start may
/// come from it, which the fences and the next check cover) and has a
/// strictly higher fence. Returns the number of targets seen.
pub fn assert_exclusive(runs: &BTreeMap<(i64, i64), Run>) -> usize {
    let mut by_target: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for run in runs.values() {
        by_target.entry(&run.target).or_default().push(run);
    }
    for (target, list) in &mut by_target {
        if *target == "-" {
            continue;
        }
        list.sort_by_key(|r| r.start);
        for pair in list.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if let Some(end) = a.end {
                assert!(
                    b.start >= end,
                    "target {target}: overlap: job {} attempt {} started {} µs before \
                     job {} attempt {} ended",
                    b.job,
                    b.attempt,
                    (end - b.start) / 1000,
                    a.job,
                    a.attempt
                );
            }
            assert!(
                b.fence > a.fence,
                "target {target}: fence {} of job {}/{} not above {} of job {}/{}",
                b.fence,
                b.job,
                b.attempt,
                a.fence,
                a.job,
                a.attempt
            );
        }
    }
    by_target.len()
}

/// Every job in `ids` succeeded, and its last attempt has a complete run in
/// the ledger. Returns how many runs were cut short (killed).
pub async fn assert_all_succeeded(
    env: &Env,
    ids: &BTreeSet<i64>,
    runs: &BTreeMap<(i64, i64), Run>,
) -> usize {
    let seen: BTreeSet<i64> = runs.keys().map(|k| k.0).collect();
    let lost: Vec<_> = ids.difference(&seen).collect();
    assert!(lost.is_empty(), "jobs never started: {lost:?}");
    for id in ids {
        let job = env.job(*id).await;
        assert_eq!(job.state, State::Succeeded, "job {id}: {job:?}");
        let run = runs
            .get(&(*id, job.attempt as i64))
            .unwrap_or_else(|| panic!("job {id}: no run of its last attempt {}", job.attempt));
        assert!(
            run.end.is_some(),
            "job {id} succeeded without finishing its step"
        );
    }
    runs.values().filter(|r| r.end.is_none()).count()
}

/// The move that takes a job from `from` to `to`, if any.
fn move_for(from: State, to: State) -> Option<Move> {
    use State::*;
    Some(match (from, to) {
        (Queued, Leased) => Move::Claim,
        (Leased, Running) => Move::Start,
        (Leased, Queued) => Move::Unclaim,
        (Leased, Failed) => Move::FailLockBusy,
        (Running, Succeeded) => Move::Succeed,
        (Running, Failed | Queued) => Move::Fail,
        (Running, Cancelled) => Move::StopCancelled,
        (Running, Stale) => Move::ExpireRunning,
        (Queued | Leased | Stale, Cancelled) => Move::Cancel,
        (Stale | Failed | Cancelled, Queued) => Move::Requeue,
        _ => return None,
    })
}

/// The job's events chain from its enqueue to its current state, each step
/// a move [`jobdeck::job::check`] allows; same-state events (a cancel
/// request, a skipped slot, a released lock) only on unfinished jobs.
/// Returns the events.
pub async fn assert_valid_history(env: &Env, id: i64) -> Vec<Event> {
    let events = env.events(id).await;
    let job = env.job(id).await;
    let first = events
        .first()
        .unwrap_or_else(|| panic!("job {id}: no events"));
    assert_eq!(
        (first.from, first.to),
        (None, State::Queued),
        "job {id} starts queued: {events:?}"
    );
    for pair in events.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let from = b
            .from
            .unwrap_or_else(|| panic!("job {id}: event without a from state: {b:?}"));
        assert_eq!(
            from, a.to,
            "job {id}: events do not chain: {a:?} then {b:?}"
        );
        if from == b.to {
            assert!(
                !from.is_terminal(),
                "job {id}: event on a finished job: {b:?}"
            );
            continue;
        }
        let mv = move_for(from, b.to)
            .unwrap_or_else(|| panic!("job {id}: no move from {from} to {}: {b:?}", b.to));
        if let Err(e) = jobdeck::job::check(id, from, mv) {
            panic!("job {id}: {e}: {b:?}");
        }
        // Only a person requeues a finished or stale job, or cancels one
        // no worker holds: the event names them.
        let by_operator = matches!(
            (from, b.to),
            (
                State::Stale | State::Failed | State::Cancelled,
                State::Queued
            ) | (State::Queued | State::Stale, State::Cancelled)
        );
        if by_operator {
            assert!(
                b.actor.starts_with("operator:"),
                "job {id}: operator action without the operator: {b:?}"
            );
        }
    }
    assert_eq!(
        events.last().map(|e| e.to),
        Some(job.state),
        "job {id}: last event is not its state"
    );
    events
}

/// No lock is held any more.
pub async fn assert_no_locks(env: &Env) {
    let locks = env.store.list_locks().await.expect("list locks");
    assert!(locks.is_empty(), "locks still held: {locks:?}");
}

/// Ids of the jobs in `state`, as an operator sees them (`jobdeck jobs`).
pub async fn jobs_in(env: &Env, state: &str) -> Vec<i64> {
    let out = env
        .cli(&["jobs", "--state", state, "--limit", "10000", "--json"])
        .await;
    if !out.ok() {
        // The operator's command may meet a busy database: try next round.
        return Vec::new();
    }
    let v: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("jobs --json: not JSON ({e}): {}", out.stdout));
    v.as_array()
        .expect("jobs --json is an array")
        .iter()
        .filter_map(|j| j["id"].as_i64())
        .collect()
}

/// The operator's round: requeue every stale job (`jobdeck requeue`).
/// Returns how many were requeued.
pub async fn requeue_stale(env: &Env) -> usize {
    let stale = jobs_in(env, "stale").await;
    if stale.is_empty() {
        return 0;
    }
    let ids: Vec<String> = stale.iter().map(i64::to_string).collect();
    let mut args = vec!["requeue"];
    args.extend(ids.iter().map(String::as_str));
    let out = env.cli(&args).await;
    if out.ok() { stale.len() } else { 0 }
}

/// Pids of every process descending from `pid` (its supervisors and their
/// steps), read from /proc.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut parent: Vec<(i32, i32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok());
        if let Some(ppid) = ppid {
            parent.push((p, ppid));
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

/// Waits until none of `pids` is alive; returns the survivors after `within`.
pub async fn survivors(pids: &[i32], within: Duration) -> Vec<i32> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let alive: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|p| crate::harness::alive(*p))
            .collect();
        if alive.is_empty() || tokio::time::Instant::now() >= deadline {
            return alive;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until no job is queued, leased, running or stale, acting as the
/// operator for stale ones; panics after `within`.
pub async fn drain(env: &Env, within: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + within;
    let mut requeued = 0;
    loop {
        let counts = env.store.count_by_state().await.unwrap_or_default();
        let open: i64 = [State::Queued, State::Leased, State::Running, State::Stale]
            .iter()
            .map(|s| counts.get(s).copied().unwrap_or(0))
            .sum();
        if open == 0 && !counts.is_empty() {
            return requeued;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "jobs still unfinished after {within:?}: {counts:?}"
        );
        requeued += requeue_stale(env).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
