#!/bin/sh
# Runs every test: each busted spec file (the conformance suite runs once per
# backend URL in ES_TEST_URLS) and each C test in $BUILD/ctest, each as a
# process of its own, ES_JOBS of them at a time (default: one more than the
# cores, 3 on 2 cores: many files spend much of their time waiting on
# children, servers and timers). Prints one line
# per file as it finishes (its counts and time; with its failures and skips
# under it), and a closing line "N passed, N failed, N skipped" summing all
# of them (CI reads its "N passed, N failed" prefix). Exits non-zero when
# anything failed. A file still running after ES_FILE_TIMEOUT seconds
# (default 1800, ten times the longest) is a hang: it is killed and fails.
#
# A skipped test ("ok N - # SKIP why", busted's pending or tap.h's skip())
# is counted apart, never as passed. A skip whose reason names a requirement
# `make deps` installs as a word followed by a colon ("postgres: ...",
# "chromium: ...", also after the describe names busted puts first) also
# fails the run, unless ES_ALLOW_SKIP names it (ES_ALLOW_SKIP=postgres,chromium):
# a machine that should run those tests must not pass without them.
#
# ES_VERBOSE=1 prints every file's whole TAP output, not only its failures.
# `sh spec/run.sh FILE...` runs only those files (spec files or C tests).
BUILD=${BUILD:-build}
LUA=${LUA:-lua5.4}
JOBS=${ES_JOBS:-$(($(nproc 2>/dev/null || echo 2) + 1))}
NEEDS="postgres chromium"
# Files that stop or restart PostgreSQL: each gets a throwaway cluster of
# its own (spec/support/pg_cluster.sh run; a few seconds of initdb), so
# that the run's shared server stays up for the files beside them. (They
# ran alone after all the others, which left one core idle for their
# whole time at the end of every run.)
OWN_CLUSTER="spec/33-postgres_restart_spec.lua spec/84-http_metrics_spec.lua"
# The longest files start first (longest first, as measured: spec/README.md
# "How long"), so that the last ones to finish are short; but a short one
# third, so that the first progress line comes within seconds, not minutes.
FIRST="spec/34-shards_spec.lua spec/16-store_hostile_input_spec.lua spec/01-json_spec.lua spec/99-soak_spec.lua
  spec/43-engine_budgets_spec.lua spec/33-postgres_silent_net_spec.lua spec/40-engine_spec.lua
  spec/32-postgres_engines_spec.lua spec/10-store_append_spec.lua spec/87-http_attacks_spec.lua
  spec/33-postgres_restart_spec.lua spec/11-store_dispatch_spec.lua spec/50-cli_spec.lua
  spec/63-replay_spec.lua spec/48-engine_prefetch_spec.lua spec/64-cli_replay_spec.lua
  spec/15-store_errors_spec.lua spec/31-postgres_spec.lua spec/86-http_inspector_spec.lua
  spec/18-store_branches_spec.lua spec/26-store_archive_spec.lua spec/42-engine_crash_spec.lua
  $BUILD/ctest/memory_backend_test $BUILD/ctest/sqlite_backend_test spec/83-http_sse_spec.lua
  $BUILD/ctest/store_threads_test spec/49-engine_ack_crash_spec.lua"
SKIP_RE='^ok( [0-9]+)?( -)? # skip'

# Runs one test file, keeps its output in $ES_RUN_DIR/NAME.out and its
# counts in NAME.res, and prints its progress line (and its failures).
run_one() {
  t=$1
  name=$(printf '%s' "$t" | tr '/' '_')
  out="$ES_RUN_DIR/$name.out"
  started=$(date +%s.%N)
  case $t in
    *.lua) set -- $LUA /usr/bin/busted --config-file=spec/.busted --output=TAP "$t" ;;
    *) set -- "$t" ;;
  esac
  if [ -n "${ES_PG_DIR:-}" ] && is_in "$t" "$OWN_CLUSTER"; then
    # its own cluster; --own-cluster puts its URL in ES_TEST_URLS in place
    # of the shared one's
    set -- env ES_SHARED_PG_URL="${ES_PG_URL:-}" sh spec/support/pg_cluster.sh run sh "$0" --own-cluster "$@"
  fi
  # --foreground: in the run's process group, so that Ctrl-C reaches the test
  timeout --foreground -k 10 "${ES_FILE_TIMEOUT:-1800}" "$@" >"$out" 2>&1 </dev/null
  status=$?
  secs=$(echo "$started $(date +%s.%N)" | awk '{ printf "%.1f", $2 - $1 }')
  # Died (a crash in the module kills the whole file) after some results:
  # what came after the last result never ran. Counted even when other
  # tests failed, so the summary cannot look nearly green. busted ends
  # with "1..N" unless it died (its exit status is its failure count); a C
  # test exits 0 or 1 unless it died.
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "not ok - $t timed out (ES_FILE_TIMEOUT=${ES_FILE_TIMEOUT:-1800} s): killed as hung" >>"$out"
  elif case $t in *.lua) ! grep -q '^1\.\.[0-9]' "$out" ;; *) [ "$status" -gt 128 ] ;; esac; then
    echo "not ok - $t died (exit status $status): the tests after the last result above did not run" >>"$out"
  elif [ "$status" -ne 0 ] && ! grep -q '^not ok ' "$out"; then
    # failed without a failed test (a C test that exits early): count it
    echo "not ok - $t exited with status $status without a failed test" >>"$out"
  fi
  s=$(grep -ciE "$SKIP_RE" "$out")
  p=$(($(grep -c '^ok ' "$out") - s))
  f=$(grep -c '^not ok' "$out")
  # one writer at a time: the lines of two files never interleave, and
  # the counts are written under the lock too, so that two files ending
  # together get two numbers ([47/112], [48/112]), not the same one twice
  (
    flock 9
    echo "$p $f $s" >"$ES_RUN_DIR/$name.res"
    done_n=$(ls "$ES_RUN_DIR" | grep -c '\.res$')
    printf '[%2d/%d] %-44s %5d passed, %d failed, %d skipped  %6s s\n' \
      "$done_n" "$ES_RUN_TOTAL" "$t" "$p" "$f" "$s" "$secs"
    if [ -n "${ES_VERBOSE:-}" ]; then
      sed 's/^/    /' "$out"
    elif [ "$f" -gt 0 ]; then
      # the failures with what explains them (every line but the passes),
      # not indented: CI looks for lines that begin "not ok"
      grep -v '^ok ' "$out"
    elif [ "$s" -gt 0 ]; then
      grep -iE "$SKIP_RE" "$out" | sed 's/^/    /'
    fi
  ) 9>>"$ES_RUN_DIR/lock"
}

