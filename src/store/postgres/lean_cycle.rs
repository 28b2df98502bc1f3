//! The common cycle as one plain statement: successes that hold no lock,
//! and a claim of jobs that need none. `jobdeck_cycle` does the same work
//! in PL/pgSQL, whose statements, cursor and returned set cost about a
//! sixth of a call at 8 slots (pgbench calling each the way the engine
//! does: 14.3k against 12.0k jobs/s; bench/HISTORY.md, session 14; in the
//! engine 1.076×). Everything with a lock to take or free goes to the
//! statement with locks (`lock_cycle`, which this one's probes and lock
//! upsert would only slow down on a queue without targets):
//! - a success with a target makes the statement stop with `JDL01`
//!   (migration 0012) before anything is written, as does a session on
//!   which the count trigger is on (the statement counts its moves);
//! - a queued job with a target among the claim's candidates is left
//!   queued and returned as it is, so the store can claim it through the
//!   statement with locks in the same call.
//!
//! Runs on the engine's own connections, whose settings (`engine_conn`)
//! are the function's: the trigger leaves the counting to the statement,
//! and the plan stays generic and on the indexes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool};

use super::worker::claim_window;
use super::{SpecColumns, ms};
use crate::job::{self, State};
use crate::store::{CycleRequest, Result, StoreError, successes};

/// Whether a store's cycles take the lean statement, and how many it has
/// written.
#[derive(Debug, Default)]
pub(super) struct LeanMode {
    /// Set when a cycle met a target (a success, a claimed job or a
    /// candidate with one), cleared when a cycle through the function met
    /// none: a queue of targeted jobs goes straight to the function.
    targets_seen: AtomicBool,
    written: AtomicU64,
}

impl LeanMode {
    pub(super) fn targets_seen(&self) -> bool {
        self.targets_seen.load(Ordering::Relaxed)
    }

    pub(super) fn saw_targets(&self, seen: bool) {
        self.targets_seen.store(seen, Ordering::Relaxed);
    }

    /// Count a written cycle. Every 16th folds the state counts' deltas,
    /// as the function and the count triggers do about one call in 16,
    /// on a pooled connection so that no cycle waits for it.
    pub(super) fn written(&self, pool: &PgPool) {
        if self.written.fetch_add(1, Ordering::Relaxed) % 16 != 15 {
            return;
        }
        let pool = pool.clone();
        tokio::spawn(async move { fold_state_counts(&pool).await });
    }
}

/// Fold the state counts' deltas (migration 0002), for a writer that
/// counts its own moves; a failure only leaves them for the next fold.
pub(super) async fn fold_state_counts(pool: &PgPool) {
    if let Err(e) = sqlx::query("SELECT job_state_fold()").execute(pool).await {
        tracing::debug!("fold of the state counts: {e}");
    }
}

/// What the statement answered.
pub(super) enum Lean {
    /// Written and committed: the rows of the successes, the claimed jobs
    /// and the queued jobs it passed over (which have a target).
    Written(Vec<PgRow>),
    /// A success holds a lock, or the session's count trigger is on:
    /// nothing was written.
    Refused,
}

/// The last parts of both cycle statements (this module's and
/// `lock_cycle`'s), up to their final `SELECT`: the claim's events (each
/// claimed job queued → leased, a started one leased → running with its
/// attempt and fence) and the cycle's moves, netted into one delta row
/// per state it changed. Parameter $3: the worker.
macro_rules! claim_logged_and_counted {
    () => {
        "claim_logged AS ( \
             INSERT INTO job_events (job_id, from_state, to_state, actor, detail) \
             SELECT c.id, e.from_state, e.to_state, $3, e.detail \
             FROM claimed c CROSS JOIN LATERAL (VALUES \
                 (1, 'queued', 'leased', ''), \
                 (2, 'leased', 'running', \
                  'attempt ' || c.attempt || coalesce(', fence ' || c.lock_fence, '')) \
             ) AS e(n, from_state, to_state, detail) \
             WHERE e.n = 1 OR c.state = 'running' \
             ORDER BY c.id, e.n \
         ), moved AS MATERIALIZED ( \
             SELECT (SELECT count(*) FROM done) AS done, \
                    (SELECT count(*) FROM claimed WHERE state = 'running') AS started, \
                    (SELECT count(*) FROM claimed WHERE state = 'leased') AS leased \
         ), counted AS ( \
             INSERT INTO job_state_deltas (state, n) \
             SELECT d.state, d.n FROM moved m CROSS JOIN LATERAL (VALUES \
                 ('running', m.started - m.done), ('succeeded', m.done), \
                 ('leased', m.leased), ('queued', -m.started - m.leased)) AS d(state, n) \
             WHERE d.n <> 0 \
         ) \
         SELECT "
    };
}
pub(super) use claim_logged_and_counted;

