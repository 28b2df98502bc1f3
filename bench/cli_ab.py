#!/usr/bin/env python3
"""One-shot commands of two jobdeck builds against each other: the time a
script waits for `jobdeck enqueue`, `stats` and `jobs`, from spawn to exit,
on Postgres and SQLite, with no worker running. A and B alternate call by
call so that a machine whose speed drifts weighs on both alike; prints the
median per build and command and the median of the per-pair ratios B ÷ A.

  bench/cli_ab.py /tmp/jobdeck-before target/release/jobdeck
  bench/cli_ab.py --calls 200 --backend postgres A B

Postgres: a database bench_cli on PGHOST/PGPORT/PGUSER (default
127.0.0.1 5432 postgres, trust auth), created and dropped; SQLite: a temp
file. Both are migrated by A first, so every timed call finds the schema
current.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONFIG = '[[pipeline]]\nname = "p"\n[[pipeline.step]]\nname = "s"\nbuiltin = "noop"\n'


def psql(sql):
    subprocess.run(
        ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-d", "postgres", "-c", sql],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def timed(cmd):
    start = time.perf_counter()
    out = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = (time.perf_counter() - start) * 1000.0
    if out.returncode != 0:
        sys.exit(f"cli_ab.py: {' '.join(cmd)}: {out.stderr.strip()}")
    return took


def compare(a, b, url, config, calls):
    subprocess.run([a, "--db", url, "migrate"], check=True, stdout=subprocess.DEVNULL)
    for command in (["enqueue", "p"], ["stats"], ["jobs", "--limit", "10"]):
        times = {a: [], b: []}
        for _ in range(calls):
            for binary in (a, b):
                times[binary].append(timed([binary, "--db", url, "--config", config] + command))
        ratios = [tb / ta for ta, tb in zip(times[a], times[b])]
        kind = url.split(":", 1)[0]
        print(
            f"{kind:<8} {command[0]:<8} A p50 {statistics.median(times[a]):6.1f} ms   "
            f"B p50 {statistics.median(times[b]):6.1f} ms   "
            f"B ÷ A {statistics.median(ratios):.2f} (median of {calls} pairs; "
            f"B faster in {sum(r < 1 for r in ratios)})"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--calls", type=int, default=100, help="pairs per command and backend (100)")
    ap.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both")
    args = ap.parse_args()
    os.environ.setdefault("PGHOST", "127.0.0.1")
    os.environ.setdefault("PGPORT", "5432")
    os.environ.setdefault("PGUSER", "postgres")
    a, b = os.path.abspath(args.a), os.path.abspath(args.b)
    with tempfile.TemporaryDirectory() as work:
        config = os.path.join(work, "jobdeck.toml")
        with open(config, "w") as f:
            f.write(CONFIG)
        if args.backend in ("postgres", "both"):
            psql("DROP DATABASE IF EXISTS bench_cli")
            psql("CREATE DATABASE bench_cli")
            try:
                url = f"postgres://{os.environ['PGUSER']}@{os.environ['PGHOST']}:{os.environ['PGPORT']}/bench_cli"
                compare(a, b, url, config, args.calls)
            finally:
                psql("DROP DATABASE IF EXISTS bench_cli")
        if args.backend in ("sqlite", "both"):
            compare(a, b, f"sqlite://{work}/cli.db", config, args.calls)


if __name__ == "__main__":
    main()
