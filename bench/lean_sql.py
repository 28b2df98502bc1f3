#!/usr/bin/env python3
"""Print the engine's lean cycle statement (src/store/postgres/lean_cycle.rs)
as a pgbench script for bench/lean.sh: its Rust string literals joined, the
engine's parameters replaced by pgbench variables and constants, and the
rows it returns folded into the ids and lease tokens the next call finishes.
With the argument `without-events` the statement writes no job_events rows
(a measurement of what the event log costs, never a mode of jobdeck's); with
`floor` it prints bench/floor.sql instead (the contract's row writes alone,
for the same harness; lean.sh then sets the database up as run.sh's floor
rows do). The floor takes its batch as a second argument and keeps it a
literal, as run.sh's rows do: a `LIMIT` sent as a parameter gets another
plan under the server's default settings, about 0.6× the rate on session
50's machine. Fails loudly when the source no longer has the shape this expects."""
import re
import sys
from pathlib import Path

bench_dir = Path(__file__).resolve().parent
src_dir = bench_dir.parent / "src" / "store" / "postgres"
variant = sys.argv[1] if len(sys.argv) > 1 else ""
if variant == "floor":
    batch = sys.argv[2] if len(sys.argv) > 2 else ""
    if not batch.isdigit() or int(batch) < 1:
        sys.exit("lean_sql.py: usage: lean_sql.py floor BATCH (a positive integer)")
    floor = (bench_dir / "floor.sql").read_text()
    if "LIMIT BATCH" not in floor or "pipeline = 'noop'" not in floor:
        sys.exit("lean_sql.py: floor.sql has changed shape; update this script")
    print(floor.replace("LIMIT BATCH", f"LIMIT {int(batch)}").replace("pipeline = 'noop'", "pipeline = 'bench'"))
    sys.exit(0)
lean = (src_dir / "lean_cycle.rs").read_text()
mod = (src_dir / "mod.rs").read_text()


def literals(block):
    """The concatenation of the Rust string literals in `block`."""
    return "".join(
        re.sub(r"\\\n\s*", " ", m.group(1))
        for m in re.finditer(r'"((?:[^"\\]|\\.)*)"', block, re.S)
    )


def between(text, start, end):
    i = text.index(start)
    return text[i : text.index(end, i)]


macros = {
    "engine_counts!()": literals(between(lean, "macro_rules! engine_counts", "pub(super) use engine_counts")),
    "claim_events!()": literals(between(lean, "macro_rules! claim_events", "pub(super) use claim_events")),
    "net_counts!()": literals(between(lean, "macro_rules! net_counts", "pub(super) use net_counts")),
    "job_cols!()": literals(between(mod, "macro_rules! job_cols", "macro_rules! brief_cols")),
}
# brief_cols!("'state'") puts its argument in the middle of its literals.
brief = re.search(r'macro_rules! brief_cols.*?"((?:[^"\\]|\\.)*)",\s*\$state,\s*"((?:[^"\\]|\\.)*)"',
                  mod, re.S)
if not brief:
    sys.exit("lean_sql.py: brief_cols! in mod.rs has changed shape; update this script")
body = between(lean, "const STATEMENT: &str = concat!(", ");\n")
parts = []
for m in re.finditer(r'"((?:[^"\\]|\\.)*)"|[a-z_]+!\(\)|brief_cols!\("([^"]*)"\)', body, re.S):
    token = m.group(0)
    if token.startswith("brief_cols!"):
        parts.append(literals(f'"{brief.group(1)}"') + m.group(2) + literals(f'"{brief.group(2)}"'))
    elif token in macros:
        parts.append(macros[token])
    else:
        parts.append(re.sub(r"\\\n\s*", " ", m.group(1)))
sql = "".join(parts)
if "$10" not in sql or "SELECT id, pipeline" not in sql:
    sys.exit("lean_sql.py: lean_cycle.rs's statement has changed shape; update this script")
if variant == "without-events":
    logged = re.search(r"done_logged AS \(.*?\), counted AS", sql, re.S)
    if not logged:
        sys.exit("lean_sql.py: the statement's event inserts have changed shape; update this script")
    sql = sql.replace(logged.group(0), "counted AS")
elif variant:
    sys.exit(f"lean_sql.py: unknown variant {variant!r} (known: without-events, floor)")

# The engine reads the rows; pgbench keeps the running jobs' ids and tokens.
i = sql.index(" SELECT id, pipeline")
sql = (
    sql[:i].rstrip()
    + ", r AS ("
    + sql[i:]
    + ") SELECT coalesce(array_agg(id) FILTER (WHERE state = 'running'), '{}') AS ids,"
    + " coalesce(array_agg(lease_token) FILTER (WHERE state = 'running'), '{}') AS toks FROM r"
)
params = {
    "$10": "ARRAY[0]::bigint[]", "$1": ":ids", "$2": ":toks", "$3": "'lean'",
    "$4": "ARRAY['bench']", "$5": ":batch", "$6": "30000", "$7": "ARRAY['bench']",
    "$8": "ARRAY[30000]::bigint[]", "$9": "ARRAY['hold']",
}
for k, v in params.items():  # $10 before $1
    sql = sql.replace(k, v)
print(sql)
print("\\gset")
