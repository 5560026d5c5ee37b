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
mkfifo "$TMP/trace.fifo"
write_one_step "$TMP/run.ini"
start_cluster "$TMP/run.ini" 1 1 --trace "$TMP/trace.fifo" --max-steps 1
wait_exit "${WPIDS[0]}" 30 || { show_logs; die "worker blocked on the trace FIFO for 30 s"; }
rc=0; wait "${WPIDS[0]}" || rc=$?
expect_eq "worker exit with the trace at a FIFO" "$rc" 1
expect_grep "trace FIFO refused" "cannot write trace file '$TMP/trace.fifo': a FIFO, not a regular file" \
  "$TMP/worker0.log"
stop_servers

# The same with a reader holding the FIFO open (a write would succeed until the pipe fills).
exec 7<>"$TMP/trace.fifo"
write_one_step "$TMP/run.ini"
start_cluster "$TMP/run.ini" 1 1 --trace "$TMP/trace.fifo" --max-steps 1
wait_exit "${WPIDS[0]}" 30 || { show_logs; die "worker blocked on the read-open trace FIFO for 30 s"; }
rc=0; wait "${WPIDS[0]}" || rc=$?
expect_eq "worker exit with the trace at a read-open FIFO" "$rc" 1
expect_grep "read-open trace FIFO refused" "cannot write trace file '$TMP/trace.fifo': a FIFO, not a regular file" \
  "$TMP/worker0.log"
exec 7>&-
stop_servers

# training.log at a FIFO: a warning, and the step is trained.
mkdir -p "$TMP/out"
rm -f "$TMP/out/training.log"
mkfifo "$TMP/out/training.log"
write_one_step "$TMP/run.ini"
start_cluster "$TMP/run.ini" 1 1 --trace "$TMP/trace" --max-steps 1
wait_exit "${WPIDS[0]}" 60 || { show_logs; die "worker blocked on the training.log FIFO for 60 s"; }
rc=0; wait "${WPIDS[0]}" || rc=$?
expect_eq "worker exit with training.log at a FIFO" "$rc" 0
expect_grep "training.log FIFO warned" "cannot write $TMP/out/training.log: a FIFO, not a regular file" \
  "$TMP/worker0.log"
expect_eq "steps traced with training.log at a FIFO" "$(wc -l <"$TMP/trace")" 1
stop_servers
expect_summary
