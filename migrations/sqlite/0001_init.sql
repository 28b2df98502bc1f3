-- jobdeck schema, SQLite. Times are integer milliseconds since the Unix epoch.

CREATE TABLE jobs (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline            TEXT    NOT NULL,
    target              TEXT,
    args                TEXT    NOT NULL DEFAULT '{}',
    state               TEXT    NOT NULL CHECK (state IN ('queued','leased','running','stale','succeeded','failed','cancelled')),
    priority            INTEGER NOT NULL DEFAULT 0,
    due_at              INTEGER NOT NULL,
    attempt             INTEGER NOT NULL DEFAULT 0,
    max_attempts        INTEGER NOT NULL DEFAULT 3,
    step                INTEGER NOT NULL DEFAULT 0,
    lease_owner         TEXT,
    lease_token         INTEGER,
    lease_expires_at    INTEGER,
    lock_fence          INTEGER,
    unique_key          TEXT,
    cancel_requested_at INTEGER,
    last_error          TEXT,
    on_stale            TEXT    NOT NULL DEFAULT 'hold',
    backoff_ms          INTEGER NOT NULL DEFAULT 5000,
    schedule_id         INTEGER,
    fire_at             INTEGER,
    created_at          INTEGER NOT NULL,
    started_at          INTEGER,
    finished_at         INTEGER
);

-- The claim walks queued jobs in claim order.
CREATE INDEX jobs_claim ON jobs (priority DESC, due_at, id) WHERE state = 'queued';
-- Per-state counts and listings.
CREATE INDEX jobs_state ON jobs (state, id);
-- "Has this target a leased/running/stale job?" and "who waits for it?"
CREATE INDEX jobs_target_active ON jobs (target, state) WHERE state IN ('queued','leased','running','stale');
-- The reaper's scan for expired leases.
CREATE INDEX jobs_lease_expiry ON jobs (lease_expires_at) WHERE state IN ('leased','running');
-- Recently finished, and pruning.
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
-- A unique key is taken while its job is unfinished.
CREATE UNIQUE INDEX jobs_unique_key ON jobs (unique_key) WHERE unique_key IS NOT NULL AND state IN ('queued','leased','running','stale');
-- A schedule fires each slot at most once.
CREATE UNIQUE INDEX jobs_schedule_slot ON jobs (schedule_id, fire_at) WHERE schedule_id IS NOT NULL;
CREATE INDEX jobs_schedule_active ON jobs (schedule_id) WHERE schedule_id IS NOT NULL AND state IN ('queued','leased','running','stale');

-- One row per target ever locked; holder_job NULL = free. The fence survives
-- release so it only ever grows.
CREATE TABLE locks (
    target        TEXT PRIMARY KEY,
    fence         INTEGER NOT NULL DEFAULT 0,
    holder_job    INTEGER,
    holder_worker TEXT,
    acquired_at   INTEGER,
    expires_at    INTEGER
);
CREATE INDEX locks_held ON locks (holder_job) WHERE holder_job IS NOT NULL;

CREATE TABLE workers (
    id           TEXT PRIMARY KEY,
    host         TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    slots        INTEGER NOT NULL,
    busy         INTEGER NOT NULL DEFAULT 0,
    paused       INTEGER NOT NULL DEFAULT 0,
    pipelines    TEXT    NOT NULL DEFAULT '[]',
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    gone         INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE job_events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     INTEGER NOT NULL,
    at         INTEGER NOT NULL,
    from_state TEXT,
    to_state   TEXT    NOT NULL,
    actor      TEXT    NOT NULL,
    detail     TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX job_events_job ON job_events (job_id, id);

-- The last lines of a job's output, for every console.
CREATE TABLE job_output (
    job_id     INTEGER PRIMARY KEY,
    tail       TEXT    NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE schedules (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT    NOT NULL UNIQUE,
    pipeline      TEXT    NOT NULL,
    target        TEXT,
    args          TEXT    NOT NULL DEFAULT '{}',
    cron          TEXT    NOT NULL,
    timezone      TEXT    NOT NULL DEFAULT 'UTC',
    overlap_queue INTEGER NOT NULL DEFAULT 0,
    enabled       INTEGER NOT NULL DEFAULT 1,
    -- The pipeline's max_attempts stamped on each fired job; NULL = default.
    max_attempts  INTEGER,
    paused        INTEGER NOT NULL DEFAULT 0,
    next_fire_at  INTEGER,
    last_fire_at  INTEGER,
    last_job_id   INTEGER,
    last_skip_at  INTEGER
);

-- Values a step printed as `::jobdeck checkpoint KEY=VALUE`, per
-- (pipeline, target); target '' for jobs without one.
CREATE TABLE checkpoints (
    pipeline   TEXT    NOT NULL,
    target     TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    value      TEXT    NOT NULL,
    job_id     INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (pipeline, target, key)
);
