//! The engine's cycle on SQLite: finish, claim and start in one
//! transaction, in one round trip. A round trip is a hand-off through
//! sqlx's connection thread and back, and with short jobs their count, not
//! SQLite's work, sets the pace. One query of several statements opens the
//! transaction, writes the successes (one UPDATE), the claim that starts
//! every claimed job (one UPDATE), the successes' locks freed (one UPDATE)
//! and the started jobs' locks taken (one upsert), the history of all
//! those moves (two INSERTs), checks the locks and commits. Only a cycle
//! that also finishes jobs otherwise (retries, failures, cancels) leaves
//! its transaction open for those, one by one, and commits after them.
//!
//! Since nothing can be read back before the `COMMIT`, the history is
//! derived in SQL: the successes' events are written just before the
//! successes, by the same predicate, so they name exactly the jobs that
//! statement moves; the claim's jobs are found again by the lease token the
//! claim gives them all, drawn anew for each cycle.
//!
//! The claim starts targeted jobs before their locks are written, with
//! the fence the lock will get: within `BEGIN IMMEDIATE` nothing else
//! writes, the claim only takes targets whose lock is free or held by a
//! job this cycle finishes, and one job per target. The last statement
//! checks that every job the cycle started on a target holds its lock under
//! that fence; when one does not, it fails (migration 0005's
//! `cycle_checks`), the query stops before its `COMMIT` and the whole cycle
//! is rolled back (the engine then writes its parts on their own).
//!
//! A query of several statements runs them in order on the connection's
//! thread, binding the numbered parameters (`?N`) of each from the one
//! argument list, and streams each statement's rows followed by its
//! result, stopping at the first error: that is how the rows are told apart
//! below, and why a failed check leaves the `COMMIT` unrun. sqlx 0.9 keeps
//! this for SQLite only and calls it deprecated on `Query::fetch_many` (its
//! replacement, `raw_sql`, takes no parameters); the contract tests run
//! every cycle through it, so an upgrade that drops it fails them.

use std::collections::{HashMap, HashSet};

use sqlx::sqlite::{SqliteQueryResult, SqliteRow};
use sqlx::{Either, Executor};

use super::awake::collect_awake;
use super::batch::{finish_answers, finish_one_by_one, succeed_jobs};
use super::rows::{job_cols, job_from_row, lease_lists, lease_of, ms, now_ms, to_json};
use super::worker::{claim_picks, sort_claim_order};
use super::{SqliteStore, Unbegun, WriteTx};
use crate::job::{Job, State};
use crate::store::{
    ClaimRequest, Claimed, CycleOutcome, CycleRequest, LeaseRef, Result, StartSpec, successes,
};

/// The successes' events, written before [`succeed_jobs`] with its
/// predicate (a running job whose lease is listed). Unsorted: one event per
/// job, so no job's history depends on their order. Parameters: ?1 now,
/// ?4 the finishing jobs, ?8 their lease tokens (in the same order), ?10
/// the actor.
macro_rules! success_events {
    () => {
        "INSERT INTO job_events (job_id, at, from_state, to_state, actor, detail)
         SELECT jobs.id, ?1, 'running', 'succeeded', ?10, ''
         FROM json_each(?4) AS lease
         JOIN jobs ON jobs.id = lease.value AND jobs.lease_token = ?8 ->> lease.key
         WHERE jobs.state = 'running'"
    };
}

/// The claim that starts what it takes. Parameters: ?1 now, ?2 pipelines,
/// ?3 limit, ?4 the jobs whose locks count as free, ?5 worker, ?6 the
/// claim's lease, ?7 the start specs, ?9 the cycle's lease token.
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
                lease_token = ?9, lease_expires_at = ?1 + iif(go.go, go.spec_lease, ?6),
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

/// The jobs this cycle started on a target: running, this worker's, under
/// the cycle's lease token. Parameters: ?5 worker, ?9 the token.
macro_rules! started_on_targets {
    () => {
        "FROM jobs j INDEXED BY jobs_target_active
         WHERE j.state = 'running'
           AND j.target IS NOT NULL AND j.lease_owner = ?5 AND j.lease_token = ?9"
    };
}

