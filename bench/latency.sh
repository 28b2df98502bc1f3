#!/usr/bin/env bash
# Cross-process enqueue→start latency: a `jobdeck worker` (8 slots) runs in
# its own process, and jobs are enqueued one at a time, with idle gaps, from
# another process. Latencies come from the database's timestamps (see
# bench/latency.py for exactly which).
#
#   bench/latency.sh                      Postgres (psql and cli producers) and SQLite (cli)
#   bench/latency.sh --backend sqlite --poll 50ms --runs 3
#   bench/latency.sh --json               JSON lines on stdout (one per run, then medians)
#
# Options: --backend postgres|sqlite|both  --producer psql|cli|both (Postgres;
#          SQLite always uses cli)  --jobs N (200)  --gap MIN-MAX (ms, 20-50)
#          --poll DURATION ([workers] poll, 200ms = the default)  --runs N (1)
#          --json
# Producers: cli = one `jobdeck enqueue` process per job (the real code path;
#            measured from the enqueue transaction's start); psql = one psql
#            session running enqueue's statements (measured from the commit).
# Env: PGHOST PGPORT PGUSER (default 127.0.0.1 5432 postgres, trust auth),
#      JOBDECK_BIN (use this binary instead of building target/release/jobdeck).
# Postgres runs in a database bench_latency, created and dropped each run.
set -uo pipefail

BACKEND=both
PRODUCER=both
JOBS=200
GAP=20-50
POLL=200ms
RUNS=1
JSON=0
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) BACKEND="$2"; shift ;;
    --producer) PRODUCER="$2"; shift ;;
    --jobs) JOBS="$2"; shift ;;
    --gap) GAP="$2"; shift ;;
    --poll) POLL="$2"; shift ;;
    --runs) RUNS="$2"; shift ;;
    --json) JSON=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "latency.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$BACKEND" in postgres|sqlite|both) ;; *) echo "latency.sh: --backend is postgres, sqlite or both" >&2; exit 2 ;; esac
case "$PRODUCER" in psql|cli|both) ;; *) echo "latency.sh: --producer is psql, cli or both" >&2; exit 2 ;; esac
if ! [[ "$JOBS" =~ ^[1-9][0-9]*$ && "$RUNS" =~ ^[1-9][0-9]*$ && "$GAP" =~ ^[0-9]+-[0-9]+$ ]]; then
  echo "latency.sh: --jobs and --runs take a positive number, --gap MIN-MAX in ms" >&2
  exit 2
fi
if ! [[ "$POLL" =~ ^[0-9]+(ms|s)$ ]]; then
  echo "latency.sh: --poll takes e.g. 50ms or 1s" >&2
  exit 2
fi
POLL_MS="${POLL%ms}"
[[ "$POLL" == *ms ]] || POLL_MS="$((${POLL%s} * 1000))"

BENCH="$(cd "$(dirname "$0")" && pwd)"
REPO="$(dirname "$BENCH")"
export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}" PGUSER="${PGUSER:-postgres}"
PGDB=bench_latency
PG_URL="postgres://$PGUSER@$PGHOST:$PGPORT/$PGDB"

say() { echo "[latency] $*" >&2; }

if [ -n "${JOBDECK_BIN:-}" ]; then
  JOBDECK="$JOBDECK_BIN"
else
  say "building jobdeck (release)"
  (cd "$REPO" && cargo build --release --bin jobdeck) >&2 || { say "cargo build failed"; exit 1; }
  JOBDECK="$REPO/target/release/jobdeck"
fi

