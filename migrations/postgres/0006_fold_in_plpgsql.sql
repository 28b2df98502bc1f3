-- The state-count fold (migration 0002) was a SQL-language function, which
-- Postgres parses and plans again at every call: one statement in 16 paid
-- for that, about 5 % of the server's time in the benchmark (perf:
-- fmgr_sql). In PL/pgSQL its statement is planned once per connection.
CREATE OR REPLACE FUNCTION job_state_fold() RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    WITH gone AS (
        DELETE FROM job_state_deltas d
        WHERE d.id IN (SELECT id FROM job_state_deltas FOR UPDATE SKIP LOCKED)
        RETURNING d.state, d.n
    )
    INSERT INTO job_state_deltas (state, n)
    SELECT state, sum(n) FROM gone GROUP BY state HAVING sum(n) <> 0;
END $$;
