//! Operator commands, run against the store (as the operator) or this
//! node's engine. Each answers with the flash line to show: the result, or
//! the store's one-line reason for refusing.

use std::time::Duration;

use crate::engine::EngineHandle;
use crate::store::{CancelOutcome, FireResult, FireSlot, NewJob, Store};

use super::dialogs::job_list;
use super::state::Flash;

#[derive(Debug, Clone, PartialEq)]
pub struct EnqueueSpec {
    pub pipeline: String,
    pub target: Option<String>,
    pub args: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Cancel(Vec<i64>),
    Requeue(Vec<i64>),
    Extend {
        ids: Vec<i64>,
        by: Duration,
    },
    ReleaseLock(String),
    FireNow {
        id: i64,
        name: String,
    },
    SetSchedulePaused {
        name: String,
        paused: bool,
    },
    Enqueue(EnqueueSpec),
    /// Flip this node's claiming between paused and running.
    ToggleNodePause,
    /// Add (or remove, negative) slots on this node.
    Slots(i32),
}

impl Command {
    /// The y/n question asked before running it, for those that need one.
    pub fn question(&self) -> Option<String> {
        match self {
            Command::Cancel(ids) => Some(format!("Cancel {}?", job_list(ids))),
            Command::Requeue(ids) => Some(format!("Requeue {}?", job_list(ids))),
            Command::ReleaseLock(target) => Some(format!(
                "Release the lock on {target}? Its stale holder may have left it half-changed."
            )),
            _ => None,
        }
    }
}

/// Who and what the commands act on.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub store: Store,
    pub engine: Option<EngineHandle>,
    pub actor: String,
    /// A worker silent this long is gone: its jobs' leases are not extended.
    pub worker_alive: Duration,
    /// Each configured pipeline's max_attempts, given to the jobs enqueued
    /// here as `jobdeck enqueue` does.
    pub max_attempts: std::collections::BTreeMap<String, i32>,
}

pub async fn execute(cmd: Command, ctx: &Ctx) -> Flash {
    let store = &ctx.store;
    let actor = ctx.actor.as_str();
    match cmd {
        Command::Cancel(ids) => {
            per_job(&ids, "cancelled", |id| async move {
                match store.cancel(id, actor).await? {
                    CancelOutcome::Cancelled => Ok("cancelled"),
                    CancelOutcome::Requested => Ok("cancel requested (its worker stops it)"),
                }
            })
            .await
        }
        Command::Requeue(ids) => {
            per_job(&ids, "requeued", |id| async move {
                store.requeue(id, actor).await.map(|()| "requeued")
            })
            .await
        }
        Command::Extend { ids, by } => {
            let alive = ctx.worker_alive;
            let what = format!("lease extended by {}", humantime::format_duration(by));
            per_job(&ids, &what, |id| async move {
                store
                    .extend(id, by, alive, actor)
                    .await
                    .map(|_| "lease extended")
            })
            .await
        }
        Command::ReleaseLock(target) => match store.release_lock(&target, actor).await {
            Ok(job) => Flash::ok(format!(
                "lock on {target} released (held by stale job {job})"
            )),
            Err(e) => Flash::err(e.to_string()),
        },
        Command::FireNow { id, name } => {
            match store.fire_schedule(id, FireSlot::Manual, actor).await {
                Ok(FireResult::Fired { job_id }) => {
                    Flash::ok(format!("schedule {name} fired: job {job_id}"))
                }
                Ok(FireResult::Skipped { blocking_job }) => Flash::err(format!(
                    "schedule {name} skipped: its previous job {blocking_job} is unfinished"
                )),
                Ok(FireResult::NotFired) => {
                    Flash::err(format!("schedule {name} did not fire (paused or disabled)"))
                }
                Err(e) => Flash::err(e.to_string()),
            }
        }
        Command::SetSchedulePaused { name, paused } => {
            match store.set_schedule_paused(&name, paused).await {
                Ok(()) if paused => Flash::ok(format!("schedule {name} paused")),
                Ok(()) => Flash::ok(format!("schedule {name} resumed")),
                Err(e) => Flash::err(e.to_string()),
            }
        }
        Command::Enqueue(spec) => {
            let job = NewJob {
                max_attempts: ctx.max_attempts.get(&spec.pipeline).copied(),
                pipeline: spec.pipeline.clone(),
                target: spec.target,
                args: spec.args,
                ..NewJob::default()
            };
            match store.enqueue(job, actor).await {
                Ok(e) if e.deduplicated => {
                    Flash::ok(format!("already queued as job {} (deduplicated)", e.id))
                }
                Ok(e) => Flash::ok(format!("enqueued job {} ({})", e.id, spec.pipeline)),
                Err(e) => Flash::err(e.to_string()),
            }
        }
        Command::ToggleNodePause => match &ctx.engine {
            Some(engine) => {
                let paused = !engine.status().paused;
                engine.set_paused(paused);
                Flash::ok(if paused {
                    "this node stopped claiming jobs (running ones go on)"
                } else {
                    "this node claims jobs again"
                })
            }
            None => no_workers(),
        },
        Command::Slots(delta) => match &ctx.engine {
            Some(engine) => {
                let now = engine.status().slots;
                let slots = now.saturating_add_signed(delta as isize).max(1);
                engine.set_slots(slots);
                Flash::ok(format!("slots: {now} → {slots}"))
            }
            None => no_workers(),
        },
    }
}

fn no_workers() -> Flash {
    Flash::err("this console runs no workers (--no-workers)")
}

/// Apply `op` to each job and sum up: one job's result verbatim; for
/// several, how many succeeded and the first refusal.
async fn per_job<'a, F, Fut>(ids: &[i64], done: &str, op: F) -> Flash
where
    F: Fn(i64) -> Fut,
    Fut: Future<Output = crate::store::Result<&'static str>> + 'a,
{
    let mut ok = 0usize;
    let mut first_ok = "";
    let mut errors = Vec::new();
    for &id in ids {
        match op(id).await {
            Ok(what) => {
                ok += 1;
                first_ok = what;
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    match (ids, errors.first()) {
        ([], _) => Flash::err("no job selected"),
        ([id], None) => Flash::ok(format!("job {id} {first_ok}")),
        ([_], Some(e)) => Flash::err(e.clone()),
        (_, None) => Flash::ok(format!("{ok} jobs {done}")),
        (_, Some(e)) => Flash::err(format!(
            "{ok} of {} jobs {done}; {} refused, first: {e}",
            ids.len(),
            errors.len()
        )),
    }
}
