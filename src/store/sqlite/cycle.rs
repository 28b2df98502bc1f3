//! The engine's cycle on SQLite: finish, claim and start in one
//! transaction, in two round trips. Each round trip is a hand-off through
//! sqlx's connection thread and back, and with short jobs their count,
//! not SQLite's work, sets the pace. The first query opens the
//! transaction and writes the successes (one UPDATE), the claim that
//! starts every claimed job (one UPDATE) and the locks handed on, freed
//! and taken (one upsert); the second writes the history (one INSERT) and
//! commits.
//!
//! The claim starts targeted jobs before their locks are written, with
//! the fence the lock will get: within `BEGIN IMMEDIATE` nothing else
//! writes, the claim only takes targets whose lock is free or held by a
//! job this cycle finishes, and one job per target. What the lock upsert
//! returns is checked against the claimed jobs before the second query:
//! a lock that did not go as predicted rolls the whole cycle back (and the
//! engine writes its parts on their own).
//!
//! A query of several statements runs them in order on the connection's
//! thread, binding the numbered parameters (`?N`) of each from the one
//! argument list, and streams each statement's rows followed by its
//! result: that is how the rows are told apart below. sqlx 0.9 keeps this
//! for SQLite only and calls it deprecated on `Query::fetch_many` (its
//! replacement, `raw_sql`, takes no parameters); the contract tests run
//! every cycle through it, so an upgrade that drops it fails them.

use std::collections::HashSet;

use futures::TryStreamExt;
use sqlx::sqlite::{SqliteQueryResult, SqliteRow};
use sqlx::{Either, Executor, Row};

use super::batch::{finish_answers, finish_one_by_one, succeed_jobs, succeeded};
use super::events::{Events, insert_events};
use super::rows::{job_cols, job_from_row, lease_pairs, ms, now_ms, to_json};
use super::worker::{claim_picks, sort_claim_order};
use super::{SqliteStore, Unbegun, WriteTx};
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

