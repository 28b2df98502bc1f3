//! The cycle of a queue with targets as one plain statement: successes
//! with or without a lock, and a claim that takes a lock per target and
//! starts what it got. `jobdeck_cycle` does the same in PL/pgSQL, in
//! three statements (lock the successes, write them and free their
//! locks, claim); in pgbench calling each the way the engine does, with
//! 100 targets, the statement cost about 0.83× the machine CPU per job of
//! the call (bench/HISTORY.md, session 16).
//!
//! Locks are freed and taken by one upsert keyed by target, whose
//! conditions Postgres checks on the newest version of each lock row: a
//! lease renewal that rewrote a finishing job's lock row after this
//! statement's snapshot cannot make the release miss it (what a release
//! by row version in one statement did; session 12). A lock held by one
//! of the cycle's own successes counts as free to its claim, and the
//! upsert hands it straight to the job claimed on that target with the
//! next fence. A claimed job whose lock went elsewhere meanwhile stays
//! leased, as in the function, and starts through the per-job path.
//!
//! Runs on the engine's own connections (`engine_conn`); on a session
//! where the count trigger counts, it stops before writing (`JDL01`) and
//! the store calls the function.

use std::sync::atomic::{AtomicI64, Ordering};

use sqlx::PgConnection;

use super::lean_cycle::{Lean, claim_events, engine_counts, net_counts, send};
use super::worker::claim_window;
use crate::store::{CycleRequest, Result};

