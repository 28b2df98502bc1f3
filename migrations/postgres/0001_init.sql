-- jobdeck schema, PostgreSQL. Every lease time comes from the database's now().

CREATE SEQUENCE lease_tokens;

CREATE TABLE jobs (
    id                  BIGSERIAL PRIMARY KEY,
    pipeline            TEXT        NOT NULL,
    target              TEXT,
    args                JSONB       NOT NULL DEFAULT '{}',
    state               TEXT        NOT NULL CHECK (state IN ('queued','leased','running','stale','succeeded','failed','cancelled')),
    priority            INTEGER     NOT NULL DEFAULT 0,
    due_at              TIMESTAMPTZ NOT NULL,
    attempt             INTEGER     NOT NULL DEFAULT 0,
    max_attempts        INTEGER     NOT NULL DEFAULT 3,
    step                INTEGER     NOT NULL DEFAULT 0,
    lease_owner         TEXT,
    lease_token         BIGINT,
    lease_expires_at    TIMESTAMPTZ,
    lock_fence          BIGINT,
    unique_key          TEXT,
    cancel_requested_at TIMESTAMPTZ,
    last_error          TEXT,
    on_stale            TEXT        NOT NULL DEFAULT 'hold',
    backoff_ms          BIGINT      NOT NULL DEFAULT 5000,
    schedule_id         BIGINT,
    fire_at             TIMESTAMPTZ,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at          TIMESTAMPTZ,
    finished_at         TIMESTAMPTZ
);

CREATE INDEX jobs_claim ON jobs (priority DESC, due_at, id) WHERE state = 'queued';
CREATE INDEX jobs_state ON jobs (state, id);
CREATE INDEX jobs_target_active ON jobs (target, state) WHERE state IN ('queued','leased','running','stale');
CREATE INDEX jobs_lease_expiry ON jobs (lease_expires_at) WHERE state IN ('leased','running');
-- Most recently finished first (the console's view, in list_jobs' exact
-- order so the LIMIT stops early), and the ranges of pruning and the
-- throughput histogram.
CREATE INDEX jobs_finished ON jobs (finished_at DESC NULLS LAST, id DESC);
CREATE UNIQUE INDEX jobs_unique_key ON jobs (unique_key) WHERE unique_key IS NOT NULL AND state IN ('queued','leased','running','stale');
CREATE UNIQUE INDEX jobs_schedule_slot ON jobs (schedule_id, fire_at) WHERE schedule_id IS NOT NULL;
CREATE INDEX jobs_schedule_active ON jobs (schedule_id) WHERE schedule_id IS NOT NULL AND state IN ('queued','leased','running','stale');

CREATE TABLE locks (
    target        TEXT PRIMARY KEY,
    fence         BIGINT NOT NULL DEFAULT 0,
    holder_job    BIGINT,
    holder_worker TEXT,
    acquired_at   TIMESTAMPTZ,
    expires_at    TIMESTAMPTZ
);
CREATE INDEX locks_held ON locks (holder_job) WHERE holder_job IS NOT NULL;

CREATE TABLE workers (
    id           TEXT PRIMARY KEY,
    host         TEXT        NOT NULL,
    pid          BIGINT      NOT NULL,
    slots        INTEGER     NOT NULL,
    busy         INTEGER     NOT NULL DEFAULT 0,
    paused       BOOLEAN     NOT NULL DEFAULT false,
    pipelines    JSONB       NOT NULL DEFAULT '[]',
    started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    gone         BOOLEAN     NOT NULL DEFAULT false
);

CREATE TABLE job_events (
    id         BIGSERIAL PRIMARY KEY,
    job_id     BIGINT      NOT NULL,
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    from_state TEXT,
    to_state   TEXT        NOT NULL,
    actor      TEXT        NOT NULL,
    detail     TEXT        NOT NULL DEFAULT ''
);
CREATE INDEX job_events_job ON job_events (job_id, id);

CREATE TABLE job_output (
    job_id     BIGINT PRIMARY KEY,
    tail       TEXT        NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE schedules (
    id            BIGSERIAL PRIMARY KEY,
    name          TEXT    NOT NULL UNIQUE,
    pipeline      TEXT    NOT NULL,
    target        TEXT,
    args          JSONB   NOT NULL DEFAULT '{}',
    cron          TEXT    NOT NULL,
    timezone      TEXT    NOT NULL DEFAULT 'UTC',
    overlap_queue BOOLEAN NOT NULL DEFAULT false,
    enabled       BOOLEAN NOT NULL DEFAULT true,
    -- The pipeline's max_attempts, stamped on each fired job (NULL = default).
    max_attempts  INTEGER,
    paused        BOOLEAN NOT NULL DEFAULT false,
    next_fire_at  TIMESTAMPTZ,
    last_fire_at  TIMESTAMPTZ,
    last_job_id   BIGINT,
    last_skip_at  TIMESTAMPTZ
);

CREATE TABLE checkpoints (
    pipeline   TEXT        NOT NULL,
    target     TEXT        NOT NULL,
    key        TEXT        NOT NULL,
    value      TEXT        NOT NULL,
    job_id     BIGINT      NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, target, key)
);
