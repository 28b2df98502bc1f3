//! The engine's cycle on SQLite: finish, claim and start in one
//! transaction, in as few statements as the writes allow. Each statement
//! is a round trip through sqlx's connection thread, and with short jobs
//! the cycle's statement count, not SQLite's work, sets the pace: between
//! BEGIN and COMMIT, the successes (one UPDATE), the claim that starts
//! every claimed job (one UPDATE), the locks handed on and taken (one
//! upsert, only with targets), the history (one INSERT).
//!
//! The claim starts targeted jobs before their locks are written, with
//! the fence the lock will get: within `BEGIN IMMEDIATE` nothing else
//! writes, the claim only takes targets whose lock is free or held by a
//! job this cycle just finished, and one job per target. The lock upsert
//! then checks that every lock went as predicted, or the whole cycle
//! rolls back (and the engine writes its parts on their own).

use std::collections::HashMap;

use sqlx::{Row, SqliteConnection};

use super::SqliteStore;
use super::batch::{HeldLock, finish_batch_in};
use super::events::Events;
use super::rows::{job_cols, job_from_row, ms, now_ms, to_json};
use super::worker::{claim_picks, sort_claim_order};
use crate::job::{Job, State};
use crate::store::{
    ClaimRequest, Claimed, CycleOutcome, CycleRequest, Result, StartSpec, StoreError, start_detail,
};

impl SqliteStore {
    /// Finish, claim and start in one transaction: the claim sees the
    /// slots and locks the finishes just freed.
    pub(super) async fn do_cycle(&self, req: &CycleRequest, worker: &str) -> Result<CycleOutcome> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let claiming = req.claim.as_ref().map_or(0, |c| c.limit);
        let mut events = Events::with_capacity(req.finishes.len() + 2 * claiming);
        let (finished, held) =
            finish_batch_in(&mut tx, now, &req.finishes, worker, &mut events).await?;
        let claimed = match &req.claim {
            Some(claim) => {
                claim_and_start(&mut tx, now, claim, &req.specs, &held, &mut events).await?
            }
            None => Vec::new(),
        };
        hand_on_locks(&mut tx, now, worker, &held, &claimed).await?;
        events.write(&mut tx, now, worker).await?;
        tx.commit().await?;
        Ok(CycleOutcome { finished, claimed })
    }
}

/// The cycle's claim, which also starts every claimed job whose pipeline
/// has a spec: one row write instead of two (leased, then running) in the
/// same transaction, nothing observable in between; a job with a target
/// gets the fence its lock is about to get. The locks of `held` (jobs
/// this cycle finished) count as free. Both moves are recorded in
/// `events`.
async fn claim_and_start(
    tx: &mut SqliteConnection,
    now: i64,
    req: &ClaimRequest,
    specs: &[(String, StartSpec)],
    held: &[HeldLock],
    events: &mut Events,
) -> Result<Vec<Claimed>> {
    if req.limit == 0 || req.pipelines.is_empty() {
        return Ok(Vec::new());
    }
    let specs = specs
        .iter()
        .map(|(p, s)| (p, ms(s.lease), s.on_stale.as_str(), ms(s.backoff)))
        .collect::<Vec<_>>();
    let freed = held.iter().map(|(_, _, job)| *job).collect::<Vec<_>>();
    let limit = i64::try_from(req.limit).unwrap_or(i64::MAX / 16);
    let rows = sqlx::query(concat!(
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
    ))
    .bind(now)
    .bind(to_json(&req.pipelines)?)
    .bind(limit)
    .bind(to_json(&freed)?)
    .bind(&req.worker)
    .bind(ms(req.lease))
    .bind(to_json(&specs)?)
    .fetch_all(&mut *tx)
    .await?;
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

/// Write the cycle's locks in one upsert: each one a finished job held is
/// freed (by its fence) or, when a job this cycle started has its target,
/// handed straight to that job with the next fence; each other target a
/// started job has is taken. Fails when a lock did not go as the claim
/// predicted.
async fn hand_on_locks(
    tx: &mut SqliteConnection,
    now: i64,
    worker: &str,
    held: &[HeldLock],
    claimed: &[Claimed],
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
        return Ok(());
    }
    let mut rows: Vec<_> = locks
        .into_iter()
        .map(|(target, (fence, holder, expires))| (target, fence, holder, expires))
        .collect();
    rows.sort_unstable_by(|a, b| a.0.cmp(b.0));
    // A job holds one lock at a time, under the fence it recorded: its id
    // alone names the lock it held.
    let freed: Vec<i64> = held.iter().map(|(_, _, job)| *job).collect();
    let written = sqlx::query(
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
         RETURNING holder_job, fence",
    )
    .bind(worker)
    .bind(now)
    .bind(to_json(&rows)?)
    .bind(to_json(&freed)?)
    .fetch_all(&mut *tx)
    .await?;
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
