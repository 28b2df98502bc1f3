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
//!   queued and returned (in brief: `brief_cols!`), so the store can claim
//!   it through the statement with locks in the same call.
//!
//! Runs on the engine's own connections, whose settings (`engine_conn`)
//! are the function's: the trigger leaves the counting to the statement,
//! and the plan stays generic and on the indexes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool};

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

/// The engine's setting, checked on a row the cycle statements are about
/// to write: true on the engine's own connections, where the count trigger
/// leaves the counting to the statement; elsewhere the statement stops
/// with `JDL01` before anything is written. A filter on each row, since
/// `jobdeck_lean_cycle_refuses` is volatile: both branches of a cycle's
/// writes need it. Shared by both cycle statements.
macro_rules! engine_counts {
    () => {
        "(current_setting('jobdeck.cycle_counts', true) IS NOT DISTINCT FROM 'on' \
          OR jobdeck_lean_cycle_refuses('the count trigger is on'))"
    };
}
pub(super) use engine_counts;

/// The claim's events of a claimed row `c`, as a lateral list to join to
/// it: queued → leased, and for a started job (state running) leased →
/// running with its attempt and fence. A nested loop over the claimed
/// rows, the only join a lateral list allows, inserts each job's events
/// in this order, so their ids follow its moves without a sort (a Sort's
/// start-up cost the server 1.8 % of the statement; session 21 in
/// bench/HISTORY.md). Shared by both cycle statements (this module's and
/// `lock_cycle`'s).
macro_rules! claim_events {
    () => {
        "CROSS JOIN LATERAL (VALUES \
             (1, 'queued', 'leased', ''), \
             (2, 'leased', 'running', \
              'attempt ' || c.attempt || coalesce(', fence ' || c.lock_fence, '')) \
         ) AS e(n, from_state, to_state, detail) \
         WHERE (e.n = 1 OR c.state = 'running')"
    };
}
pub(super) use claim_events;

/// A cycle's moves netted into one delta row per state it changed, from
/// a row `m` of its counts: `done` successes, `started` jobs claimed and
/// started, `leased` jobs claimed and left leased. Shared by both cycle
/// statements.
macro_rules! net_counts {
    () => {
        "CROSS JOIN LATERAL (VALUES \
             ('running', m.started - m.done), ('succeeded', m.done), \
             ('leased', m.leased), ('queued', -m.started - m.leased)) AS d(state, n) \
         WHERE d.n <> 0"
    };
}
pub(super) use net_counts;

