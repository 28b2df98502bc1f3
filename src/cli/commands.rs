//! The non-interactive commands on the store.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::json;

use super::args::{EnqueueArgs, JobsArgs, ScheduleAction};
use super::output::{self, opt, relative, time};
use crate::config::Config;
use crate::job::{Job, operator_actor};
use crate::store::{FireSlot, JobFilter, JobOrder, NewJob, Store, StoreError};

pub async fn enqueue(store: &Store, config: &Config, a: EnqueueArgs) -> Result<()> {
    let pipeline = config.pipeline(&a.pipeline);
    if config.source.is_some() && pipeline.is_none() {
        bail!(
            "unknown pipeline {:?} (the config {} defines: {})",
            a.pipeline,
            config
                .source
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            config.pipeline_names().join(", ")
        );
    }
    let job = NewJob {
        pipeline: a.pipeline,
        target: a.target,
        args: a
            .args
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect(),
        priority: a.priority,
        run_at: a.at,
        delay: a.delay,
        unique_key: a.unique_key,
        max_attempts: a.max_attempts.or(pipeline.map(|p| p.max_attempts)),
    };
    let done = store.enqueue(job, &operator_actor()).await?;
    if a.json {
        output::json(&done);
    } else {
        println!("{}", done.id);
    }
    Ok(())
}

pub async fn jobs(store: &Store, a: JobsArgs) -> Result<()> {
    let filter = JobFilter {
        states: a.state,
        pipeline: a.pipeline,
        target: a.target,
        text: None,
        limit: a.limit as usize,
        order: JobOrder::Newest,
    };
    let jobs = store.list_jobs(&filter).await?;
    if a.json {
        output::json(&jobs);
        return Ok(());
    }
    let now = store.now().await?;
    output::table(
        &[
            "id",
            "state",
            "pipeline",
            "target",
            "pri",
            "attempt",
            "step",
            "due",
            "owner",
            "lease",
            "last error",
        ],
        jobs.iter().map(|j| job_row(j, now)).collect(),
    );
    Ok(())
}

fn job_row(j: &Job, now: chrono::DateTime<chrono::Utc>) -> Vec<String> {
    vec![
        j.id.to_string(),
        j.state.to_string(),
        j.pipeline.clone(),
        opt(&j.target),
        j.priority.to_string(),
        format!("{}/{}", j.attempt, j.max_attempts),
        j.step.to_string(),
        if j.state.is_terminal() {
            String::new()
        } else {
            relative(Some(j.due_at), now)
        },
        opt(&j.lease_owner),
        relative(j.lease_expires_at, now),
        j.last_error
            .clone()
            .unwrap_or_default()
            .chars()
            .take(60)
            .collect(),
    ]
}

