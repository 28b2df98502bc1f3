//! The engine's cycle on SQLite: finish, claim and start in one
//! transaction, in as few round trips as the writes allow. Each round
//! trip is a hand-off through sqlx's connection thread and back, and with
//! short jobs their count, not SQLite's work, sets the pace. Between BEGIN
//! and COMMIT there are two: the successes (one UPDATE) and the claim
//! that starts every claimed job (one UPDATE) go together, as one
//! multi-statement query; then the locks handed on and taken (one upsert,
//! only with targets) and the history (one INSERT) go together.
//!
//! The claim starts targeted jobs before their locks are written, with
//! the fence the lock will get: within `BEGIN IMMEDIATE` nothing else
//! writes, the claim only takes targets whose lock is free or held by a
//! job this cycle finishes, and one job per target. The lock upsert then
//! checks that every lock went as predicted, or the whole cycle rolls
//! back (and the engine writes its parts on their own).
//!
//! A query of several statements runs them in order on the connection's
//! thread, binding the numbered parameters (`?N`) of each from the one
//! argument list, and streams each statement's rows followed by its
//! result: that is how the rows are told apart below. sqlx 0.9 keeps this
//! for SQLite only and calls it deprecated on `Query::fetch_many` (its
//! replacement, `raw_sql`, takes no parameters); the contract tests run
//! every cycle through it, so an upgrade that drops it fails them.

use std::collections::{HashMap, HashSet};

use futures::TryStreamExt;
use sqlx::sqlite::{SqliteQueryResult, SqliteRow};
use sqlx::{Either, Executor, Row, SqliteConnection};

use super::SqliteStore;
use super::batch::{
    HeldLock, finish_answers, finish_one_by_one, succeed_all, succeed_jobs, succeeded,
};
use super::events::{Events, insert_events};
use super::rows::{job_cols, job_from_row, lease_pairs, ms, now_ms, to_json};
use super::worker::{claim_picks, sort_claim_order};
use crate::job::{Job, State};
use crate::store::{
    ClaimRequest, Claimed, CycleOutcome, CycleRequest, LeaseRef, Result, StartSpec, StoreError,
    start_detail, successes,
};

/// The claim that starts what it takes. Parameters: ?1 now, ?2 pipelines,
/// ?3 limit, ?4 the jobs whose locks count as free, ?5 worker, ?6 the
/// claim's lease, ?7 the start specs.
macro_rules! claim_and_start_jobs {
    () => {
        concat!(
            claim_picks!(),
            ", spec AS MATERIALIZED (
                SELECT value ->> 0 AS pipeline, value ->> 1 AS lease, value ->> 2 AS on_stale,
                    value ->> 3 AS backoff
                FROM json_each(?7)
            ), go AS (
                SELECT pick.id, spec.lease AS spec_lease, spec.on_stale AS spec_stale,
                    spec.backoff AS spec_backoff, spec.pipeline IS NOT NULL AS go,
                    iif(pick.target IS NULL, NULL,
                        COALESCE((SELECT fence FROM locks WHERE locks.target = pick.target), 0) + 1)
                        AS fence
                FROM pick LEFT JOIN spec ON spec.pipeline = pick.pipeline
            )
            UPDATE jobs SET state = iif(go.go, 'running', 'leased'), lease_owner = ?5,
                lease_token = random(), lease_expires_at = ?1 + iif(go.go, go.spec_lease, ?6),
                attempt = attempt + go.go, started_at = iif(go.go, ?1, started_at),
                lock_fence = iif(go.go, go.fence, lock_fence),
                on_stale = iif(go.go, go.spec_stale, on_stale),
                backoff_ms = iif(go.go, go.spec_backoff, backoff_ms)
            FROM go WHERE jobs.id = go.id
            RETURNING ",
            job_cols!()
        )
    };
}

