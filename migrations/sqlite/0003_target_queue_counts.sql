-- Queued jobs per target, kept by triggers, for the Locks pane's
-- "waiting" column; and the per-target index without queued jobs.
--
-- With queued jobs in jobs_target_active, a cycle that claims jobs of
-- eight targets and finishes jobs of eight others changed entries in as
-- many index pages, each written to the WAL at every commit: with 100
-- targets the engine wrote 2.5 times the bytes it writes without targets
-- (562 MB against 226 MB for 20,000 jobs), and ran 0.67 times as fast.
-- Without queued jobs the index holds only the few leased, running and
-- stale ones (it answers "has this target a leased or running job?"),
-- and the count of queued jobs behind a lock, which walked that index
-- (as long as the backlog), is one row read here. SQLite has one writer
-- at a time, so one row per target costs no contention.

DROP INDEX jobs_target_active;
CREATE INDEX jobs_target_active ON jobs (target, state)
    WHERE state IN ('leased','running','stale');

CREATE TABLE target_queue (
    target TEXT    PRIMARY KEY,
    queued INTEGER NOT NULL
) WITHOUT ROWID;

INSERT INTO target_queue (target, queued)
SELECT target, COUNT(*) FROM jobs
WHERE state = 'queued' AND target IS NOT NULL
GROUP BY target;

CREATE TRIGGER jobs_target_queue_insert AFTER INSERT ON jobs
WHEN NEW.state = 'queued' AND NEW.target IS NOT NULL
BEGIN
    INSERT INTO target_queue (target, queued) VALUES (NEW.target, 1)
    ON CONFLICT (target) DO UPDATE SET queued = queued + 1;
END;

CREATE TRIGGER jobs_target_queue_leave AFTER UPDATE OF state, target ON jobs
WHEN OLD.state = 'queued' AND OLD.target IS NOT NULL
 AND (NEW.state <> 'queued' OR NEW.target IS NOT OLD.target)
BEGIN
    UPDATE target_queue SET queued = queued - 1 WHERE target = OLD.target;
    DELETE FROM target_queue WHERE target = OLD.target AND queued <= 0;
END;

CREATE TRIGGER jobs_target_queue_enter AFTER UPDATE OF state, target ON jobs
WHEN NEW.state = 'queued' AND NEW.target IS NOT NULL
 AND (OLD.state <> 'queued' OR NEW.target IS NOT OLD.target)
BEGIN
    INSERT INTO target_queue (target, queued) VALUES (NEW.target, 1)
    ON CONFLICT (target) DO UPDATE SET queued = queued + 1;
END;

CREATE TRIGGER jobs_target_queue_delete AFTER DELETE ON jobs
WHEN OLD.state = 'queued' AND OLD.target IS NOT NULL
BEGIN
    UPDATE target_queue SET queued = queued - 1 WHERE target = OLD.target;
    DELETE FROM target_queue WHERE target = OLD.target AND queued <= 0;
END;
