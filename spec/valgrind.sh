#!/bin/sh
# Runs the C unit tests and a Lua smoke run of the module under valgrind;
# any leak or memory error fails. Last line: "N passed, N failed, N
# skipped": the cases a test skips under valgrind (tap.h's skip(), "ok N -
# # SKIP why") are printed and counted apart, never as passed.
BUILD=${BUILD:-build}
ES_UNDER_VALGRIND=1 # tests skip what valgrind's one-thread-at-a-time scheduling cannot time
export ES_UNDER_VALGRIND
passed=0
failed=0
skipped=0
check() {
  name=$1
  shift
  valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect \
    --show-leak-kinds=definite,indirect "$@" >"$BUILD/valgrind.out" 2>"$BUILD/valgrind.log"
  rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "ok - valgrind $name"
    passed=$((passed + 1))
  else
    echo "not ok - valgrind $name"
    # How it ended: --quiet prints nothing for a program killed by a signal,
    # and a test's own failures are on its standard output.
    if [ "$rc" -eq 99 ]; then echo "# valgrind found errors (exit 99):"
    elif [ "$rc" -gt 128 ]; then echo "# killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null))"
    else echo "# exit status $rc"; fi
    cat "$BUILD/valgrind.log"
    sed -n 's/^not ok/#   not ok/p' "$BUILD/valgrind.out"
    echo "# the last lines of its output:"
    tail -n 5 "$BUILD/valgrind.out" | sed 's/^/#   /'
    failed=$((failed + 1))
  fi
  s=$(grep -ciE '^ok( [0-9]+)?( -)? # skip' "$BUILD/valgrind.out")
  if [ "$s" -gt 0 ]; then
    grep -iE '^ok( [0-9]+)?( -)? # skip' "$BUILD/valgrind.out" | sed "s/^ok[^#]*# [sS][kK][iI][pP]/ok - # SKIP $name:/"
    skipped=$((skipped + s))
  fi
}
for t in "$BUILD"/ctest/*; do
  [ -x "$t" ] || continue
  check "$(basename "$t")" "$t"
done
check "lua smoke" lua5.4 spec/support/valgrind_smoke.lua
rm -f "$BUILD/valgrind.out"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
