#!/usr/bin/env bash
# A restarted server rejoins a running replicas = 1 run (docs/architecture.md, "Hot-standby shards", Rejoin),
# and the run then survives a loss it could only survive with the rejoined copies correct.
# Reference: cluster.sh recovery_ref (2 servers + 2 workers, replicas = 0, 10 ORL identities in a table of 40
# classes sampled at 0.25, pfc_update = dense, 36 steps, snapshot_every 4, uninterrupted; the table's bits do
# not depend on the number of servers). Then, without a launcher:
#   rejoin:   replicas = 1, 3 servers: kill -9 of server 1 once worker 0 logged a step in 5..8 (shard 1 goes on
#             on its backup on server 2, shard 0 on its primary alone); server 1 started again with the same
#             command line joins as a learner, copies shard 1 and shard 0's backup from the checkpoint the
#             workers take for it, and the rendezvous says every shard has two copies again; then kill -9 of
#             server 2, which held shard 1's other copy: the run goes on only because server 1's copy of
#             shard 1 is there (without the rejoin this loss re-forms the run: test_replicas.sh's "both"
#             case), and it ends with every worker and the surviving servers exiting 0 and a model.ckpt and
#             final checkpoint (`pfcps ckpt-info` table and backbone SHA-256) equal to the reference's;
#   aborted:  replicas = 1, 3 servers: kill -9 of server 1, restarted as pfcps-server-test-hooks (the server built
#             with the tests' failure hooks) with PFCPS_TEST_REJOIN_EXIT_BEFORE_READY=1
#             (it loads its copies, then exits before it says ready: a learner that dies while copying): the
#             rendezvous aborts the rejoin, the workers stop holding their pushes and the run ends on single
#             copies with the reference's bits (no second kill: shard 1 has one copy);
#   launcher: the rejoin under deploy/local/launch.sh --max-restarts 1: kill -9 of server 1; the launcher starts
#             it again alone with the same command line, it rejoins, and the launcher exits 0 with the
#             reference's model.ckpt and final checkpoint;
#   local:    head_mode = local, replicas = 1: server 1 started again after its failover is refused, naming
#             head_mode = local, and exits 1; the run goes on and every worker exits 0;
#   skipped:  the same with pfcps-server-test-hooks and PFCPS_TEST_REJOIN_SKIP_COPY=1 on the restarted server (its shards stay as generated
#             at step 0, the copy skipped): the final checkpoint must differ from the reference's (or the run
#             fail), so the first case cannot pass without the copy.
# A sixth argument names the cases to run (default "rejoin launcher skipped"; meson's train_rejoin_abort runs
# "aborted local").
CASES=${6:-rejoin launcher skipped}
set -- "${@:1:5}"
source "$(dirname "$0")/cluster.sh" "$@"
# The failure hooks PFCPS_TEST_REJOIN_* (server/main.c) exist only in the tests' build of the server.
HOOKS_SERVER=$BUILD/server/pfcps-server-test-hooks
[ -x "$HOOKS_SERVER" ] || die "$HOOKS_SERVER is missing (built with -Dtests=true)"
export OMP_NUM_THREADS=1 PFCPS_SECRET=rejoin-secret
pack_orl 10

# write_cfg NAME REPLICAS: $TMP/NAME.ini (cluster.sh ckpt_ini: 6 epochs, 3 servers + 2 workers, keep 2, 40
# classes at 0.25, dense updates, a log line every step).
write_cfg() {
  ckpt_ini "$1" 6 3 2 2 40 "sample_rate = 0.25" "pfc_update = dense" "frequent = 1" "replicas = $2" \
    "ctl_timeout = 20"
}