/// The locks of the jobs that succeeded in this transaction, freed: each
/// only while its job still holds it. Run after the claim, which counts
/// them as free already, and before [`take_locks`]. The finishing jobs
/// are joined (`UPDATE … FROM`, as in `succeed_jobs`); one without a
/// target joins no lock, so a cycle without targets reads the finishing
/// jobs' rows and writes nothing. Parameters: ?4 the finishing jobs.
macro_rules! free_locks {
    () => {
        "UPDATE locks SET holder_job = NULL, holder_worker = NULL, acquired_at = NULL,
             expires_at = NULL
         FROM json_each(?4) AS finishing JOIN jobs h ON h.id = finishing.value
         WHERE h.target IS NOT NULL AND h.state = 'succeeded'
           AND locks.target = h.target AND locks.holder_job = h.id"
    };
}

/// The locks of the jobs the claim started, taken with the fence each
/// start recorded: a new target's row is inserted, a free one's fence
/// moves on. A lock still held is left as it is, and the check after
/// fails the cycle. (One upsert that also freed the successes' locks, a
/// row per move, ran 1.8 times the VDBE operations of these two
/// statements with 100 targets: its `SELECT` read `locks` and so was
/// materialized first, and every row tested the finishing list;
/// bench/HISTORY.md, session 43.) Parameters: ?1 now, ?5 worker, ?9 the
/// cycle's lease token.
macro_rules! take_locks {
    () => {
        concat!(
            "INSERT INTO locks (target, fence, holder_job, holder_worker, acquired_at, expires_at)
             SELECT j.target, j.lock_fence, j.id, ?5, ?1, j.lease_expires_at ",
            started_on_targets!(),
            "
             ON CONFLICT (target) DO UPDATE SET fence = locks.fence + 1,
                 holder_job = excluded.holder_job, holder_worker = excluded.holder_worker,
                 acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
             WHERE locks.holder_job IS NULL"
        )
    };
}

/// The claim's events: each job queued → leased, and a started one leased
/// → running with the detail of [`crate::store::start_detail`]. The moves
/// are the outer loop (SQLite keeps a `CROSS JOIN`'s left side outside),
/// so every job's `queued → leased` is written before any `leased →
/// running`, and each job's history is in order without sorting the rows
/// (a temporary b-tree at every cycle). Its `state <> 'queued'` is the
/// state index's condition, which SQLite must see to use it (migration
/// 0006). Parameters: ?1 now, ?5 worker, ?9 the cycle's lease token, ?10
/// the actor.
macro_rules! claim_events {
    () => {
        "INSERT INTO job_events (job_id, at, from_state, to_state, actor, detail)
         SELECT j.id, ?1, m.from_state, m.to_state, ?10,
             iif(m.step = 0, '', 'attempt ' || j.attempt
                 || iif(j.lock_fence IS NULL, '', ', fence ' || j.lock_fence))
         FROM (SELECT 0 AS step, 'queued' AS from_state, 'leased' AS to_state
               UNION ALL SELECT 1, 'leased', 'running') m
         CROSS JOIN jobs j INDEXED BY jobs_state
         WHERE (m.step = 0 OR j.state = 'running')
           AND j.state IN ('leased','running') AND j.state <> 'queued'
           AND j.lease_owner = ?5 AND j.lease_token = ?9"
    };
}

/// Fails (see migration 0005) when a job this cycle started on a target
/// does not hold its lock under the fence its start recorded. Parameters:
/// ?5 worker, ?9 the cycle's lease token.
macro_rules! check_locks {
    () => {
        concat!(
            "INSERT INTO cycle_checks (ok) SELECT 0 ",
            started_on_targets!(),
            "
               AND NOT EXISTS (SELECT 1 FROM locks l WHERE l.target = j.target
                               AND l.holder_job = j.id AND l.fence IS j.lock_fence)
             LIMIT 1"
        )
    };
}

/// The cycle's statements, `BEGIN IMMEDIATE` aside.
macro_rules! cycle_statements {
    () => {
        concat!(
            success_events!(),
            ";\n",
            succeed_jobs!("?1", "?4", "?8"),
            ";\n",
            claim_and_start_jobs!(),
            ";\n",
            free_locks!(),
            ";\n",
            take_locks!(),
            ";\n",
            claim_events!(),
            ";\n",
            check_locks!()
        )
    };
}

