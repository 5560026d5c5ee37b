#!/usr/bin/env bash
# A second run started on the rendezvous of a running one, with the same secret (a user who runs the quick
# start twice with PFCPS_SECRET exported): its members' joins are refused while the seats' members are
# connected, and the running run goes on. 1 server + 1 worker train an endless run; then a second server 0
# (its rendezvous port is taken: it fails to bind it) and a second worker 0 start on the same config with
# join_timeout = 3.
#  - The second worker gives up after its join_timeout (exit 1) naming the cause: "worker rank 0 is held by a
#    live member of the formed run (...): is a second process of this rank running (...), or another run using
#    this rendezvous and secret?".
#  - The first run does not re-form: its server logs no rejoin, its worker keeps training (its trace grows by
#    at least 5 steps after the second worker gave up) and stops in order on SIGTERM (exit 0).
source "$(dirname "$0")/cluster.sh" "$@"
start_endless 1 1 second-run-secret "the first run did not train a step"
"$SERVER" --config "$TMP/run.ini" --rank 0 --set join_timeout=3 >"$TMP/server0.second.log" 2>&1 &
s2=$!; PIDS+=($s2)
"$WORKER" --config "$TMP/run.ini" --rank 0 --set join_timeout=3 >"$TMP/worker0.second.log" 2>&1 &
w2=$!; PIDS+=($w2)
wait_exit "$w2" 60 || { show_logs; die "the second worker still runs after 60 s"; }
rc=0; wait "$w2" || rc=$?
expect_eq "second worker's exit" "$rc" 1
expect_grep "second worker names the cause" \
  "worker rank 0 is held by a live member of the formed run .*: is a second process of this rank running .*, or another run using this rendezvous and secret" \
  "$TMP/worker0.second.log"
wait_exit "$s2" 30 || die "the second server 0 still runs after 30 s"
rc=0; wait "$s2" || rc=$?
[ "$rc" -ne 0 ] && ok "second server 0 exited $rc: $(grep -m1 ERROR "$TMP/server0.second.log")" ||
  fail "second server 0 exited 0"
n=$(wc -l <"$TMP/trace0")
wait_trace "$TMP/trace0" $((n + 5)) "the first run stopped training after the second run's joins"
ok "the first run trained on: $n then $(wc -l <"$TMP/trace0") steps"
if grep -q "joined again" "$TMP/server0.log"; then fail "the first run re-formed: $(grep -m1 'joined again' "$TMP/server0.log")"; else ok "no rejoin in the first run's server log"; fi
kill -TERM "${WPIDS[0]}"
rc=0; wait "${WPIDS[0]}" || rc=$?
expect_eq "first run's worker exit on SIGTERM" "$rc" 0
stop_servers
expect_summary