/// The lock upsert: each row of ?3 (target, fence, holder, expires_at)
/// frees a lock a finished job held (no holder) or hands it to a started
/// job, or takes a free one. Parameters: ?1 worker, ?2 now, ?4 the
/// finished jobs whose locks may be handed on.
macro_rules! write_locks {
    () => {
        "INSERT INTO locks (target, fence, holder_job, holder_worker, acquired_at, expires_at)
         SELECT value ->> 0, value ->> 1, value ->> 2, iif(value ->> 2 IS NULL, NULL, ?1),
             iif(value ->> 2 IS NULL, NULL, ?2), value ->> 3
         FROM json_each(?3) WHERE true
         ON CONFLICT (target) DO UPDATE SET
             fence = locks.fence + (excluded.holder_job IS NOT NULL),
             holder_job = excluded.holder_job, holder_worker = excluded.holder_worker,
             acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
         WHERE (excluded.holder_job IS NOT NULL AND locks.holder_job IS NULL)
            OR locks.holder_job IN (SELECT value FROM json_each(?4))
         RETURNING holder_job, fence"
    };
}

impl SqliteStore {
    /// Finish, claim and start in one transaction: the claim sees the
    /// slots and locks the finishes just freed.
    pub(super) async fn do_cycle(&self, req: &CycleRequest, worker: &str) -> Result<CycleOutcome> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let claim = req
            .claim
            .as_ref()
            .filter(|c| c.limit > 0 && !c.pipelines.is_empty());
        let claiming = claim.map_or(0, |c| c.limit);
        let mut events = Events::with_capacity(req.finishes.len() + 2 * claiming);
        let others = finish_one_by_one(&mut tx, now, &req.finishes, worker).await?;
        let successes = successes(&req.finishes);
        let (done, held, claimed) = match claim {
            None => {
                let (done, held) = succeed_all(&mut tx, now, &successes, &mut events).await?;
                (done, held, Vec::new())
            }
            Some(claim) => {
                succeed_and_claim(&mut tx, now, &successes, claim, &req.specs, &mut events).await?
            }
        };
        let finished = finish_answers(&req.finishes, others, &done);
        write_locks_and_events(&mut tx, now, worker, &held, &claimed, &mut events).await?;
        tx.commit().await?;
        Ok(CycleOutcome { finished, claimed })
    }
}

/// The successes, then the claim that starts every claimed job whose
/// pipeline has a spec (one row write instead of two, leased then
/// running, nothing observable in between; a job with a target gets the
/// fence its lock is about to get), in one round trip. The locks of the
/// jobs that succeeded here count as free. All moves are recorded in
/// `events`.
async fn succeed_and_claim(
    tx: &mut SqliteConnection,
    now: i64,
    successes: &[LeaseRef],
    claim: &ClaimRequest,
    specs: &[(String, StartSpec)],
    events: &mut Events,
) -> Result<(HashSet<LeaseRef>, Vec<HeldLock>, Vec<Claimed>)> {
    let specs = specs
        .iter()
        .map(|(p, s)| (p, ms(s.lease), s.on_stale.as_str(), ms(s.backoff)))
        .collect::<Vec<_>>();
    let finishing = successes.iter().map(|l| l.id).collect::<Vec<_>>();
    let limit = i64::try_from(claim.limit).unwrap_or(i64::MAX / 16);
    let query = sqlx::query(concat!(
        succeed_jobs!("?1", "?8"),
        ";\n",
        claim_and_start_jobs!()
    ))
    .bind(now)
    .bind(to_json(&claim.pipelines)?)
    .bind(limit)
    .bind(to_json(&finishing)?)
    .bind(&claim.worker)
    .bind(ms(claim.lease))
    .bind(to_json(&specs)?)
    .bind(lease_pairs(successes)?);
    let mut results = statement_rows((&mut *tx).fetch_many(query).try_collect().await?);
    let success_rows = results.next().unwrap_or_default();
    let claim_rows = results.next().unwrap_or_default();
    let (done, held) = succeeded(&success_rows, successes, events)?;
    let claimed = started(&claim_rows, events)?;
    Ok((done, held, claimed))
}