/// The statement, with the parameters of `lean_cycle::send`. The successes
/// are locked in id order on the primary key, as the renewal locks them;
/// the candidates' probes are `OFFSET 0` so that each stays a probe of one
/// target (see worker.rs). A candidate's probe for a leased job of its
/// target runs only when some job with a target is leased at all (an
/// uncorrelated `EXISTS`, which the server evaluates once per call): the
/// engine starts what it claims, so there is rarely one (2.3 % fewer
/// server instructions per job with 100 targets; session 25). The rows
/// come back with the candidates passed over as duplicates of an earlier
/// one's target, in brief, for the window (`ClaimWindow`). Locks are
/// written in target order, as every lock-taking batch: two nodes' cycles
/// cannot deadlock on each other's locks. The engine's setting (`engine_counts!`) is checked on each
/// success and each candidate before anything is written (0.85 % fewer
/// server instructions per job than reading it once through a common
/// table expression; session 21 in bench/HISTORY.md). Every row source
/// an `UPDATE ... FROM` joins to its table yields a whole-row copy of each
/// of its rows too (for the recheck after a concurrent update), built anew
/// at each rescan of a nested loop. So the successes' `UPDATE` joins
/// nothing (each token is looked up by `array_position`), and the claim's
/// joins `plan` materialized, one narrow row per job, where Postgres would
/// inline it into a nested loop that rebuilt the copy of every `taken` row
/// for every picked job (together 3.2 % fewer server instructions per job
/// with 100 targets; session 22 in bench/HISTORY.md).
const STATEMENT: &str = concat!(
    "WITH done AS ( \
             UPDATE jobs SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL \
             WHERE jobs.id = ANY ($1::bigint[]) \
               AND jobs.lease_token = ($2::bigint[])[array_position($1::bigint[], jobs.id)] \
               AND (jobs.state = 'running') IS TRUE \
               AND ",
    engine_counts!(),
    " RETURNING jobs.id, jobs.lease_token, jobs.target, jobs.lock_fence \
         ), done_logged AS ( \
             INSERT INTO job_events (job_id, from_state, to_state, actor, detail) \
             SELECT id, 'running', 'succeeded', $3, '' FROM done \
         ), candidates AS ( \
             SELECT j.id, j.pipeline, j.target, j.priority, j.due_at FROM jobs j \
             WHERE j.state = 'queued' AND j.due_at <= now() AND j.pipeline = ANY ($4::text[]) \
               AND ",
    engine_counts!(),
    " AND (j.target IS NULL OR ( \
                 NOT EXISTS (SELECT 1 FROM locks l \
                             WHERE l.target = j.target AND l.holder_job IS NOT NULL \
                               AND l.holder_job <> ALL ($1::bigint[]) \
                             OFFSET 0) \
                 AND (NOT EXISTS (SELECT 1 FROM jobs a \
                                  WHERE a.state = 'leased' AND a.target IS NOT NULL) \
                      OR NOT EXISTS (SELECT 1 FROM jobs o \
                                 WHERE o.target = j.target AND o.state = 'leased' \
                                 OFFSET 0)))) \
             ORDER BY j.priority DESC, j.due_at, j.id \
             LIMIT $11 \
             FOR UPDATE OF j SKIP LOCKED \
         ), ranked AS ( \
             SELECT c.*, row_number() OVER ( \
                 PARTITION BY c.target ORDER BY c.priority DESC, c.due_at, c.id) AS nth \
             FROM candidates c \
         ), picked AS ( \
             SELECT r.id, r.target, array_position($7::text[], r.pipeline) AS i \
             FROM ranked r WHERE r.nth = 1 OR r.target IS NULL \
             ORDER BY r.priority DESC, r.due_at, r.id LIMIT $5 \
         ), lock_moves AS ( \
             SELECT d.target, NULL::bigint AS job, NULL::bigint AS lease_ms \
             FROM done d WHERE d.target IS NOT NULL \
             UNION ALL \
             SELECT p.target, p.id, ($8::bigint[])[p.i] \
             FROM picked p WHERE p.target IS NOT NULL AND p.i IS NOT NULL \
         ), taken AS ( \
             INSERT INTO locks AS l (target, fence, holder_job, holder_worker, acquired_at, expires_at) \
             SELECT m.target, 1, max(m.job), CASE WHEN max(m.job) IS NOT NULL THEN $3 END, \
                    CASE WHEN max(m.job) IS NOT NULL THEN now() END, \
                    now() + max(m.lease_ms) * interval '1 millisecond' \
             FROM lock_moves m GROUP BY m.target ORDER BY m.target \
             ON CONFLICT (target) DO UPDATE SET \
                 fence = l.fence + CASE WHEN EXCLUDED.holder_job IS NULL THEN 0 ELSE 1 END, \
                 holder_job = EXCLUDED.holder_job, holder_worker = EXCLUDED.holder_worker, \
                 acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at \
             WHERE (l.holder_job IS NULL AND EXCLUDED.holder_job IS NOT NULL) \
                OR (l.holder_job, l.fence) IN (SELECT d.id, d.lock_fence FROM done d) \
             RETURNING l.holder_job AS id, l.fence \
         ), plan AS MATERIALIZED ( \
             SELECT p.id, p.i, t.fence, \
                    p.i IS NOT NULL AND (p.target IS NULL OR t.id IS NOT NULL) AS go \
             FROM picked p LEFT JOIN taken t ON t.id = p.id \
         ), claimed AS ( \
             UPDATE jobs SET \
                 state = CASE WHEN plan.go THEN 'running' ELSE 'leased' END, \
                 lease_owner = $3, \
                 lease_token = nextval('lease_tokens'), \
                 lease_expires_at = now() + CASE WHEN plan.go THEN ($8::bigint[])[plan.i] \
                                                 ELSE $6 END * interval '1 millisecond', \
                 attempt = jobs.attempt + CASE WHEN plan.go THEN 1 ELSE 0 END, \
                 started_at = CASE WHEN plan.go THEN now() ELSE jobs.started_at END, \
                 lock_fence = CASE WHEN plan.go THEN plan.fence ELSE jobs.lock_fence END, \
                 on_stale = CASE WHEN plan.go THEN ($9::text[])[plan.i] ELSE jobs.on_stale END, \
                 backoff_ms = CASE WHEN plan.go THEN ($10::bigint[])[plan.i] \
                                   ELSE jobs.backoff_ms END \
             FROM plan WHERE jobs.id = plan.id \
             RETURNING jobs.* \
         ), claim_logged AS ( \
             INSERT INTO job_events (job_id, from_state, to_state, actor, detail) \
             SELECT c.id, e.from_state, e.to_state, $3, e.detail FROM claimed c ",
    claim_events!(),
    " ), counted AS ( \
             INSERT INTO job_state_deltas (state, n) \
             SELECT d.state, d.n FROM ( \
                 SELECT (SELECT count(*) FROM done) AS done, \
                        count(*) FILTER (WHERE state = 'running') AS started, \
                        count(*) FILTER (WHERE state = 'leased') AS leased \
                 FROM claimed \
             ) m ",
    net_counts!(),
    " ) SELECT ",
    job_cols!(),
    " FROM claimed UNION ALL SELECT ",
    brief_cols!("'queued'"),
    " FROM (SELECT r.id, r.target, NULL::bigint AS lease_token FROM ranked r \
            WHERE r.nth > 1 AND r.target IS NOT NULL) passed UNION ALL SELECT ",
    brief_cols!("'succeeded'"),
    " FROM done"
);

