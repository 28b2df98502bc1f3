#!/usr/bin/env python3
"""VDBE operations per job, statement by statement, of jobdeck's SQLite cycle.

Takes the cycle's query from a jobdeck binary's own sqlx log (a short
`jobdeck bench` with JOBDECK_LOG=sqlx::query=debug), then replays it on a
fresh database migrated by that binary: JOBS queued no-op jobs spread over
TARGETS targets as `jobdeck bench --targets` spreads them, cycles of SLOTS
in which every job claimed by the previous cycle succeeds, until the queue
is empty. A progress handler called at every VDBE operation counts them per
statement. The counts repeat exactly from run to run and do not depend on
the machine, so a change to one statement shows as a number beside the
others; `bench/instructions.sh` then says what it is worth in instructions
and `bench/ab.sh` in time.

The replay uses the SQLite that jobdeck bundles (the libsqlite3-sys version
in Cargo.lock), compiled once from cargo's registry into
~/.cache/jobdeck-bench, so that the planner is the one the binary runs.

  bench/statement_ops.py target/release/jobdeck
  bench/statement_ops.py --targets 0,100 /tmp/jobdeck-before target/release/jobdeck

Options: --jobs N (4000)  --slots N (8)  --targets K,K... (0,100)
Needs gcc and a cargo registry holding libsqlite3-sys (any `cargo build`).
"""

import argparse
import collections
import glob
import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Python's own module needs sqlite3_enable_shared_cache, so the shared cache
# stays in; the other options are .cargo/config.toml's.
FLAGS = [
    "-O2", "-shared", "-fPIC", "-DSQLITE_THREADSAFE=1", "-DSQLITE_ENABLE_STAT4",
    "-DSQLITE_ENABLE_COLUMN_METADATA", "-DSQLITE_ENABLE_LOAD_EXTENSION=1",
    "-DSQLITE_DEFAULT_MEMSTATUS=0", "-DSQLITE_MAX_EXPR_DEPTH=0",
    "-DSQLITE_LIKE_DOESNT_MATCH_BLOBS", "-DSQLITE_USE_ALLOCA",
]


def fail(msg):
    print(f"statement_ops.py: {msg}", file=sys.stderr)
    sys.exit(2)


def bundled_sqlite():
    """The directory of a libsqlite3.so.0 built from the bundled source, and
    that source's SQLite version."""
    lock = open(os.path.join(REPO, "Cargo.lock")).read()
    m = re.search(r'name = "libsqlite3-sys"\nversion = "([^"]+)"', lock)
    if not m:
        fail("no libsqlite3-sys in Cargo.lock")
    crate = m.group(1)
    home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    found = glob.glob(f"{home}/registry/src/*/libsqlite3-sys-{crate}/sqlite3/sqlite3.c")
    if not found:
        fail(f"libsqlite3-sys {crate} is not in {home}/registry: run `cargo build` first")
    src = found[0]
    version = re.search(r'#define SQLITE_VERSION\s+"([^"]+)"', open(src, errors="replace").read())
    version = version.group(1)
    out = os.path.expanduser(f"~/.cache/jobdeck-bench/sqlite-{version}")
    lib = os.path.join(out, "libsqlite3.so.0")
    if not os.path.exists(lib):
        os.makedirs(out, exist_ok=True)
        print(f"[ops] compiling SQLite {version} from {src}", file=sys.stderr)
        subprocess.run(["gcc", *FLAGS, src, "-o", lib + ".tmp", "-lpthread", "-lm", "-ldl"],
                       check=True)
        os.rename(lib + ".tmp", lib)
    return out, version