pub async fn show(store: &Store, id: i64, as_json: bool) -> Result<()> {
    let job = store.get_job(id).await?;
    let events = store.job_events(id).await?;
    let out = store.job_output(id).await?;
    if as_json {
        output::json(&json!({ "job": job, "events": events, "output": out }));
        return Ok(());
    }
    let fields = serde_json::to_value(&job)?;
    if let Some(map) = fields.as_object() {
        let width = map.keys().map(|k| k.len()).max().unwrap_or(0);
        for (k, v) in map {
            let shown = match v {
                serde_json::Value::Null => String::new(),
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            println!("{k:width$}  {shown}");
        }
    }
    println!();
    output::table(
        &["at", "from", "to", "actor", "detail"],
        events
            .iter()
            .map(|e| {
                vec![
                    time(Some(e.at)),
                    opt(&e.from),
                    e.to.to_string(),
                    e.actor.clone(),
                    e.detail.clone(),
                ]
            })
            .collect(),
    );
    if let Some(out) = out {
        println!("\noutput (last lines):\n{out}");
    }
    Ok(())
}

#[derive(Serialize)]
struct ActionResult {
    id: i64,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Apply an operator action to each id; report each; fail if any failed.
async fn for_each_id<F, Fut>(ids: &[i64], as_json: bool, mut act: F) -> Result<()>
where
    F: FnMut(i64) -> Fut,
    Fut: std::future::Future<Output = Result<String, StoreError>>,
{
    let mut results = Vec::new();
    for &id in ids {
        results.push(match act(id).await {
            Ok(r) => ActionResult {
                id,
                ok: true,
                result: Some(r),
                error: None,
            },
            Err(e) => ActionResult {
                id,
                ok: false,
                result: None,
                error: Some(e.to_string()),
            },
        });
    }
    let failed = results.iter().filter(|r| !r.ok).count();
    if as_json {
        output::json(&results);
    } else {
        for r in &results {
            match (&r.result, &r.error) {
                (Some(res), _) => println!("job {}: {res}", r.id),
                (_, Some(err)) => eprintln!("jobdeck: {err}"),
                _ => {}
            }
        }
    }
    if failed > 0 {
        // Already reported per job; the exit status carries the failure.
        return Err(super::Reported.into());
    }
    Ok(())
}

pub async fn cancel(store: &Store, ids: &[i64], as_json: bool) -> Result<()> {
    let actor = operator_actor();
    for_each_id(ids, as_json, |id| {
        let (store, actor) = (store.clone(), actor.clone());
        async move {
            Ok(match store.cancel(id, &actor).await? {
                crate::store::CancelOutcome::Cancelled => "cancelled".to_string(),
                crate::store::CancelOutcome::Requested => {
                    "cancel requested (its worker stops it)".to_string()
                }
            })
        }
    })
    .await
}

pub async fn requeue(store: &Store, ids: &[i64], as_json: bool) -> Result<()> {
    let actor = operator_actor();
    for_each_id(ids, as_json, |id| {
        let (store, actor) = (store.clone(), actor.clone());
        async move {
            store
                .requeue(id, &actor)
                .await
                .map(|()| "requeued".to_string())
        }
    })
    .await
}

pub async fn extend(
    store: &Store,
    config: &Config,
    ids: &[i64],
    by: Duration,
    as_json: bool,
) -> Result<()> {
    let actor = operator_actor();
    let alive = config.workers.lease * 3;
    for_each_id(ids, as_json, |id| {
        let (store, actor) = (store.clone(), actor.clone());
        async move {
            let until = store.extend(id, by, alive, &actor).await?;
            Ok(format!("lease extended to {}", time(Some(until))))
        }
    })
    .await
}

pub async fn release(store: &Store, target: &str, as_json: bool) -> Result<()> {
    let job = store.release_lock(target, &operator_actor()).await?;
    if as_json {
        output::json(&json!({ "target": target, "job_id": job, "released": true }));
    } else {
        println!("lock on {target} released (was held by stale job {job})");
    }
    Ok(())
}

pub async fn locks(store: &Store, as_json: bool) -> Result<()> {
    let locks = store.list_locks().await?;
    if as_json {
        output::json(&locks);
        return Ok(());
    }
    output::table(
        &[
            "target", "fence", "job", "state", "worker", "acquired", "waiting",
        ],
        locks
            .iter()
            .map(|l| {
                vec![
                    l.target.clone(),
                    l.fence.to_string(),
                    l.job_id.to_string(),
                    l.job_state.to_string(),
                    opt(&l.worker_id),
                    time(Some(l.acquired_at)),
                    l.waiting.to_string(),
                ]
            })
            .collect(),
    );
    Ok(())
}

pub async fn workers(store: &Store, as_json: bool) -> Result<()> {
    let workers = store.list_workers().await?;
    if as_json {
        output::json(&workers);
        return Ok(());
    }
    let now = store.now().await?;
    output::table(
        &[
            "id",
            "host",
            "pid",
            "busy",
            "heartbeat",
            "state",
            "pipelines",
        ],
        workers
            .iter()
            .map(|w| {
                vec![
                    w.id.clone(),
                    w.host.clone(),
                    w.pid.to_string(),
                    format!("{}/{}", w.busy, w.slots),
                    relative(Some(w.heartbeat_at), now),
                    if w.gone {
                        "gone"
                    } else if w.paused {
                        "paused"
                    } else {
                        "alive"
                    }
                    .to_string(),
                    w.pipelines.join(","),
                ]
            })
            .collect(),
    );
    Ok(())
}

pub async fn stats(store: &Store, as_json: bool) -> Result<()> {
    let counts = store.count_by_state().await?;
    if as_json {
        let map: serde_json::Map<String, serde_json::Value> = counts
            .iter()
            .map(|(s, n)| (s.to_string(), json!(n)))
            .collect();
        output::json(&map);
    } else {
        output::table(
            &["state", "jobs"],
            counts
                .iter()
                .map(|(s, n)| vec![s.to_string(), n.to_string()])
                .collect(),
        );
    }
    Ok(())
}

pub async fn schedules(store: &Store, as_json: bool) -> Result<()> {
    let list = store.list_schedules().await?;
    if as_json {
        output::json(&list);
        return Ok(());
    }
    output::table(
        &[
            "name",
            "pipeline",
            "target",
            "cron",
            "next fire",
            "last job",
            "last skip",
            "state",
        ],
        list.iter()
            .map(|s| {
                vec![
                    s.def.name.clone(),
                    s.def.pipeline.clone(),
                    opt(&s.def.target),
                    s.def.cron.clone(),
                    time(s.next_fire_at),
                    opt(&s.last_job_id),
                    time(s.last_skip_at),
                    if !s.def.enabled {
                        "disabled"
                    } else if s.paused {
                        "paused"
                    } else {
                        "active"
                    }
                    .to_string(),
                ]
            })
            .collect(),
    );
    Ok(())
}

pub async fn schedule(store: &Store, action: ScheduleAction) -> Result<()> {
    match action {
        ScheduleAction::Pause { name } => {
            store.set_schedule_paused(&name, true).await?;
            println!("schedule {name} paused");
        }
        ScheduleAction::Resume { name } => {
            store.set_schedule_paused(&name, false).await?;
            println!("schedule {name} resumed");
        }
        ScheduleAction::Run { name } => {
            let list = store.list_schedules().await?;
            let s = list
                .iter()
                .find(|s| s.def.name == name)
                .with_context(|| format!("no schedule named {name:?}"))?;
            match store
                .fire_schedule(s.id, FireSlot::Manual, &operator_actor())
                .await?
            {
                crate::store::FireResult::Fired { job_id } => println!("{job_id}"),
                crate::store::FireResult::Skipped { blocking_job } => {
                    bail!(
                        "schedule {name} not fired: its job {blocking_job} is unfinished (overlap = \"skip\")"
                    )
                }
                crate::store::FireResult::NotFired => {
                    bail!("schedule {name} not fired (paused or disabled)")
                }
            }
        }
    }
    Ok(())
}

/// Block until every job is terminal. Exit code: 0 all succeeded, 1 some
/// did not, 124 timeout.
pub async fn wait(store: &Store, ids: &[i64], timeout: Option<Duration>) -> Result<i32> {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    loop {
        let mut all_done = true;
        let mut all_ok = true;
        for &id in ids {
            let job = store.get_job(id).await?;
            all_done &= job.state.is_terminal();
            all_ok &= job.state == crate::job::State::Succeeded;
        }
        if all_done {
            return Ok(if all_ok { 0 } else { 1 });
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            return Ok(124);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
