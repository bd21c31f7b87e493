#!/bin/sh
# spec/support/pg_pair.sh: a throwaway PostgreSQL primary and streaming
# standby, for failover (spec/33-postgres_failover_spec.lua, make
# failover-demo).
#
#   pg_pair.sh start DIR MODE     MODE sync or async: initdb a primary in
#                                 DIR/a, clone a standby into DIR/b with
#                                 pg_basebackup -R, start it, and (sync)
#                                 name it in synchronous_standby_names, so
#                                 that a commit returns once the standby
#                                 has it; wait until it streams; print the
#                                 multi-host libpq URL of database estest
#                                 (host=DIR/a,DIR/b,
#                                 target_session_attrs=read-write)
#   pg_pair.sh kill-primary DIR   kill -9 the primary's postmaster and
#                                 every process of it at once (as a machine
#                                 that dies): nothing is flushed or closed
#   pg_pair.sh promote DIR        promote the standby (pg_ctl promote -w)
#   pg_pair.sh stop DIR           stop both (immediate) and remove DIR
#
# Unix sockets only (each server's socket in its own directory), trust
# authentication, as spec/support/pg_cluster.sh (whose rules for root and
# PG_BINDIR apply). Unlike that cluster's, commits are synchronous
# (synchronous_commit=on): what the standby acknowledged is what failover
# keeps. fsync stays off: a process killed with -9 loses nothing the
# kernel has; only a machine crash would, and none is simulated here.
set -u


bindir() {
  if [ -n "${PG_BINDIR:-}" ]; then echo "$PG_BINDIR"; return; fi
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return; fi
  p=$(command -v initdb 2>/dev/null) && { dirname "$p"; return; }
  echo "pg_pair.sh: initdb not found (install the Debian package postgresql)" >&2
  exit 1
}

as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_user() {
  if [ "$(id -u)" = 0 ]; then echo postgres; else id -un; fi
}

opts() {
  echo "-c listen_addresses='' -k $1 -c fsync=off -c full_page_writes=off -c shared_buffers=32MB -c max_connections=100 -c max_locks_per_transaction=256 -c autovacuum=off -c wal_level=replica -c max_wal_senders=4 -c hot_standby=on -c wal_keep_size=256MB"
}

start() {
  dir=$1 mode=$2
  bin=$(bindir) || exit 1
  mkdir -p "$dir/a" "$dir/b" || exit 1
  if [ "$(id -u)" = 0 ]; then chown postgres "$dir" "$dir/a" "$dir/b" || exit 1; fi
  chmod 755 "$dir" "$dir/a" "$dir/b"
  as_pg "$bin/initdb" -D "$dir/a/data" -U "$(pg_user)" --auth=trust -E UTF8 --locale=C \
    --no-sync >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
  echo "local replication all trust" | as_pg tee -a "$dir/a/data/pg_hba.conf" >/dev/null
  as_pg "$bin/pg_ctl" -D "$dir/a/data" -l "$dir/a/server.log" -w -t 60 -o "$(opts "$dir/a")" \
    start >/dev/null 2>&1 || { cat "$dir/a/server.log" >&2; exit 1; }
  as_pg "$bin/pg_basebackup" -h "$dir/a" -U "$(pg_user)" -D "$dir/b/data" -R -X stream \
    --no-sync >"$dir/basebackup.log" 2>&1 || { cat "$dir/basebackup.log" >&2; exit 1; }
  # the standby names itself in its connection to the primary
  echo "primary_conninfo = 'host=$dir/a user=$(pg_user) application_name=standby'" |
    as_pg tee -a "$dir/b/data/postgresql.auto.conf" >/dev/null
  as_pg "$bin/pg_ctl" -D "$dir/b/data" -l "$dir/b/server.log" -w -t 60 -o "$(opts "$dir/b")" \
    start >/dev/null 2>&1 || { cat "$dir/b/server.log" >&2; exit 1; }
  psql_a="$bin/psql -h $dir/a -U $(pg_user) -d postgres -qAt"
  if [ "$mode" = sync ]; then
    as_pg $psql_a -c "ALTER SYSTEM SET synchronous_standby_names = 'standby'" -c "SELECT pg_reload_conf()" \
      >/dev/null || exit 1
  fi
  # streaming (and, sync, the synchronous standby) before anything counts
  want=async
  [ "$mode" = sync ] && want=sync
  i=0
  until [ "$(as_pg $psql_a -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby' AND state = 'streaming'")" = "$want" ]; do
    i=$((i + 1))
    [ $i -gt 600 ] && { echo "pg_pair.sh: the standby does not stream ($want)" >&2; tail -n 20 "$dir/b/server.log" >&2; exit 1; }
    sleep 0.1
  done
  as_pg $psql_a -c "CREATE DATABASE estest" >/dev/null || exit 1
  echo "postgresql://$(pg_user)@/estest?host=$dir/a,$dir/b&target_session_attrs=read-write"
}

kill_primary() {
  dir=$1
  pid=$(head -n 1 "$dir/a/data/postmaster.pid" 2>/dev/null) || { echo "pg_pair.sh: no primary running in $dir" >&2; exit 1; }
  # the postmaster's children (backends, walsender, writer) by parent pid,
  # then the postmaster, in one kill: nothing runs on to flush or close
  kill -9 $(ps -o pid= --ppid "$pid") "$pid" 2>/dev/null
  i=0
  while kill -0 "$pid" 2>/dev/null; do
    i=$((i + 1)); [ $i -gt 600 ] && exit 1
    sleep 0.05
  done
}

case "${1:-}" in
  start) start "$2" "${3:-sync}" ;;
  kill-primary) kill_primary "$2" ;;
  promote)
    bin=$(bindir) || exit 1
    as_pg "$bin/pg_ctl" -D "$2/b/data" -w -t 60 promote >/dev/null || { tail -n 20 "$2/b/server.log" >&2; exit 1; } ;;
  stop)
    bin=$(bindir) || exit 1
    for s in a b; do
      [ -d "$2/$s/data" ] && as_pg "$bin/pg_ctl" -D "$2/$s/data" -m immediate -w stop >/dev/null 2>&1
    done
    rm -rf "$2" ;;
  *)
    echo "usage: pg_pair.sh start DIR sync|async | kill-primary DIR | promote DIR | stop DIR" >&2
    exit 2 ;;
esac