/// sqlx 0.9 binds a statement's `?N` to the Nth argument, but takes each
/// number below its highest that the statement does not use for an
/// anonymous `?`, which consumes the next argument not yet consumed by
/// earlier statements; when the list runs out it stops binding the
/// statement and leaves its later parameters NULL (sqlx-sqlite's
/// `arguments.rs`). Each number a statement skips therefore needs a spare
/// argument: at most one per parameter (ten) in each of the query's nine
/// statements. The spares are NULLs bound to numbers nothing reads.
const SPARE_ARGUMENTS: usize = 9 * 10;

impl SqliteStore {
    /// Finish, claim and start in one transaction: the claim sees the
    /// slots and locks the successes just freed.
    pub(super) async fn do_cycle(&self, req: &CycleRequest, worker: &str) -> Result<CycleOutcome> {
        let now = now_ms();
        let claim = req
            .claim
            .as_ref()
            .filter(|c| c.limit > 0 && !c.pipelines.is_empty());
        let successes = successes(&req.finishes);
        // The rare other outcomes go after the claim, in the same
        // transaction: their locks and requeued jobs wait for the next
        // cycle.
        let only_successes = successes.len() == req.finishes.len();
        let unbegun = self.begin_in_first_query().await?;
        let written = write_cycle(
            unbegun,
            now,
            &successes,
            claim,
            &req.specs,
            worker,
            only_successes,
        )
        .await?;
        let others = match written.open {
            None => HashMap::new(),
            Some(mut tx) => {
                let others = finish_one_by_one(&mut tx, now, &req.finishes, worker).await?;
                tx.commit().await?;
                others
            }
        };
        Ok(CycleOutcome {
            finished: finish_answers(&req.finishes, others, &written.done),
            claimed: written.claimed,
        })
    }
}

/// What the cycle's query wrote.
struct Written {
    /// The transaction, when the query left it open.
    open: Option<WriteTx>,
    /// The successes whose lease was still held.
    done: HashSet<LeaseRef>,
    claimed: Vec<Claimed>,
}

/// The cycle's query: `BEGIN`, the successes, the claim that starts every
/// claimed job whose pipeline has a spec (one row write instead of two,
/// leased then running, nothing observable in between; a job with a target
/// gets the fence its lock is about to get), the locks (those of the jobs
/// that succeeded here count as free), the history, the check of the locks
/// and, when `commit`, the `COMMIT`.
async fn write_cycle(
    unbegun: Unbegun,
    now: i64,
    successes: &[LeaseRef],
    claim: Option<&ClaimRequest>,
    specs: &[(String, StartSpec)],
    worker: &str,
    commit: bool,
) -> Result<Written> {
    let specs = specs
        .iter()
        .map(|(p, s)| (p, ms(s.lease), s.on_stale.as_str(), ms(s.backoff)))
        .collect::<Vec<_>>();
    let (finishing, tokens) = lease_lists(successes)?;
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
    let (mut tx, sql) = unbegun.begin_with(if commit {
        concat!(cycle_statements!(), ";\nCOMMIT")
    } else {
        cycle_statements!()
    });
    let mut query = sqlx::query(sql)
        .bind(now)
        .bind(pipelines)
        .bind(limit)
        .bind(finishing)
        .bind(owner)
        .bind(lease)
        .bind(to_json(&specs)?)
        .bind(tokens)
        .bind(rand::random::<i64>())
        .bind(worker);
    for _ in 0..SPARE_ARGUMENTS {
        query = query.bind(None::<i64>);
    }
    let mut results = statement_rows(collect_awake((&mut *tx).fetch_many(query)).await?);
    let _begin = results.next();
    let _success_events = results.next();
    let success_rows = results.next().unwrap_or_default();
    let claim_rows = results.next().unwrap_or_default();
    let done = success_rows
        .iter()
        .map(lease_of)
        .collect::<Result<HashSet<_>>>()?;
    let claimed = started(&claim_rows)?;
    let open = if commit {
        tx.committed();
        None
    } else {
        Some(tx)
    };
    Ok(Written {
        open,
        done,
        claimed,
    })
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

/// The claimed jobs, in the claim's order.
fn started(rows: &[SqliteRow]) -> Result<Vec<Claimed>> {
    let mut jobs = rows
        .iter()
        .map(job_from_row)
        .collect::<Result<Vec<Job>>>()?;
    sort_claim_order(&mut jobs);
    Ok(jobs
        .into_iter()
        .map(|job| {
            let started = (job.state == State::Running).then_some((job.attempt, job.lock_fence));
            Claimed { job, started }
        })
        .collect())
}
