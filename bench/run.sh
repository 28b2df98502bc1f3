#!/usr/bin/env bash
# jobdeck next to peer queues on this machine's Postgres and SQLite.
#
#   bench/run.sh            20,000 no-op jobs, concurrency 8, 3 runs each (medians)
#   bench/run.sh --quick    2,000 jobs, 1 run: a smoke test of the whole pipeline
#   bench/run.sh --only jobdeck,pgbench   run only rows whose name starts with these
#
# Options: --jobs N  --runs N  --concurrency N  --latency-jobs N  --only LIST
# Env: PGHOST PGPORT PGUSER (default 127.0.0.1 5432 postgres, trust auth),
#      JOBDECK_BENCH_CACHE (default /tmp/peerbench-cache: installed peers and
#      the Rust harness build, kept so reruns are fast), JOBDECK_BIN (use this
#      binary instead of building target/release/jobdeck).
#
# Peers are installed by package name into the cache, never into the repo.
# Every measurement runs in a fresh database (bench_<row>) dropped afterwards.
# Runs are interleaved: pass 1 measures every row once, then pass 2, and so
# on, so that a machine whose speed drifts over the hour weighs on every row
# alike instead of on whichever rows ran in its slow minutes.
# Output: a table on stdout, bench/results/latest.json, and the raw JSON lines
# in bench/results/raw.jsonl (bench/results/ is not committed).
set -uo pipefail

JOBS=20000
RUNS=3
CONC=8
LAT_JOBS=200
PGBENCH_S=10
SQLITE_S=5
ONLY=""
QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; JOBS=2000; RUNS=1; LAT_JOBS=50; PGBENCH_S=3; SQLITE_S=2 ;;
    --jobs) JOBS="$2"; shift ;;
    --runs) RUNS="$2"; shift ;;
    --concurrency) CONC="$2"; shift ;;
    --latency-jobs) LAT_JOBS="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

BENCH="$(cd "$(dirname "$0")" && pwd)"
REPO="$(dirname "$BENCH")"
CACHE="${JOBDECK_BENCH_CACHE:-/tmp/peerbench-cache}"
RESULTS="$BENCH/results"
export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}" PGUSER="${PGUSER:-postgres}"
PG_BASE="postgres://$PGUSER@$PGHOST:$PGPORT"
RUN_LIMIT=900 # seconds one measurement may take before it counts as failed

mkdir -p "$CACHE" "$RESULTS"
RAW="$RESULTS/raw.jsonl"
: > "$RAW"
FAILED="$RESULTS/failed.txt"
: > "$FAILED"
LOG="$RESULTS/run.log"
: > "$LOG"

say() { echo "[bench] $*" >&2; }
fail() { # row reason
  say "FAILED $1: $2"
  printf '%s\t%s\n' "$1" "$2" >> "$FAILED"
}
wanted() { # row name
  cut -f1 "$FAILED" | grep -qxF "$1" && return 1 # failed in an earlier pass
  [ -z "$ONLY" ] && return 0
  local p
  IFS=, read -ra ps <<< "$ONLY"
  for p in "${ps[@]}"; do [[ "$1" == "$p"* ]] && return 0; done
  return 1
}
wanted_any() { # row names: is any of them wanted?
  local r
  for r in "$@"; do wanted "$r" && return 0; done
  return 1
}

# ---------------------------------------------------------------- installs
JOBDECK=""
setup_jobdeck() {
  if [ -n "${JOBDECK_BIN:-}" ]; then JOBDECK="$JOBDECK_BIN"; return 0; fi
  say "building jobdeck (release)"
  if (cd "$REPO" && cargo build --release --bin jobdeck) >> "$LOG" 2>&1; then
    JOBDECK="$REPO/target/release/jobdeck"
  else
    fail jobdeck "cargo build --release failed (see $LOG)"
    return 1
  fi
}

PY="$CACHE/py/bin/python"
setup_python() {
  [ -f "$CACHE/py/.ok-pgqueuer-1.6" ] && return 0
  say "installing pgqueuer 1.6 (PyPI) into $CACHE/py"
  python3 -m venv "$CACHE/py" >> "$LOG" 2>&1 &&
    "$CACHE/py/bin/pip" install -q 'pgqueuer==1.6.*' asyncpg >> "$LOG" 2>&1 &&
    touch "$CACHE/py/.ok-pgqueuer-1.6"
}

