//! Group commit: many starts or finishes in one transaction, and the
//! engine's cycle (finish, claim, start in one commit). Jobs without a
//! target start, and successes finish, in set-based statements; everything
//! else goes through the per-job path of `worker.rs` inside the same
//! transaction, each write all or nothing (one SQLite writer makes the
//! per-job path cheap: no round trips over a network).

use sqlx::{Row, SqliteConnection};

use super::SqliteStore;
use super::rows::{lease_pairs, ms, now_ms};
use super::worker::{claim_in, finish_in, start_in};
use crate::job::{self, Move, State};
use crate::store::{
    CycleOutcome, CycleRequest, LeaseRef, Outcome, Result, StartOutcome, StartSpec, StoreError,
    group_by_spec, item_answer, successes,
};

impl SqliteStore {
    /// One transaction, one commit, for a batch of starts.
    pub(super) async fn do_start_many(
        &self,
        items: &[(LeaseRef, StartSpec)],
        worker: &str,
    ) -> Result<Vec<Result<StartOutcome>>> {
        let mut tx = self.begin().await?;
        let out = start_batch_in(&mut tx, now_ms(), items, worker).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// One transaction, one commit, for a batch of finishes.
    pub(super) async fn do_finish_many(
        &self,
        items: &[(LeaseRef, Outcome)],
        actor: &str,
    ) -> Result<Vec<Result<State>>> {
        let mut tx = self.begin().await?;
        let out = finish_batch_in(&mut tx, now_ms(), items, actor).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Finish, claim and start in one transaction: the claim sees the
    /// slots and locks the finishes just freed.
    pub(super) async fn do_cycle(&self, req: &CycleRequest, worker: &str) -> Result<CycleOutcome> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let finished = finish_batch_in(&mut tx, now, &req.finishes, worker).await?;
        let jobs = match &req.claim {
            Some(claim) => claim_in(&mut tx, now, claim).await?,
            None => Vec::new(),
        };
        let (startable, starts) = crate::store::startable(&jobs, &req.specs);
        let answers = start_batch_in(&mut tx, now, &starts, worker).await?;
        tx.commit().await?;
        Ok(CycleOutcome {
            finished,
            claimed: crate::store::pair_starts(jobs, startable, answers),
        })
    }
}

/// Start a batch, each start all or nothing, so one job's lost lease or
/// busy lock leaves the others' answers intact. Jobs without a target need
/// no lock: each group of one spec starts in two statements. What is left
/// (targets, lost leases) goes one by one through the full start.
async fn start_batch_in(
    tx: &mut SqliteConnection,
    now: i64,
    items: &[(LeaseRef, StartSpec)],
    worker: &str,
) -> Result<Vec<Result<StartOutcome>>> {
    let mut started = std::collections::HashMap::new();
    for (spec, leases) in group_by_spec(items) {
        started.extend(start_untargeted(tx, now, &leases, &spec, worker).await?);
    }
    let mut out = Vec::with_capacity(items.len());
    for (lease, spec) in items {
        out.push(match started.get(lease) {
            Some(attempt) => Ok(StartOutcome::Started {
                attempt: *attempt,
                fence: None,
            }),
            None => item_answer(start_in(tx, now, *lease, spec, worker).await)?,
        });
    }
    Ok(out)
}

/// Finish a batch, each finish all or nothing. Successes, the bulk of any
/// batch, take three statements together; the rest go one by one through
/// the full decision.
async fn finish_batch_in(
    tx: &mut SqliteConnection,
    now: i64,
    items: &[(LeaseRef, Outcome)],
    actor: &str,
) -> Result<Vec<Result<State>>> {
    let done = succeed_all(tx, now, &successes(items), actor).await?;
    let mut out = Vec::with_capacity(items.len());
    for (lease, outcome) in items {
        out.push(if *outcome == Outcome::Succeeded {
            if done.contains(lease) {
                Ok(State::Succeeded)
            } else {
                Err(StoreError::LeaseLost(lease.id))
            }
        } else {
            item_answer(finish_in(tx, now, *lease, outcome.clone(), actor).await)?
        });
    }
    Ok(out)
}

/// Start every listed leased job that has no target (no lock to take):
/// count the attempt, write `running`, record the events. Returns the
/// attempt of each job started; the others are left untouched.
async fn start_untargeted(
    tx: &mut SqliteConnection,
    now: i64,
    leases: &[LeaseRef],
    spec: &StartSpec,
    worker: &str,
) -> Result<std::collections::HashMap<LeaseRef, i32>> {
    if leases.is_empty() {
        return Ok(Default::default());
    }
    job::check(leases[0].id, State::Leased, Move::Start)?;
    let pairs = lease_pairs(leases)?;
    let rows = sqlx::query(
        "UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_expires_at = ?1 + ?2,
             started_at = ?1, lock_fence = NULL, on_stale = ?3, backoff_ms = ?4
         WHERE state = 'leased' AND target IS NULL
           AND (id, lease_token) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                     FROM json_each(?5))
         RETURNING id, lease_token, attempt",
    )
    .bind(now)
    .bind(ms(spec.lease))
    .bind(spec.on_stale.as_str())
    .bind(ms(spec.backoff))
    .bind(&pairs)
    .fetch_all(&mut *tx)
    .await?;
    let mut started = std::collections::HashMap::new();
    let mut events = Vec::with_capacity(rows.len());
    for row in &rows {
        let id: i64 = row.try_get("id")?;
        let attempt: i32 = row.try_get("attempt")?;
        started.insert(
            LeaseRef {
                id,
                token: row.try_get("lease_token")?,
            },
            attempt,
        );
        events.push(serde_json::json!([
            id,
            crate::store::start_detail(attempt, None)
        ]));
    }
    if !events.is_empty() {
        sqlx::query(
            "INSERT INTO job_events (job_id, at, from_state, to_state, actor, detail)
             SELECT json_extract(value, '$[0]'), ?, 'leased', 'running', ?, json_extract(value, '$[1]')
             FROM json_each(?) ORDER BY key",
        )
        .bind(now)
        .bind(worker)
        .bind(serde_json::Value::Array(events).to_string())
        .execute(&mut *tx)
        .await?;
    }
    Ok(started)
}

