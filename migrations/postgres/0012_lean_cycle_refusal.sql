-- The engine's lean cycle (src/store/postgres/lean_cycle.rs) is one plain
-- statement: it writes successes that hold no lock and claims jobs that
-- need none, and counts its own moves. It stops with this error, before
-- anything is written, when it meets what it leaves to jobdeck_cycle (a
-- success with a target's lock to free) or runs on a session where the
-- count trigger would count its moves a second time; the store then sends
-- the cycle through jobdeck_cycle.
CREATE FUNCTION jobdeck_lean_cycle_refuses(p_why TEXT) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the lean cycle leaves this to jobdeck_cycle: %', p_why
        USING ERRCODE = 'JDL01';
END $$;
