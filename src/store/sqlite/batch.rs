//! Group commit: many starts or finishes in one transaction. Starts, with
//! or without a target, and successes go through set-based statements and
//! their events through one INSERT; everything else goes through the
//! per-job path of `worker.rs` inside the same transaction, each write all
//! or nothing (one SQLite writer makes the per-job path cheap: no round
//! trips over a network).

use std::collections::{HashMap, HashSet};

use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use super::SqliteStore;
use super::events::Events;
use super::rows::{lease_lists, lease_of, ms, now_ms, to_json};
use super::worker::{finish_in, start_in};
use crate::job::{self, Move, State};
use crate::store::{
    LeaseRef, Outcome, Result, StartOutcome, StartSpec, StoreError, group_by_spec, item_answer,
    start_detail, successes,
};

impl SqliteStore {
    /// One transaction, one commit, for a batch of starts.
    pub(super) async fn do_start_many(
        &self,
        items: &[(LeaseRef, StartSpec)],
        worker: &str,
    ) -> Result<Vec<Result<StartOutcome>>> {
        let mut tx = self.begin().await?;
        let mut events = Events::with_capacity(items.len());
        let out = start_batch_in(&mut tx, now_ms(), items, worker, &mut events).await?;
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
        let now = now_ms();
        let mut events = Events::with_capacity(items.len());
        let (out, held) = finish_batch_in(&mut tx, now, items, actor, &mut events).await?;
        release_locks(&mut tx, &held).await?;
        events.write(&mut tx, now, actor).await?;
        tx.commit().await?;
        Ok(out)
    }
}

/// Start a batch, each start all or nothing, so one job's lost lease or
/// busy lock leaves the others' answers intact. Per spec, jobs without a
/// target start in one statement and jobs with one take their locks in
/// two; `events` (with whatever the caller recorded before) is then
/// written. What is left (a busy lock, a lost lease) goes one by one
/// through the full start, which names the holder.
async fn start_batch_in(
    tx: &mut SqliteConnection,
    now: i64,
    items: &[(LeaseRef, StartSpec)],
    worker: &str,
    events: &mut Events,
) -> Result<Vec<Result<StartOutcome>>> {
    let mut started: HashMap<LeaseRef, (i32, Option<i64>)> = HashMap::new();
    for (spec, leases) in group_by_spec(items) {
        let untargeted = start_untargeted(tx, now, &leases, &spec).await?;
        started.extend(untargeted.into_iter().map(|(l, a)| (l, (a, None))));
        let rest: Vec<LeaseRef> = leases
            .into_iter()
            .filter(|l| !started.contains_key(l))
            .collect();
        started.extend(start_targeted(tx, now, &rest, &spec, worker).await?);
    }
    for (lease, _) in items {
        if let Some((attempt, fence)) = started.get(lease) {
            events.push(
                lease.id,
                State::Leased,
                State::Running,
                start_detail(*attempt, *fence),
            );
        }
    }
    events.write(tx, now, worker).await?;
    let mut out = Vec::with_capacity(items.len());
    for (lease, spec) in items {
        out.push(match started.get(lease) {
            Some((attempt, fence)) => Ok(StartOutcome::Started {
                attempt: *attempt,
                fence: *fence,
            }),
            None => item_answer(start_in(tx, now, *lease, spec, worker).await)?,
        });
    }
    Ok(out)
}

/// A lock a job held when it succeeded, not yet released: (target, fence,
/// job).
pub(super) type HeldLock = (String, i64, i64);

/// Finish a batch, each finish all or nothing. The rest go one by one
/// through the full decision first; successes, the bulk of any batch,
/// then take one statement together, their events left in `events` and
/// the locks they held returned for the caller to release (see
/// [`release_locks`]).
pub(super) async fn finish_batch_in(
    tx: &mut SqliteConnection,
    now: i64,
    items: &[(LeaseRef, Outcome)],
    actor: &str,
    events: &mut Events,
) -> Result<(Vec<Result<State>>, Vec<HeldLock>)> {
    let others = finish_one_by_one(tx, now, items, actor).await?;
    let (done, held) = succeed_all(tx, now, &successes(items), events).await?;
    Ok((finish_answers(items, others, &done), held))
}