is_in() { case " $(echo $2) " in *" $1 "*) return 0 ;; esac; return 1; }

# The whole run, in a function: sh reads a function whole before running
# it, so that editing this file while it runs cannot break the run (the
# files it runs read it again, as they start).
main() {
  ES_RUN_DIR=$(mktemp -d) || exit 1
  trap 'rm -rf "$ES_RUN_DIR"' EXIT
  export ES_RUN_DIR BUILD LUA

  # the pool: FIRST, then the other spec files, then the C tests (or the
  # files named on the command line)
  if [ $# -gt 0 ]; then
    all=$(printf '%s\n' "$@")
  else
    all=$(
      for t in $FIRST; do [ -f "$t" ] && echo "$t"; done
      for t in spec/*_spec.lua; do is_in "$t" "$FIRST" || echo "$t"; done
      for t in "$BUILD"/ctest/*; do [ -f "$t" ] && [ -x "$t" ] && ! is_in "$t" "$FIRST" && echo "$t"; done
    )
  fi
  ES_RUN_TOTAL=$(printf '%s\n' $all | grep -c .)
  export ES_RUN_TOTAL
  echo "# $ES_RUN_TOTAL test files, $JOBS at a time (ES_JOBS); backends: ${ES_TEST_URLS:-memory: sqlite:}"

  started=$(date +%s)
  printf '%s\n' $all | xargs -P "$JOBS" -n 1 sh "$0" --one

  passed=0
  failed=0
  skipped=0
  for r in "$ES_RUN_DIR"/*.res; do
    read -r p f s <"$r"
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + s))
  done
  reported=$(ls "$ES_RUN_DIR" | grep -c '\.res$')
  if [ "$reported" -ne "$ES_RUN_TOTAL" ]; then
    echo "not ok - $((ES_RUN_TOTAL - reported)) of $ES_RUN_TOTAL test files did not report (the runner itself failed)"
    failed=$((failed + 1))
  fi

  # Skips for want of what `make deps` installs fail the run unless asked for.
  allowed=$(echo "${ES_ALLOW_SKIP:-}" | tr ',' ' ')
  for need in $NEEDS; do
    n=$(cat "$ES_RUN_DIR"/*.out | grep -ciE "$SKIP_RE (.* )?$need: ")
    [ "$n" -gt 0 ] || continue
    if is_in "$need" "$allowed"; then
      echo "# $n tests skipped for want of $need (allowed: ES_ALLOW_SKIP names it)"
    else
      echo "not ok - $n tests skipped for want of $need: \`make deps\` installs it; set ES_ALLOW_SKIP=$need to skip them on purpose"
      failed=$((failed + 1))
    fi
  done

  echo "# $((ES_RUN_TOTAL)) test files in $(($(date +%s) - started)) s"
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" -eq 0 ]
}

if [ "${1:-}" = "--one" ]; then run_one "$2"; exit 0; fi
if [ "${1:-}" = "--own-cluster" ]; then
  shift
  set -f # the URLs hold '?'
  urls=
  for u in ${ES_TEST_URLS:-}; do
    [ "$u" = "$ES_SHARED_PG_URL" ] && u=$ES_PG_URL
    urls="$urls${urls:+ }$u"
  done
  set +f
  ES_TEST_URLS=$urls
  export ES_TEST_URLS
  exec "$@"
fi
main "$@"; exit $?
