//! Group commit: many starts or finishes in one transaction, and the
//! engine's cycle (finish, claim, start in one commit: when its finishes
//! are all successes, one plain statement, `lean_cycle` or `lock_cycle`).
//! Starts, with or without a target, and successes finish in set-based
//! statements; everything else goes through the per-job path of
//! `worker.rs` inside the same transaction, each write all or nothing.

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{Connection, PgConnection};

use super::lean_cycle::{self, Lean};
use super::lock_cycle;
use super::lock_cycle::ClaimWindow;
use super::worker::{claim_in, claim_window, finish_in, start_in};
use super::{PgStore, ms, rows};
use crate::job::{self, Job, State};
use crate::store::columns::InOrder;
use crate::store::{
    ClaimRequest, Claimed, CycleOutcome, CycleRequest, LeaseRef, Outcome, Result, StartOutcome,
    StartSpec, StoreError, group_by_spec, item_answer, successes,
};

impl PgStore {
    /// One transaction, one commit, for a batch of starts.
    pub(super) async fn start_many_jobs(
        &self,
        items: &[(LeaseRef, StartSpec)],
        worker: &str,
    ) -> Result<Vec<Result<StartOutcome>>> {
        let mut tx = self.pool.begin().await?;
        lock_in_id_order(&mut tx, items.iter().map(|(l, _)| l.id)).await?;
        let out = start_batch_in(&mut tx, items, worker).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// One transaction, one commit, for a batch of finishes.
    pub(super) async fn finish_many_jobs(
        &self,
        items: &[(LeaseRef, Outcome)],
        actor: &str,
    ) -> Result<Vec<Result<State>>> {
        let mut tx = self.pool.begin().await?;
        let out = finish_batch_in(&mut tx, items, actor).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Finish, claim and start in one transaction: the claim sees the
    /// slots and locks the finishes just freed. The claimed rows stay
    /// locked by this transaction until it commits, so their starts need
    /// no further row locks. A cycle of successes runs on one of the
    /// engine's own connections (`engine_conn`), in one statement when
    /// no lock is involved (`lean_cycle`), else in one statement with
    /// locks (`lock_cycle`); one with a failure runs statement by statement on
    /// a pooled connection, where the count trigger counts its moves.
    pub(super) async fn cycle_jobs(
        &self,
        req: &CycleRequest,
        worker: &str,
    ) -> Result<CycleOutcome> {
        if !req.finishes.iter().all(|(_, o)| *o == Outcome::Succeeded) {
            let mut conn = self.pool.acquire().await?;
            return cycle_in_parts(&mut conn, req, worker).await;
        }
        let mut held = self.engine.hold(&self.pool).await?;
        let outcome = self.cycle_of_successes(held.conn(), req, worker).await;
        held.release(&outcome);
        outcome
    }

    /// The lean statement while no lock has come its way, else (and for
    /// what it passes over) the statement with locks.
    async fn cycle_of_successes(
        &self,
        conn: &mut PgConnection,
        req: &CycleRequest,
        worker: &str,
    ) -> Result<CycleOutcome> {
        if !self.lean.targets_seen() {
            match lean_cycle::cycle(conn, req, worker).await? {
                Lean::Written(rows) => {
                    self.lean.written(&self.pool);
                    let CycleRows {
                        mut outcome,
                        passed_over,
                        ..
                    } = read_cycle(&rows, &req.finishes)?;
                    if passed_over > 0 {
                        self.lean.saw_targets(true);
                        let rest =
                            claim_rest(conn, req, outcome.claimed.len(), worker, &self.window)
                                .await;
                        outcome.claimed.extend(rest);
                        outcome.claimed.sort_by_key(claim_order);
                    }
                    return Ok(outcome);
                }
                Lean::Refused => self.lean.saw_targets(true),
            }
        }
        let rows = cycle_with_locks(conn, req, worker, &self.window).await?;
        self.lean.written(&self.pool);
        if let Some(met) = rows.met_targets {
            self.lean.saw_targets(met);
        }
        Ok(rows.outcome)
    }
}

/// The claim's slots the lean statement left free (it passed over jobs
/// with a target), claimed through the function. Its finishes and claim
/// are committed already: a failure here leaves these slots to the next
/// claim rather than failing the cycle.
async fn claim_rest(
    conn: &mut PgConnection,
    req: &CycleRequest,
    claimed: usize,
    worker: &str,
    window: &ClaimWindow,
) -> Vec<Claimed> {
    let Some(claim) = req.claim.as_ref().filter(|c| c.limit > claimed) else {
        return Vec::new();
    };
    let rest = CycleRequest {
        finishes: Vec::new(),
        claim: Some(ClaimRequest {
            limit: claim.limit - claimed,
            ..claim.clone()
        }),
        specs: req.specs.clone(),
    };
    match cycle_with_locks(conn, &rest, worker, window).await {
        Ok(rows) => rows.outcome.claimed,
        Err(e) => {
            tracing::warn!("claim after the lean cycle: {e}; its slots wait for the next claim");
            Vec::new()
        }
    }
}

/// A cycle with a failure, cancellation or timeout among its finishes:
/// statement by statement in one transaction, each finish through the full
/// decision of `finish_in`.
async fn cycle_in_parts(
    conn: &mut PgConnection,
    req: &CycleRequest,
    worker: &str,
) -> Result<CycleOutcome> {
    let mut tx = conn.begin().await?;
    let finished = finish_batch_in(&mut tx, &req.finishes, worker).await?;
    let jobs = match &req.claim {
        Some(claim) => claim_in(&mut tx, claim).await?,
        None => Vec::new(),
    };
    let (startable, starts) = startable(&jobs, &req.specs);
    let answers = start_batch_in(&mut tx, &starts, worker).await?;
    tx.commit().await?;
    Ok(CycleOutcome {
        finished,
        claimed: pair_starts(jobs, startable, answers),
    })
}

/// A cycle whose finishes are all successes, where a lock may be taken or
/// freed: one plain statement (`lock_cycle`, whose claim window learns
/// from what each cycle passed over), or `jobdeck_cycle` on a session
/// where that statement refuses to run.
async fn cycle_with_locks(
    conn: &mut PgConnection,
    req: &CycleRequest,
    worker: &str,
    window: &ClaimWindow,
) -> Result<CycleRows> {
    match lock_cycle::cycle(conn, req, worker, window).await? {
        Lean::Written(rows) => {
            let read = read_cycle(&rows, &req.finishes)?;
            if let Some(claim) = &req.claim {
                window.observe(claim.limit, read.passed_over);
            }
            Ok(read)
        }
        Lean::Refused => cycle_in_one_call(conn, req, worker).await,
    }
}

/// A cycle whose finishes are all successes, where a lock may be taken or
/// freed, in one call of `jobdeck_cycle` (migrations 0003, 0007): one
/// round trip, and the statement's own commit. Failures need the full
/// decision of `finish_in`, so a cycle with one goes statement by
/// statement.
///
/// The function locks the finishing rows in a statement of their own
/// before it writes them and frees their locks by row version: the second
/// statement's snapshot then includes any lease renewal that held those
/// rows and rewrote their lock rows. Folded into one statement, that
/// snapshot predates the wait, and the release missed such lock rows (the
/// kill storm of `tests/faults/storm.rs` ended with targets held by
/// succeeded jobs; see bench/HISTORY.md, session 12).
async fn cycle_in_one_call(
    conn: &mut PgConnection,
    req: &CycleRequest,
    worker: &str,
) -> Result<CycleRows> {
    // The function takes the shared parameters in its own order.
    const CALL: &str = concat!(
        "SELECT ",
        job_cols!(),
        " FROM jobdeck_cycle($1, $2, $3, $4, $11, $5, $6, $7, $8, $9, $10)"
    );
    match lean_cycle::send(conn, CALL, Some(&claim_window), req, worker).await? {
        Lean::Written(rows) => read_cycle(&rows, &req.finishes),
        // The function counts its own moves whatever the session's setting.
        Lean::Refused => Err(StoreError::Database(
            "jobdeck_cycle answered with the lean cycle's refusal".into(),
        )),
    }
}

/// The order a claim takes queued jobs in: priority, then due time, then id.
fn claim_order(c: &Claimed) -> (Reverse<i32>, DateTime<Utc>, i64) {
    (Reverse(c.job.priority), c.job.due_at, c.job.id)
}

/// A one-statement cycle's rows, read.
struct CycleRows {
    /// The successes it wrote and the jobs it claimed, in the rows' order.
    outcome: CycleOutcome,
    /// Queued jobs its claim passed over: the lean statement's have a
    /// target, the statement with locks' share one with an earlier
    /// candidate.
    passed_over: usize,
    /// Whether any of its rows has a target; `None` without rows.
    met_targets: Option<bool>,
}

fn read_cycle(rows: &[PgRow], finishes: &[(LeaseRef, Outcome)]) -> Result<CycleRows> {
    let mut succeeded = HashSet::with_capacity(finishes.len());
    let mut claimed = Vec::with_capacity(rows.len());
    let mut passed_over = 0;
    let mut any_target = false;
    for row in rows {
        // Positions in `job_cols!`, whose shape `brief_cols!` shares.
        let mut c = InOrder::new(row);
        any_target |= c.get_at::<Option<&str>>(2, "target")?.is_some();
        // Only the claimed jobs are decoded whole: the engine runs them.
        match rows::state(c.get_at(4, "state")?)? {
            State::Succeeded => {
                succeeded.insert(LeaseRef {
                    id: c.get_at(0, "id")?,
                    token: c
                        .get_at::<Option<i64>>(11, "lease_token")?
                        .unwrap_or_default(),
                });
            }
            State::Queued => passed_over += 1,
            State::Running => {
                let job = rows::job(row)?;
                claimed.push(Claimed {
                    started: Some((job.attempt, job.lock_fence)),
                    job,
                });
            }
            _ => claimed.push(Claimed {
                job: rows::job(row)?,
                started: None,
            }),
        }
    }
    // The statements return their rows unsorted (a Sort's start-up per call
    // cost the server more than these few rows cost here).
    claimed.sort_by_key(claim_order);
    let finished = finishes
        .iter()
        .map(|(lease, _)| {
            if succeeded.contains(lease) {
                Ok(State::Succeeded)
            } else {
                Err(StoreError::LeaseLost(lease.id))
            }
        })
        .collect();
    Ok(CycleRows {
        outcome: CycleOutcome { finished, claimed },
        passed_over,
        met_targets: (!rows.is_empty()).then_some(any_target),
    })
}

/// Start a batch of leased jobs whose rows this transaction has locked,
/// each start all or nothing. Jobs without a target start in one statement
/// per spec, jobs with one take their locks in one statement per spec (in
/// target order, so two workers' batches cannot deadlock); what is left
/// (a busy lock, a lost lease) goes through the full per-job start, which
/// names the holder.
async fn start_batch_in(
    tx: &mut PgConnection,
    items: &[(LeaseRef, StartSpec)],
    worker: &str,
) -> Result<Vec<Result<StartOutcome>>> {
    let mut started: HashMap<LeaseRef, (i32, Option<i64>)> = HashMap::new();
    for (spec, leases) in group_by_spec(items) {
        let untargeted = start_untargeted(tx, &leases, &spec, worker).await?;
        started.extend(untargeted.into_iter().map(|(l, a)| (l, (a, None))));
        let rest: Vec<LeaseRef> = leases
            .into_iter()
            .filter(|l| !started.contains_key(l))
            .collect();
        started.extend(start_targeted(tx, &rest, &spec, worker).await?);
    }
    let mut out = Vec::with_capacity(items.len());
    for (lease, spec) in items {
        out.push(match started.get(lease) {
            Some((attempt, fence)) => Ok(StartOutcome::Started {
                attempt: *attempt,
                fence: *fence,
            }),
            None => item_answer(start_in(tx, *lease, spec, worker).await)?,
        });
    }
    Ok(out)
}

/// Finish a batch, each finish all or nothing. Successes, the bulk of any
/// batch, take one statement together; the rest go one by one through the
/// full decision. Each job's lock row is its own: no ordering needed.
async fn finish_batch_in(
    tx: &mut PgConnection,
    items: &[(LeaseRef, Outcome)],
    actor: &str,
) -> Result<Vec<Result<State>>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    lock_in_id_order(tx, items.iter().map(|(l, _)| l.id)).await?;
    let done = succeed_all(tx, &successes(items), actor).await?;
    let mut out = Vec::with_capacity(items.len());
    for (lease, outcome) in items {
        out.push(if *outcome == Outcome::Succeeded {
            if done.contains(lease) {
                Ok(State::Succeeded)
            } else {
                Err(StoreError::LeaseLost(lease.id))
            }
        } else {
            item_answer(finish_in(tx, *lease, outcome.clone(), actor).await)?
        });
    }
    Ok(out)
}

/// Start every listed leased job that has a target whose lock is free, in
/// one statement: take the locks (fence + 1), write `running` with the
/// fence, count the attempt; then record the events. Only jobs still
/// leased under the listed token take a lock, one job per target; the
/// others are left untouched. The caller holds the job rows' locks, so
/// the statement's view of them cannot change under it.
async fn start_targeted(
    tx: &mut PgConnection,
    leases: &[LeaseRef],
    spec: &StartSpec,
    worker: &str,
) -> Result<HashMap<LeaseRef, (i32, Option<i64>)>> {
    if leases.is_empty() {
        return Ok(HashMap::new());
    }
    job::check(leases[0].id, State::Leased, job::Move::Start)?;
    let ids: Vec<i64> = leases.iter().map(|l| l.id).collect();
    let tokens: Vec<i64> = leases.iter().map(|l| l.token).collect();
    let rows: Vec<(i64, i64, i32, i64)> = sqlx::query_as(
        "WITH wanted AS ( \
             SELECT DISTINCT ON (j.target) j.id, j.target FROM jobs j \
             JOIN unnest($1::bigint[], $2::bigint[]) AS t(id, token) \
               ON j.id = t.id AND j.lease_token = t.token \
             WHERE j.state = 'leased' AND j.target IS NOT NULL \
             ORDER BY j.target, j.id \
         ), taken AS ( \
             INSERT INTO locks AS l (target, fence, holder_job, holder_worker, acquired_at, expires_at) \
             SELECT target, 1, id, $3, now(), now() + $4 * interval '1 millisecond' \
             FROM wanted ORDER BY target \
             ON CONFLICT (target) DO UPDATE SET fence = l.fence + 1, \
                 holder_job = EXCLUDED.holder_job, holder_worker = EXCLUDED.holder_worker, \
                 acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at \
             WHERE l.holder_job IS NULL \
             RETURNING l.fence, l.holder_job \
         ) \
         UPDATE jobs SET state = 'running', attempt = attempt + 1, \
             lease_expires_at = now() + $4 * interval '1 millisecond', started_at = now(), \
             lock_fence = taken.fence, on_stale = $5, backoff_ms = $6 \
         FROM taken WHERE jobs.id = taken.holder_job \
         RETURNING jobs.id, jobs.lease_token, jobs.attempt, jobs.lock_fence",
    )
    .bind(&ids)
    .bind(&tokens)
    .bind(worker)
    .bind(ms(spec.lease))
    .bind(spec.on_stale.as_str())
    .bind(ms(spec.backoff))
    .fetch_all(&mut *tx)
    .await?;
    if rows.is_empty() {
        return Ok(HashMap::new());
    }
    let mut event_ids = Vec::with_capacity(rows.len());
    let mut details = Vec::with_capacity(rows.len());
    let mut started = HashMap::with_capacity(rows.len());
    for (id, token, attempt, fence) in rows {
        event_ids.push(id);
        details.push(crate::store::start_detail(attempt, Some(fence)));
        started.insert(LeaseRef { id, token }, (attempt, Some(fence)));
    }
    sqlx::query(
        "INSERT INTO job_events (job_id, from_state, to_state, actor, detail) \
         SELECT id, 'leased', 'running', $3, detail \
         FROM unnest($1::bigint[], $2::text[]) WITH ORDINALITY AS e(id, detail, n) ORDER BY n",
    )
    .bind(&event_ids)
    .bind(&details)
    .bind(worker)
    .execute(&mut *tx)
    .await?;
    Ok(started)
}

/// Start every listed leased job that has no target (no lock to take) in
/// one statement: count the attempt, write `running`, record the events.
/// Returns the attempt of each job started; the others are left untouched.
async fn start_untargeted(
    tx: &mut PgConnection,
    leases: &[LeaseRef],
    spec: &StartSpec,
    worker: &str,
) -> Result<HashMap<LeaseRef, i32>> {
    if leases.is_empty() {
        return Ok(HashMap::new());
    }
    job::check(leases[0].id, State::Leased, job::Move::Start)?;
    let ids: Vec<i64> = leases.iter().map(|l| l.id).collect();
    let tokens: Vec<i64> = leases.iter().map(|l| l.token).collect();
    let rows: Vec<(i64, i64, i32)> = sqlx::query_as(
        "WITH started AS ( \
             UPDATE jobs SET state = 'running', attempt = attempt + 1, \
                 lease_expires_at = now() + $3 * interval '1 millisecond', started_at = now(), \
                 lock_fence = NULL, on_stale = $4, backoff_ms = $5 \
             FROM unnest($1::bigint[], $2::bigint[]) AS t(id, token) \
             WHERE jobs.id = t.id AND jobs.lease_token = t.token AND jobs.state = 'leased' \
               AND jobs.target IS NULL \
             RETURNING jobs.id, jobs.lease_token, jobs.attempt \
         ), events AS ( \
             INSERT INTO job_events (job_id, from_state, to_state, actor, detail) \
             SELECT id, 'leased', 'running', $6, 'attempt ' || attempt FROM started ORDER BY id \
         ) \
         SELECT id, lease_token, attempt FROM started",
    )
    .bind(&ids)
    .bind(&tokens)
    .bind(ms(spec.lease))
    .bind(spec.on_stale.as_str())
    .bind(ms(spec.backoff))
    .bind(worker)
    .fetch_all(&mut *tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, token, attempt)| (LeaseRef { id, token }, attempt))
        .collect())
}