NODE="$CACHE/node/node_modules/.bin/node"
setup_node() {
  mkdir -p "$CACHE/node"
  cp "$BENCH"/peers/*.mjs "$CACHE/node/" # imports resolve against its node_modules
  [ -f "$CACHE/node/.ok-v1" ] && return 0
  say "installing pg-boss 12, graphile-worker 0.18, node 22 (npm) into $CACHE/node"
  (cd "$CACHE/node" && { [ -f package.json ] || npm init -y > /dev/null; } &&
    npm install --silent 'pg-boss@12' 'graphile-worker@0.18' 'node@22' pg) >> "$LOG" 2>&1 &&
    touch "$CACHE/node/.ok-v1"
}

RUST_BIN="$CACHE/rust/target/release"
setup_rust() {
  mkdir -p "$CACHE/rust"
  # Copy only changed files so cargo's incremental build stays valid.
  cp -ru "$BENCH/peers/rust/Cargo.toml" "$BENCH/peers/rust/src" "$CACHE/rust/"
  say "building the apalis and River harnesses in $CACHE/rust (slow the first time)"
  (cd "$CACHE/rust" && cargo build --release --bins) >> "$LOG" 2>&1
}

# ---------------------------------------------------------------- running
# Before every measured run: write out what earlier rows left in the page
# cache and checkpoint Postgres, so that no row pays for the disk writes of
# the one before it (the reference rows write the most: in one full run
# jobdeck's Postgres row, measured right after them, came out at 4,336
# jobs/s against 6,056 when run alone).
settle() {
  sync
  psql -q -d postgres -c CHECKPOINT >> "$LOG" 2>&1
}

fresh_db() { # name
  dropdb --if-exists "$1" >> "$LOG" 2>&1
  createdb "$1" >> "$LOG" 2>&1
}

# measure ROW DB|"" COMMAND...: runs COMMAND once, as run $PASS of $RUNS
# (with {URL} replaced by a fresh database's URL when DB is given), keeps its
# JSON line.
measure() {
  local row="$1" db="$2"; shift 2
  wanted "$row" || return 0
  local i="$PASS" out rc args
  say "$row: run $i/$RUNS"
  settle
  args=()
  if [ -n "$db" ]; then
    if ! fresh_db "$db"; then fail "$row" "createdb $db failed"; return; fi
    for a in "$@"; do args+=("${a//\{URL\}/$PG_BASE/$db}"); done
  else
    args=("$@")
  fi
  out="$(timeout "$RUN_LIMIT" "${args[@]}" 2>> "$LOG")"
  rc=$?
  [ -n "$db" ] && dropdb --if-exists "$db" >> "$LOG" 2>&1
  local line
  line="$(grep '^{' <<< "$out" | tail -n 1)"
  if [ $rc -ne 0 ] || [ -z "$line" ]; then
    [ $rc -eq 124 ] && fail "$row" "timed out after ${RUN_LIMIT}s" || fail "$row" "exit $rc, no result (see $LOG)"
    return
  fi
  printf '{"row":"%s","run":%d,"result":%s}\n' "$row" "$i" "$line" >> "$RAW"
}

pgbench_row() { # row clients
  local row="$1" c="$2" i="$PASS"
  wanted "$row" || return 0
  local script="$CACHE/pgbench-update.sql"
  # One row per transaction, spread over 100,000 rows: independent commits,
  # like jobs on different rows, so group commit can work.
  printf '\\set aid random(1, 100000)\nUPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n' > "$script"
  say "$row: run $i/$RUNS"
  fresh_db bench_pgbench || { fail "$row" "createdb failed"; return; }
  pgbench -i -q -s 1 bench_pgbench >> "$LOG" 2>&1
  settle
  local out tps lat
  out="$(pgbench -n -c "$c" -j "$((c < 2 ? 1 : 2))" -T "$PGBENCH_S" -f "$script" bench_pgbench 2>> "$LOG")"
  dropdb --if-exists bench_pgbench >> "$LOG" 2>&1
  tps="$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<< "$out")"
  lat="$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' <<< "$out")"
  if [ -z "$tps" ]; then fail "$row" "pgbench printed no tps (see $LOG)"; return; fi
  printf '{"row":"%s","run":%d,"result":{"backend":"pgbench","slots":%d,"process_per_s":%s,"latency_avg_ms":%s}}\n' \
    "$row" "$i" "$c" "$tps" "${lat:-null}" >> "$RAW"
}

# floor_row ROW CLIENTS BATCH: bench/floor.sql through pgbench on a fresh
# database with jobdeck's schema and JOBS queued no-op jobs, each client
# claiming up to BATCH per transaction (one transaction more than the claims
# need, to finish the last batch). process/s = jobs finished / elapsed:
# clients that skip each other's rows may leave a few jobs unfinished.
floor_row() {
  local row="$1" c="$2" batch="$3" i="$PASS"
  wanted "$row" || return 0
  local script="$CACHE/floor-$batch.sql" db=bench_floor
  sed "s/LIMIT BATCH/LIMIT $batch/" "$BENCH/floor.sql" > "$script"
  local tx=$((JOBS / (c * batch) + 1))
  say "$row: run $i/$RUNS"
  fresh_db "$db" || { fail "$row" "createdb failed"; return; }
  if ! "$JOBDECK" --db "$PG_BASE/$db" migrate >> "$LOG" 2>&1 ||
    ! psql -q -v ON_ERROR_STOP=1 -d "$db" >> "$LOG" 2>&1 <<SQL; then
ALTER TABLE jobs DISABLE TRIGGER USER;
INSERT INTO jobs (pipeline, state, due_at) SELECT 'noop', 'queued', now() FROM generate_series(1, $JOBS);
VACUUM ANALYZE jobs;
SQL
    fail "$row" "schema or jobs setup failed (see $LOG)"; return
  fi
  settle
  local out tps finished
  out="$(pgbench -n -M prepared -c "$c" -j "$c" -t "$tx" -f "$script" "$db" 2>> "$LOG")"
  finished="$(psql -Atq -d "$db" -c "SELECT count(*) FROM jobs WHERE state = 'succeeded'" 2>> "$LOG")"
  dropdb --if-exists "$db" >> "$LOG" 2>&1
  tps="$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<< "$out")"
  if [ -z "$tps" ] || [ "${finished:-0}" -eq 0 ]; then
    fail "$row" "pgbench printed no tps or finished no job (see $LOG)"; return
  fi
  printf '{"row":"%s","run":%d,"result":{"backend":"floor","slots":%d,"process_per_s":%s}}\n' \
    "$row" "$i" "$((c * batch))" "$(python3 -c "print(round($tps * $finished / ($c * $tx), 1))")" >> "$RAW"
}

# lean_row ROW BATCH: bench/lean.sh, the engine's common cycle statement
# alone (pgbench, one client, BATCH jobs per call, each call finishing the
# jobs the one before started) on a fresh database. Between the floor and
# jobdeck's own row it splits what jobdeck runs above the floor into the
# statement's share (lean ÷ floor) and the engine's (jobdeck ÷ lean).
lean_row() {
  local row="$1" batch="$2" i="$PASS"
  wanted "$row" || return 0
  say "$row: run $i/$RUNS"
  settle
  local out rate
  out="$(JOBDECK_BIN="$JOBDECK" timeout "$RUN_LIMIT" bash "$BENCH/lean.sh" "$batch" "$JOBS" 2>> "$LOG")"
  rate="$(sed -n 's/^1 x [0-9]*: \([0-9]*\) jobs\/s.*/\1/p' <<< "$out")"
  if [ -z "$rate" ]; then fail "$row" "lean.sh printed no rate (see $LOG)"; return; fi
  printf '{"row":"%s","run":%d,"result":{"backend":"lean","slots":%d,"process_per_s":%s}}\n' \
    "$row" "$i" "$batch" "$rate" >> "$RAW"
}

