-- Targets and states compared byte by byte. Every claim of a queue with
-- targets probes `locks_pkey` and `jobs_target_active` once per
-- candidate, and each probe's descent compares text at every level:
-- under the database's collation each comparison went through strcoll
-- (on a C.UTF-8 database too; only "C" and "POSIX" take Postgres's
-- memcmp path), about 700 comparisons per cycle of 8 jobs. jobdeck asks
-- these columns for equality and for one order of targets (the order in
-- which every statement takes locks, and the Locks pane's), which byte
-- order gives as well as any; on a C.UTF-8 database it is the same order.

-- The trigger names `state` (its WHEN and its column list), which keeps
-- the column's type from changing under it.
DROP TRIGGER jobs_count_update ON jobs;

ALTER TABLE jobs
    ALTER COLUMN state TYPE TEXT COLLATE "C",
    ALTER COLUMN target TYPE TEXT COLLATE "C";
ALTER TABLE locks ALTER COLUMN target TYPE TEXT COLLATE "C";

CREATE TRIGGER jobs_count_update AFTER UPDATE OF state ON jobs
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          AND current_setting('jobdeck.cycle_counts', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION jobs_count_row_updated();