/// Mark every listed running job succeeded, release their locks by fence
/// and record the events, in one statement. Returns the ids that were
/// still held (the others' leases were lost).
async fn succeed_all(
    tx: &mut PgConnection,
    leases: &[LeaseRef],
    actor: &str,
) -> Result<std::collections::HashSet<LeaseRef>> {
    if leases.is_empty() {
        return Ok(Default::default());
    }
    job::check(leases[0].id, State::Running, job::Move::Succeed)?;
    let ids: Vec<i64> = leases.iter().map(|l| l.id).collect();
    let tokens: Vec<i64> = leases.iter().map(|l| l.token).collect();
    let done: Vec<(i64, i64)> = sqlx::query_as(
        "WITH done AS ( \
             UPDATE jobs SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL \
             FROM unnest($1::bigint[], $2::bigint[]) AS t(id, token) \
             WHERE jobs.id = t.id AND jobs.lease_token = t.token AND jobs.state = 'running' \
             RETURNING jobs.id, jobs.lease_token, jobs.target, jobs.lock_fence \
         ), freed AS ( \
             UPDATE locks SET holder_job = NULL, holder_worker = NULL, acquired_at = NULL, \
                 expires_at = NULL \
             FROM done \
             WHERE locks.target = done.target AND locks.fence = done.lock_fence \
               AND locks.holder_job = done.id \
         ), events AS ( \
             INSERT INTO job_events (job_id, from_state, to_state, actor, detail) \
             SELECT id, 'running', 'succeeded', $3, '' FROM done ORDER BY id \
         ) \
         SELECT id, lease_token FROM done",
    )
    .bind(&ids)
    .bind(&tokens)
    .bind(actor)
    .fetch_all(&mut *tx)
    .await?;
    Ok(done
        .into_iter()
        .map(|(id, token)| LeaseRef { id, token })
        .collect())
}

