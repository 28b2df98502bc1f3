//! The engine's cycle on SQLite: finish, claim and start in one
//! transaction, in as few statements as the writes allow. Each statement
//! is a round trip through sqlx's connection thread, and with short jobs
//! the cycle's statement count, not SQLite's work, sets the pace.

use sqlx::SqliteConnection;

use super::SqliteStore;
use super::batch::{Targets, finish_batch_in, start_batch_in};
use super::events::Events;
use super::rows::{job_cols, job_from_row, ms, now_ms, to_json};
use super::worker::{claim_picks, sort_claim_order};
use crate::job::{Job, State};
use crate::store::{
    ClaimRequest, Claimed, CycleOutcome, CycleRequest, Result, StartOutcome, StartSpec,
    start_detail,
};

impl SqliteStore {
    /// Finish, claim and start in one transaction: the claim sees the
    /// slots and locks the finishes just freed.
    pub(super) async fn do_cycle(&self, req: &CycleRequest, worker: &str) -> Result<CycleOutcome> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let claiming = req.claim.as_ref().map_or(0, |c| c.limit);
        let mut events = Events::with_capacity(req.finishes.len() + 2 * claiming);
        let finished = finish_batch_in(&mut tx, now, &req.finishes, worker, &mut events).await?;
        let mut claimed = match &req.claim {
            Some(claim) => claim_and_start(&mut tx, now, claim, &req.specs, &mut events).await?,
            None => Vec::new(),
        };
        // What the claim did not start (a target's lock to take) starts
        // set-based too; `start_batch_in` writes every event so far.
        let mut waiting = Vec::new();
        let mut starts = Vec::new();
        for (i, c) in claimed.iter().enumerate() {
            let spec = req.specs.iter().find(|(p, _)| *p == c.job.pipeline);
            if let (None, Some(lease), Some((_, spec))) = (c.started, c.job.lease_ref(), spec) {
                waiting.push(i);
                starts.push((lease, *spec));
            }
        }
        let answers =
            start_batch_in(&mut tx, now, &starts, Targets::All, worker, &mut events).await?;
        tx.commit().await?;
        for (i, answer) in waiting.into_iter().zip(answers) {
            if let Ok(StartOutcome::Started { attempt, fence }) = answer {
                let job = &mut claimed[i].job;
                (job.state, job.attempt, job.lock_fence) = (State::Running, attempt, fence);
                claimed[i].started = Some((attempt, fence));
            }
        }
        Ok(CycleOutcome { finished, claimed })
    }
}

/// The cycle's claim, which also starts every claimed job that has no
/// target and whose pipeline has a spec: one row write instead of two
/// (leased, then running) in the same transaction, nothing observable in
/// between. Both moves are recorded in `events`. Jobs with a target are
/// left leased: their locks are taken next.
async fn claim_and_start(
    tx: &mut SqliteConnection,
    now: i64,
    req: &ClaimRequest,
    specs: &[(String, StartSpec)],
    events: &mut Events,
) -> Result<Vec<Claimed>> {
    if req.limit == 0 || req.pipelines.is_empty() {
        return Ok(Vec::new());
    }
    let pipelines = to_json(&req.pipelines)?;
    let specs = to_json(
        &specs
            .iter()
            .map(|(p, s)| (p, ms(s.lease), s.on_stale.as_str(), ms(s.backoff)))
            .collect::<Vec<_>>(),
    )?;
    let limit = i64::try_from(req.limit).unwrap_or(i64::MAX / 16);
    let rows = sqlx::query(concat!(
        claim_picks!(),
        ", go AS (
            SELECT pick.id, spec.value ->> 1 AS spec_lease, spec.value ->> 2 AS spec_stale,
                spec.value ->> 3 AS spec_backoff, spec.key IS NOT NULL AS go
            FROM pick LEFT JOIN json_each(?6) AS spec
                ON spec.value ->> 0 = pick.pipeline AND pick.target IS NULL
        )
        UPDATE jobs SET state = iif(go.go, 'running', 'leased'), lease_owner = ?4,
            lease_token = random(), lease_expires_at = ?1 + iif(go.go, go.spec_lease, ?5),
            attempt = attempt + go.go, started_at = iif(go.go, ?1, started_at),
            lock_fence = iif(go.go, NULL, lock_fence),
            on_stale = iif(go.go, go.spec_stale, on_stale),
            backoff_ms = iif(go.go, go.spec_backoff, backoff_ms)
        FROM go WHERE jobs.id = go.id
        RETURNING ",
        job_cols!()
    ))
    .bind(now)
    .bind(pipelines)
    .bind(limit)
    .bind(&req.worker)
    .bind(ms(req.lease))
    .bind(specs)
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
                events.push(
                    job.id,
                    State::Leased,
                    State::Running,
                    start_detail(job.attempt, None),
                );
                (job.attempt, None)
            });
            Claimed { job, started }
        })
        .collect())
}