/// The finishes of a batch that are not successes, each through the full
/// decision (retry, fail, cancel) of the per-job path.
pub(super) async fn finish_one_by_one(
    tx: &mut SqliteConnection,
    now: i64,
    items: &[(LeaseRef, Outcome)],
    actor: &str,
) -> Result<HashMap<LeaseRef, Result<State>>> {
    let mut others = HashMap::new();
    for (lease, outcome) in items {
        if *outcome != Outcome::Succeeded {
            let answer = item_answer(finish_in(tx, now, *lease, outcome.clone(), actor).await)?;
            others.insert(*lease, answer);
        }
    }
    Ok(others)
}

/// Each finish's answer, in the batch's order: the one-by-one answer, or
/// whether its success was written (`done`).
pub(super) fn finish_answers(
    items: &[(LeaseRef, Outcome)],
    mut others: HashMap<LeaseRef, Result<State>>,
    done: &HashSet<LeaseRef>,
) -> Vec<Result<State>> {
    items
        .iter()
        .map(|(lease, outcome)| {
            if *outcome != Outcome::Succeeded {
                others
                    .remove(lease)
                    .unwrap_or(Err(StoreError::LeaseLost(lease.id)))
            } else if done.contains(lease) {
                Ok(State::Succeeded)
            } else {
                Err(StoreError::LeaseLost(lease.id))
            }
        })
        .collect()
}

/// Free the locks finished jobs held, each only while that job still
/// holds it under its fence.
pub(super) async fn release_locks(tx: &mut SqliteConnection, held: &[HeldLock]) -> Result<()> {
    if held.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE locks SET holder_job = NULL, holder_worker = NULL, acquired_at = NULL,
             expires_at = NULL
         WHERE (target, fence, holder_job) IN (
             SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(?))",
    )
    .bind(to_json(held)?)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Start every listed leased job that has no target (no lock to take):
/// count the attempt, write `running`. Returns the attempt of each job
/// started; the others are left untouched.
async fn start_untargeted(
    tx: &mut SqliteConnection,
    now: i64,
    leases: &[LeaseRef],
    spec: &StartSpec,
) -> Result<HashMap<LeaseRef, i32>> {
    if leases.is_empty() {
        return Ok(HashMap::new());
    }
    job::check(leases[0].id, State::Leased, Move::Start)?;
    let (ids, tokens) = lease_lists(leases)?;
    let rows = sqlx::query(
        "UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_expires_at = ?1 + ?2,
             started_at = ?1, lock_fence = NULL, on_stale = ?3, backoff_ms = ?4
         FROM json_each(?5) AS lease
         WHERE jobs.id = lease.value AND jobs.lease_token = ?6 ->> lease.key
           AND jobs.state = 'leased' AND jobs.target IS NULL
         RETURNING id, lease_token, attempt",
    )
    .bind(now)
    .bind(ms(spec.lease))
    .bind(spec.on_stale.as_str())
    .bind(ms(spec.backoff))
    .bind(ids)
    .bind(tokens)
    .fetch_all(&mut *tx)
    .await?;
    rows.iter()
        .map(|row| Ok((lease_of(row)?, row.try_get("attempt")?)))
        .collect()
}

