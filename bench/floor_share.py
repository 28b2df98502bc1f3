#!/usr/bin/env python3
"""How near jobdeck runs to the floor (the contract's row writes alone,
`bench/floor.sql` under pgbench), run by run: reads the full-run tables
kept in bench/HISTORY.md (at concurrency 8, since session 22, with a
floor row) and prints jobdeck over the floor and twice the fastest peer
over the floor, then their medians, ranges and how many runs came within
a given share of the floor. BENCHMARKS.md's Known gaps quotes these.

    bench/floor_share.py                 # bench/HISTORY.md
    bench/floor_share.py FILE.md         # another file of such tables

Shares are counted as written, to two places (0.847 counts as 0.85).
"""
import re
import statistics
import sys
from pathlib import Path

from statement_ceiling import JOBDECK, LABELS, PEERS, table_rows
from summarize import FASTEST_PEER_LINE as LINE

FLOOR = LABELS["floor-1x8"]
FIRST_SESSION = 22  # the first session whose runs the counts cover


def runs(text):
    """(heading, jobdeck ÷ floor, line × fastest peer ÷ floor) per full run."""
    for section in re.split(r"\n### ", text)[1:]:
        heading = section.split("\n", 1)[0]
        if "bench/run.sh" not in heading or "concurrency 8," not in heading:
            continue
        session = re.match(r"Session (\d+)", heading)
        if not session or int(session.group(1)) < FIRST_SESSION:
            continue
        rows = table_rows(section)
        peers = [rows[p] for p in PEERS if p in rows]
        jobdeck, floor = rows.get(JOBDECK), rows.get(FLOOR)
        if jobdeck and floor and peers:
            yield heading.split(":")[0], jobdeck / floor, LINE * max(peers) / floor


def main():
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "HISTORY.md"
    found = list(runs(path.read_text()))
    if not found:
        sys.exit(f"floor_share.py: no full-run table with a floor row in {path}")
    print(f"{'run':44} {'jobdeck/floor':>13} {'line/floor':>11}")
    for name, ours, needed in found:
        print(f"{name[:44]:44} {ours:12.3f}x {needed:10.3f}x")
    print(f"\n{len(found)} runs since session {FIRST_SESSION}; medians and ranges:")
    for label, values in zip(["jobdeck / floor", f"{LINE:g} x fastest peer / floor"], list(zip(*[f[1:] for f in found]))):
        print(f"  {label:28} {statistics.median(values):.3f}x  ({min(values):.3f}x to {max(values):.3f}x)")
    print("\njobdeck at a share of the floor or more (to two places):")
    for share in (0.75, 0.80, 0.85, 0.90, 0.95):
        within = sum(1 for _, ours, _ in found if round(ours, 2) >= share)
        print(f"  {share:.2f} of the floor: {within} of {len(found)}")


if __name__ == "__main__":
    main()