/// Mark every listed running job succeeded, release their locks by fence
/// and record the events: three statements for the whole batch. Returns
/// the ids that were still held (the others' leases were lost).
async fn succeed_all(
    tx: &mut SqliteConnection,
    now: i64,
    leases: &[LeaseRef],
    actor: &str,
) -> Result<std::collections::HashSet<LeaseRef>> {
    if leases.is_empty() {
        return Ok(Default::default());
    }
    job::check(leases[0].id, State::Running, Move::Succeed)?;
    let pairs = lease_pairs(leases)?;
    let rows = sqlx::query(
        "UPDATE jobs SET state = 'succeeded', finished_at = ?1, lease_expires_at = NULL
         WHERE state = 'running'
           AND (id, lease_token) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                     FROM json_each(?2))
         RETURNING id, lease_token, target, lock_fence",
    )
    .bind(now)
    .bind(&pairs)
    .fetch_all(&mut *tx)
    .await?;
    let mut ids = Vec::with_capacity(rows.len());
    let mut done = std::collections::HashSet::new();
    let mut held = Vec::new();
    for row in &rows {
        let id: i64 = row.try_get("id")?;
        done.insert(LeaseRef {
            id,
            token: row.try_get("lease_token")?,
        });
        let target: Option<String> = row.try_get("target")?;
        let fence: Option<i64> = row.try_get("lock_fence")?;
        if let (Some(t), Some(f)) = (target, fence) {
            held.push(serde_json::json!([t, f, id]));
        }
        ids.push(id);
    }
    if !held.is_empty() {
        sqlx::query(
            "UPDATE locks SET holder_job = NULL, holder_worker = NULL, acquired_at = NULL,
                 expires_at = NULL
             WHERE (target, fence, holder_job) IN (
                 SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
                        json_extract(value, '$[2]') FROM json_each(?))",
        )
        .bind(serde_json::Value::Array(held).to_string())
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query(
        "INSERT INTO job_events (job_id, at, from_state, to_state, actor, detail)
         SELECT value, ?, 'running', 'succeeded', ?, '' FROM json_each(?) ORDER BY key",
    )
    .bind(now)
    .bind(actor)
    .bind(serde_json::to_string(&ids).map_err(|e| StoreError::Invalid(e.to_string()))?)
    .execute(&mut *tx)
    .await?;
    Ok(done)
}
