#!/usr/bin/env bash
# Two builds of jobdeck against each other: `jobdeck bench` with the same
# arguments, alternating A, B, A, B… so that a machine whose speed drifts
# within minutes (±15–30 % on some; see BENCHMARKS.md) weighs on both
# alike. Prints every pair, the medians and the median of the per-pair
# ratios B ÷ A, which is the figure to quote: a change is real when most
# pairs agree on its side of 1.
#
#   bench/ab.sh /tmp/jobdeck-before target/release/jobdeck
#   bench/ab.sh --rounds 8 --db postgres://postgres@127.0.0.1/test A B
#   bench/ab.sh --targets 100 A B -- --cycles-in-flight 2
#
# Options: --rounds N (6)  --jobs N (20000)  --slots N (8)  --targets K (0)
#          --db URL (default: a temp SQLite file per run; a Postgres URL
#          runs each in a fresh schema of that database)
# Arguments after `--` go to every `jobdeck bench` call.
set -euo pipefail

ROUNDS=6 JOBS=20000 SLOTS=8 TARGETS=0 DB=""
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --slots) SLOTS="$2"; shift 2 ;;
    --targets) TARGETS="$2"; shift 2 ;;
    --db) DB="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) break ;;
    -*) echo "ab.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "ab.sh: need two jobdeck binaries, A and B (see --help)" >&2
  exit 2
fi
A="$1" B="$2"
shift 2
[ "${1:-}" = "--" ] && shift
for bin in "$A" "$B"; do
  [ -x "$bin" ] || { echo "ab.sh: $bin is not an executable" >&2; exit 2; }
done
for n in "$ROUNDS" "$JOBS" "$SLOTS" "$TARGETS"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "ab.sh: $n is not a number" >&2; exit 2; }
done
[ "$ROUNDS" -ge 1 ] || { echo "ab.sh: --rounds must be at least 1" >&2; exit 2; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# One `jobdeck bench`; prints its processing jobs/s.
run() {
  local bin="$1" db=()
  shift
  if [ -n "$DB" ]; then db=(--db "$DB"); else db=(--db "sqlite://$tmp/ab.db"); fi
  rm -f "$tmp"/ab.db*
  "$bin" "${db[@]}" bench --jobs "$JOBS" --slots "$SLOTS" --targets "$TARGETS" \
    --no-latency --json "$@" |
    python3 -c 'import json, sys; print(round(json.load(sys.stdin)["process_per_s"]))'
}

echo "A = $A"
echo "B = $B"
echo "jobdeck bench --jobs $JOBS --slots $SLOTS --targets $TARGETS ${DB:+--db $DB} $*"
: > "$tmp/pairs"
for r in $(seq "$ROUNDS"); do
  a="$(run "$A" "$@")"
  b="$(run "$B" "$@")"
  echo "$a $b" >> "$tmp/pairs"
  printf 'pair %2d: A %7d  B %7d  B/A %.3f\n' "$r" "$a" "$b" "$(python3 -c "print($b / $a)")"
done
python3 - "$tmp/pairs" <<'PY'
import statistics, sys
pairs = [tuple(map(int, line.split())) for line in open(sys.argv[1])]
a = [p[0] for p in pairs]
b = [p[1] for p in pairs]
ratios = [y / x for x, y in pairs]
faster = sum(r > 1 for r in ratios)
print(f"median jobs/s: A {statistics.median(a):.0f}, B {statistics.median(b):.0f}")
print(f"B/A: median of {len(ratios)} pairs {statistics.median(ratios):.3f} "
      f"(range {min(ratios):.3f}-{max(ratios):.3f}; B faster in {faster} of {len(ratios)})")
PY