/// Start every listed leased job that has a target whose lock is free:
/// take the locks in one statement (fence + 1, in target order, the
/// smallest id first where two jobs want one target), then write
/// `running` with each fence and count the attempt in a second. A lock
/// held by another job is left untouched, and so is its contender: the
/// per-job start answers it, naming the holder.
async fn start_targeted(
    tx: &mut SqliteConnection,
    now: i64,
    leases: &[LeaseRef],
    spec: &StartSpec,
    worker: &str,
) -> Result<HashMap<LeaseRef, (i32, Option<i64>)>> {
    if leases.is_empty() {
        return Ok(HashMap::new());
    }
    job::check(leases[0].id, State::Leased, Move::Start)?;
    let lease_ms = ms(spec.lease);
    let (ids, tokens) = lease_lists(leases)?;
    // An upsert's RETURNING names only the rows it inserted or updated:
    // exactly the locks this statement took.
    let taken: Vec<(i64, i64)> = sqlx::query_as(
        "INSERT INTO locks (target, fence, holder_job, holder_worker, acquired_at, expires_at)
         SELECT jobs.target, 1, jobs.id, ?2, ?3, ?3 + ?4
         FROM json_each(?1) AS lease
         JOIN jobs ON jobs.id = lease.value AND jobs.lease_token = ?5 ->> lease.key
         WHERE jobs.state = 'leased' AND jobs.target IS NOT NULL
         ORDER BY jobs.target, jobs.id
         ON CONFLICT (target) DO UPDATE SET fence = locks.fence + 1,
             holder_job = excluded.holder_job, holder_worker = excluded.holder_worker,
             acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
         WHERE locks.holder_job IS NULL
         RETURNING holder_job, fence",
    )
    .bind(ids)
    .bind(worker)
    .bind(now)
    .bind(lease_ms)
    .bind(tokens)
    .fetch_all(&mut *tx)
    .await?;
    if taken.is_empty() {
        return Ok(HashMap::new());
    }
    let taken = to_json(&taken)?;
    let rows = sqlx::query(
        "UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_expires_at = ?1 + ?2,
             started_at = ?1, lock_fence = t.value ->> 1, on_stale = ?3, backoff_ms = ?4
         FROM json_each(?5) AS t
         WHERE jobs.id = t.value ->> 0 AND jobs.state = 'leased'
         RETURNING id, lease_token, attempt, lock_fence",
    )
    .bind(now)
    .bind(lease_ms)
    .bind(spec.on_stale.as_str())
    .bind(ms(spec.backoff))
    .bind(taken)
    .fetch_all(&mut *tx)
    .await?;
    rows.iter()
        .map(|row| {
            let running = (row.try_get("attempt")?, row.try_get("lock_fence")?);
            Ok((lease_of(row)?, running))
        })
        .collect()
}

/// The statement that marks running jobs succeeded; `$now`, `$ids` and
/// `$tokens` name its parameters (the time and the leases as
/// [`lease_lists`] gives them), so that the cycle can send it ahead of its
/// claim in one round trip. The leases are joined (`UPDATE … FROM`), not
/// tested with `IN (SELECT …)`, which builds a temporary index and a 10 KB
/// Bloom filter at every call: the statement ran 22 % fewer instructions
/// (bench/HISTORY.md, session 18).
macro_rules! succeed_jobs {
    ($now:literal, $ids:literal, $tokens:literal) => {
        concat!(
            "UPDATE jobs SET state = 'succeeded', finished_at = ",
            $now,
            ", lease_expires_at = NULL
             FROM json_each(",
            $ids,
            ") AS lease
             WHERE jobs.id = lease.value AND jobs.lease_token = ",
            $tokens,
            " ->> lease.key
               AND jobs.state = 'running'
             RETURNING id, lease_token, target, lock_fence"
        )
    };
}
pub(super) use succeed_jobs;

/// Mark every listed running job succeeded, leaving the events in
/// `events`. Returns the leases that were still held (the others were
/// lost) and the locks those jobs held.
pub(super) async fn succeed_all(
    tx: &mut SqliteConnection,
    now: i64,
    leases: &[LeaseRef],
    events: &mut Events,
) -> Result<(HashSet<LeaseRef>, Vec<HeldLock>)> {
    if leases.is_empty() {
        return Ok(Default::default());
    }
    job::check(leases[0].id, State::Running, Move::Succeed)?;
    let (ids, tokens) = lease_lists(leases)?;
    let rows = sqlx::query(succeed_jobs!("?1", "?2", "?3"))
        .bind(now)
        .bind(ids)
        .bind(tokens)
        .fetch_all(&mut *tx)
        .await?;
    succeeded(&rows, leases, events)
}

/// Read what [`succeed_jobs`] returned for `leases`: the leases that were
/// still held and the locks their jobs held; their events go to `events`.
pub(super) fn succeeded(
    rows: &[SqliteRow],
    leases: &[LeaseRef],
    events: &mut Events,
) -> Result<(HashSet<LeaseRef>, Vec<HeldLock>)> {
    let mut done = HashSet::with_capacity(rows.len());
    let mut held = Vec::new();
    for row in rows {
        let lease = lease_of(row)?;
        done.insert(lease);
        let target: Option<String> = row.try_get("target")?;
        let fence: Option<i64> = row.try_get("lock_fence")?;
        if let (Some(t), Some(f)) = (target, fence) {
            held.push((t, f, lease.id));
        }
    }
    // RETURNING has no defined order; the history follows the request's.
    for lease in leases {
        if done.contains(lease) {
            events.push(lease.id, State::Running, State::Succeeded, String::new());
        }
    }
    Ok((done, held))
}