/// Lock the batch's job rows in id order before touching anything else:
/// the renewal locks its rows in the same order, so neither can hold one
/// row while waiting for another the other holds.
async fn lock_in_id_order(tx: &mut PgConnection, ids: impl Iterator<Item = i64>) -> Result<()> {
    let ids: Vec<i64> = ids.collect();
    sqlx::query("SELECT id FROM jobs WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Which jobs a statement-by-statement cycle starts after its claim (those
/// whose pipeline has a spec): per job, its index in the returned start
/// list.
fn startable(
    jobs: &[Job],
    specs: &[(String, StartSpec)],
) -> (Vec<Option<usize>>, Vec<(LeaseRef, StartSpec)>) {
    let mut index = Vec::with_capacity(jobs.len());
    let mut starts = Vec::with_capacity(jobs.len());
    for job in jobs {
        let spec = specs.iter().find(|(p, _)| *p == job.pipeline);
        match (job.lease_ref(), spec) {
            (Some(lease), Some((_, spec))) => {
                index.push(Some(starts.len()));
                starts.push((lease, *spec));
            }
            _ => index.push(None),
        }
    }
    (index, starts)
}

/// The claimed jobs with the answers of their starts (see [`startable`]).
fn pair_starts(
    jobs: Vec<Job>,
    index: Vec<Option<usize>>,
    answers: Vec<Result<StartOutcome>>,
) -> Vec<Claimed> {
    jobs.into_iter()
        .zip(index)
        .map(|(job, i)| {
            let started = match i.and_then(|i| answers.get(i)) {
                Some(Ok(StartOutcome::Started { attempt, fence })) => Some((*attempt, *fence)),
                _ => None,
            };
            Claimed { job, started }
        })
        .collect()
}
