-- The cycle counts its moves once, netted, at its end. Since 0009 each of
-- its statements carried its own count as one more CTE: two delta rows for
-- the successes, and for a claim a GROUP BY over the rows it took, so four
-- rows and an aggregate per cycle. In pgbench calling the function as the
-- engine does (two clients, 4 jobs per cycle), the aggregate and the rows
-- were a sixth of a cycle's cost with targets and more without.
--
-- Now the successes are counted from the rows they locked (every locked
-- version is written: no one else holds it), and each claim's rows as the
-- function reads them back to return them; one INSERT at the end writes
-- the difference. A cycle that claims as many jobs as it finishes leaves
-- `running` unchanged, so it writes two rows: succeeded +n and queued -n.
-- Measured against 0010 (alternating pgbench pairs): 1.23x without
-- targets (24 pairs, 6,000 jobs), 1.21x with 100 targets (12 pairs,
-- 4,000 jobs).

CREATE OR REPLACE FUNCTION jobdeck_cycle(
    p_done_ids        BIGINT[],
    p_done_tokens     BIGINT[],
    p_worker          TEXT,
    p_pipelines       TEXT[],
    p_window          BIGINT,
    p_limit           BIGINT,
    p_claim_lease_ms  BIGINT,
    p_spec_pipelines  TEXT[],
    p_spec_lease_ms   BIGINT[],
    p_spec_on_stale   TEXT[],
    p_spec_backoff_ms BIGINT[]
) RETURNS SETOF jobs
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- With array and LIMIT parameters every custom plan looks cheaper than the
-- generic one, so without this the statements were planned at every call
-- (a third of the server's time in the benchmark). The generic plans walk
-- the same indexes (jobs_claim, jobs_pkey, locks_pkey).
SET plan_cache_mode = force_generic_plan
SET jit = off
-- Its statements each touch a few rows by key; a generic plan made while
-- a table was small stays for the connection's life, and a scan of
-- `locks` chosen then (for the lock release's join) read every dead lock
-- version at every cycle once the table had grown (100 targets ran at
-- 0.64x the untargeted rate).
SET enable_seqscan = off
-- The count trigger's WHEN: this function counts its own moves.
SET jobdeck.cycle_counts = 'on'
AS $$
DECLARE
    v_done TID[];
    -- Either claim, read back to return its rows and count them by state.
    v_claim REFCURSOR;
    v_row jobs;
    v_started BIGINT := 0;
    v_leased BIGINT := 0;
BEGIN
    IF cardinality(p_done_ids) > 0 THEN
        -- Renewals lock a worker's rows in id order too: neither can hold
        -- one row while waiting for another the other holds.
        SELECT array_agg(l.ctid) FILTER (WHERE l.state = 'running' AND l.lease_token = l.token)
        INTO v_done FROM (
            SELECT j.ctid, j.state, j.lease_token, t.token
            FROM jobs j JOIN unnest(p_done_ids, p_done_tokens) AS t(id, token) ON t.id = j.id
            WHERE j.id = ANY (p_done_ids)
            ORDER BY j.id
            FOR NO KEY UPDATE OF j
        ) l;
        RETURN QUERY
        WITH done AS (
            UPDATE jobs SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL
            WHERE jobs.ctid = ANY (v_done)
            RETURNING jobs.*
        ), freed AS (
            -- Each lock found by a probe of its key, then written by row
            -- version, as the successes are: a join here is planned on the
            -- estimates of the moment, and hashed every held lock.
            UPDATE locks SET holder_job = NULL, holder_worker = NULL, acquired_at = NULL,
                expires_at = NULL
            WHERE locks.ctid = ANY (ARRAY(
                SELECT (SELECT l.ctid FROM locks l
                        WHERE l.target = done.target AND l.fence = done.lock_fence
                          AND l.holder_job = done.id)
                FROM done WHERE done.target IS NOT NULL))
        ), logged AS (
            INSERT INTO job_events (job_id, from_state, to_state, actor, detail)
            SELECT id, 'running', 'succeeded', p_worker, '' FROM done ORDER BY id
        )
        SELECT * FROM done;
    END IF;

    IF p_limit > 0 AND cardinality(p_pipelines) > 0 THEN
        IF EXISTS (SELECT 1 FROM jobs WHERE state = 'queued' AND target IS NOT NULL) THEN
            -- A new statement: it sees the locks the successes just released.
            -- The candidate window and the target checks are the claim's of
            -- worker.rs (see there why the checks are OFFSET 0 probes).
            OPEN v_claim FOR
            WITH candidates AS (
                SELECT j.id, j.pipeline, j.target, j.priority, j.due_at FROM jobs j
                WHERE j.state = 'queued' AND j.due_at <= now() AND j.pipeline = ANY (p_pipelines)
                  AND (j.target IS NULL OR (
                    NOT EXISTS (SELECT 1 FROM locks l
                                WHERE l.target = j.target AND l.holder_job IS NOT NULL
                                OFFSET 0)
                    AND NOT EXISTS (SELECT 1 FROM jobs o
                                    WHERE o.target = j.target AND o.state = 'leased'
                                    OFFSET 0)))
                ORDER BY j.priority DESC, j.due_at, j.id
                LIMIT p_window
                FOR UPDATE OF j SKIP LOCKED
            ), ranked AS (
                SELECT c.*, row_number() OVER (
                    PARTITION BY c.target ORDER BY c.priority DESC, c.due_at, c.id) AS nth
                FROM candidates c
            ), picked AS (
                SELECT r.id, r.pipeline, r.target FROM ranked r WHERE r.nth = 1 OR r.target IS NULL
                ORDER BY r.priority DESC, r.due_at, r.id LIMIT p_limit
            ), spec AS (
                SELECT * FROM unnest(p_spec_pipelines, p_spec_lease_ms, p_spec_on_stale,
                                     p_spec_backoff_ms) AS s(pipeline, lease_ms, on_stale, backoff_ms)
            ), taken AS (
                -- In target order, as every lock-taking batch: two nodes'
                -- cycles cannot deadlock on each other's locks.
                INSERT INTO locks AS l (target, fence, holder_job, holder_worker, acquired_at, expires_at)
                SELECT p.target, 1, p.id, p_worker, now(), now() + s.lease_ms * interval '1 millisecond'
                FROM picked p JOIN spec s ON s.pipeline = p.pipeline
                WHERE p.target IS NOT NULL
                ORDER BY p.target
                ON CONFLICT (target) DO UPDATE SET fence = l.fence + 1,
                    holder_job = EXCLUDED.holder_job, holder_worker = EXCLUDED.holder_worker,
                    acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
                WHERE l.holder_job IS NULL
                RETURNING l.holder_job AS id, l.fence
            ), plan AS (
                SELECT p.id, t.fence, s.on_stale, s.backoff_ms, s.lease_ms,
                       s.pipeline IS NOT NULL AND (p.target IS NULL OR t.id IS NOT NULL) AS go
                FROM picked p
                LEFT JOIN spec s ON s.pipeline = p.pipeline
                LEFT JOIN taken t ON t.id = p.id
            ), claimed AS (
                UPDATE jobs SET
                    state = CASE WHEN plan.go THEN 'running' ELSE 'leased' END,
                    lease_owner = p_worker,
                    lease_token = nextval('lease_tokens'),
                    lease_expires_at = now() + CASE WHEN plan.go THEN plan.lease_ms
                                                    ELSE p_claim_lease_ms END
                                             * interval '1 millisecond',
                    attempt = jobs.attempt + CASE WHEN plan.go THEN 1 ELSE 0 END,
                    started_at = CASE WHEN plan.go THEN now() ELSE jobs.started_at END,
                    lock_fence = CASE WHEN plan.go THEN plan.fence ELSE jobs.lock_fence END,
                    on_stale = CASE WHEN plan.go THEN plan.on_stale ELSE jobs.on_stale END,
                    backoff_ms = CASE WHEN plan.go THEN plan.backoff_ms ELSE jobs.backoff_ms END
                FROM plan WHERE jobs.id = plan.id
                RETURNING jobs.*
            ), logged AS (
                INSERT INTO job_events (job_id, from_state, to_state, actor, detail)
                SELECT c.id, e.from_state, e.to_state, p_worker, e.detail
                FROM claimed c CROSS JOIN LATERAL (VALUES
                    (1, 'queued', 'leased', ''),
                    (2, 'leased', 'running',
                     'attempt ' || c.attempt || coalesce(', fence ' || c.lock_fence, ''))
                ) AS e(n, from_state, to_state, detail)
                WHERE e.n = 1 OR c.state = 'running'
                ORDER BY c.id, e.n
            )
            SELECT * FROM claimed ORDER BY priority DESC, due_at, id;
        ELSE
            -- No queued job has a target: the lean claim of 0010.
            OPEN v_claim FOR
            WITH claimed AS (
                UPDATE jobs SET
                    state = CASE WHEN s.i IS NULL THEN 'leased' ELSE 'running' END,
                    lease_owner = p_worker,
                    lease_token = nextval('lease_tokens'),
                    lease_expires_at = now() + coalesce(p_spec_lease_ms[s.i], p_claim_lease_ms)
                                             * interval '1 millisecond',
                    attempt = jobs.attempt + CASE WHEN s.i IS NULL THEN 0 ELSE 1 END,
                    started_at = CASE WHEN s.i IS NULL THEN jobs.started_at ELSE now() END,
                    lock_fence = CASE WHEN s.i IS NULL THEN jobs.lock_fence END,
                    on_stale = coalesce(p_spec_on_stale[s.i], jobs.on_stale),
                    backoff_ms = coalesce(p_spec_backoff_ms[s.i], jobs.backoff_ms)
                FROM (SELECT j.id, array_position(p_spec_pipelines, j.pipeline) AS i
                      FROM jobs j
                      WHERE j.id = ANY (ARRAY(
                          SELECT q.id FROM jobs q
                          WHERE q.state = 'queued' AND q.due_at <= now()
                            AND q.pipeline = ANY (p_pipelines) AND q.target IS NULL
                          ORDER BY q.priority DESC, q.due_at, q.id
                          LIMIT p_limit
                          FOR UPDATE OF q SKIP LOCKED))) AS s
                WHERE jobs.id = s.id
                RETURNING jobs.*
            ), logged AS (
                INSERT INTO job_events (job_id, from_state, to_state, actor, detail)
                SELECT c.id, e.from_state, e.to_state, p_worker, e.detail
                FROM claimed c CROSS JOIN LATERAL (VALUES
                    (1, 'queued', 'leased', ''),
                    (2, 'leased', 'running', 'attempt ' || c.attempt)
                ) AS e(n, from_state, to_state, detail)
                WHERE e.n = 1 OR c.state = 'running'
                ORDER BY c.id, e.n
            )
            SELECT * FROM claimed ORDER BY priority DESC, due_at, id;
        END IF;
        -- Either claim's rows are returned and counted by the state each took.
        LOOP
            FETCH v_claim INTO v_row;
            EXIT WHEN NOT FOUND;
            RETURN NEXT v_row;
            IF v_row.state = 'running' THEN
                v_started := v_started + 1;
            ELSE
                v_leased := v_leased + 1;
            END IF;
        END LOOP;
        CLOSE v_claim;
    END IF;

    -- The successes' moves and the claim's, netted.
    IF v_started + v_leased > 0 OR cardinality(v_done) > 0 THEN
        INSERT INTO job_state_deltas (state, n)
        SELECT * FROM (VALUES ('running', v_started - coalesce(cardinality(v_done), 0)),
                              ('succeeded', coalesce(cardinality(v_done), 0)),
                              ('leased', v_leased),
                              ('queued', -v_started - v_leased)) AS d(state, n)
        WHERE d.n <> 0;
    END IF;
    -- As the count triggers do after their statements.
    IF random() < 1.0 / 16 THEN
        PERFORM job_state_fold();
    END IF;
END $$;
