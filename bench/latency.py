"""Cross-process enqueue→start latency against a running `jobdeck worker`
(driven by bench/latency.sh, which starts and stops the worker).

  latency.py run ...     enqueue jobs one at a time from this process, wait
                         until the worker has run them all, print percentiles
  latency.py median ...  medians over runs of the JSON lines `run` printed

Every latency comes from the database's own timestamps, never from this
process's clock, so how long a producer takes to start does not count:

- `from_begin`: jobs.started_at - jobs.created_at. Both are now(): on
  Postgres the *transaction start* time of the enqueue and of the worker's
  start transaction; on SQLite the writing process's clock, in whole
  milliseconds, read just after BEGIN IMMEDIATE got the write lock.
- `from_commit` (Postgres, psql producer only): jobs.started_at - the
  database's clock_timestamp() read in the statement that follows the
  enqueue's COMMIT, i.e. once the commit was acknowledged: one round trip
  after the commit became visible and the NOTIFY was sent, later if psql
  was descheduled meanwhile, so this is a lower bound. It is the "commit of
  the insert → start" the latency target means.
  `from_before_commit` reads the clock in the last statement before COMMIT
  instead: an upper bound that adds the commit itself (its WAL flush).

Python 3 standard library only.
"""

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from datetime import datetime

PIPELINE = "lat"
ACTOR = "bench-latency"


def pct(xs, p):
    """Same rank rule as `jobdeck bench` (round((n-1)·p)), so the figures compare."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[round((len(xs) - 1) * p)]


def summary(xs):
    if not xs:
        return None
    return {
        "p50": pct(xs, 0.50),
        "p95": pct(xs, 0.95),
        "p99": pct(xs, 0.99),
        "min": min(xs),
        "max": max(xs),
        "mean": statistics.fmean(xs),
    }


def epoch(iso):
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class Jobdeck:
    def __init__(self, a):
        self.base = [a.jobdeck, "--db", a.db, "--config", a.config]

    def json(self, *args):
        try:
            out = subprocess.run(
                self.base + list(args) + ["--json"], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SystemExit(f"latency.py: jobdeck {' '.join(args)}: {e}")
        if out.returncode != 0:
            raise SystemExit(f"latency.py: jobdeck {' '.join(args)}: {out.stderr.strip()}")
        return json.loads(out.stdout)


def gap(a):
    time.sleep(random.uniform(a.gap_min_ms, a.gap_max_ms) / 1000.0)


def produce_cli(a, jd):
    """One `jobdeck enqueue` process per job: the real producer code path.
    Also times each process from its spawn to its exit, as a script that
    calls it waits for it (the producer's clock; not part of the latency)."""
    ids, command_ms = [], []
    for _ in range(a.jobs):
        spawned = time.perf_counter()
        ids.append(jd.json("enqueue", PIPELINE)["id"])
        command_ms.append((time.perf_counter() - spawned) * 1000.0)
        gap(a)
    return ids, ({}, {}), command_ms


# The statements of PgStore::enqueue_job (src/store/postgres/enqueue.rs):
# the job row, its 'enqueued' event, its state count (the count trigger
# steps aside) and the NOTIFY, committed together, in one round trip
# instead of three; then the clock once the commit is back.
PSQL_JOB = f"""BEGIN;
WITH c AS MATERIALIZED (SELECT set_config('jobdeck.cycle_counts', 'on', true)),
     j AS (INSERT INTO jobs (pipeline, state, priority, due_at, max_attempts)
           SELECT '{PIPELINE}', 'queued', 0, now(), 3 FROM c RETURNING id),
     e AS (INSERT INTO job_events (job_id, from_state, to_state, actor, detail)
           SELECT id, NULL, 'queued', '{ACTOR}', 'enqueued' FROM j),
     n AS (INSERT INTO job_state_deltas (state, n)
           SELECT 'queued', count(*) FROM j HAVING count(*) > 0)
SELECT 'job', id, extract(epoch FROM clock_timestamp()), pg_notify('jobdeck_jobs', '{PIPELINE}') FROM j;
COMMIT;
SELECT 'committed', extract(epoch FROM clock_timestamp());
"""


def produce_psql(a):
    """One long-lived psql session: no process start or exit next to the
    commit, and the commit time read on the database clock."""
    try:
        p = subprocess.Popen(
            ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", a.db],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
    except OSError as e:
        raise SystemExit(f"latency.py: cannot run psql: {e}")
    ids, committed, before = [], {}, {}
    try:
        for _ in range(a.jobs):
            p.stdin.write(PSQL_JOB)
            p.stdin.flush()
            job = p.stdout.readline().strip().split("|")
            done = p.stdout.readline().strip().split("|")
            if len(job) < 3 or job[0] != "job" or len(done) != 2 or done[0] != "committed":
                raise SystemExit(f"latency.py: psql producer answered {job!r} {done!r}")
            ids.append(int(job[1]))
            committed[int(job[1])] = float(done[1])
            before[int(job[1])] = float(job[2])
            gap(a)
    finally:
        p.stdin.close()
        p.wait(timeout=10)
    return ids, (committed, before)


def wait_done(a, jd, n):
    deadline = time.monotonic() + a.timeout
    while True:
        s = jd.json("stats")
        if s.get("failed", 0) or s.get("cancelled", 0) or s.get("stale", 0):
            raise SystemExit(f"latency.py: some jobs did not succeed: {s}")
        if s.get("succeeded", 0) >= n:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"latency.py: only {s.get('succeeded', 0)}/{n} jobs done after {a.timeout}s")
        time.sleep(0.2)


def run(a):
    jd = Jobdeck(a)
    load = open("/proc/loadavg").read().split()[:3]
    command_ms = []
    if a.producer == "psql":
        ids, (committed, before) = produce_psql(a)
    else:
        ids, (committed, before), command_ms = produce_cli(a, jd)
    wait_done(a, jd, len(ids))
    rows = {j["id"]: j for j in jd.json("jobs", "--state", "succeeded", "--limit", str(len(ids) * 2))}
    begin, commit, precommit, tx = [], [], [], []
    for i in ids:
        j = rows.get(i)
        if j is None or not j.get("started_at"):
            raise SystemExit(f"latency.py: job {i} has no start time")
        started, created = epoch(j["started_at"]), epoch(j["created_at"])
        begin.append((started - created) * 1000.0)
        if i in committed:
            commit.append((started - committed[i]) * 1000.0)
            precommit.append((started - before[i]) * 1000.0)
            tx.append((committed[i] - created) * 1000.0)
    headline = commit if commit else begin
    result = {
        "bench": "latency",
        "backend": a.backend,
        "producer": a.producer,
        "jobs": len(ids),
        "slots": a.slots,
        "poll_ms": a.poll_ms,
        "gap_ms": [a.gap_min_ms, a.gap_max_ms],
        "measured": "from_commit" if commit else "from_begin",
        "latency_ms": summary(headline),
        "from_begin_ms": summary(begin),
        "from_commit_ms": summary(commit),
        "from_before_commit_ms": summary(precommit),
        "enqueue_tx_ms": summary(tx),
        "command_ms": summary(command_ms),
        "load_before": [float(x) for x in load],
    }
    print(human(result), file=sys.stderr if a.json else sys.stdout)
    if a.json:
        print(json.dumps(result))
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(result) + "\n")


