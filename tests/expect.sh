# shellcheck shell=bash
# The assertions every shell test shares (sourced; tests/check.h is the C side). A test sources it by its own
# path, e.g. from tests/tools: . "$(dirname "$0")/../expect.sh"; tests/deploy/local/cluster.sh sources it for
# the tests built on it. It sources tests/reference/skip.sh as well: ref_skip, ref_python and ref_run_py, for a
# missing reference or Python dependency (SKIP, or FAIL under PFCPS_REQUIRE_REFERENCES).
# Exit statuses as meson reads them: 0 pass, 77 skip, anything else a failure.
# Counted checks print "ok   NAME: ..." or "FAIL NAME: ..." and the test goes on; the failures are counted in
# expect_fails and expect_summary, the test's last line, turns the count into the exit status.
# Functions:
#   fail MSG...                    a failure: prints "FAIL: MSG", counts it; the test goes on
#   die MSG...                     a fatal failure: prints "FAIL: MSG" and exits 1 at once
#   skip WHY...                    prints "SKIP: WHY" and exits 77: a facility this machine lacks (root, a command,
#                                  a kernel feature); for a missing reference or Python module use ref_skip
#   ok MSG...                      prints "ok   MSG" (a check that passed, for the log)
#   expect_eq NAME GOT WANT        GOT and WANT are the same string
#   expect_rc NAME RC TEXT CMD...  runs CMD (stdout and stderr together); it must exit RC and print TEXT (a fixed
#                                  string; "" matches anything). Leaves the output in OUT and the status in RC.
#   expect_grep NAME PATTERN FILE  FILE ("-": standard input) has a line matching PATTERN (extended regex)
#   expect_summary                 prints "PASS" (exit 0) or "FAILED (N)" with N failures (exit 1)
# The expect_* functions return 0 when the check passed and 1 when it failed (so `expect_rc ... || continue`
# works); fail returns 0. Under set -e a failed expect_* check therefore ends the test at once, with status 1.

. "$(dirname "${BASH_SOURCE[0]}")/reference/skip.sh"

expect_fails=${expect_fails:-0} # kept when sourced twice (a test, then cluster.sh)

fail() {
  echo "FAIL: $*"
  expect_fails=$((expect_fails + 1))
}

die() {
  echo "FAIL: $*"
  exit 1
}

skip() {
  echo "SKIP: $*"
  exit 77
}

ok() { echo "ok   $*"; }

# expect_failed NAME MSG [OUTPUT]: the failure line of a counted check, then OUTPUT's first 20 lines indented.
expect_failed() {
  echo "FAIL $1: $2"
  if [ -n "${3:-}" ]; then head -n 20 <<<"$3" | sed 's/^/     | /'; fi
  expect_fails=$((expect_fails + 1))
  return 1
}

expect_eq() {
  if [ "$2" = "$3" ]; then
    ok "$1: [$2]"
  else
    expect_failed "$1" "got [$2], want [$3]"
  fi
}

expect_rc() {
  local name=$1 want=$2 text=$3
  shift 3
  RC=0
  OUT=$("$@" 2>&1) || RC=$?
  if [ "$RC" -eq "$want" ] && grep -qF -- "$text" <<<"$OUT"; then
    # the first line with TEXT; a daemon's log line without its time, pid and level
    ok "$name: exit $RC: $(grep -F -m 1 -- "$text" <<<"$OUT" | sed -E 's/^[0-9T:.-]+Z pid=[0-9]+ [^ ]+ [A-Z]+ //')"
  else
    expect_failed "$name" "exit $RC, expected $want and '$text' in the output:" "$OUT"
  fi
}

expect_grep() {
  local name=$1 pattern=$2 file=$3 line
  if line=$(grep -E -m 1 -- "$pattern" "$file"); then
    ok "$name: $line"
  else
    [ "$file" != - ] || file="the standard input"
    expect_failed "$name" "no line matches '$pattern' in $file"
  fi
}

expect_summary() {
  if [ "$expect_fails" -eq 0 ]; then
    echo PASS
    exit 0
  fi
  echo "FAILED ($expect_fails)"
  exit 1
}