/// The rows of each statement of a multi-statement query, in order.
fn statement_rows(
    steps: Vec<Either<SqliteQueryResult, SqliteRow>>,
) -> impl Iterator<Item = Vec<SqliteRow>> {
    let mut statements = Vec::new();
    let mut current = Vec::new();
    for step in steps {
        match step {
            Either::Left(_) => statements.push(std::mem::take(&mut current)),
            Either::Right(row) => current.push(row),
        }
    }
    statements.into_iter()
}

/// The claimed jobs, in the claim's order, and their moves in `events`.
fn started(rows: &[SqliteRow], events: &mut Events) -> Result<Vec<Claimed>> {
    let mut jobs = rows
        .iter()
        .map(job_from_row)
        .collect::<Result<Vec<Job>>>()?;
    sort_claim_order(&mut jobs);
    Ok(jobs
        .into_iter()
        .map(|job| {
            events.push(job.id, State::Queued, State::Leased, String::new());
            let started = (job.state == State::Running).then(|| {
                let detail = start_detail(job.attempt, job.lock_fence);
                events.push(job.id, State::Leased, State::Running, detail);
                (job.attempt, job.lock_fence)
            });
            Claimed { job, started }
        })
        .collect())
}

/// Write the cycle's locks and its events, in one round trip. Each lock a
/// finished job held is freed (by its fence) or, when a job this cycle
/// started has its target, handed straight to that job with the next
/// fence; each other target a started job has is taken. Fails when a lock
/// did not go as the claim predicted.
async fn write_locks_and_events(
    tx: &mut SqliteConnection,
    now: i64,
    worker: &str,
    held: &[HeldLock],
    claimed: &[Claimed],
    events: &mut Events,
) -> Result<()> {
    // target → (fence, holder, expires_at); no holder = free it.
    let mut locks: HashMap<&str, (i64, Option<i64>, Option<i64>)> = HashMap::new();
    for (target, fence, _) in held {
        locks.insert(target, (*fence, None, None));
    }
    let mut taking = 0;
    for c in claimed {
        if let (Some(target), Some((_, Some(fence)))) = (&c.job.target, c.started) {
            let expires = c.job.lease_expires_at.map(|t| t.timestamp_millis());
            locks.insert(target, (fence, Some(c.job.id), expires));
            taking += 1;
        }
    }
    if locks.is_empty() {
        return events.write(tx, now, worker).await;
    }
    let mut rows: Vec<_> = locks
        .into_iter()
        .map(|(target, (fence, holder, expires))| (target, fence, holder, expires))
        .collect();
    rows.sort_unstable_by(|a, b| a.0.cmp(b.0));
    // A job holds one lock at a time, under the fence it recorded: its id
    // alone names the lock it held.
    let freed: Vec<i64> = held.iter().map(|(_, _, job)| *job).collect();
    // With no events (never so when locks move) the INSERT writes nothing.
    let query = sqlx::query(concat!(
        write_locks!(),
        ";\n",
        insert_events!("?2", "?1", "?5")
    ))
    .bind(worker)
    .bind(now)
    .bind(to_json(&rows)?)
    .bind(to_json(&freed)?)
    .bind(events.to_json()?);
    let written = statement_rows((&mut *tx).fetch_many(query).try_collect().await?)
        .next()
        .unwrap_or_default();
    events.clear();
    let mut taken = 0;
    for row in &written {
        let holder: Option<i64> = row.try_get("holder_job")?;
        let fence: i64 = row.try_get("fence")?;
        let expected = claimed
            .iter()
            .find(|c| Some(c.job.id) == holder)
            .and_then(|c| c.job.lock_fence);
        match (holder, expected) {
            (None, _) => {}
            (Some(_), Some(f)) if f == fence => taken += 1,
            (Some(job), _) => {
                return Err(StoreError::Database(format!(
                    "job {job}: its lock's fence {fence} is not the one its start recorded"
                )));
            }
        }
    }
    if taken != taking {
        return Err(StoreError::Database(format!(
            "the cycle took {taken} of the {taking} locks its claim started jobs for"
        )));
    }
    Ok(())
}
