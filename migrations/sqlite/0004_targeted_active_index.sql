-- jobs_target_active answers questions about one target ("has it a
-- leased or running job?", "which of its jobs just started?"), which a job
-- without a target can never match; yet every untargeted job got an entry
-- when it started and lost it when it finished: two index writes per job
-- for nothing (Postgres migration 0005 does the same there).
DROP INDEX jobs_target_active;
CREATE INDEX jobs_target_active ON jobs (target, state)
    WHERE target IS NOT NULL AND state IN ('leased','running','stale');
