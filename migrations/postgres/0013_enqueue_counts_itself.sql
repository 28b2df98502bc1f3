-- A single enqueue counts its own job. Through the statement trigger of
-- migration 0002, the first insert into jobs on a new backend compiled
-- the trigger's PL/pgSQL and planned its statement: 7–9 ms for that
-- first insert against 3–4 ms with the trigger off (psql, a new session
-- each time), and `jobdeck enqueue` is a new process on a new backend
-- every time, so most of its enqueue→start latency was that compile.
-- The enqueue statement (src/store/postgres/enqueue.rs) now sets
-- jobdeck.cycle_counts for its own transaction and writes its delta row
-- in plain SQL; the trigger steps aside when the setting is on, as the
-- update trigger does for the engine's cycles (0009). Every other
-- insert still counts through the trigger.

DROP TRIGGER jobs_count_insert ON jobs;

CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    WHEN (current_setting('jobdeck.cycle_counts', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION jobs_count_inserted();
