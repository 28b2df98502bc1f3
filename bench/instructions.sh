#!/usr/bin/env bash
# Instructions per job on SQLite's writing thread, counted by callgrind:
# `jobdeck bench` on a fresh SQLite file under valgrind, the counters
# zeroed once the bulk enqueue has landed, so the figure is the processing
# phase alone. The same binary and arguments give the same count within
# 0.1 %, whatever else the machine is doing, so a change to the cycle's
# SQL or to SQLite's build shows as a number, where `bench/ab.sh`'s
# wall-clock pairs swing by ±15 % on these machines. It counts
# instructions, not time: it does not see the kernel (the WAL's writes) or
# waits; confirm a gain with `bench/ab.sh`. The engine's own thread (the
# main one: decoding rows, running the jobs, building the next cycle) is
# printed too. Its count moves by a few percent from run to run, with how
# often the runtime parks between the writer's answers.
#
#   bench/instructions.sh target/release/jobdeck
#   bench/instructions.sh --targets 100 /tmp/jobdeck-before target/release/jobdeck
#
# Options: --jobs N (5000)  --targets K (0)
# Needs valgrind. Takes about half a minute per binary at 5,000 jobs.
set -euo pipefail

JOBS=5000 TARGETS=0
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) JOBS="$2"; shift 2 ;;
    --targets) TARGETS="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "instructions.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "instructions.sh: name at least one jobdeck binary (see --help)" >&2; exit 2; }
for n in "$JOBS" "$TARGETS"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "instructions.sh: $n is not a number" >&2; exit 2; }
done
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is not installed" >&2; exit 2; }
command -v callgrind_control >/dev/null || { echo "instructions.sh: callgrind_control is not installed" >&2; exit 2; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The writer is the thread that runs SQLite's bytecode the most; print
# its total.
writer_total() {
  local best=0 writer="" file n
  for file in "$1"/cg.*-*; do
    n=$(callgrind_annotate --inclusive=yes "$file" 2>/dev/null \
      | awk '/sqlite3VdbeExec/ { gsub(",", "", $1); print $1; exit }')
    if [ -n "$n" ] && [ "$n" -gt "$best" ]; then
      best=$n writer=$file
    fi
  done
  [ -n "$writer" ] || { echo 0; return; }
  awk '/^summary:/ { print $2; exit }' "$writer"
}

for bin in "$@"; do
  [ -x "$bin" ] || { echo "instructions.sh: $bin is not an executable" >&2; exit 2; }
  run="$tmp/run"
  rm -rf "$run" && mkdir -p "$run"
  valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$run/cg.%p" \
    "$bin" bench --db "sqlite://$run/bench.db" --jobs "$JOBS" --targets "$TARGETS" --no-latency \
    >"$run/out" 2>"$run/err" &
  pid=$!
  # The bench's scratch file, in a directory beside the one --db names
  # (valgrind keeps the program's pid); builds before 5ad0f12 wrote into
  # the named file itself.
  db=""
  # Zero the counters once every job is in (the enqueue is one transaction).
  while kill -0 "$pid" 2>/dev/null; do
    for f in "$run/jobdeck-bench-$pid/bench.db" "$run/bench.db"; do
      [ -e "$f" ] && db=$f
    done
    [ -n "$db" ] || { sleep 0.05; continue; }
    jobs_in=$("$bin" stats --db "sqlite://$db" --json 2>/dev/null \
      | awk -F': ' '/"(queued|leased|running|succeeded)"/ { gsub(",", "", $2); s += $2 } END { print s + 0 }')
    [ "$jobs_in" -ge "$JOBS" ] && break
    sleep 0.05
  done
  callgrind_control --zero "$pid" >/dev/null 2>&1 || true
  if ! wait "$pid"; then
    echo "instructions.sh: $bin bench failed:" >&2
    cat "$run/err" >&2
    exit 1
  fi
  total=$(writer_total "$run")
  printf '%-40s targets %-4s writer thread %15s instructions, %9s per job\n' \
    "$bin" "$TARGETS" "$total" "$((total / JOBS))"
  engine=$(awk '/^summary:/ { print $2; exit }' "$run"/cg.*-01)
  printf '%-40s targets %-4s engine thread %15s instructions, %9s per job\n' \
    "$bin" "$TARGETS" "$engine" "$((engine / JOBS))"
done
