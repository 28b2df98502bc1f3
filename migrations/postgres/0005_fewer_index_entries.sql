-- Fewer index entries per job. A job's row is written twice in its life
-- on the engine's path (queued → running, running → succeeded), and each
-- write changes an indexed column, so it is never a HOT update: the new
-- version gets an entry in every index whose predicate it matches. With
-- its three events that was 14 index insertions per job, a sixth of the
-- server's time in the benchmark. Indexes now hold only the rows their
-- queries can ask for, and the events' one index is their key: 8 per job.

-- The claim's and the Locks pane's questions are about one target, and
-- `target = x` never matches a job without one.
DROP INDEX jobs_target_active;
CREATE INDEX jobs_target_active ON jobs (target, state)
    WHERE target IS NOT NULL AND state IN ('queued','leased','running','stale');

-- Only finished jobs have a finish time; the queries over it (the Finished
-- pane, pruning, the throughput histogram) say so.
DROP INDEX jobs_finished;
CREATE INDEX jobs_finished ON jobs (finished_at DESC NULLS LAST, id DESC)
    WHERE finished_at IS NOT NULL;

-- The panes that list one state newest first are the active ones; finished
-- jobs are listed by jobs_finished.
DROP INDEX jobs_state;
CREATE INDEX jobs_state ON jobs (state, id)
    WHERE state IN ('queued','leased','running','stale');

-- Events are only ever read per job, in order: (job_id, id) is the key,
-- and the index on id alone goes.
CREATE UNIQUE INDEX job_events_key ON job_events (job_id, id);
ALTER TABLE job_events DROP CONSTRAINT job_events_pkey;
ALTER TABLE job_events ADD CONSTRAINT job_events_pkey PRIMARY KEY USING INDEX job_events_key;
DROP INDEX job_events_job;
