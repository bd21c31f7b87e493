#!/bin/sh
# http_bench.sh (make bench-http): eventstore serve under a real HTTP load
# generator (wrk, Debian) on loopback, beside the same operations through
# the Lua API in the same run, then many Server-Sent Events clients on one
# session (bench/sse_fanout). bench/README.md, "HTTP (issue 13)", has one
# run's figures and how to read them.
#
# The server: the built binary, `serve --no-engine` (appended events stay
# pending: no handler runs, as for a store fed by remote writers) on a fresh
# sqlite: file, default durability, a hashed admin token.
#
# Settings (environment):
#   HTTP_BENCH_SECONDS   seconds per wrk run and per Lua API loop (5)
#   HTTP_BENCH_CONNS     wrk connection counts (1 16 64); 2 wrk threads (1 for
#                        one connection: the per-request cost beside one Lua call)
#   HTTP_BENCH_SSE       SSE client counts (100 500)
#   HTTP_BENCH_SSE_EVENTS  events appended for the fan-out (1000, batches of 100)
BUILD=${BUILD:-build}
BIN=$BUILD/bin/eventstore
FANOUT=$BUILD/bench/sse_fanout
SECS=${HTTP_BENCH_SECONDS:-5}
CONNS=${HTTP_BENCH_CONNS:-1 16 64}
SSE=${HTTP_BENCH_SSE:-100 500}
SSE_EVENTS=${HTTP_BENCH_SSE_EVENTS:-1000}
LUA=${LUA:-lua5.4}

set -e
for tool in wrk curl; do
  command -v $tool >/dev/null || { echo "http_bench: needs $tool (make deps installs it)" >&2; exit 1; }
done
[ -x "$BIN" ] && [ -x "$FANOUT" ] || { echo "http_bench: build first (make bench-http)" >&2; exit 1; }

dir=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The SSE clients need as many streams and connections as they are, plus
# wrk's; the server's defaults are lower (docs/http.md, "Limits"). The sum
# of every run's clients: a closed stream's slot is freed when the server
# next writes to it (an event, or the keep-alive comment every 15 s), so
# one run's streams may still count when the next one opens its own.
max_sse=0
for n in $SSE; do max_sse=$((max_sse + n)); done
max_conns=0
for c in $CONNS; do [ "$c" -gt "$max_conns" ] && max_conns=$c; done

token=bench-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
printf '%s * read,append,work,admin\n' "$("$BIN" token hash "$token")" >"$dir/tokens"
mkdir -p "$dir/scripts"
"$BIN" serve --db "sqlite:$dir/http.db" --scripts "$dir/scripts" --listen 127.0.0.1:0 \
  --tokens "$dir/tokens" --no-engine \
  --max-streams $((max_sse + 16)) --max-connections $((max_sse + max_conns + 64)) \
  >"$dir/serve.log" 2>&1 &
pid=$!
port=
i=0
while [ $i -lt 200 ]; do
  port=$(sed -n 's/^listening on http:\/\/127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$dir/serve.log")
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
  i=$((i + 1))
done
if [ -z "$port" ]; then
  echo "http_bench: eventstore serve did not start:" >&2
  cat "$dir/serve.log" >&2
  exit 1
fi
url=http://127.0.0.1:$port
auth="Authorization: Bearer $token"

# The read session: 1,000 events, appended in 10 batches of 100.
payload='{"customer":"c-000123","items":[{"qty":2,"sku":"SKU-42"}],"note":"leave at the door"}'
for b in 0 1 2 3 4 5 6 7 8 9; do
  body=$(awk -v b=$b -v p="$payload" 'BEGIN {
    printf "{\"events\":["
    for (i = 1; i <= 100; i++) printf "%s{\"type\":\"order.placed\",\"payload\":%s}", (i > 1 ? "," : ""), p
    printf "]}" }')
  curl -sf -o /dev/null -H "$auth" -H 'Content-Type: application/json' --data-binary "$body" \
    "$url/v1/sessions/read-1000/events" || { echo "http_bench: filling read-1000 failed" >&2; exit 1; }
done

echo "HTTP bench: sqlite: on loopback, wrk 2 threads (1 for 1 connection), ${SECS} s a run; $(nproc) cores shared by wrk and the server"

# The Lua API, same kind of store, one thread (a fresh file of its own).
"$LUA" bench/http_lua_api.lua "sqlite:$dir/lua.db" "$SECS" >"$dir/lua.txt"

# wrk: every operation at every connection count.
: >"$dir/http.txt"
run() { # op conns label args...
  op=$1 c=$2 label=$3
  shift 3
  t=2
  [ "$c" -lt 2 ] && t=1
  wrk -t$t -c"$c" -d"${SECS}s" -s bench/http_wrk.lua "$url" -- "$op" "$token" "$label" "$@" \
    >"$dir/wrk.out" 2>&1 || true
  if ! grep -q '^RESULT ' "$dir/wrk.out"; then
    echo "http_bench: wrk $op -c$c gave no result:" >&2
    cat "$dir/wrk.out" >&2
    exit 1
  fi
  grep '^RESULT ' "$dir/wrk.out" | sed "s/^RESULT /RESULT $op $c /" >>"$dir/http.txt"
}
for c in $CONNS; do
  run append "$c" a1c$c 1
  run append "$c" a100c$c 100
  run read "$c" r$c read-1000 1000
  run head "$c" h$c read-1000
done

# One table: HTTP beside the Lua API. events/s = requests/s x events per
# request (1 or 100 for appends, 100 for a read, none for head).
awk '
  FILENAME ~ /lua.txt$/ { lua[$2] = $4; luap50[$2] = $5; next }
  {
    op = $2; label = $4
    if (op == "append") { n = (label ~ /^a100/) ? 100 : 1; key = "append" n; name = "append, batch " n }
    else if (op == "read") { n = 100; key = "read100"; name = "read 100 of 1000" }
    else { n = 0; key = "head"; name = "head" }
    rows[++nr] = sprintf("%-18s %5d %9.0f %10s %8.2f %8.2f | %10s %8.3f %8s%s", name, $3, $6,
      n ? sprintf("%.0f", $6 * n) : "-", $7, $8,
      n ? sprintf("%.0f", lua[key] * n) : sprintf("%.0f/s", lua[key]), luap50[key],
      sprintf("%.2f", lua[key] > 0 ? $6 / lua[key] : 0),
      ($9 + $10 > 0) ? sprintf("  (%d non-2xx, %d socket errors)", $9, $10) : "")
    if ($9 + $10 > 0) bad = 1
  }
  END {
    printf "%-18s %5s %9s %10s %8s %8s | %10s %8s %8s\n", "operation", "conns", "req/s", "events/s",
      "p50 ms", "p99 ms", "Lua ev/s", "Lua p50", "HTTP/Lua"
    for (i = 1; i <= nr; i++) print rows[i]
    if (bad) { print "http_bench: some requests failed (see the rows above)" > "/dev/stderr"; exit 1 }
  }' "$dir/lua.txt" "$dir/http.txt"

# Many SSE clients on one session each run (a fresh one).
for n in $SSE; do
  "$FANOUT" 127.0.0.1 "$port" "$token" "fanout-$n" "$n" "$SSE_EVENTS" 100 | grep -v '^SSE '
done
