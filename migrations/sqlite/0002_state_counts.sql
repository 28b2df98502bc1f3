-- Jobs per state, kept by triggers, for the console's header and
-- `jobdeck stats`: COUNT(*) … GROUP BY state walked the whole state index,
-- about 0.1 s per refresh at a million jobs. SQLite has one writer at a
-- time, so one row per state costs no contention.

CREATE TABLE job_state_counts (
    state TEXT    PRIMARY KEY,
    n     INTEGER NOT NULL
) WITHOUT ROWID;

INSERT INTO job_state_counts (state, n)
SELECT s.state, (SELECT COUNT(*) FROM jobs j WHERE j.state = s.state)
FROM (SELECT 'queued' AS state UNION ALL SELECT 'leased' UNION ALL SELECT 'running'
      UNION ALL SELECT 'stale' UNION ALL SELECT 'succeeded' UNION ALL SELECT 'failed'
      UNION ALL SELECT 'cancelled') s;

CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs
BEGIN
    UPDATE job_state_counts SET n = n + 1 WHERE state = NEW.state;
END;

CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs
BEGIN
    UPDATE job_state_counts SET n = n - 1 WHERE state = OLD.state;
END;

CREATE TRIGGER jobs_count_update AFTER UPDATE OF state ON jobs
WHEN OLD.state <> NEW.state
BEGIN
    UPDATE job_state_counts SET n = n - 1 WHERE state = OLD.state;
    UPDATE job_state_counts SET n = n + 1 WHERE state = NEW.state;
END;