/// The cycle's locks, after its successes and its claim: the lock of each
/// job that succeeded in this transaction is freed, or handed with the
/// next fence to the job this cycle started on its target; each other
/// target a started job has is taken. A started job is one of this
/// worker's running jobs, started now, that its lock does not name yet
/// (a running job with a target holds its lock once its start commits).
/// Parameters: ?1 now, ?4 the finishing jobs, ?5 worker.
macro_rules! write_locks {
    () => {
        "INSERT INTO locks (target, fence, holder_job, holder_worker, acquired_at, expires_at)
         SELECT target, max(fence), max(holder), iif(max(holder) IS NULL, NULL, ?5),
             iif(max(holder) IS NULL, NULL, ?1), max(expires)
         FROM (
             SELECT l.target, l.fence, NULL AS holder, NULL AS expires
             FROM jobs h JOIN locks l ON l.holder_job = h.id AND l.target = h.target
             WHERE h.id IN (SELECT value FROM json_each(?4)) AND h.state = 'succeeded'
             UNION ALL
             SELECT j.target, j.lock_fence, j.id, j.lease_expires_at
             FROM jobs j INDEXED BY jobs_target_active
             WHERE j.state IN ('leased','running','stale') AND j.state = 'running'
               AND j.target IS NOT NULL AND j.lease_owner = ?5 AND j.started_at = ?1
               AND NOT EXISTS (SELECT 1 FROM locks t
                               WHERE t.target = j.target AND t.holder_job = j.id)
         )
         GROUP BY target
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
    /// slots and locks the successes just freed.
    pub(super) async fn do_cycle(&self, req: &CycleRequest, worker: &str) -> Result<CycleOutcome> {
        let now = now_ms();
        let claim = req
            .claim
            .as_ref()
            .filter(|c| c.limit > 0 && !c.pipelines.is_empty());
        let claiming = claim.map_or(0, |c| c.limit);
        let mut events = Events::with_capacity(req.finishes.len() + 2 * claiming);
        let successes = successes(&req.finishes);
        let unbegun = self.begin_in_first_query().await?;
        let (mut tx, done, claimed) = succeed_claim_and_lock(
            unbegun,
            now,
            &successes,
            claim,
            &req.specs,
            worker,
            &mut events,
        )
        .await?;
        // The rare other outcomes, after the claim: their locks and
        // requeued jobs wait for the next cycle.
        let others = finish_one_by_one(&mut tx, now, &req.finishes, worker).await?;
        let finished = finish_answers(&req.finishes, others, &done);
        if events.is_empty() {
            tx.commit().await?;
        } else {
            let sql = WriteTx::then_commit(insert_events!("?1", "?2", "?3"));
            let query = sqlx::query(sql)
                .bind(now)
                .bind(worker)
                .bind(events.to_json()?);
            (&mut *tx).execute(query).await?;
            tx.committed();
        }
        Ok(CycleOutcome { finished, claimed })
    }
}

/// The transaction's first query: `BEGIN`, the successes, the claim that
/// starts every claimed job whose pipeline has a spec (one row write
/// instead of two, leased then running, nothing observable in between; a
/// job with a target gets the fence its lock is about to get), and the
/// locks. The locks of the jobs that succeeded here count as free. All
/// moves are recorded in `events`.
async fn succeed_claim_and_lock(
    unbegun: Unbegun,
    now: i64,
    successes: &[LeaseRef],
    claim: Option<&ClaimRequest>,
    specs: &[(String, StartSpec)],
    worker: &str,
    events: &mut Events,
) -> Result<(WriteTx, HashSet<LeaseRef>, Vec<Claimed>)> {
    let specs = specs
        .iter()
        .map(|(p, s)| (p, ms(s.lease), s.on_stale.as_str(), ms(s.backoff)))
        .collect::<Vec<_>>();
    let finishing = successes.iter().map(|l| l.id).collect::<Vec<_>>();
    // Without a claim, the same query with nothing to claim.
    let (pipelines, limit, lease, owner) = match claim {
        Some(c) => (
            to_json(&c.pipelines)?,
            i64::try_from(c.limit).unwrap_or(i64::MAX / 16),
            ms(c.lease),
            c.worker.as_str(),
        ),
        None => ("[]".to_string(), 0, 0, worker),
    };
    let (mut tx, sql) = unbegun.begin_with(concat!(
        succeed_jobs!("?1", "?8"),
        ";\n",
        claim_and_start_jobs!(),
        ";\n",
        write_locks!()
    ));
    let query = sqlx::query(sql)
        .bind(now)
        .bind(pipelines)
        .bind(limit)
        .bind(to_json(&finishing)?)
        .bind(owner)
        .bind(lease)
        .bind(to_json(&specs)?)
        .bind(lease_pairs(successes)?);
    let mut results = statement_rows((&mut *tx).fetch_many(query).try_collect().await?);
    let _begin = results.next();
    let success_rows = results.next().unwrap_or_default();
    let claim_rows = results.next().unwrap_or_default();
    let lock_rows = results.next().unwrap_or_default();
    let (done, _) = succeeded(&success_rows, successes, events)?;
    let claimed = started(&claim_rows, events)?;
    check_locks(&lock_rows, &claimed)?;
    Ok((tx, done, claimed))
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

/// Every lock the upsert gave a holder went to a job this cycle started,
/// under the fence its start recorded, and every such job got one.
fn check_locks(rows: &[SqliteRow], claimed: &[Claimed]) -> Result<()> {
    let mut taken = 0;
    for row in rows {
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
    let taking = claimed
        .iter()
        .filter(|c| c.job.target.is_some() && matches!(c.started, Some((_, Some(_)))))
        .count();
    if taken != taking {
        return Err(StoreError::Database(format!(
            "the cycle took {taken} of the {taking} locks its claim started jobs for"
        )));
    }
    Ok(())
}
