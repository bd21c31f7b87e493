#!/bin/sh
# redis_bench.sh (make bench-redis): eventstore beside Redis Streams on this
# machine (issue 26; bench/README.md, "Redis Streams (issue 26)"). The
# program (bench/redis_bench.c) starts and stops its own redis-server for
# every Redis measurement, on a free port of 127.0.0.1, with its files in
# this script's temporary directory; whatever happens, the directory goes
# at the end, and a server the program left running (its pid file there)
# is stopped.
#
# Settings (environment; see bench/redis_bench.c): REDIS_BENCH_ROUNDS (5),
# REDIS_BENCH_SCALE (1; 0.05 for a run of seconds), REDIS_BENCH_COUNT (10),
# REDIS_BENCH_ONLY (a space-separated list of workload keys), REDIS_SERVER.
BUILD=${BUILD:-build}
PROG=$BUILD/bench/redis_bench

set -e
command -v "${REDIS_SERVER:-redis-server}" >/dev/null ||
  { echo "redis_bench: needs redis-server (make deps-bench-redis installs it)" >&2; exit 1; }
[ -x "$PROG" ] || { echo "redis_bench: build first (make bench-redis)" >&2; exit 1; }

dir=$(mktemp -d)
cleanup() {
  if [ -f "$dir/redis.pid" ]; then
    pid=$(cat "$dir/redis.pid")
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'),$(uptime | sed 's/.*load/ load/')"
echo "# $("${REDIS_SERVER:-redis-server}" --version)"
"$PROG" "$dir"
