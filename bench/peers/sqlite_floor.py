"""The SQLite floor: the least work jobdeck's contract asks of SQLite for
no-op jobs, with none of its machinery (the counterpart of bench/floor.sql).
On jobdeck's own schema (migrated by the given jobdeck binary, the count
triggers dropped as floor.sql's run disables them), WAL with
synchronous=NORMAL, one connection, each transaction (BEGIN IMMEDIATE)
finishes the batch the one before claimed (running -> succeeded, one event
each) and claims the next (queued -> running, two events each: leased,
running). Left out, on purpose: the lease token check, target locks, the
state counts, the engine and its hand-offs. Prints one JSON line with the
jobs finished per second."""

import argparse
import json
import os
import sqlite3
import subprocess
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--jobdeck", required=True, help="jobdeck binary, to migrate the schema")
ap.add_argument("--jobs", type=int, default=20000)
ap.add_argument("--batch", type=int, default=8)
a = ap.parse_args()

CLAIM = """
UPDATE jobs SET state = 'running', lease_owner = 'floor', lease_token = ?1,
    lease_expires_at = ?2 + 30000, attempt = attempt + 1, started_at = ?2
WHERE id IN (SELECT id FROM jobs WHERE state = 'queued' AND due_at <= ?2 AND pipeline = 'noop'
             ORDER BY priority DESC, due_at, id LIMIT ?3)
RETURNING id, attempt"""
FINISH = """
UPDATE jobs SET state = 'succeeded', finished_at = ?1, lease_expires_at = NULL
WHERE id IN (SELECT value FROM json_each(?2))"""
EVENTS = """
INSERT INTO job_events (job_id, at, from_state, to_state, actor, detail)
SELECT value ->> 0, ?1, value ->> 1, value ->> 2, 'floor', value ->> 3 FROM json_each(?2)"""


def now_ms():
    return int(time.time() * 1000)


with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "floor.db")
    subprocess.run([a.jobdeck, "--db", f"sqlite://{path}", "migrate"], check=True,
                   stdout=subprocess.DEVNULL)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'jobs'").fetchall():
        db.execute(f"DROP TRIGGER {name}")
    t = now_ms()
    db.execute("BEGIN IMMEDIATE")
    db.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?2) "
               "INSERT INTO jobs (pipeline, state, due_at, created_at) "
               "SELECT 'noop', 'queued', ?1, ?1 FROM n", (t, a.jobs))
    db.execute("COMMIT")
    db.execute("ANALYZE")

    running, finished, token = [], 0, 0
    t0 = time.monotonic()
    while True:
        t = now_ms()
        token += 1
        db.execute("BEGIN IMMEDIATE")
        events = []
        if running:
            db.execute(FINISH, (t, json.dumps(running)))
            events += [[i, "running", "succeeded", ""] for i in running]
            finished += len(running)
        claimed = db.execute(CLAIM, (token, t, a.batch)).fetchall()
        for i, attempt in claimed:
            events += [[i, "queued", "leased", ""], [i, "leased", "running", f"attempt {attempt}"]]
        if events:
            db.execute(EVENTS, (t, json.dumps(events)))
        db.execute("COMMIT")
        running = [i for i, _ in claimed]
        if not running:
            break
    s = time.monotonic() - t0
    db.close()

print(json.dumps({"backend": "floor-sqlite", "slots": a.batch, "process_per_s": finished / s,
                  "jobs": finished}))