def cycle_sql(binary):
    """The engine's cycle query, from the binary's sqlx log: the statements
    between `BEGIN IMMEDIATE` and `COMMIT`."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, JOBDECK_LOG="sqlx::query=debug", NO_COLOR="1")
        run = subprocess.run(
            [binary, "bench", "--db", f"sqlite://{d}/b.db", "--jobs", "40", "--targets", "10",
             "--no-latency"], env=env, capture_output=True, text=True)
        if run.returncode != 0:
            fail(f"{binary} bench failed: {run.stderr.strip()[-500:]}")
    log = re.sub(r"\x1b\[[0-9;]*m", "", run.stderr)
    for m in re.finditer(r'db\.statement="((?:[^"\\]|\\.)*)"', log):
        text = json.loads('"' + m.group(1) + '"')
        if "BEGIN IMMEDIATE;" in text and "cand AS" in text and text.rstrip().endswith("COMMIT"):
            stmts = [s.strip() for s in text.split(";\n") if s.strip()]
            return stmts[1:-1]
    fail(f"no cycle query in {binary}'s sqlx log")


def replay(binary, stmts, jobs, slots, targets):
    """Operations per job of each statement over a whole queue."""
    with tempfile.TemporaryDirectory() as d:
        db = os.path.join(d, "r.db")
        subprocess.run([binary, "--db", f"sqlite://{db}", "migrate"], check=True,
                       stdout=subprocess.DEVNULL)
        con = sqlite3.connect(db, isolation_level=None)
        con.execute("PRAGMA journal_mode = WAL")
        con.execute("PRAGMA synchronous = NORMAL")
        now = 1_700_000_000_000
        con.execute("BEGIN")
        con.executemany(
            "INSERT INTO jobs (pipeline, target, args, state, due_at, created_at) "
            "VALUES ('bench', ?, '{}', 'queued', ?, ?)",
            [((f"t{i % targets}" if targets else None), now, now) for i in range(jobs)])
        con.execute("COMMIT")
        highest = [max([int(n) for n in re.findall(r"\?(\d+)", s)] or [0]) for s in stmts]
        claim = next(i for i, s in enumerate(stmts) if "cand AS" in s)
        ops = collections.Counter()
        current = [0]

        def tick():
            ops[current[0]] += 1
            return 0

        con.set_progress_handler(tick, 1)
        finishing, done, cycles = [], 0, 0
        rng = random.Random(1)
        while True:
            now += 1
            params = [now, json.dumps(["bench"]), slots, json.dumps([f[0] for f in finishing]),
                      "w-ops", 60000, json.dumps([["bench", 60000, "hold", 1000]]),
                      json.dumps([str(f[1]) for f in finishing]), rng.getrandbits(62), "w-ops"]
            con.execute("BEGIN IMMEDIATE")
            claimed = []
            for i, s in enumerate(stmts):
                current[0] = i
                cur = con.execute(s, params[:highest[i]])
                rows = cur.fetchall()
                if i == claim:
                    # The claim returns whole jobs; the next cycle finishes
                    # them by id and lease token.
                    names = [c[0] for c in cur.description]
                    at_id, at_token = names.index("id"), names.index("lease_token")
                    claimed = [(r[at_id], r[at_token]) for r in rows]
            current[0] = len(stmts)
            con.execute("COMMIT")
            done += len(finishing)
            cycles += 1
            finishing = claimed
            if not finishing:
                break
        if done != jobs:
            fail(f"the replay finished {done} of {jobs} jobs")
        return [ops[i] / done for i in range(len(stmts))], cycles


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=4000)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--targets", default="0,100")
    p.add_argument("binaries", nargs="+")
    a = p.parse_args()
    try:
        targets = [int(t) for t in a.targets.split(",")]
    except ValueError:
        fail(f"--targets {a.targets}: a comma-separated list of numbers")
    if a.jobs < 1 or a.slots < 1 or any(t < 0 for t in targets):
        fail("--jobs and --slots must be positive, --targets not negative")
    libdir, version = bundled_sqlite()
    if sqlite3.sqlite_version != version:
        if os.environ.get("JOBDECK_OPS_REEXEC"):
            fail(f"Python still loads SQLite {sqlite3.sqlite_version}, not {version}")
        env = dict(os.environ, JOBDECK_OPS_REEXEC="1",
                   LD_LIBRARY_PATH=libdir + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    for binary in a.binaries:
        if not os.access(binary, os.X_OK):
            fail(f"{binary} is not an executable")
        stmts = cycle_sql(binary)
        for t in targets:
            per_stmt, cycles = replay(binary, stmts, a.jobs, a.slots, t)
            print(f"{binary}  targets {t}  ({a.jobs} jobs, {cycles} cycles of up to {a.slots}, "
                  f"SQLite {version}): VDBE operations per job")
            for s, n in zip(stmts, per_stmt):
                print(f"  {n:8.1f}  {' '.join(s.split())[:70]}")
            print(f"  {sum(per_stmt):8.1f}  the cycle")


if __name__ == "__main__":
    main()
