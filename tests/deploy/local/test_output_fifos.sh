#!/usr/bin/env bash
# Outputs that lie: a FIFO where the worker writes its trace (--trace) or training.log. Opening a FIFO for
# writing waits for a reader; the worker opens every output without blocking and names the kind instead.
#  - --trace at a FIFO: worker 0 stops at once (exit 1) with "cannot write trace file '<path>': a FIFO, not a
#    regular file", also while something holds the FIFO open for reading.
#  - training.log at a FIFO: a warning naming it ("cannot write <path>: a FIFO, not a regular file"), and the
#    run trains its step to the end.
source "$(dirname "$0")/cluster.sh" "$@"
write_one_step() { # write_one_step FILE
  run_ini "$1" 1 1 fifo-test-secret <<INI
[train]
$ONE_STEP_NET
output = $TMP/out
[data]
$ONE_STEP_DATA
INI
}
# one_step WHAT WANT_RC PATTERN TRACE: a 1 + 1 run of one step with --trace TRACE; worker 0 must exit within
# 60 s with WANT_RC and log a line matching PATTERN; the servers are stopped.
one_step() {
  local what=$1 want=$2 pattern=$3 trace=$4 rc=0
  write_one_step "$TMP/run.ini"
  start_cluster "$TMP/run.ini" 1 1 --trace "$trace" --max-steps 1
  wait_exit "${WPIDS[0]}" 60 || { show_logs; die "$what: worker blocked for 60 s"; }
  wait "${WPIDS[0]}" || rc=$?
  expect_eq "$what: worker exit" "$rc" "$want"
  expect_grep "$what: named" "$pattern" "$TMP/worker0.log"
  stop_servers
}
mkfifo "$TMP/trace.fifo"
refused="cannot write trace file '$TMP/trace.fifo': a FIFO, not a regular file"
one_step "trace at a FIFO" 1 "$refused" "$TMP/trace.fifo"
# The same with a reader holding the FIFO open (a write would succeed until the pipe fills).
exec 7<>"$TMP/trace.fifo"
one_step "trace at a read-open FIFO" 1 "$refused" "$TMP/trace.fifo"
exec 7>&-

# training.log at a FIFO: a warning, and the step is trained.
mkdir -p "$TMP/out"
rm -f "$TMP/out/training.log"
mkfifo "$TMP/out/training.log"
one_step "training.log at a FIFO" 0 "cannot write $TMP/out/training.log: a FIFO, not a regular file" "$TMP/trace"
expect_eq "steps traced with training.log at a FIFO" "$(wc -l <"$TMP/trace")" 1
expect_summary
