#!/usr/bin/env python3
"""How far the engine's cycle statement alone would take issue 6's first
ratio, run by run: reads the full-run tables kept in bench/HISTORY.md (at
concurrency 8, with a lean row) and prints, at each run's medians, jobdeck
over the fastest peer, the lean row (the statement sent by pgbench, no
engine) over the same peer, and jobdeck over the lean row; then their
medians and how many runs an engine at a given fraction of its statement
would have taken over the line.

    bench/statement_ceiling.py                 # bench/HISTORY.md
    bench/statement_ceiling.py FILE.md         # another file of such tables
"""
import re
import statistics
import sys
from pathlib import Path

# The tables are summarize.py's: its row labels (at concurrency 8), its
# peers and its line.
from summarize import FASTEST_PEER_LINE as LINE
from summarize import PEERS as PEER_KEYS
from summarize import ROWS, row_label

LABELS = {key: row_label(label, 8) for key, label, _ in ROWS}
PEERS = [LABELS[key] for key in PEER_KEYS]
JOBDECK = LABELS["jobdeck-postgres"]
LEAN = LABELS["lean-1x8"]


def table_rows(block):
    """process/s by row label, from the first run.sh table in a section."""
    m = re.search(r"```\n(system / backend.*?)```", block, re.S)
    if not m:
        return {}
    rows = {}
    for line in m.group(1).splitlines():
        cells = re.match(r"(.+?)\s{2,}(\S+)\s+([\d,]+)\s", line)
        if cells:
            rows[cells.group(1).strip()] = int(cells.group(3).replace(",", ""))
    return rows


def runs(text):
    """(heading, jobdeck ÷ fastest, lean ÷ fastest, jobdeck ÷ lean) per full run."""
    for section in re.split(r"\n### ", text)[1:]:
        heading = section.split("\n", 1)[0]
        if "bench/run.sh" not in heading or "concurrency 8," not in heading:
            continue
        rows = table_rows(section)
        peers = [rows[p] for p in PEERS if p in rows]
        jobdeck, lean = rows.get(JOBDECK), rows.get(LEAN)
        if jobdeck and lean and peers:
            fastest = max(peers)
            yield heading.split(":")[0], jobdeck / fastest, lean / fastest, jobdeck / lean


def main():
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "HISTORY.md"
    found = list(runs(path.read_text()))
    if not found:
        sys.exit(f"statement_ceiling.py: no full-run table with a lean row in {path}")
    print(f"{'run':44} {'jobdeck/peer':>12} {'lean/peer':>10} {'jobdeck/lean':>13}")
    for name, ours, ceiling, share in found:
        print(f"{name[:44]:44} {ours:11.3f}x {ceiling:9.3f}x {share:12.3f}x")
    columns = list(zip(*[f[1:] for f in found]))
    print(f"\n{len(found)} runs; medians and ranges:")
    for label, values in zip(["jobdeck / fastest peer", "lean / fastest peer", "jobdeck / lean"], columns):
        print(f"  {label:24} {statistics.median(values):.3f}x  ({min(values):.3f}x to {max(values):.3f}x)")
    met = sum(1 for _, ours, _, _ in found if ours >= LINE)
    print(f"\njobdeck at or over {LINE:g}x in {met} of {len(found)}; at a fraction of its statement:")
    for fraction in (0.90, 0.93, 0.95, 0.97, 0.98, 0.985, 0.99, 1.00):
        over = sum(1 for _, _, ceiling, _ in found if ceiling * fraction >= LINE)
        print(f"  {fraction:.3f} of the statement: {over} of {len(found)}")


if __name__ == "__main__":
    main()
