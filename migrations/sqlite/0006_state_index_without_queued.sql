-- jobs_state without queued jobs. A queued job's entry was written at its
-- enqueue and deleted at its claim, two index writes per job that no hot
-- path read: the claim and the Queued pane walk jobs_claim, the counts are
-- kept in job_state_counts. Without them the engine ran 1.07 times as fast
-- in alternating runs (BENCHMARKS.md, session 10).
--
-- SQLite uses a partial index only for a query whose WHERE repeats the
-- index's condition, so the statements that find jobs by state say
-- `state <> 'queued'` (or the condition of another index) as well.
DROP INDEX jobs_state;
CREATE INDEX jobs_state ON jobs (state, id) WHERE state <> 'queued';
