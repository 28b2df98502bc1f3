-- The engine's lean cycle (src/store/postgres/lean_cycle.rs) is one plain
-- statement: it writes successes that hold no lock and claims jobs that
-- need none. A success with a target has a lock to free, which that
-- statement leaves to jobdeck_cycle: meeting one, it stops with this error,
-- so nothing of the cycle is written, and the store sends the cycle again
-- through jobdeck_cycle.
CREATE FUNCTION jobdeck_lean_cycle_refuses(p_job BIGINT) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'job % holds a target''s lock: the lean cycle leaves it to jobdeck_cycle', p_job
        USING ERRCODE = 'JDL01';
END $$;