/// How many candidates the statement locks for a claim of `limit` jobs:
/// the limit itself while the queue's head holds one job per target, and
/// up to `claim_window` once a cycle passed over a job whose target an
/// earlier candidate had, halving back towards the limit with every cycle
/// that passes over none. Each candidate is a row lock (a WAL record) and
/// its probes; with 100 targets the ten beyond a limit of 8 cost the
/// server 5.6 % of its instructions per job (session 25 in
/// bench/HISTORY.md). One per store: its engine's cycles share what they
/// learn of the queue; a lost update between two of them only costs one
/// cycle a narrower or wider window.
#[derive(Debug, Default)]
pub(super) struct ClaimWindow {
    /// Candidates beyond the limit.
    slack: AtomicI64,
}

impl ClaimWindow {
    pub(super) fn for_limit(&self, limit: i64) -> i64 {
        limit
            .saturating_add(self.slack.load(Ordering::Relaxed))
            .min(claim_window(limit))
    }

    /// What a written cycle of `limit` passed over: duplicates of a
    /// target among its candidates.
    pub(super) fn observe(&self, limit: usize, passed_over: usize) {
        let slack = if passed_over > 0 {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            claim_window(limit).saturating_sub(limit)
        } else {
            self.slack.load(Ordering::Relaxed) / 2
        };
        self.slack.store(slack, Ordering::Relaxed);
    }
}