def fmt(s, key):
    return "-" if s is None or s.get(key) is None else f"{s[key]:.2f}"


def human(r):
    lat = r["latency_ms"]
    line = (
        f"{r['backend']:<8} producer {r['producer']:<4} poll {r['poll_ms']:>4} ms  "
        f"enqueue→start ({r['measured'].replace('_', ' ')}) "
        f"p50 {fmt(lat, 'p50')}  p95 {fmt(lat, 'p95')}  p99 {fmt(lat, 'p99')}  max {fmt(lat, 'max')} ms"
    )
    if r.get("from_commit_ms"):
        b = r["from_begin_ms"]
        c = r["from_before_commit_ms"]
        line += (
            f"  (from before COMMIT: p50 {fmt(c, 'p50')} p99 {fmt(c, 'p99')};"
            f" from BEGIN: p50 {fmt(b, 'p50')} p99 {fmt(b, 'p99')})"
        )
    if r.get("command_ms"):
        c = r["command_ms"]
        line += f"  (each `jobdeck enqueue` spawn→exit: p50 {fmt(c, 'p50')} p99 {fmt(c, 'p99')} ms)"
    return line


def median(a):
    groups = {}
    for path in a.files:
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    r = json.loads(line)
                    groups.setdefault((r["backend"], r["producer"], r["poll_ms"]), []).append(r)
    for (backend, producer, poll), rs in groups.items():
        out = dict(rs[0], runs=len(rs), load_before=None)
        for key in ("latency_ms", "from_begin_ms", "from_commit_ms", "from_before_commit_ms", "enqueue_tx_ms", "command_ms"):
            if rs[0].get(key):
                out[key] = {k: statistics.median(r[key][k] for r in rs) for k in rs[0][key]}
        out["per_run_p50_p99"] = [[r["latency_ms"]["p50"], r["latency_ms"]["p99"]] for r in rs]
        print(f"median of {len(rs)}: " + human(out), file=sys.stderr if a.json else sys.stdout)
        if a.json:
            print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--backend", choices=["postgres", "sqlite"], required=True)
    r.add_argument("--producer", choices=["cli", "psql"], default="cli")
    r.add_argument("--jobdeck", required=True)
    r.add_argument("--db", required=True)
    r.add_argument("--config", required=True)
    r.add_argument("--jobs", type=int, default=200)
    r.add_argument("--gap-min-ms", type=float, default=20)
    r.add_argument("--gap-max-ms", type=float, default=50)
    r.add_argument("--poll-ms", type=int, required=True)
    r.add_argument("--slots", type=int, default=8)
    r.add_argument("--timeout", type=float, default=120)
    r.add_argument("--json", action="store_true")
    r.add_argument("--out", help="also append the JSON line to this file")
    m = sub.add_parser("median")
    m.add_argument("files", nargs="+")
    m.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.cmd == "run":
        if a.producer == "psql" and a.backend != "postgres":
            ap.error("the psql producer is for Postgres")
        if a.jobs < 1 or a.gap_min_ms < 0 or a.gap_max_ms < a.gap_min_ms:
            ap.error("need --jobs ≥ 1 and 0 ≤ --gap-min-ms ≤ --gap-max-ms")
        run(a)
    else:
        median(a)


if __name__ == "__main__":
    main()
