-- Jobs per state for the console's header and `jobdeck stats`:
-- count(*) … GROUP BY state read every row, about 0.2 s per refresh at a
-- million jobs. One counter row per state would make every claim, start
-- and finish in the cluster queue behind each other's commits (and could
-- deadlock), so writers only append deltas, one row per state a statement
-- changed; the count is their sum. About one statement in 16 also folds
-- the rows no one else is folding into one row per state (SKIP LOCKED: it
-- never waits), which keeps the table a few hundred rows long.

CREATE TABLE job_state_deltas (
    id    BIGSERIAL PRIMARY KEY,
    state TEXT   NOT NULL,
    n     BIGINT NOT NULL
);

-- The starting counts must not miss a job written meanwhile.
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO job_state_deltas (state, n)
SELECT state, count(*) FROM jobs GROUP BY state;

-- The functions run with the search path they were created under, so a
-- session with another path still counts into this schema's table.
CREATE FUNCTION job_state_fold() RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    WITH gone AS (
        DELETE FROM job_state_deltas d
        WHERE d.id IN (SELECT id FROM job_state_deltas FOR UPDATE SKIP LOCKED)
        RETURNING d.state, d.n
    )
    INSERT INTO job_state_deltas (state, n)
    SELECT state, sum(n) FROM gone GROUP BY state HAVING sum(n) <> 0;
$$;

CREATE FUNCTION jobs_count_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO job_state_deltas (state, n)
    SELECT state, count(*) FROM new_rows GROUP BY state;
    IF random() < 1.0 / 16 THEN
        PERFORM job_state_fold();
    END IF;
    RETURN NULL;
END $$;

-- Fires for every UPDATE of jobs (a transition table cannot go with a
-- column list); updates that change no state append nothing.
CREATE FUNCTION jobs_count_updated() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO job_state_deltas (state, n)
    SELECT state, sum(d) FROM (
        SELECT state, 1 AS d FROM new_rows
        UNION ALL
        SELECT state, -1 FROM old_rows
    ) moved
    GROUP BY state HAVING sum(d) <> 0;
    IF random() < 1.0 / 16 THEN
        PERFORM job_state_fold();
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION jobs_count_deleted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO job_state_deltas (state, n)
    SELECT state, -count(*) FROM old_rows GROUP BY state;
    RETURN NULL;
END $$;

CREATE FUNCTION jobs_count_truncated() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM job_state_deltas;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_inserted();

CREATE TRIGGER jobs_count_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_updated();

CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_deleted();

CREATE TRIGGER jobs_count_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_truncated();
