//! Group commit: many starts or finishes in one transaction. Jobs without a
//! target start, and successes finish, in set-based statements; everything
//! else goes through the per-job path of `worker.rs` inside the same
//! transaction, each write all or nothing.

use std::collections::HashMap;

use sqlx::{PgConnection, Row};

use super::worker::{finish_in, start_in};
use super::{PgStore, ms};
use crate::job::{self, State};
use crate::store::{LeaseRef, Outcome, Result, StartOutcome, StartSpec, StoreError};

impl PgStore {
    /// One transaction, one commit, for a batch of starts (each all or
    /// nothing). Lock rows are taken in target order so that two workers'
    /// batches cannot deadlock on each other's targets.
    pub(super) async fn start_many_jobs(
        &self,
        items: &[(LeaseRef, StartSpec)],
        worker: &str,
    ) -> Result<Vec<Result<StartOutcome>>> {
        let mut tx = self.pool.begin().await?;
        lock_in_id_order(&mut tx, items.iter().map(|(l, _)| l.id)).await?;
        // Jobs without a target need no lock: each group of one spec starts
        // in one statement (the statement itself skips targeted jobs).
        let mut started = HashMap::new();
        let mut specs: Vec<StartSpec> = Vec::new();
        for (_, spec) in items {
            if !specs.contains(spec) {
                specs.push(*spec);
            }
        }
        for spec in &specs {
            let leases: Vec<LeaseRef> = items
                .iter()
                .filter(|(_, s)| s == spec)
                .map(|(l, _)| *l)
                .collect();
            started.extend(start_untargeted(&mut tx, &leases, spec, worker).await?);
        }
        // What is left (targets, lost leases) goes one by one through the
        // full start, in target order.
        let rest: Vec<usize> = (0..items.len())
            .filter(|i| !started.contains_key(&items[*i].0))
            .collect();
        let targets = self.targets_of(rest.iter().map(|i| items[*i].0.id)).await?;
        let mut order = rest;
        order.sort_by(|a, b| {
            targets
                .get(&items[*a].0.id)
                .cmp(&targets.get(&items[*b].0.id))
        });
        let mut out: Vec<Option<Result<StartOutcome>>> = items
            .iter()
            .map(|(lease, _)| {
                started.get(lease).map(|attempt| {
                    Ok(StartOutcome::Started {
                        attempt: *attempt,
                        fence: None,
                    })
                })
            })
            .collect();
        for i in order {
            let (lease, spec) = &items[i];
            out[i] = Some(match start_in(&mut tx, *lease, spec, worker).await {
                Err(e @ (StoreError::Database(_) | StoreError::Unreachable(_))) => return Err(e),
                other => other,
            });
        }
        tx.commit().await?;
        Ok(out.into_iter().flatten().collect())
    }

    /// Targets of the given jobs (jobs without one are absent).
    async fn targets_of(&self, ids: impl Iterator<Item = i64>) -> Result<HashMap<i64, String>> {
        let ids: Vec<i64> = ids.collect();
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let rows =
            sqlx::query("SELECT id, target FROM jobs WHERE id = ANY($1) AND target IS NOT NULL")
                .bind(&ids)
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("target")?)))
            .collect()
    }

    /// One transaction, one commit, for a batch of finishes (each all or
    /// nothing). Each job's lock row is its own: no ordering needed.
    pub(super) async fn finish_many_jobs(
        &self,
        items: &[(LeaseRef, Outcome)],
        actor: &str,
    ) -> Result<Vec<Result<State>>> {
        let mut tx = self.pool.begin().await?;
        lock_in_id_order(&mut tx, items.iter().map(|(l, _)| l.id)).await?;
        // Successes, the bulk of any batch, take one statement together;
        // the rest go one by one through the full decision.
        let succeeded: Vec<LeaseRef> = items
            .iter()
            .filter(|(_, o)| *o == Outcome::Succeeded)
            .map(|(l, _)| *l)
            .collect();
        let done = succeed_all(&mut tx, &succeeded, actor).await?;
        let mut out = Vec::with_capacity(items.len());
        for (lease, outcome) in items {
            out.push(if *outcome == Outcome::Succeeded {
                if done.contains(lease) {
                    Ok(State::Succeeded)
                } else {
                    Err(StoreError::LeaseLost(lease.id))
                }
            } else {
                match finish_in(&mut tx, *lease, outcome.clone(), actor).await {
                    Err(e @ (StoreError::Database(_) | StoreError::Unreachable(_))) => {
                        return Err(e);
                    }
                    other => other,
                }
            });
        }
        tx.commit().await?;
        Ok(out)
    }
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