/// The statement: the successes and the claimed jobs are written by one
/// `UPDATE`, whose start-up (the table's indexes opened, its CHECK and the
/// count trigger's `WHEN` read back from their stored text) the server
/// paid twice per call with one `UPDATE` each; with that and no sorts the
/// server runs 14 % fewer instructions per job (session 21 in
/// bench/HISTORY.md).
/// - The engine's setting (`engine_counts!`) is checked on every row
///   before the `UPDATE` gets it (each success in `moves`, each candidate
///   in `picked`): on a session where the count trigger would count the
///   moves too, the statement stops before anything is written.
/// - The successes come first in `moves`, in the order given (`send`
///   sorts them by id), and each is found by its primary key: they are
///   locked in id order, as the renewal locks them, before the claimed
///   jobs' rows, which `picked` has locked already without waiting.
/// - A success's state is checked on the row (`IS TRUE` keeps it from
///   being an index condition): through `jobs_state` the scan would walk
///   every entry of the running range, one per job run since the last
///   vacuum.
/// - The rows come back unsorted; `read_cycle` puts the claimed jobs in
///   claim order.
const STATEMENT: &str = concat!(
    "WITH picked AS ( \
             SELECT q.id, q.pipeline, q.target, q.lease_token FROM jobs q \
             WHERE q.state = 'queued' AND q.due_at <= now() AND q.pipeline = ANY ($4::text[]) \
               AND ",
    engine_counts!(),
    " ORDER BY q.priority DESC, q.due_at, q.id \
             LIMIT $5 \
             FOR UPDATE OF q SKIP LOCKED \
         ), moves AS ( \
             SELECT t.id, t.token, NULL::int AS i, true AS done \
             FROM unnest($1::bigint[], $2::bigint[]) AS t(id, token) \
             WHERE ",
    engine_counts!(),
    " UNION ALL \
             SELECT p.id, NULL, array_position($7::text[], p.pipeline), false \
             FROM picked p WHERE p.target IS NULL \
         ), written AS ( \
             UPDATE jobs SET \
                 state = CASE WHEN m.done THEN 'succeeded' \
                              WHEN m.i IS NULL THEN 'leased' ELSE 'running' END, \
                 finished_at = CASE WHEN m.done THEN now() ELSE jobs.finished_at END, \
                 lease_owner = CASE WHEN m.done THEN jobs.lease_owner ELSE $3 END, \
                 lease_token = CASE WHEN m.done THEN jobs.lease_token \
                                    ELSE nextval('lease_tokens') END, \
                 lease_expires_at = CASE WHEN m.done THEN NULL \
                     ELSE now() + coalesce(($8::bigint[])[m.i], $6) * interval '1 millisecond' END, \
                 attempt = jobs.attempt + CASE WHEN m.i IS NULL THEN 0 ELSE 1 END, \
                 started_at = CASE WHEN m.i IS NULL THEN jobs.started_at ELSE now() END, \
                 lock_fence = CASE WHEN m.done OR m.i IS NULL THEN jobs.lock_fence END, \
                 on_stale = coalesce(($9::text[])[m.i], jobs.on_stale), \
                 backoff_ms = coalesce(($10::bigint[])[m.i], jobs.backoff_ms) \
             FROM moves m \
             WHERE jobs.id = m.id \
               AND (NOT m.done \
                    OR (jobs.lease_token = m.token AND (jobs.state = 'running') IS TRUE \
                        AND (jobs.target IS NULL \
                             OR jobdeck_lean_cycle_refuses('job ' || jobs.id || ' holds a lock')))) \
             RETURNING jobs.*, m.done \
         ), done_logged AS ( \
             INSERT INTO job_events (job_id, from_state, to_state, actor, detail) \
             SELECT id, 'running', 'succeeded', $3, '' FROM written WHERE done \
         ), claim_logged AS ( \
             INSERT INTO job_events (job_id, from_state, to_state, actor, detail) \
             SELECT c.id, e.from_state, e.to_state, $3, e.detail FROM written c ",
    claim_events!(),
    " AND NOT c.done \
         ), counted AS ( \
             INSERT INTO job_state_deltas (state, n) \
             SELECT d.state, d.n FROM ( \
                 SELECT count(*) FILTER (WHERE done) AS done, \
                        count(*) FILTER (WHERE NOT done AND state = 'running') AS started, \
                        count(*) FILTER (WHERE state = 'leased') AS leased \
                 FROM written \
             ) m ",
    net_counts!(),
    " ) SELECT ",
    job_cols!(),
    " FROM written WHERE NOT done UNION ALL SELECT ",
    brief_cols!("'queued'"),
    " FROM picked WHERE target IS NOT NULL UNION ALL SELECT ",
    brief_cols!("'succeeded'"),
    " FROM written WHERE done"
);

/// Finish the request's successes (all of its finishes must be) and claim
/// into its limit, in one statement and its own commit.
pub(super) async fn cycle(
    conn: &mut PgConnection,
    req: &CycleRequest,
    worker: &str,
) -> Result<Lean> {
    send(conn, STATEMENT, None, req, worker).await
}

