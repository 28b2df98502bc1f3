#!/usr/bin/env bash
# The server side of jobdeck's engine alone: pgbench calls jobdeck_cycle the
# way the engine does (bench/cycle.sql), CLIENTS connections side by side,
# BATCH jobs per call, on a fresh database migrated by jobdeck with JOBS
# queued no-op jobs, spread over TARGETS targets as `jobdeck bench --targets`
# does (0, the default: no targets). Prints jobs/s and the machine's CPU per
# 1,000 jobs (from /proc/stat, every process included).
#
#   bench/cycle.sh 1 8            one client, 8 jobs per call
#   bench/cycle.sh 2 4 20000      two clients, 4 each, 20,000 jobs
#   bench/cycle.sh 1 8 20000 100  one client, 8 jobs per call, 100 targets
#
# Env: PGHOST PGPORT PGUSER (default 127.0.0.1 5432 postgres),
#      JOBDECK_BIN (default target/release/jobdeck, built if missing).
# The database bench_cycle is created and dropped.
set -euo pipefail

if [ $# -lt 2 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ && "$2" =~ ^[1-9][0-9]*$ && "${3:-1}" =~ ^[1-9][0-9]*$ && "${4:-0}" =~ ^[0-9]+$ ]]; then
  echo "usage: bench/cycle.sh CLIENTS BATCH [JOBS [TARGETS]]" >&2
  exit 2
fi
CLIENTS=$1 BATCH=$2 JOBS=${3:-20000} TARGETS=${4:-0}
source "$(dirname "$0")/pg_harness.sh"
DB=bench_cycle

dropdb --if-exists "$DB" && createdb "$DB"
trap 'dropdb --if-exists "$DB"' EXIT
"$JOBDECK" --db "postgres://$PGUSER@$PGHOST:$PGPORT/$DB" migrate > /dev/null
psql -q -v ON_ERROR_STOP=1 -d "$DB" -c \
  "INSERT INTO jobs (pipeline, state, due_at, target)
   SELECT 'bench', 'queued', now(), CASE WHEN $TARGETS > 0 THEN 't' || (i % greatest($TARGETS, 1)) END
   FROM generate_series(0, $JOBS - 1) AS i;
   ANALYZE jobs;"

cpu() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
tx=$((JOBS / (CLIENTS * BATCH) + 1))
c0=$(cpu)
out="$(pgbench -n -M prepared -c "$CLIENTS" -j "$CLIENTS" -t "$tx" -D ids='{}' -D toks='{}' \
  -D win=$((2 * BATCH + 2)) -D batch="$BATCH" -f "$BENCH/cycle.sql" "$DB" 2>&1)" ||
  { echo "$out" >&2; exit 1; }
c1=$(cpu)
done_jobs="$(psql -Atq -d "$DB" -c "SELECT count(*) FROM jobs WHERE state = 'succeeded'")"
tps="$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<< "$out")"
ticks="$(getconf CLK_TCK)"
python3 -c "
jobs_s = $tps * $done_jobs / ($CLIENTS * $tx)
cpu_ms = ($c1 - $c0) * 1000 / $ticks * 1000 / max($done_jobs, 1)
print(f'{$CLIENTS} x {$BATCH}: {jobs_s:.0f} jobs/s, machine CPU {cpu_ms:.0f} ms per 1,000 jobs')"
