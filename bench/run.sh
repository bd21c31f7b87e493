#!/bin/sh
# make bench: every benchmark, figures on stdout. See bench/README.md.
# PG_BENCH_SCALE scales the PostgreSQL step (pg_bench).
BUILD=${BUILD:-build}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
set -e
"$BUILD"/bench/store_bench memory: 1000000
lua5.4 bench/store_bench.lua memory: 1000000
"$BUILD"/bench/store_bench "sqlite:$dir/store_bench.db" 1000000
lua5.4 bench/store_bench.lua "sqlite:$dir/fork_bench.db" 0 fork
"$BUILD"/bench/sqlite_bench "$dir" 3
lua5.4 bench/engine_bench.lua "$dir"
# dispatch beside raw SQLite and the C API in the same run (bench/README.md "Dispatch")
"$BUILD"/bench/dispatch_bench "$dir"
"$BUILD"/bench/archive_bench "$dir" 200000 10000
# PostgreSQL: a throwaway server for this step only, started and removed by
# the same script as make test's (bench/README.md, "PostgreSQL").
sh spec/support/pg_cluster.sh run "$BUILD"/bench/pg_bench