/// The statement. `settings` is read once, before either write: on a
/// session where the count trigger would count the moves too, the
/// statement stops. The successes are found by `id = ANY ($1)` on the
/// primary key, so they are locked in id order, as the renewal locks
/// them. Their state is checked on the row (`IS TRUE` keeps it from being
/// an index condition): through `jobs_state` the scan would walk every
/// entry of the running range, one per job run since the last vacuum.
const STATEMENT: &str = concat!(
    "WITH settings AS MATERIALIZED ( \
             SELECT current_setting('jobdeck.cycle_counts', true) IS NOT DISTINCT FROM 'on' \
                 OR jobdeck_lean_cycle_refuses('the count trigger is on') AS counting \
         ), done AS ( \
             UPDATE jobs SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL \
             FROM unnest($1::bigint[], $2::bigint[]) AS t(id, token) \
             WHERE jobs.id = ANY ($1::bigint[]) AND jobs.id = t.id AND jobs.lease_token = t.token \
               AND (jobs.state = 'running') IS TRUE \
               AND (jobs.target IS NULL \
                    OR jobdeck_lean_cycle_refuses('job ' || jobs.id || ' holds a lock')) \
               AND (SELECT counting FROM settings) \
             RETURNING jobs.id, jobs.lease_token, jobs.target \
         ), done_logged AS ( \
             INSERT INTO job_events (job_id, from_state, to_state, actor, detail) \
             SELECT id, 'running', 'succeeded', $3, '' FROM done ORDER BY id \
         ), picked AS ( \
             SELECT q.* FROM jobs q \
             WHERE q.state = 'queued' AND q.due_at <= now() AND q.pipeline = ANY ($4::text[]) \
               AND (SELECT counting FROM settings) \
             ORDER BY q.priority DESC, q.due_at, q.id \
             LIMIT $5 \
             FOR UPDATE OF q SKIP LOCKED \
         ), claimed AS ( \
             UPDATE jobs SET \
                 state = CASE WHEN s.i IS NULL THEN 'leased' ELSE 'running' END, \
                 lease_owner = $3, \
                 lease_token = nextval('lease_tokens'), \
                 lease_expires_at = now() + coalesce(($8::bigint[])[s.i], $6) \
                                          * interval '1 millisecond', \
                 attempt = jobs.attempt + CASE WHEN s.i IS NULL THEN 0 ELSE 1 END, \
                 started_at = CASE WHEN s.i IS NULL THEN jobs.started_at ELSE now() END, \
                 lock_fence = CASE WHEN s.i IS NULL THEN jobs.lock_fence END, \
                 on_stale = coalesce(($9::text[])[s.i], jobs.on_stale), \
                 backoff_ms = coalesce(($10::bigint[])[s.i], jobs.backoff_ms) \
             FROM picked p CROSS JOIN LATERAL (SELECT array_position($7::text[], p.pipeline) AS i) s \
             WHERE jobs.id = p.id AND p.target IS NULL \
             RETURNING jobs.* \
         ), ",
    claim_logged_and_counted!(),
    job_cols!(),
    " FROM ( \
             SELECT * FROM claimed \
             UNION ALL SELECT * FROM picked WHERE target IS NOT NULL \
         ) r UNION ALL SELECT ",
    success_cols!(),
    " FROM done ORDER BY priority DESC, due_at, id"
);

/// Finish the request's successes (all of its finishes must be) and claim
/// into its limit, in one statement and its own commit.
pub(super) async fn cycle(
    conn: &mut PgConnection,
    req: &CycleRequest,
    worker: &str,
) -> Result<Lean> {
    send(conn, STATEMENT, false, req, worker).await
}