{
  echo "nproc=$(nproc) load_before=$(cut -d' ' -f1-3 /proc/loadavg)"
} > "$RESULTS/machine.txt"
say "jobs=$JOBS concurrency=$CONC runs=$RUNS latency_jobs=$LAT_JOBS load=$(cut -d' ' -f1-3 /proc/loadavg)"

# Install first (each once), then measure in passes.
HAVE_JOBDECK=0 HAVE_PY=0 HAVE_NODE=0 HAVE_RUST=0
if wanted_any jobdeck-postgres jobdeck-postgres-t100 jobdeck-sqlite jobdeck-sqlite-t100 floor-1x8 floor-2x4 lean-1x8 floor-sqlite &&
  setup_jobdeck; then HAVE_JOBDECK=1; fi
if wanted pgqueuer-postgres; then
  if setup_python; then HAVE_PY=1; else fail pgqueuer-postgres "pip install pgqueuer failed (see $LOG)"; fi
fi
if wanted_any pgboss-postgres graphile-postgres; then
  if setup_node; then HAVE_NODE=1; else
    fail pgboss-postgres "npm install failed (see $LOG)"
    fail graphile-postgres "npm install failed (see $LOG)"
  fi
fi
if wanted_any river-postgres river-sqlite apalis-postgres apalis-sqlite; then
  if setup_rust; then HAVE_RUST=1; else
    for r in river-postgres river-sqlite apalis-postgres apalis-sqlite; do
      wanted "$r" && fail "$r" "cargo build of bench/peers/rust failed (see $LOG)"
    done
  fi
