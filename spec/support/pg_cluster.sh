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
#                               ES_TEST_URLS is already set), ES_PG_URL to
#                               the URL and ES_PG_DIR to the directory, stop
#                               the cluster whatever CMD did, exit with
#                               CMD's status. Without PostgreSQL installed
#                               (no initdb), runs CMD without them: the
#                               PostgreSQL tests then report SKIP
#                               "postgres: ...", which spec/run.sh fails
#                               unless ES_ALLOW_SKIP names postgres
#
# For fault tests (spec/33-postgres_restart_spec.lua), on a cluster that
# start (or run) made, keeping its data:
#   pg_cluster.sh restart DIR       pg_ctl restart (fast: connections are
#                                   terminated, transactions rolled back)
#   pg_cluster.sh stop-server DIR   stop the server (fast); the socket goes
#   pg_cluster.sh start-server DIR  start it again with the same settings
#
# The server runs as the user running this script, or as "postgres" when
# that is root (PostgreSQL refuses to run as root). Settings favour speed
# over durability of this throwaway data (fsync off: nothing here must
# survive a machine crash). PG_BINDIR overrides where initdb and pg_ctl are
# found (default: the newest /usr/lib/postgresql/*/bin, then PATH);
# PG_BINDIR=/nowhere runs as if PostgreSQL were not installed.
set -u

bindir() {
  if [ -n "${PG_BINDIR:-}" ]; then
    [ -x "$PG_BINDIR/initdb" ] || { echo "pg_cluster.sh: no initdb in PG_BINDIR=$PG_BINDIR" >&2; exit 1; }
    echo "$PG_BINDIR"; return
  fi
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

# The server's settings (for start and start-server/restart alike).
server_opts() {
  echo "-c listen_addresses='' -k $1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=32MB -c max_connections=300 -c max_locks_per_transaction=256 -c autovacuum=off"
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
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$(server_opts "$dir")" \
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

# pg_ctl ACTION on the server of DIR (which start made), waiting for it.
server() {
  dir=$2
  bin=$(bindir) || exit 1
  [ -d "$dir/data" ] || { echo "pg_cluster.sh: no cluster in $dir" >&2; exit 1; }
  case $1 in
    restart | start)
      as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -m fast -o "$(server_opts "$dir")" \
        "$1" >/dev/null 2>&1 || { tail -n 20 "$dir/server.log" >&2; exit 1; } ;;
    stop)
      as_pg "$bin/pg_ctl" -D "$dir/data" -w -t 60 -m fast stop >/dev/null 2>&1 ||
        { tail -n 20 "$dir/server.log" >&2; exit 1; } ;;
  esac
}

case "${1:-}" in
  start) start "$2" ;;
  stop) stop "$2" ;;
  restart) server restart "$2" ;;
  stop-server) server stop "$2" ;;
  start-server) server start "$2" ;;
  run)
    shift
    if ! (bindir) >/dev/null 2>&1; then
      echo "pg_cluster.sh: PostgreSQL is not installed (no initdb; make deps installs it): running without it" >&2
      "$@"
      exit $?
    fi
    dir=$(mktemp -d /tmp/es-pg.XXXXXX) || exit 1
    trap 'stop "$dir"' EXIT
    trap 'exit 130' INT TERM
    url=$(start "$dir") || exit 1
    ES_PG_URL=$url
    ES_PG_DIR=$dir
    export ES_PG_URL ES_PG_DIR
    if [ -z "${ES_TEST_URLS:-}" ]; then
      ES_TEST_URLS="memory: sqlite: $url"
      export ES_TEST_URLS
    fi
    "$@"
    exit $?
    ;;
  *)
    echo "usage: pg_cluster.sh start DIR | stop DIR | run CMD... | restart DIR | stop-server DIR | start-server DIR" >&2
    exit 2
    ;;
esac
