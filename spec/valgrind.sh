#!/bin/sh
# Runs the C unit tests and a Lua smoke run of the module under valgrind;
# any leak or memory error fails. Last line: "N passed, N failed".
BUILD=${BUILD:-build}
ES_UNDER_VALGRIND=1 # tests skip what valgrind's one-thread-at-a-time scheduling cannot time
export ES_UNDER_VALGRIND
passed=0
failed=0
check() {
  name=$1
  shift
  if valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect \
      --show-leak-kinds=definite,indirect "$@" >/dev/null 2>"$BUILD/valgrind.log"; then
    echo "ok - valgrind $name"
    passed=$((passed + 1))
  else
    echo "not ok - valgrind $name"
    cat "$BUILD/valgrind.log"
    failed=$((failed + 1))
  fi
}
for t in "$BUILD"/ctest/*; do
  [ -x "$t" ] || continue
  check "$(basename "$t")" "$t"
done
check "lua smoke" lua5.4 spec/support/valgrind_smoke.lua
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
