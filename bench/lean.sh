#!/usr/bin/env bash
# The server side of the engine's common cycle alone: pgbench sends the lean
# cycle statement (src/store/postgres/lean_cycle.rs, printed by
# bench/lean_sql.py) the way the engine does, one client, BATCH jobs per
# call, each call finishing the jobs the one before started, on a fresh
# database migrated by jobdeck with JOBS queued no-op jobs. SQL given after
# the numbers runs once the jobs are in, so a change to the schema can be
# measured without a build (e.g. 'DROP INDEX jobs_finished').
#
#   bench/lean.sh                      8 jobs per call, 20,000 jobs
#   bench/lean.sh 8 20000 'ALTER SEQUENCE lease_tokens CACHE 64'
#   LEAN_VARIANT=without-events bench/lean.sh   the statement without its
#                                  event inserts (what the event log costs)
#   LEAN_VARIANT=floor bench/lean.sh   bench/floor.sql instead, set up as
#                                  bench/run.sh's floor rows are (the count
#                                  triggers disabled, VACUUM ANALYZE, the
#                                  server's default settings)
#
# Prints jobs/s and the jobs done. Env: PGHOST PGPORT PGUSER (default 127.0.0.1 5432
# postgres), JOBDECK_BIN (default target/release/jobdeck, built if missing).
# The database bench_lean is created and dropped.
set -euo pipefail
BATCH=${1:-8} JOBS=${2:-20000} EXTRA=${3:-}
[[ "$BATCH" =~ ^[1-9][0-9]*$ && "$JOBS" =~ ^[1-9][0-9]*$ ]] ||
  { echo "usage: bench/lean.sh [BATCH [JOBS [SQL]]]" >&2; exit 2; }
source "$(dirname "$0")/pg_harness.sh"
DB=bench_lean
script="$(mktemp)"
trap 'rm -f "$script"; dropdb --if-exists "$DB" 2>/dev/null' EXIT
if [ "${LEAN_VARIANT:-}" = floor ]; then
  python3 "$BENCH/lean_sql.py" floor "$BATCH" > "$script"
else
  python3 "$BENCH/lean_sql.py" ${LEAN_VARIANT:+"$LEAN_VARIANT"} > "$script"
fi

dropdb --if-exists "$DB" 2>/dev/null; createdb "$DB"
"$JOBDECK" --db "postgres://$PGUSER@$PGHOST:$PGPORT/$DB" migrate > /dev/null
insert="INSERT INTO jobs (pipeline, state, due_at) SELECT 'bench', 'queued', now() FROM generate_series(1, $JOBS);"
if [ "${LEAN_VARIANT:-}" = floor ]; then
  # bench/run.sh's floor rows' set-up: the count triggers disabled, the
  # server's default settings (the engine's below would give the floor's
  # finish a generic plan through jobs_state, which walks every job's
  # dead entry in the running range: 3.3 times the server instructions
  # per job at 8,000 jobs, half the rate at 20,000).
  setup="ALTER TABLE jobs DISABLE TRIGGER USER;
$insert
VACUUM ANALYZE jobs;"
else
  # The engine's connections' settings (src/store/postgres/engine_conn.rs).
  setup="$insert
ANALYZE jobs;
ALTER DATABASE $DB SET jobdeck.cycle_counts = 'on';
ALTER DATABASE $DB SET plan_cache_mode = 'force_generic_plan';
ALTER DATABASE $DB SET enable_seqscan = off;
ALTER DATABASE $DB SET jit = off;"
fi
psql -q -v ON_ERROR_STOP=1 -d "$DB" > /dev/null <<SQL
$setup
$EXTRA;
CHECKPOINT;
SQL
tx=$((JOBS / BATCH + 1))
out="$(pgbench -n -M prepared -c 1 -j 1 -t "$tx" -D ids='{}' -D toks='{}' -D batch="$BATCH" \
  -f "$script" "$DB" 2>&1)" || { echo "$out" >&2; exit 1; }
done_jobs="$(psql -Atq -d "$DB" -c "SELECT count(*) FROM jobs WHERE state = 'succeeded'")"
tps="$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<< "$out")"
python3 -c "print(f'1 x $BATCH: {$tps * $done_jobs / $tx:.0f} jobs/s ($done_jobs jobs done)')"