fi

JD=("$JOBDECK" bench --jobs "$JOBS" --slots "$CONC" --latency-jobs "$LAT_JOBS" --json)
PEER=(--jobs "$JOBS" --concurrency "$CONC" --latency-jobs "$LAT_JOBS")
SQ="$(mktemp -d)"
trap 'rm -rf "$SQ"' EXIT
for ((PASS = 1; PASS <= RUNS; PASS++)); do
  # References first: they need nothing installed.
  pgbench_row pgbench-c8 "$CONC"
  pgbench_row pgbench-c1 1
  measure sqlite-wal-update "" python3 "$BENCH/peers/sqlite_update.py" --seconds "$SQLITE_S"
  if [ "$HAVE_JOBDECK" = 1 ]; then
    measure jobdeck-postgres bench_jobdeck "${JD[@]}" --db "{URL}"
    measure jobdeck-postgres-t100 bench_jobdeck "${JD[@]}" --db "{URL}" --targets 100
    measure jobdeck-postgres-busypoll bench_jobdeck "${JD[@]}" --db "{URL}" --busy-poll 2ms
    measure jobdeck-sqlite "" "${JD[@]}"
    measure jobdeck-sqlite-t100 "" "${JD[@]}" --targets 100
    floor_row floor-1x8 1 "$CONC"
    floor_row floor-2x4 2 "$((CONC / 2))"
    lean_row lean-1x8 "$CONC"
    measure floor-sqlite "" python3 "$BENCH/peers/sqlite_floor.py" --jobdeck "$JOBDECK" \
      --jobs "$JOBS" --batch "$CONC"
  fi
  if [ "$HAVE_PY" = 1 ]; then
    measure pgqueuer-postgres bench_pgqueuer "$PY" "$BENCH/peers/pgqueuer_peer.py" --url "{URL}" "${PEER[@]}"
  fi
  if [ "$HAVE_NODE" = 1 ]; then
    measure pgboss-postgres bench_pgboss "$NODE" "$CACHE/node/pgboss_peer.mjs" --url "{URL}" "${PEER[@]}"
    measure graphile-postgres bench_graphile "$NODE" "$CACHE/node/graphile_peer.mjs" --url "{URL}" "${PEER[@]}"
  fi
  if [ "$HAVE_RUST" = 1 ]; then
    measure river-postgres bench_river "$RUST_BIN/river_peer" --backend postgres --url "{URL}" "${PEER[@]}"
    measure river-sqlite "" bash -c 'rm -f "$0"/r.db*; exec "$@" --url "sqlite://$0/r.db"' "$SQ" \
      "$RUST_BIN/river_peer" --backend sqlite "${PEER[@]}"
    measure apalis-postgres bench_apalis "$RUST_BIN/apalis_peer" --backend postgres --url "{URL}" "${PEER[@]}"
    measure apalis-sqlite "" bash -c 'rm -f "$0"/a.db*; exec "$@" --url "sqlite://$0/a.db?mode=rwc"' "$SQ" \
      "$RUST_BIN/apalis_peer" --backend sqlite "${PEER[@]}"
  fi
done

echo "load_after=$(cut -d' ' -f1-3 /proc/loadavg)" >> "$RESULTS/machine.txt"
python3 "$BENCH/summarize.py" --raw "$RAW" --failed "$FAILED" --machine "$RESULTS/machine.txt" \
  --jobs "$JOBS" --runs "$RUNS" --concurrency "$CONC" --out "$RESULTS/latest.json"