/// Send a cycle's statement: this module's, `lock_cycle`'s or the call of
/// `jobdeck_cycle`, which share their parameters: $1 the successes' ids,
/// $2 their lease tokens, $3 the worker, $4 the claim's pipelines, $5 its
/// limit, $6 its lease (ms), $7 to $10 the start specs' columns, and $11
/// the claim's window of candidates for its limit (`window`: the
/// statements that claim jobs with targets). `Refused` when the statement
/// stopped with `JDL01` (migration 0012) before writing anything.
pub(super) async fn send(
    conn: &mut PgConnection,
    statement: &'static str,
    window: Option<&(dyn Fn(i64) -> i64 + Sync)>,
    req: &CycleRequest,
    worker: &str,
) -> Result<Lean> {
    let mut done = successes(&req.finishes);
    // In id order, the order the statements lock them in.
    done.sort_by_key(|l| l.id);
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
    if let Some(window) = window {
        query = query.bind(window(limit));
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
    use crate::job::StalePolicy;
    use crate::store::{Backend, ClaimRequest, LeaseRef, NewJob, Outcome, StartSpec, scratch};

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

    /// One `UPDATE` writes a cycle's successes and its claim (but not on a
    /// session whose count trigger counts): each job's
    /// events follow its moves in id order (no sort puts them there), the
    /// counts match the rows, and the claimed jobs come back in claim
    /// order, though the statement returns its rows unsorted.
    #[tokio::test]
    async fn one_update_finishes_the_successes_and_claims_the_next_jobs() {
        let Some((store, base, schema)) = scratch_store("leanmoves").await else {
            return;
        };
        let enqueue = |priority: i32| {
            let job = NewJob {
                pipeline: "p".into(),
                priority,
                ..NewJob::default()
            };
            let store = store.clone();
            async move { store.enqueue(job, "test").await.unwrap().id }
        };
        let mut first = Vec::new();
        for _ in 0..3 {
            first.push(enqueue(0).await);
        }
        let spec = StartSpec {
            lease: std::time::Duration::from_secs(60),
            on_stale: StalePolicy::Hold,
            backoff: std::time::Duration::ZERO,
        };
        let request = |finishes: Vec<(LeaseRef, Outcome)>, limit| CycleRequest {
            finishes,
            claim: Some(ClaimRequest {
                worker: "w".into(),
                pipelines: vec!["p".into()],
                limit,
                lease: std::time::Duration::from_secs(60),
            }),
            specs: vec![("p".into(), spec)],
        };
        let started = store.cycle(&request(Vec::new(), 3), "w").await.unwrap();
        let ids: Vec<i64> = started.claimed.iter().map(|c| c.job.id).collect();
        assert_eq!(ids, first);
        assert!(started.claimed.iter().all(|c| c.started == Some((1, None))));

        let low = enqueue(0).await;
        let high = enqueue(5).await;
        let done = started
            .claimed
            .iter()
            .map(|c| (c.job.lease_ref().unwrap(), Outcome::Succeeded))
            .collect();
        let next = request(done, 2);
        // On a session whose count trigger counts, the successes alone (no
        // claim) stop it, before anything is written.
        let only_successes = CycleRequest {
            claim: None,
            ..next.clone()
        };
        let mut conn = store.pool().acquire().await.unwrap();
        let answer = cycle(&mut conn, &only_successes, "w").await.unwrap();
        assert!(matches!(answer, Lean::Refused));
        drop(conn);
        assert_eq!(store.get_job(first[0]).await.unwrap().state, State::Running);
        assert_eq!(store.get_job(high).await.unwrap().state, State::Queued);
        let next = store.cycle(&next, "w").await.unwrap();
        assert!(
            next.finished
                .iter()
                .all(|f| matches!(f, Ok(State::Succeeded)))
        );
        let ids: Vec<i64> = next.claimed.iter().map(|c| c.job.id).collect();
        assert_eq!(ids, vec![high, low]);

        for id in first {
            let events = store.job_events(id).await.unwrap();
            let moves: Vec<_> = events.iter().map(|e| (e.from, e.to)).collect();
            assert_eq!(
                moves,
                vec![
                    (None, State::Queued),
                    (Some(State::Queued), State::Leased),
                    (Some(State::Leased), State::Running),
                    (Some(State::Running), State::Succeeded),
                ],
                "job {id}"
            );
        }
        let counts = store.count_by_state().await.unwrap();
        assert_eq!(counts.get(&State::Succeeded), Some(&3));
        assert_eq!(counts.get(&State::Running), Some(&2));
        assert_eq!(counts.get(&State::Queued).copied().unwrap_or(0), 0);
        scratch::drop_pg_schema(&base, &schema).await.unwrap();
    }
}