/// Send a cycle's statement: this module's, `lock_cycle`'s or the call of
/// `jobdeck_cycle`, which share their parameters: $1 the successes' ids,
/// $2 their lease tokens, $3 the worker, $4 the claim's pipelines, $5 its
/// limit, $6 its lease (ms), $7 to $10 the start specs' columns, and $11
/// the claim's window of candidates (`with_window`: the statements that
/// claim jobs with targets). `Refused` when the statement stopped with
/// `JDL01` (migration 0012) before writing anything.
pub(super) async fn send(
    conn: &mut PgConnection,
    statement: &'static str,
    with_window: bool,
    req: &CycleRequest,
    worker: &str,
) -> Result<Lean> {
    let done = successes(&req.finishes);
    if let Some(first) = done.first() {
        job::check(first.id, State::Running, job::Move::Succeed)?;
    }
    let (pipelines, limit, claim_lease) = match &req.claim {
        Some(c) => (c.pipelines.as_slice(), c.limit, ms(c.lease)),
        None => (&[][..], 0, 0),
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let specs = SpecColumns::of(&req.specs);
    let mut query = sqlx::query(statement)
        .bind(done.iter().map(|l| l.id).collect::<Vec<_>>())
        .bind(done.iter().map(|l| l.token).collect::<Vec<_>>())
        .bind(worker)
        .bind(pipelines)
        .bind(limit)
        .bind(claim_lease)
        .bind(&specs.pipelines)
        .bind(&specs.lease_ms)
        .bind(&specs.on_stale)
        .bind(&specs.backoff_ms);
    if with_window {
        query = query.bind(claim_window(limit));
    }
    match query.fetch_all(&mut *conn).await {
        Ok(rows) => Ok(Lean::Written(rows)),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("JDL01") => Ok(Lean::Refused),
        Err(e) => Err(StoreError::from(e)),
    }
}

/// What the tests of this module and of `lock_cycle` share.
#[cfg(test)]
pub(super) mod testing {
    use crate::store::postgres::PgStore;
    use crate::store::{ClaimRequest, CycleRequest, StartSpec, scratch};

    /// A store on a schema of its own in `JOBDECK_TEST_POSTGRES`'s
    /// database, with that URL and the schema's name; `None` (said on
    /// stderr) when the variable is unset, as the Postgres tests under
    /// `tests/` do.
    pub async fn scratch_store(name: &str) -> Option<(PgStore, String, String)> {
        let Ok(base) = std::env::var("JOBDECK_TEST_POSTGRES") else {
            eprintln!("{name} did not run: JOBDECK_TEST_POSTGRES unset");
            return None;
        };
        let schema = format!("t_{name}_{}", std::process::id());
        let url = scratch::create_pg_schema(&base, &schema).await.unwrap();
        Some((PgStore::connect(&url).await.unwrap(), base, schema))
    }

    /// Give `conn` the engine connections' setting that lets the cycle
    /// statements count their own moves (`engine_conn`).
    pub async fn engine_settings(conn: &mut sqlx::PgConnection) {
        sqlx::query("SET jobdeck.cycle_counts = 'on'")
            .execute(conn)
            .await
            .unwrap();
    }

    /// A cycle with nothing to finish that claims one job of `p`.
    pub fn claim_one(specs: Vec<(String, StartSpec)>) -> CycleRequest {
        CycleRequest {
            finishes: Vec::new(),
            claim: Some(ClaimRequest {
                worker: "w".into(),
                pipelines: vec!["p".into()],
                limit: 1,
                lease: std::time::Duration::from_secs(60),
            }),
            specs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{claim_one, engine_settings, scratch_store};
    use super::*;
    use crate::store::{Backend, NewJob, scratch};

    /// On a session where the count trigger counts (any but the engine's
    /// own), the statement would count its moves twice: it stops before
    /// writing anything.
    #[tokio::test]
    async fn on_a_session_whose_trigger_counts_it_writes_nothing() {
        let Some((store, base, schema)) = scratch_store("lean").await else {
            return;
        };
        let job = NewJob {
            pipeline: "p".into(),
            ..NewJob::default()
        };
        let id = store.enqueue(job, "test").await.unwrap().id;
        let req = claim_one(Vec::new());
        let mut conn = store.pool().acquire().await.unwrap();
        let answer = cycle(&mut conn, &req, "w").await.unwrap();
        assert!(matches!(answer, Lean::Refused));
        assert_eq!(store.get_job(id).await.unwrap().state, State::Queued);
        // With the engine's settings the same statement claims the job.
        engine_settings(&mut conn).await;
        let Lean::Written(rows) = cycle(&mut conn, &req, "w").await.unwrap() else {
            panic!("refused with the engine's settings");
        };
        assert_eq!(rows.len(), 1);
        assert_eq!(store.get_job(id).await.unwrap().state, State::Leased);
        drop(conn);
        scratch::drop_pg_schema(&base, &schema).await.unwrap();
    }
}
