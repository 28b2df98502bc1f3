#!/usr/bin/env python3
"""The counts BENCHMARKS.md quotes under its table of every full run
("Every full run since session 22"), read off that table so that they are
recomputed, not carried by hand from one session to the next: the ratio to
the fastest peer (median, range, runs and passes at the line), the five
passes after a run, and the 100-target and SQLite targets.

    bench/full_runs.py                 # BENCHMARKS.md
    bench/full_runs.py FILE.md         # another file with such a table

A pass counts at the line only as written: the table keeps a pass just
under it to three places (1.997) so that it does not round up to 2.00.
"""
import re
import statistics
import sys
from pathlib import Path

from summarize import FASTEST_PEER_LINE as LINE

HEADING = "### Every full run since session 22"
TARGET_OWN = 0.7  # 100 targets ÷ own, on either backend
SQLITE_JOBS = 10_000

FIRST_NUMBER = re.compile(r"([\d,]+(?:\.\d+)?)")
BRACKETS = re.compile(r"\(([^)]*)\)")


def number(cell):
    return float(FIRST_NUMBER.search(cell).group(1).replace(",", ""))


def table(text):
    """The table's rows as lists of cells, from the heading to the first
    line that is not a row."""
    start = text.find(HEADING)
    if start < 0:
        return []
    rows = []
    for line in text[start:].splitlines():
        if re.match(r"\| \d+, [0-9a-f]+ \|", line):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows:
            break
    return rows


def main():
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
    rows = table(path.read_text())
    if not rows:
        sys.exit(f"full_runs.py: no table under {HEADING!r} in {path}")
    ratios, passes, five, postgres_own, sqlite_jobs, sqlite_own = [], [], [], [], [], []
    for session, _cpu, ratio, after, targets, sqlite in rows:
        ratios.append(number(ratio))
        inside = BRACKETS.search(ratio)
        if inside:
            passes += [float(p) for p in inside.group(1).split(",")]
        if FIRST_NUMBER.search(after):
            five.append(number(after))
        postgres_own.append(number(targets))
        sqlite_jobs.append(number(sqlite))
        sqlite_own.append(float(BRACKETS.search(sqlite).group(1).rstrip("×")))

    def at_line(values, line):
        return sum(1 for v in values if v >= line)

    n = len(rows)
    print(f"{n} full runs")
    print(
        f"  ÷ fastest peer: median {statistics.median(ratios):.3f}x "
        f"({min(ratios):.2f}x to {max(ratios):.2f}x); at {LINE:g}x or more in "
        f"{at_line(ratios, LINE)} runs and {at_line(passes, LINE)} of {len(passes)} passes"
    )
    print(
        f"  five passes after a run: {len(five)} sessions, {at_line(five, LINE)} at "
        f"{LINE:g}x or more ({min(five):.2f}x to {max(five):.2f}x)"
    )
    print(
        f"  100 targets ÷ own, Postgres: median {statistics.median(postgres_own):.2f}x, "
        f"{at_line(postgres_own, TARGET_OWN)} of {n} at {TARGET_OWN:g}x or more"
    )
    print(
        f"  100 targets ÷ own, SQLite: median {statistics.median(sqlite_own):.2f}x, "
        f"{at_line(sqlite_own, TARGET_OWN)} of {n} at {TARGET_OWN:g}x or more"
    )
    print(f"  SQLite: {at_line(sqlite_jobs, SQLITE_JOBS)} of {n} at {SQLITE_JOBS:,} jobs/s or more")


main()