# run_case NAME SERVER [ENV...]: the kill, restart and second kill described at the top; the restarted server 1
# is the binary SERVER run with the environment ENV. Sets RC (0: every member exited 0).
run_case() {
  local name=$1 RESTARTED=$2 at p s; shift 2
  at=$((5 + RANDOM % 4))
  write_cfg "$name" 1
  rm -f "$TMP"/*.log
  start_cluster "$TMP/$name.ini" 3 2
  wait_log "$TMP/worker0.log" "Global Step: $at " 120 || { show_logs; die "$name: worker 0 did not reach step $at"; }
  kill -KILL "${SPIDS[1]}"
  wait_log "$TMP/server0.log" "failover: server\[1\]" 30 || { show_logs; die "$name: server 1 was not failed over"; }
  local t0; t0=$(date +%s.%N)
  start_daemon "$TMP/server1-again.log" env "$@" "$RESTARTED" --config "$TMP/$name.ini" --rank 1
  local back=$DPID
  wait_log "$TMP/server0.log" "rejoin: server\[1\] .* rejoined" 60 ||
    { show_logs; die "$name: server 1 did not rejoin"; }
  echo "$name: server 1 killed at step $at; restarted, it held its copies again $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN {printf "%.2f", a - b}') s after its start"
  kill -KILL "${SPIDS[2]}"
  RC=0
  wait_all "${WPIDS[@]}" || RC=$?
  for p in "${SPIDS[0]}" "$back"; do
    wait_exit "$p" 60 || { show_logs; die "$name: server pid $p did not stop after the workers"; }
    s=0; wait "$p" || s=$?
    [ "$s" -eq 0 ] || RC=$s
  done
}

recovery_ref

RANDOM=$$
has() { [[ " $CASES " == *" $1 "* ]]; }
# --- rejoin ------------------------------------------------------------------------------------------------------
if has rejoin; then
run_case rejoin "$SERVER"
expect_eq "rejoin: every worker and the surviving servers exit 0" "$RC" 0
expect_grep "rejoin: the restarted server 1 copied shard 1 from server 2" \
  "rejoin: copying shard 1 from server 2 \(its serving copy\) at checkpoint step [0-9]+: [0-9]+ rows" \
  "$TMP/server1-again.log"
expect_grep "rejoin: and shard 0's backup from server 0" "rejoin: copying shard 0 from server 0" \
  "$TMP/server1-again.log"
expect_grep "rejoin: the rendezvous says every shard has two copies again" "every shard has two copies again" \
  "$TMP/server0.log"
expect_grep "rejoin: worker 1 says so too" "rejoined \(epoch 3\): .*every shard has two copies again" \
  "$TMP/worker1.log"
expect_grep "rejoin: worker 0 held its pushes for the copy" "rejoin of server 1: it holds its copies again" \
  "$TMP/worker0.log"
# After the rejoin, server 2's loss leaves shard 1 on server 1 alone: a failover, not the re-form.
expect_grep "rejoin: server 2's loss is failed over to the rejoined copy" \
  "failover: server\[2\] .* lost: shard 2 goes on on its backup on server 0" "$TMP/server0.log"
expect_grep "rejoin: the rejoined primary writes shard 1's snapshots after server 2's loss" \
  "shard 1: its backup copy is lost: this rejoined primary writes its snapshots again" "$TMP/server1-again.log"
if grep -q "falling back to the checkpoint re-form" "$TMP/server0.log"; then
  fail "rejoin: the run fell back to the re-form"
else
  ok "rejoin: no re-form"
fi
ckpt_check_same rejoin
fi

# --- aborted: the learner dies before it holds a copy ----------------------------------------------------------
if has aborted; then
at=$((5 + RANDOM % 4))
write_cfg aborted 1
rm -f "$TMP"/*.log
start_cluster "$TMP/aborted.ini" 3 2
wait_log "$TMP/worker0.log" "Global Step: $at " 120 || { show_logs; die "aborted: worker 0 did not reach step $at"; }
kill -KILL "${SPIDS[1]}"
wait_log "$TMP/server0.log" "failover: server\[1\]" 30 || { show_logs; die "aborted: server 1 was not failed over"; }
start_daemon "$TMP/server1-again.log" env PFCPS_TEST_REJOIN_EXIT_BEFORE_READY=1 "$HOOKS_SERVER" --config "$TMP/aborted.ini" --rank 1
RC=0
wait_all "${WPIDS[@]}" || RC=$?
wait_exit "${SPIDS[0]}" 60 || { show_logs; die "aborted: server 0 did not stop after the workers"; }
s=0; wait "${SPIDS[0]}" || s=$?
[ "$s" -eq 0 ] || RC=$s
expect_eq "aborted: every worker and the surviving servers exit 0" "$RC" 0
expect_grep "aborted: the rendezvous aborted the rejoin" "server\[1\] .* was lost while rejoining, before it held a copy" \
  "$TMP/server0.log"
expect_grep "aborted: worker 0 stopped holding its pushes" "rejoin of server 1: aborted, the run goes on as it was" \
  "$TMP/worker0.log"
ckpt_check_same aborted
fi

# --- launcher: launch.sh --max-restarts starts the lost server again, which rejoins ------------------------------
if has launcher; then
write_cfg launcher 1
setsid "$SRC/deploy/local/launch.sh" -c "$TMP/launcher.ini" -b "$BUILD" --max-restarts 1 >"$TMP/launch.out" 2>&1 &
LP=$!
wait_log "$TMP/launcher/logs/worker0.log" "Global Step: 6 " 120 || { tail -20 "$TMP/launch.out"; die "launcher: worker 0 did not reach step 6"; }
victim=$(pgrep -f -- "pfcps-server --config $TMP/launcher.ini --rank 1" | head -1)
[ -n "$victim" ] || die "launcher: server 1's pid not found"
kill -KILL "$victim"
s=0; wait "$LP" || s=$?
LP=
expect_eq "launcher: launch.sh exits 0" "$s" 0
expect_grep "launcher: it starts server 1 again alone" "restart 1/1 of server 1 alone, with the same command line" \
  "$TMP/launch.out"
expect_grep "launcher: server 1 rejoined" "rejoin: server\[1\] .* rejoined at epoch 3" "$TMP/launcher/logs/server0.log"
ckpt_check_same launcher
fi

# --- local: head_mode = local refuses the rejoin, naming why -------------------------------------------------------
if has local; then
write_cfg local 1
echo "head_mode = local" >>"$TMP/local.ini"
rm -f "$TMP"/*.log
start_cluster "$TMP/local.ini" 3 2
wait_log "$TMP/worker0.log" "Global Step: 5 " 120 || { show_logs; die "local: worker 0 did not reach step 5"; }
kill -KILL "${SPIDS[1]}"
wait_log "$TMP/server0.log" "failover: server\[1\]" 30 || { show_logs; die "local: server 1 was not failed over"; }
start_daemon "$TMP/server1-again.log" "$SERVER" --config "$TMP/local.ini" --rank 1
wait_exit "$DPID" 60 || { show_logs; die "local: the restarted server 1 still runs"; }
s=0; wait "$DPID" || s=$?
expect_eq "local: the restarted server 1 is refused (exit 1)" "$s" 1
expect_grep "local: it is told why" "it cannot rejoin under head_mode = local" "$TMP/server1-again.log"
RC=0
wait_all "${WPIDS[@]}" || RC=$?
expect_eq "local: every worker exits 0" "$RC" 0
wait_exit "${SPIDS[0]}" 60 || { show_logs; die "local: server 0 did not stop after the workers"; }
fi

# --- skipped: the copy left out must show -------------------------------------------------------------------------
if has skipped; then
run_case skipped "$HOOKS_SERVER" PFCPS_TEST_REJOIN_SKIP_COPY=1
expect_grep "skipped: the restarted server skipped its copy" "PFCPS_TEST_REJOIN_SKIP_COPY=1: shard 1 NOT copied" \
  "$TMP/server1-again.log"
if [ "$RC" -ne 0 ]; then
  ok "skipped: the run failed (status $RC) without the copy"
else
  got=$(ckpt_final_line "$TMP/skipped")
  if [ "$got" != "$REF" ]; then
    ok "skipped: the final checkpoint differs from the reference's without the copy"
  else
    fail "skipped: the final checkpoint equals the reference's although the copy was skipped"
  fi
fi
fi
expect_summary
