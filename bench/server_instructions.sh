#!/usr/bin/env bash
# The Postgres server's instructions per job for the engine's common cycle
# statement, counted by callgrind: bench/lean.sh (pgbench sending the lean
# cycle statement, one client, BATCH jobs per call) against a scratch
# Postgres cluster of the machine's own build that runs under callgrind.
# Instructions, unlike seconds, come out the same for the same schema and
# statement whatever else the machine is doing, so schema variants that
# wall-clock runs cannot tell apart (their ±15-30 % noise) can be compared.
# What they leave out: time spent waiting (the commit's fsync, the network)
# and what an instruction costs (cache misses).
#
#   bench/server_instructions.sh                  8 jobs per call, 4,000 jobs
#   bench/server_instructions.sh 8 4000 'ALTER SEQUENCE job_events_id_seq CACHE 64'
#   LEAN_VARIANT=without-events bench/server_instructions.sh
#   bench/server_instructions.sh --engine 100 8000   `jobdeck bench` itself
#                  (8 slots, 100 targets, 8,000 jobs, no latency phase)
#
# Prints the pgbench backend's instructions per job (its start-up and the
# first calls' planning included, the same for every variant), and the
# command that splits them by function (the next run deletes callgrind's
# file: copy it first to compare two variants function by function and
# see which part of the server a change moved). With
# --engine [TARGETS [JOBS]] (default 0 and 8,000) it runs the engine
# instead, whose cycle statements depend on the timing (how many jobs a
# cycle carries), and prints the instructions per job of every backend
# of its database together: the bulk enqueue, the cycles, the heartbeat
# and the folds of the counts (two runs of 8,000 jobs agree within 0.2 %,
# of 2,000 within 3 %: the fixed costs weigh more and vary). The cluster
# lives in JOBDECK_CG_CLUSTER (default /tmp/jobdeck-pgcg; made on first use,
# as the postgres user when run as root) and listens on 127.0.0.1:5499
# (JOBDECK_CG_PORT) while the script runs. Needs valgrind and the
# PostgreSQL server binaries (pg_config --bindir, else
# /usr/lib/postgresql/*/bin).
set -euo pipefail
ENGINE=
if [ "${1:-}" = "--engine" ]; then
  ENGINE=1 TARGETS=${2:-0} JOBS=${3:-8000}
  [[ "$TARGETS" =~ ^[0-9]+$ && "$JOBS" =~ ^[1-9][0-9]*$ ]] ||
    { echo "usage: bench/server_instructions.sh --engine [TARGETS [JOBS]]" >&2; exit 2; }
else
  BATCH=${1:-8} JOBS=${2:-4000} EXTRA=${3:-}
fi
BENCH="$(cd "$(dirname "$0")" && pwd)"
CLUSTER="${JOBDECK_CG_CLUSTER:-/tmp/jobdeck-pgcg}"
PORT="${JOBDECK_CG_PORT:-5499}"
BIN="$(pg_config --bindir 2>/dev/null || true)"
[ -x "$BIN/postgres" ] || BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
[ -x "$BIN/postgres" ] || { echo "server_instructions.sh: no postgres server binary found" >&2; exit 1; }
command -v valgrind > /dev/null || { echo "server_instructions.sh: valgrind not found" >&2; exit 1; }

# Postgres refuses to run as root: the cluster is then the postgres user's.
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

if [ ! -f "$CLUSTER/data/PG_VERSION" ]; then
  mkdir -p "$CLUSTER"
  [ "$(id -u)" = 0 ] && chown postgres "$CLUSTER"
  as_owner "$BIN/initdb" -D "$CLUSTER/data" -A trust -U postgres > "$CLUSTER/initdb.log"
  # The machine's defaults but for what the harness needs: its own port,
  # no autovacuum (as on the benchmark machine), and each connection's
  # PID in the log, to find pgbench's backend.
  cat >> "$CLUSTER/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$CLUSTER'
autovacuum = off
log_connections = on
log_line_prefix = '%p '
CONF
fi

out="$CLUSTER/callgrind"
as_owner mkdir -p "$out"
as_owner find "$out" -type f -delete
log="$CLUSTER/server.log"
: | as_owner tee "$log" > /dev/null # a new log for this run
stop() { as_owner "$BIN/pg_ctl" -D "$CLUSTER/data" stop -m fast -w > /dev/null 2>&1 || true; }
trap stop EXIT
# Every process of the cluster runs under callgrind (pg_ctl cannot start
# it so): each backend, forked from it, writes its own count at its exit.
as_owner bash -c "exec valgrind --tool=callgrind --callgrind-out-file='$out/cg.%p' \
  '$BIN/postgres' -D '$CLUSTER/data' >> '$log' 2>&1" &
for _ in $(seq 1 120); do pg_isready -q -h 127.0.0.1 -p "$PORT" && break; sleep 1; done
pg_isready -q -h 127.0.0.1 -p "$PORT" || { echo "server_instructions.sh: the cluster did not start (see $log)" >&2; exit 1; }

count() { as_owner sed -n 's/^totals: \([0-9]*\).*/\1/p' "$out/cg.$1" 2>/dev/null || true; }

if [ -n "$ENGINE" ]; then
  source "$BENCH/pg_harness.sh" # the jobdeck binary, built when missing
  psql -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "DROP DATABASE IF EXISTS bench_engine" \
    -c "CREATE DATABASE bench_engine"
  "$JOBDECK" bench --db "postgres://postgres@127.0.0.1:$PORT/bench_engine" --jobs "$JOBS" \
    --slots 8 --targets "$TARGETS" --no-latency
  stop
  trap - EXIT
  total=0
  for pid in $(sed -n 's/^\([0-9]*\) LOG:  connection authorized: .*database=bench_engine.*/\1/p' "$log"); do
    n="$(count "$pid")"
    total=$((total + ${n:-0}))
  done
  [ "$total" -gt 0 ] || { echo "server_instructions.sh: no callgrind count for the engine's backends (see $log)" >&2; exit 1; }
  python3 -c "print(f'engine, 8 slots, $TARGETS targets: {$total / $JOBS:,.0f} server instructions per job ($total in all, $JOBS jobs)')"
  exit 0
fi

lean="$(PGHOST=127.0.0.1 PGPORT="$PORT" PGUSER=postgres "$BENCH/lean.sh" "$BATCH" "$JOBS" "$EXTRA")"
stop
trap - EXIT

# pgbench opens one connection to look around and one per client: the
# client's backend is the one that ran the statements, the largest count.
total=0 backend=
for pid in $(sed -n 's/^\([0-9]*\) LOG:  connection authorized: .*application_name=pgbench.*/\1/p' "$log"); do
  n="$(count "$pid")"
  [ -n "$n" ] && [ "$n" -gt "$total" ] && total=$n backend=$pid
done
[ "$total" -gt 0 ] || { echo "server_instructions.sh: no callgrind count for pgbench's backend (see $log)" >&2; exit 1; }
done_jobs="$(sed -n 's/.*(\([0-9]*\) jobs done).*/\1/p' <<< "$lean")"
python3 -c "print(f'$BATCH per call: {$total / ${done_jobs:-$JOBS}:,.0f} server instructions per job ($total in all, ${done_jobs:-$JOBS} jobs)')"
# Kept until the next run: where in the server the instructions went.
echo "by function: callgrind_annotate --inclusive=yes $out/cg.$backend"