/// Finish the request's successes (all of its finishes must be) and claim
/// into its limit, locks included, in one statement and its own commit.
pub(super) async fn cycle(
    conn: &mut PgConnection,
    req: &CycleRequest,
    worker: &str,
    window: &ClaimWindow,
) -> Result<Lean> {
    send(
        conn,
        STATEMENT,
        Some(&|limit| window.for_limit(limit)),
        req,
        worker,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::super::lean_cycle::testing::{claim_one, engine_settings, scratch_store};
    use super::*;
    use crate::job::{StalePolicy, State};
    use crate::store::{Backend, NewJob, Outcome, StartSpec, scratch};

    /// On a session where the count trigger counts (any but the engine's
    /// own), the statement stops before writing anything; with the
    /// engine's settings it claims a targeted job, takes its lock and
    /// starts it.
    #[tokio::test]
    async fn refuses_where_the_trigger_counts_else_locks_and_starts() {
        let Some((store, base, schema)) = scratch_store("lockcycle").await else {
            return;
        };
        let job = NewJob {
            pipeline: "p".into(),
            target: Some("t".into()),
            ..NewJob::default()
        };
        let id = store.enqueue(job, "test").await.unwrap().id;
        let spec = StartSpec {
            lease: std::time::Duration::from_secs(60),
            on_stale: StalePolicy::Hold,
            backoff: std::time::Duration::ZERO,
        };
        let req = claim_one(vec![("p".into(), spec)]);
        let mut conn = store.pool().acquire().await.unwrap();
        let answer = cycle(&mut conn, &req, "w", &ClaimWindow::default())
            .await
            .unwrap();
        assert!(matches!(answer, Lean::Refused));
        assert_eq!(store.get_job(id).await.unwrap().state, State::Queued);
        assert!(store.list_locks().await.unwrap().is_empty());
        engine_settings(&mut conn).await;
        let Lean::Written(rows) = cycle(&mut conn, &req, "w", &ClaimWindow::default())
            .await
            .unwrap()
        else {
            panic!("refused with the engine's settings");
        };
        assert_eq!(rows.len(), 1);
        let job = store.get_job(id).await.unwrap();
        assert_eq!((job.state, job.lock_fence), (State::Running, Some(1)));
        let locks = store.list_locks().await.unwrap();
        assert_eq!(locks.iter().map(|l| l.job_id).collect::<Vec<_>>(), vec![id]);
        drop(conn);
        // Its success alone, on a session whose trigger counts: refused too,
        // the job still running and its lock held.
        let success = CycleRequest {
            finishes: vec![(job.lease_ref().unwrap(), Outcome::Succeeded)],
            claim: None,
            specs: Vec::new(),
        };
        let mut conn = store.pool().acquire().await.unwrap();
        let answer = cycle(&mut conn, &success, "w", &ClaimWindow::default())
            .await
            .unwrap();
        assert!(matches!(answer, Lean::Refused));
        drop(conn);
        assert_eq!(store.get_job(id).await.unwrap().state, State::Running);
        assert_eq!(store.list_locks().await.unwrap().len(), 1);
        scratch::drop_pg_schema(&base, &schema).await.unwrap();
    }

    /// The window starts at the limit, opens to `claim_window` when a
    /// cycle passes over a duplicate target, and halves its slack back
    /// with every cycle that passes over none.
    #[test]
    fn the_window_opens_on_a_duplicate_and_closes_by_halves() {
        let window = ClaimWindow::default();
        assert_eq!(window.for_limit(8), 8);
        window.observe(8, 1);
        assert_eq!(window.for_limit(8), 18);
        // A smaller claim is held to its own widest window.
        assert_eq!(window.for_limit(2), 6);
        let widths: Vec<i64> = (0..5)
            .map(|_| {
                window.observe(8, 0);
                window.for_limit(8)
            })
            .collect();
        assert_eq!(widths, vec![13, 10, 9, 8, 8]);
    }

    /// Through the store: a first cycle's window is its limit, so two
    /// jobs of one target at the queue's head leave it one job short (and
    /// it says so); the next cycle's window is wide enough to reach past
    /// the next duplicate.
    #[tokio::test]
    async fn a_cycle_that_passes_over_a_duplicate_widens_the_next() {
        let Some((store, base, schema)) = scratch_store("lockwindow").await else {
            return;
        };
        let mut ids = Vec::new();
        for target in ["a", "a", "b", "b", "c"] {
            let job = NewJob {
                pipeline: "p".into(),
                target: Some(target.into()),
                ..NewJob::default()
            };
            ids.push(store.enqueue(job, "test").await.unwrap().id);
        }
        let spec = StartSpec {
            lease: std::time::Duration::from_secs(60),
            on_stale: StalePolicy::Hold,
            backoff: std::time::Duration::ZERO,
        };
        let mut req = claim_one(vec![("p".into(), spec)]);
        req.claim.as_mut().unwrap().limit = 2;
        let claimed = |o: crate::store::CycleOutcome| -> Vec<i64> {
            o.claimed.iter().map(|c| c.job.id).collect()
        };
        let first = store.cycle(&req, "w").await.unwrap();
        assert_eq!(claimed(first), vec![ids[0]], "a window of 2 held a, a");
        let second = store.cycle(&req, "w").await.unwrap();
        assert_eq!(
            claimed(second),
            vec![ids[2], ids[4]],
            "b and c past b's second"
        );
        scratch::drop_pg_schema(&base, &schema).await.unwrap();
    }
}