WORK="$(mktemp -d)"
WORKER_PID=""
stop_worker() {
  [ -n "$WORKER_PID" ] || return 0
  # SIGTERM drains; a second one stops at once if a job hangs.
  kill -TERM "$WORKER_PID" 2> /dev/null
  for _ in $(seq 50); do kill -0 "$WORKER_PID" 2> /dev/null || break; sleep 0.1; done
  kill -TERM "$WORKER_PID" 2> /dev/null
  wait "$WORKER_PID" 2> /dev/null
  WORKER_PID=""
}
cleanup() {
  stop_worker
  [ "$BACKEND" = sqlite ] || dropdb --if-exists "$PGDB" > /dev/null 2>&1
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cat > "$WORK/jobdeck.toml" << EOF
[workers]
slots = 8
poll = "$POLL"

[[pipeline]]
name = "lat"
[[pipeline.step]]
name = "noop"
builtin = "noop"
EOF

# start_worker URL: a worker process, and wait until it is registered.
start_worker() {
  local url="$1" i
  # Migrate first: two processes opening a fresh SQLite file at once can
  # both try to create the schema, and one of them then fails.
  "$JOBDECK" --db "$url" --config "$WORK/jobdeck.toml" migrate > /dev/null || return 1
  "$JOBDECK" --db "$url" --config "$WORK/jobdeck.toml" worker --slots 8 > "$WORK/worker.log" 2>&1 &
  WORKER_PID=$!
  for i in $(seq 100); do
    if "$JOBDECK" --db "$url" --config "$WORK/jobdeck.toml" workers --json 2> /dev/null |
      python3 -c '
import json, sys
try:
    ws = json.load(sys.stdin)
except ValueError:  # the database may not be migrated yet
    sys.exit(1)
sys.exit(0 if any(w["pid"] == int(sys.argv[1]) and not w["gone"] for w in ws) else 1)' "$WORKER_PID"; then
      return 0
    fi
    kill -0 "$WORKER_PID" 2> /dev/null || break
    sleep 0.1
  done
  say "the worker did not register; its log:"
  tail -n 20 "$WORK/worker.log" >&2
  return 1
}

RESULTS="$WORK/results.jsonl"
: > "$RESULTS"
# one BACKEND PRODUCER RUN: one measurement on a fresh database.
one() {
  local backend="$1" producer="$2" run="$3" url
  if [ "$backend" = postgres ]; then
    dropdb --if-exists "$PGDB" > /dev/null 2>&1
    createdb "$PGDB" || { say "createdb $PGDB failed"; return 1; }
    url="$PG_URL"
  else
    rm -f "$WORK"/lat.db*
    url="sqlite://$WORK/lat.db"
  fi
  say "$backend, producer $producer, poll $POLL, run $run/$RUNS: $JOBS jobs, gaps ${GAP} ms"
  start_worker "$url" || return 1
  local rc json=()
  [ $JSON -eq 1 ] && json=(--json)
  python3 "$BENCH/latency.py" run --backend "$backend" --producer "$producer" \
    --jobdeck "$JOBDECK" --db "$url" --config "$WORK/jobdeck.toml" --jobs "$JOBS" \
    --gap-min-ms "${GAP%-*}" --gap-max-ms "${GAP#*-}" --poll-ms "$POLL_MS" \
    --out "$RESULTS" "${json[@]}"
  rc=$?
  stop_worker
  [ "$backend" = postgres ] && dropdb --if-exists "$PGDB" > /dev/null 2>&1
  [ $rc -eq 0 ] || { say "measurement failed (exit $rc); worker log:"; tail -n 5 "$WORK/worker.log" >&2; return 1; }
  return 0
}

failed=0
json_flag=()
[ $JSON -eq 1 ] && json_flag=(--json)
combos=()
if [ "$BACKEND" != sqlite ]; then
  [ "$PRODUCER" != cli ] && combos+=("postgres psql")
  [ "$PRODUCER" != psql ] && combos+=("postgres cli")
fi
[ "$BACKEND" != postgres ] && combos+=("sqlite cli")
for combo in "${combos[@]}"; do
  for ((r = 1; r <= RUNS; r++)); do
    # shellcheck disable=SC2086 # two words on purpose
    one $combo "$r" || failed=1
  done
done

if [ -s "$RESULTS" ] && [ "$RUNS" -gt 1 ]; then
  python3 "$BENCH/latency.py" median "${json_flag[@]}" "$RESULTS"
fi
exit $failed
