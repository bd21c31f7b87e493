#!/bin/sh
# make bench: every benchmark, figures on stdout. See bench/README.md.
# PG_BENCH_SCALE scales the PostgreSQL step (pg_bench).
BUILD=${BUILD:-build}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
set -e
"$BUILD"/bench/store_bench memory: 1000000
lua5.4 bench/store_bench.lua memory: 1000000
# The Lua path beside the C API in one process (bench/README.md, "The Lua path").
"$BUILD"/bench/lua_path_bench 100000
"$BUILD"/bench/store_bench "sqlite:$dir/store_bench.db" 1000000
lua5.4 bench/store_bench.lua "sqlite:$dir/fork_bench.db" 0 fork
# Claimed work completed one by one beside store:complete_many, on SQLite.
lua5.4 bench/store_bench.lua "sqlite:$dir/cm.db" 0 complete
"$BUILD"/bench/sqlite_bench "$dir" 3
# How soon a wait sees another process's append (bench/README.md, "Waits across processes").
lua5.4 bench/wait_latency.lua "$dir"
lua5.4 bench/engine_bench.lua "$dir"
# Folds and engine:state() beside lua-cjson in the same run (bench/README.md, "Folds").
lua5.4 bench/fold_bench.lua "$dir"
# A 1 -> 3 upcaster chain in a fold beside a plain fold (bench/README.md, "Upcasting").
lua5.4 bench/upcast_bench.lua 100000
# A projection's catch-up beside the reducer fold, and its steady lag (bench/README.md, "Projections").
BUILD="$BUILD" lua5.4 bench/projection_bench.lua "$dir" 1000000 20
# Replay of 10,000 demo-app sessions and its RSS (bench/README.md, "Replay").
lua5.4 bench/replay_bench.lua 10000 2>/dev/null
# dispatch beside raw SQLite and the C API in the same run (bench/README.md "Dispatch")
"$BUILD"/bench/dispatch_bench "$dir"
"$BUILD"/bench/archive_bench "$dir" 200000 10000
# Stats cost (bench/README.md "Stats cost"): counting on and off in one run.
"$BUILD"/bench/stats_bench "$dir" 5
# PostgreSQL: a throwaway server for this step only, started and removed by
# the same script as make test's (bench/README.md, "PostgreSQL").
sh spec/support/pg_cluster.sh run "$BUILD"/bench/pg_bench
# Moving a store (bench/README.md, "Moving a store"): export and import
# beside sqlite3 .dump and pg_dump, and copy --follow's switch-over.
ES_BIN="$BUILD"/bin/eventstore sh spec/support/pg_cluster.sh run sh -c \
  'lua5.4 bench/move_bench.lua "$1" 100000 "$(echo "$ES_TEST_URLS" | tr " " "\n" | grep postgres)"' sh "$dir"
# HTTP: eventstore serve under wrk beside the Lua API, and many SSE clients
# (bench/README.md, "HTTP (issue 13)"); about 90 s.
BUILD="$BUILD" sh bench/http_bench.sh
