-- The floor: the least work jobdeck's contract asks of Postgres for no-op
-- jobs, with none of its machinery. Run by bench/run.sh through pgbench on
-- jobdeck's own schema (same table, same indexes), BATCH jobs per
-- transaction: each transaction finishes the jobs its client claimed in the
-- one before (running -> succeeded, one event each) and claims BATCH more
-- (queued -> running, two events each: leased, running), in one statement
-- and one commit, as jobdeck's cycle does. Left out, on purpose: the lease
-- token check (fencing), target locks, the state counts (run.sh disables
-- their triggers), the engine process and its round trips. What jobdeck
-- does above this floor is what those cost.
WITH done AS (
    UPDATE jobs SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL
    WHERE state = 'running' AND lease_owner = 'floor-' || :client_id
    RETURNING id
), done_logged AS (
    INSERT INTO job_events (job_id, from_state, to_state, actor, detail)
    SELECT id, 'running', 'succeeded', 'floor', '' FROM done
), picked AS (
    SELECT id FROM jobs
    WHERE state = 'queued' AND due_at <= now() AND pipeline = 'noop'
    ORDER BY priority DESC, due_at, id
    LIMIT BATCH
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE jobs SET state = 'running', lease_owner = 'floor-' || :client_id,
        lease_token = nextval('lease_tokens'), lease_expires_at = now() + interval '30 seconds',
        attempt = attempt + 1, started_at = now()
    FROM picked WHERE jobs.id = picked.id
    RETURNING jobs.id, jobs.attempt
), claim_logged AS (
    INSERT INTO job_events (job_id, from_state, to_state, actor, detail)
    SELECT c.id, e.from_state, e.to_state, 'floor', e.detail
    FROM claimed c CROSS JOIN LATERAL (VALUES
        ('queued', 'leased', ''), ('leased', 'running', 'attempt ' || c.attempt)
    ) AS e(from_state, to_state, detail)
)
SELECT count(*) FROM claimed;
