# Sourced by the pgbench harnesses (cycle.sh, lean.sh) and by
# server_instructions.sh --engine: where the scripts
# and the repo are, the Postgres to reach, and the jobdeck binary that
# migrates their fresh databases (built when missing).
BENCH="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"
REPO="$(dirname "$BENCH")"
export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}" PGUSER="${PGUSER:-postgres}"
JOBDECK="${JOBDECK_BIN:-$REPO/target/release/jobdeck}"
[ -x "$JOBDECK" ] || (cd "$REPO" && cargo build --release --quiet)
