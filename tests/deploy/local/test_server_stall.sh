#!/usr/bin/env bash
# The right culprit: a server stopped with SIGSTOP (alive, not answering) is named by the workers. ctl_timeout
# 4 s, so a worker waits 4 x 4 = 16 s for a server and says every 1 s (timeout / 16) whom it waits for.
#   1. SIGSTOP server 1 for 5 s: worker logs say "still waiting for server 1"; after SIGCONT training goes on.
#   2. SIGSTOP server 1 for good: the workers stop within ~25 s and at least one error names server 1.
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1
run_ini "$TMP/run.ini" 2 2 stall-secret "ctl_timeout = 4" <<INI
[train]
$ENDLESS_NET
output = $TMP/out
[data]
$ENDLESS_DATA
INI
start_cluster "$TMP/run.ini" 2 2 --trace "$TMP/trace{r}"
wait_trace "$TMP/trace0" 3 "training did not start"
kill -STOP "${SPIDS[1]}"
sleep 5
kill -CONT "${SPIDS[1]}"
grep -q "still waiting for server 1 " "$TMP/worker0.log" "$TMP/worker1.log" || { show_logs; die "no worker named the stalled server 1"; }
grep -h "still waiting for server 1" "$TMP"/worker*.log | head -2 | sed 's/^.* WARN /  /'
n0=$(wc -l <"$TMP/trace0")
wait_trace "$TMP/trace0" $((n0 + 3)) "training did not go on after SIGCONT"
echo "ok: 5 s stall named, training went on"
kill -STOP "${SPIDS[1]}"
t0=$SECONDS
for p in "${WPIDS[@]}"; do wait_exit "$p" 40 || { kill -CONT "${SPIDS[1]}"; show_logs; die "a worker still runs 40 s after server 1 stopped answering"; }; done
kill -CONT "${SPIDS[1]}"
grep -h "ERROR" "$TMP"/worker*.log | head -4 | sed 's/^.* ERROR /  /'
grep -q "ERROR.*server 1" "$TMP/worker0.log" "$TMP/worker1.log" || { show_logs; die "no worker error names server 1"; }
echo "ok: workers stopped after $((SECONDS - t0)) s naming server 1"
echo PASS
