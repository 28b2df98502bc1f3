-- The active-job indexes' conditions as chains of comparisons, as
-- migration 0007 did for the check on `jobs.state`. SQLite tests a partial
-- index's condition at every write of a row it may cover, old row and new,
-- and codes `state IN (<more than two constants>)` there as a temporary
-- b-tree that it opens and fills with the constants at each test: every
-- start and finish of a job with a target built two of them for
-- `jobs_target_active`, and a job with a unique key or a schedule did the
-- same for its index (bench/HISTORY.md, session 24). A condition written
-- as comparisons is a few opcodes.
--
-- A query may use a partial index only when its WHERE implies the index's
-- condition; SQLite proves `state = 'running'` implies the chain below,
-- and a query asking for all the unfinished states spells the same chain
-- (`unfinished_cond!` in src/store/sqlite/rows.rs). The rows, their
-- counts and every other index stay as they are.

DROP INDEX jobs_target_active;
CREATE INDEX jobs_target_active ON jobs (target, state)
    WHERE target IS NOT NULL AND (state = 'leased' OR state = 'running' OR state = 'stale');

DROP INDEX jobs_unique_key;
CREATE UNIQUE INDEX jobs_unique_key ON jobs (unique_key)
    WHERE unique_key IS NOT NULL
      AND (state = 'queued' OR state = 'leased' OR state = 'running' OR state = 'stale');

DROP INDEX jobs_schedule_active;
CREATE INDEX jobs_schedule_active ON jobs (schedule_id)
    WHERE schedule_id IS NOT NULL
      AND (state = 'queued' OR state = 'leased' OR state = 'running' OR state = 'stale');
