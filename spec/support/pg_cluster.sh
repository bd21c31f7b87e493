#!/bin/sh
# spec/support/pg_cluster.sh: a throwaway PostgreSQL cluster for the tests.
#
#   pg_cluster.sh start DIR     initdb + start a server in DIR (Unix socket in
#                               DIR, no TCP), create the database "estest";
#                               prints the libpq URL of that database
#   pg_cluster.sh stop DIR      stop the server and remove DIR
#   pg_cluster.sh run CMD...    start a cluster in a fresh temporary
#                               directory, run CMD with ES_TEST_URLS set to
#                               "memory: sqlite: <postgres URL>" (unless
#                               ES_TEST_URLS is already set) and ES_PG_URL
#                               to the URL, stop the cluster whatever CMD
#                               did, exit with CMD's status
#
# The server runs as the user running this script, or as "postgres" when
# that is root (PostgreSQL refuses to run as root). Settings favour speed
# over durability of this throwaway data (fsync off: nothing here must
# survive a machine crash). PG_BINDIR overrides where initdb and pg_ctl are
# found (default: the newest /usr/lib/postgresql/*/bin, then PATH).
set -u

bindir() {
  if [ -n "${PG_BINDIR:-}" ]; then echo "$PG_BINDIR"; return; fi
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return; fi
  p=$(command -v initdb 2>/dev/null) && { dirname "$p"; return; }
  echo "pg_cluster.sh: initdb not found (install the Debian package postgresql)" >&2
  exit 1
}

# Runs "$@" as the server's user.
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

pg_user() {
  if [ "$(id -u)" = 0 ]; then echo postgres; else id -un; fi
}

start() {
  dir=$1
  bin=$(bindir) || exit 1
  mkdir -p "$dir" || exit 1
  if [ "$(id -u)" = 0 ]; then chown postgres "$dir" || exit 1; fi
  chmod 700 "$dir"
  as_pg "$bin/initdb" -D "$dir/data" -U "$(pg_user)" --auth=trust -E UTF8 --locale=C \
    --no-sync >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
  # the socket directory must be reachable by the clients (tests run as
  # root or as the owner): 755 on DIR is enough, the data stays 700
  chmod 755 "$dir"
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses='' -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=32MB -c max_connections=300 -c max_locks_per_transaction=256 -c autovacuum=off" \
    start >/dev/null 2>&1 || { cat "$dir/server.log" >&2; exit 1; }
  as_pg "$bin/psql" -h "$dir" -U "$(pg_user)" -d postgres -q -c "CREATE DATABASE estest" >/dev/null ||
    exit 1
  echo "postgresql://$(pg_user)@/estest?host=$dir"
}

stop() {
  dir=$1
  bin=$(bindir) || exit 1
  if [ -d "$dir/data" ]; then
    as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  start) start "$2" ;;
  stop) stop "$2" ;;
  run)
    shift
    dir=$(mktemp -d /tmp/es-pg.XXXXXX) || exit 1
    trap 'stop "$dir"' EXIT
    trap 'exit 130' INT TERM
    url=$(start "$dir") || exit 1
    ES_PG_URL=$url
    export ES_PG_URL
    if [ -z "${ES_TEST_URLS:-}" ]; then
      ES_TEST_URLS="memory: sqlite: $url"
      export ES_TEST_URLS
    fi
    "$@"
    exit $?
    ;;
  *)
    echo "usage: pg_cluster.sh start DIR | stop DIR | run CMD..." >&2
    exit 2
    ;;
esac
