#!/usr/bin/env bash
# A lost worker is replaced in place (docs/architecture.md, "Worker replacement in place"): no other member
# restarts, no checkpoint is loaded, and the run ends with the uninterrupted run's bits.
# Reference: 2 servers + 3 workers, replicas = 0, 10 ORL identities in a table of 40 classes sampled at 0.25
# (pfc_update = dense), 20 steps (5 epochs of 4), snapshot_every 4, under the launcher. Then, replicas = 1:
#   kill:     worker 1 is the tests' build of the worker (pfcps-worker-test-hooks) with
#             PFCPS_TEST_STEP_FAILS_AT at a random step in 4..14: that step fails at its start as a ring receive
#             does when the worker on its left dies inside a message; once it logged so, kill -9 of worker 0
#             and server 1 together (a machine holding both died): worker 1's step failed before the
#             worker-lost notice could come, and it must wait for the notice (it logs how long it waited)
#             instead of exiting, which the rendezvous would take for a second loss and re-form; the rendezvous
#             fails server 1 over, in whichever order it sees the two losses. Worker 0 started again with the
#             same command line joins as its replacement (its book lists server 1 as failed over), loads worker
#             1's state of the redo step (with worker 1's copy of worker 0's BN statistics, the ones model.ckpt
#             saves), and every worker redoes that step; server 1 started again rejoins once the replacement is
#             done (unless the run ended first): every member exits 0, the rendezvous names the failover, the
#             replacement and no re-form, and model.ckpt and the final checkpoint (`pfcps ckpt-info` table and
#             worker 0's backbone SHA-256) equal the reference's;
#   server0:  kill -9 of server 0 (the rendezvous' host) and worker 1 together, once worker 0 logged a random
#             step in 4..14 (one machine holding both died), then both started again by hand (server 0 first):
#             the members take the close as server 0's failover, resume at the restarted rendezvous, which finds
#             worker 1 alone missing besides server 0 and takes its new process' join as its replacement; every
#             worker redoes the decided step, server 0 then rejoins (unless the run ended first); every member
#             exits 0, no re-form, and the run ends with the reference's bits, though server 0 was started again
#             with another lr, momentum and seed (the run keeps its config, and says what differs). In half the runs at random
#             (S0_ORDER=1 always, 0 never) worker 1 is killed first and server 0 0.2 s after the rendezvous
#             began its replacement: the restarted rendezvous begins it again and the survivors report again;
#   launcher: under deploy/local/launch.sh --max-restarts 2: kill -9 of worker 2 at a random step in 4..8,
#             which launch.sh starts again alone (its state is then loaded from worker 0 and the ring rebuilt
#             around the last rank); 5 steps later worker 1 stopped (SIGSTOP) past the silence limit
#             (ctl_timeout 10: 2.5 s) and continued (SIGCONT) once the rendezvous removed it: it exits 76
#             on finding so, launch.sh starts it again alone and it replaces itself; launch.sh exits 0 with the
#             reference's bits;
#   timeout:  kill -9 of worker 1, not restarted: after ctl_timeout (3 s here) the rendezvous falls back to the
#             checkpoint re-form, named in its log, and every member stops (nobody hangs); the rendezvous logs
#             the members stopping for it as such, not as losses to fail over.
#   second:   worker 2 stopped (SIGSTOP: it will not report), worker 1 killed and started again: its replacement
#             joins and waits; then worker 2 killed: a second loss, so the rendezvous falls back to the re-form
#             and refuses the waiting replacement, which exits 75 (the re-form's status, not 1), as do the
#             others; nobody hangs;
#   acc:      (only when asked for: its own test, train_worker_replace_acc) gradient_acc = 2 against a reference
#             with gradient_acc = 2: kill -9 of worker 1 once worker 0 logged a random odd step in 5..13 (so
#             that it lands inside a window, mostly; test_ctl_replace checks the rounding), started again: the
#             redo starts at the start of the gradient_acc window (an even step: the lost worker's class-center
#             sums of the window are lost with it), and the run ends with the reference's bits;
#   local:    (only when asked for: its own test, train_worker_replace_local) head_mode = local (every worker
#             samples from all class centers, rows shared; the servers apply a step once its 3 pushes are in)
#             against a reference with head_mode = local, under deploy/local/launch.sh --max-restarts 2: kill -9
#             of worker 2 once worker 0 logged a random step in 4..14; launch.sh starts it again alone and it is
#             replaced in place (the servers undo the redo step's rows, logged once per row whichever workers
#             pushed it); launch.sh exits 0 and the run ends with the reference's bits. In half the runs at random
#             (LOCAL_S0=1 always, 0 never) server 0 is killed in the same kill: its restarted rendezvous adopts
#             the run and replaces worker 2, and server 0, which cannot rejoin in local mode, hosts the
#             rendezvous without shards until the run ends;
#   slow_end: replicas = 1 with the last checkpoint's shard write slowed past the rendezvous' silence limit
#             (PFCPS_SNAPSHOT_THROTTLE_MS; ctl_timeout 4: 2 s): training over, server 0 writes its shard for 3 s
#             after the workers left, sending no heartbeat meanwhile; the run still ends in order (launch.sh
#             exits 0: the servers leave the run before they wait for their shards, so none is reported lost).
#   end:      worker 0 is the tests' build of the worker with PFCPS_TEST_DIES_AT_END=1: it kills itself (SIGKILL)
#             once its last step is done, before its part of the final checkpoint and model.ckpt (a worker lost
#             in the final save); the others wait at the end of training (its vote) instead of leaving, worker 0
#             started again by hand replaces it at step 20 (nothing left to train: it writes its part of the
#             final checkpoint and model.ckpt from worker 1's state), every member exits 0, no re-form, no step
#             computed again, and the run ends with the reference's bits.
#   after_end: under deploy/local/launch.sh --max-restarts 2 with save_centers = true, worker 1 (the tests'
#             build, PFCPS_TEST_DIES_AT_END=after) kills itself once it passed the end vote, and worker 2
#             (PFCPS_TEST_DIES_AT_END=vote_hangs), its vote done, waits in a ring receive that only worker 1
#             could answer (as when a worker dies inside the vote): the rendezvous counts worker 1 as gone after
#             the end (no replacement, no re-form), worker 2 is told the run ended and finishes within 2 s (the
#             notice ends its receive), launch.sh does not restart worker 1 (server 0's log says it was lost
#             after the end) and exits 0, every class-center partition is written (`pfcps export --centers`
#             reads them), no ERROR is logged, and the run ends with the reference's bits.
#   end_server0: under launch.sh --max-restarts 2, worker 1 (PFCPS_TEST_DIES_AT_END=linger: it waits 2 s after the
#             end vote) and server 0 killed together while it waits: no rendezvous says what the loss was, so
#             launch.sh restarts both; once workers 0 and 2 (not restarted) exited 0 it stops them: exit 0 within
#             60 s, with the reference's bits.
#   after_steps: the run by hand with --max-steps 20 (model.ckpt is then written at the last step, not at an
#             epoch end): worker 0 (PFCPS_TEST_DIES_AT_END=after) kills itself once it passed the end vote, and
#             is started again while worker 2 (PFCPS_TEST_DIES_AT_END=linger) keeps the run open 2 s after
#             the vote: the restart is told training is over and exits 0, every other member exits 0, and
#             model.ckpt (written before the vote) and the final checkpoint equal the reference's.
# A sixth argument names the cases (default "kill server0 launcher timeout second slow_end end after_end end_server0
# after_steps").
CASES=${6:-kill server0 launcher timeout second slow_end end after_end end_server0 after_steps}
set -- "${@:1:5}"
source "$(dirname "$0")/cluster.sh" "$@"
# The training loop's failure hook PFCPS_TEST_STEP_FAILS_AT (worker/train.c) exists only in the tests' build.
HOOKS_WORKER=$BUILD/worker/pfcps-worker-test-hooks
[ -x "$HOOKS_WORKER" ] || die "$HOOKS_WORKER is missing (built with -Dtests=true)"
export OMP_NUM_THREADS=1 PFCPS_SECRET=replace-secret
pack_orl 10

# write_cfg NAME REPLICAS [LINE...]: $TMP/NAME.ini (5 epochs, 2 servers + 3 workers, keep 2, 40 classes at
# 0.25, dense updates, a log line every step, ctl_timeout 10), then each LINE.
write_cfg() {
  local name=$1 rep=$2; shift 2
  ckpt_ini "$name" 5 2 3 2 40 "sample_rate = 0.25" "pfc_update = dense" "frequent = 1" "replicas = $rep" \
    "ctl_timeout = 10" "$@"
}

# reference NAME WHAT [LINE...]: the uninterrupted replicas = 0 run $TMP/NAME (write_cfg with each LINE) under
# the launcher; REF is its final checkpoint line, which must be complete at step 20.
reference() {
  local name=$1 what=$2; shift 2
  write_cfg "$name" 0 "$@"
  ckpt_launch "$name"
  REF=$(ckpt_final_line "$TMP/$name")
  # Members leaving in order may reset their control connections as they exit: not a failure to report.
  if grep " WARN .*read from .* failed" "$TMP/$name/logs/server0.log"; then
    fail "$what: the rendezvous warned of a failed read in a run that ended in order"
  fi
  expect_grep "$what: 20 steps, final checkpoint complete" "^step 20: table [0-9a-f]{64}  backbone [0-9a-f]{64}$" - \
    <<<"$REF"
}

# all_exit_0 NAME WORKER_PIDS...: waits for those workers, then for every server (at most 60 s each after the
# workers); every one of them must exit 0.
all_exit_0() {
  local name=$1 p s rc=0; shift
  wait_all "$@" || rc=$?
  for p in "${SPIDS[@]}"; do
    wait_exit "$p" 60 || { show_logs; die "$name: server pid $p did not stop after the workers"; }
    s=0; wait "$p" || s=$?
    [ "$s" -eq 0 ] || rc=$s
  done
  expect_eq "$name: every member exits 0" "$rc" 0
}

# hooks_build DIR RANK=HOOK...: a build folder for launch.sh (-b DIR) whose server and tools are $BUILD's and
# whose worker is a wrapper that execs (launch.sh's pids stay the daemons'): each RANK listed runs the tests'
# build with PFCPS_TEST_DIES_AT_END=HOOK, every other rank the plain worker.
hooks_build() {
  local dir=$1 r; shift
  mkdir -p "$dir/worker"
  ln -sfn "$(cd "$BUILD" && pwd)/server" "$dir/server"
  ln -sfn "$(cd "$BUILD" && pwd)/tools" "$dir/tools"
  {
    printf '#!/bin/sh\ncase " $* " in\n'
    for r in "$@"; do
      printf '*" --rank %s "*) PFCPS_TEST_DIES_AT_END=%s exec "%s" "$@" ;;\n' "${r%%=*}" "${r#*=}" "$HOOKS_WORKER"
    done
    printf 'esac\nexec "%s" "$@"\n' "$WORKER"
  } >"$dir/worker/pfcps-worker"
  chmod +x "$dir/worker/pfcps-worker"
}

RANDOM=$$
has() { [[ " $CASES " == *" $1 "* ]]; }
if has kill || has server0 || has launcher || has end || has after_end || has after_steps || has end_server0; then
  reference ref reference
fi

# --- kill: worker 0 killed and started again by hand -----------------------------------------------------------
if has kill; then
at=$((4 + RANDOM % 11))
write_cfg kill 1
rm -f "$TMP"/*.log
start_cluster "$TMP/kill.ini" 2 0
WPIDS=()
for r in 0 1 2; do
  if [ "$r" -eq 1 ]; then
    start_daemon "$TMP/worker1.log" env PFCPS_TEST_STEP_FAILS_AT="$at" "$HOOKS_WORKER" --config "$TMP/kill.ini" --rank 1
  else
    start_daemon "$TMP/worker$r.log" "$WORKER" --config "$TMP/kill.ini" --rank "$r"
  fi
  WPIDS+=("$DPID")
done
wait_log "$TMP/worker1.log" "test hook PFCPS_TEST_STEP_FAILS_AT=$at: failing step $at" 120 ||
  { show_logs; die "kill: worker 1's step $at did not fail"; }
kill -KILL "${WPIDS[0]}" "${SPIDS[1]}"
t0=$(date +%s.%N)
wait_log "$TMP/server0.log" "worker\[0\] .* lost: the other workers stop" 30 ||
  { show_logs; die "kill: the rendezvous did not take worker 0's loss for a replacement"; }
wait_log "$TMP/server0.log" "failover: server\[1\]" 30 || { show_logs; die "kill: server 1 was not failed over"; }
start_daemon "$TMP/worker0-again.log" "$WORKER" --config "$TMP/kill.ini" --rank 0
W0=$DPID
start_daemon "$TMP/server1-again.log" "$SERVER" --config "$TMP/kill.ini" --rank 1
SPIDS[1]=$DPID
wait_log "$TMP/server0.log" "worker\[0\] replaced in place" 60 || { show_logs; die "kill: worker 0 was not replaced"; }
first=$(grep -o -m1 "failover: server\[1\]\|worker\[0\] ([^)]*) lost" "$TMP/server0.log")
echo "kill: worker 0 and server 1 killed at step $at (the rendezvous saw '${first}' first); worker 0 replaced" \
  "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN {printf "%.2f", a - b}') s after the kill (its restart included)"
all_exit_0 kill "${WPIDS[1]}" "${WPIDS[2]}" "$W0"
{ grep -m1 "rejoin: both copies loaded\|stopped before the run formed\|ERROR" "$TMP/server1-again.log" ||
  echo "(did not rejoin before the run ended)"; } | sed "s/^/info: server 1 started again: /"
expect_grep "kill: the replacement retired the failed-over server's copies from its start" \
  "servers failed over and not rejoined: 1 of 2" "$TMP/worker0-again.log"
expect_grep "kill: the servers undid the redo step's pushes" "rolled back \(epoch [0-9]+\): every push of step [0-9]+ and later undone on both copies" \
  "$TMP/server0.log"
expect_grep "kill: worker 2 redid from the decided step" "worker replacement \(epoch [0-9]+\): redoing from step [0-9]+" \
  "$TMP/worker2.log"
expect_grep "kill: the replacement loaded worker 1's state" "replacing worker\[0\]: loading worker\[1\]'s state of step" \
  "$TMP/worker0-again.log"
# step_losses LOG: "N LOSS" for each log line (frequent = 1: every step's global mean loss).
step_losses() { sed -n 's/.*Loss \([0-9.]*\) .*Global Step: \([0-9]*\).*/\2 \1/p' "$1"; }
# The loss is the global mean, the same on every rank: the replacement of worker 0, which took over worker 1's
# running sums, logs the uninterrupted run's losses at every step it logs.
got=$(step_losses "$TMP/worker0-again.log")
want=$(join <(step_losses "$TMP/ref/logs/worker0.log" | sort) <(awk '{print $1}' <<<"$got" | sort) | sort -n)
[ -n "$got" ] || fail "kill: the replacement logged no step"
expect_eq "kill: the replacement's logged losses (step loss) are the uninterrupted run's" \
  "$(sort -n <<<"$got" | tr '\n' ' ')" "$(tr '\n' ' ' <<<"$want")"
expect_grep "kill: the replacement's last line says it replaced a lost worker (not a checkpoint resume)" \
  "training done: .*replaced a lost worker from a live one's state" "$TMP/worker0-again.log"
if grep -q "falling back to the checkpoint re-form\|the run is broken" "$TMP/server0.log"; then
  fail "kill: the run fell back to the re-form"
else
  ok "kill: no re-form"
fi
expect_grep "kill: server 1 was failed over" "failover: server\[1\] .* lost: shard 1 goes on on its backup" "$TMP/server0.log"
expect_grep "kill: worker 1, whose step failed before the notice, waited for it" \
  "a worker-lost notice came [0-9.]+ s after this worker's step failed" "$TMP/worker1.log"
ckpt_check_same kill
fi

# --- end: worker 0 lost after its last step, in the final save, and started again by hand ---------------------
if has end; then
write_cfg end 1
rm -f "$TMP"/*.log
start_cluster "$TMP/end.ini" 2 0
start_daemon "$TMP/worker0.log" env PFCPS_TEST_DIES_AT_END=1 "$HOOKS_WORKER" --config "$TMP/end.ini" --rank 0
W0=$DPID
WPIDS=()
for r in 1 2; do
  start_daemon "$TMP/worker$r.log" "$WORKER" --config "$TMP/end.ini" --rank "$r"
  WPIDS+=("$DPID")
done
wait_exit "$W0" 120 || { show_logs; die "end: worker 0 did not end after its last step"; }
s=0; wait "$W0" || s=$?
expect_eq "end: worker 0 killed itself after its last step (SIGKILL)" "$s" 137
wait_log "$TMP/server0.log" "worker\[0\] .* lost: the other workers stop" 30 ||
  { show_logs; die "end: the rendezvous did not take worker 0's loss for a replacement"; }
start_daemon "$TMP/worker0-again.log" "$WORKER" --config "$TMP/end.ini" --rank 0
W0=$DPID
wait_log "$TMP/server0.log" "worker\[0\] replaced in place" 60 || { show_logs; die "end: worker 0 was not replaced"; }
all_exit_0 end "${WPIDS[@]}" "$W0"
expect_grep "end: the others waited at the end of training: every worker redoes from step 20, none trained again" \
  "every worker redoes step 20 \(workers stood at steps 20\.\.20, the servers held 20 of its pushes\)" "$TMP/server0.log"
expect_grep "end: worker 1 says there is nothing to redo" \
  "every step was done; worker 0's replacement writes its part of the final outputs" "$TMP/worker1.log"
expect_grep "end: the replacement has nothing left to train" \
  "the live worker's state taken over is of step 20, the last: nothing left to train" "$TMP/worker0-again.log"
expect_grep "end: the replacement's last line says so" \
  "training done: 20 of 20 steps \(all before the live worker's state this process took over; none trained now\)" \
  "$TMP/worker0-again.log"
expect_grep "end: the replacement wrote its part of the final checkpoint" "checkpoint step 20: worker state written" \
  "$TMP/worker0-again.log"
expect_grep "end: the replacement wrote model.ckpt" "training over: backbone saved to .*/model.ckpt" \
  "$TMP/worker0-again.log"
if grep -q "falling back to the checkpoint re-form\|the run is broken" "$TMP/server0.log"; then
  fail "end: the run fell back to the re-form"
else
  ok "end: no re-form"
fi
ckpt_check_same end
fi

# --- after_end: worker 1 lost after the end vote, worker 2's vote blocked by that loss, under launch.sh -----------
if has after_end; then
write_cfg after_end 1 "save_centers = true"
# rank 1 dies after the end vote, rank 2's vote then waits on a ring receive; rank 0 is the plain worker
hooks_build "$TMP/lb" 1=after 2=vote_hangs
s=0; "$SRC/deploy/local/launch.sh" -c "$TMP/after_end.ini" -b "$TMP/lb" --max-restarts 2 >"$TMP/after_end.out" 2>&1 || s=$?
L=$TMP/after_end/logs
expect_eq "after_end: launch.sh exits 0" "$s" 0
expect_grep "after_end: worker 1 killed itself after the end vote" \
  "PFCPS_TEST_DIES_AT_END=after: killing this worker after the end vote" "$L/worker1.log"
expect_grep "after_end: the rendezvous counts worker 1 as gone after the end" \
  "worker\[1\] \(.*\) was lost after the end of training \(every worker passed the end vote at step 20" "$L/server0.log"
expect_grep "after_end: worker 2, whose vote waited on worker 1, is told the run ended and finishes" \
  "worker 1 was lost after the others passed the end vote at step 20, this worker's vote failing with it" \
  "$L/worker2.log"
# At once: the run-ended notice ends the ring receive (the fabric interrupt), not its 4 x ctl_timeout bound.
t_lost=$(grep -m1 -o "^[0-9T:.-]*Z.* was lost after the end of training" "$L/server0.log" | cut -d' ' -f1)
t_done=$(grep -m1 -o "^[0-9T:.-]*Z.* this worker's vote failing with it" "$L/worker2.log" | cut -d' ' -f1)
dt=$(python3 -c "from datetime import datetime as d; f=lambda s: d.strptime(s, '%Y-%m-%dT%H:%M:%S.%fZ');
print(f'{(f(\"$t_done\") - f(\"$t_lost\")).total_seconds():.3f}')")
if python3 -c "import sys; sys.exit(0 if $dt < 2 else 1)"; then
  ok "after_end: worker 2 finished $dt s after the loss (its ring receive ended by the notice)"
else
  fail "after_end: worker 2 finished $dt s after the loss (2 s at most: the notice must end its ring receive)"
fi
expect_grep "after_end: launch.sh does not restart worker 1: the run ends without it" \
  "worker 1 exited with status 137 after the end of training .*: the run ends without it" "$TMP/after_end.out"
if grep -n " ERROR \|falling back to the checkpoint re-form" "$L"/*.log; then
  fail "after_end: an ERROR or a re-form was logged"
else
  ok "after_end: no ERROR, no re-form"
fi
s=0
"$PFCPS" export --centers "$TMP/after_end" "$TMP/after_end-centers.safetensors" >"$TMP/after_end-export.out" 2>&1 || s=$?
expect_eq "after_end: every class-center partition was written (pfcps export --centers reads them)" "$s" 0
ckpt_check_same after_end
fi

# --- after_steps: --max-steps 20, worker 0 lost after the end vote and started again by hand -----------------------
if has after_steps; then
write_cfg after_steps 1
rm -f "$TMP"/*.log
start_cluster "$TMP/after_steps.ini" 2 0
start_daemon "$TMP/worker0.log" env PFCPS_TEST_DIES_AT_END=after "$HOOKS_WORKER" --config "$TMP/after_steps.ini" \
  --rank 0 --max-steps 20
W0=$DPID
start_daemon "$TMP/worker1.log" "$WORKER" --config "$TMP/after_steps.ini" --rank 1 --max-steps 20
WPIDS=("$DPID")
start_daemon "$TMP/worker2.log" env PFCPS_TEST_DIES_AT_END=linger "$HOOKS_WORKER" --config "$TMP/after_steps.ini" \
  --rank 2 --max-steps 20
WPIDS+=("$DPID")
wait_exit "$W0" 120 || { show_logs; die "after_steps: worker 0 did not end"; }
s=0; wait "$W0" || s=$?
expect_eq "after_steps: worker 0 killed itself after the end vote (SIGKILL)" "$s" 137
# Started again while worker 2 lingers (the run is still open): told training is over, it exits 0.
start_daemon "$TMP/worker0-again.log" "$WORKER" --config "$TMP/after_steps.ini" --rank 0 --max-steps 20
all_exit_0 after_steps "${WPIDS[@]}" "$DPID"
expect_grep "after_steps: the restarted worker 0 is told training is over" \
  "training is over: every worker passed the end vote at step 20; nothing left to replace: nothing to do; exiting 0" \
  "$TMP/worker0-again.log"
expect_grep "after_steps: worker 0 wrote model.ckpt before the vote" "backbone saved to .*/model.ckpt after 20 steps" \
  "$TMP/worker0.log"
ckpt_check_same after_steps
fi

# --- end_server0: worker 1 and server 0 killed together after the end vote, under launch.sh -------------------------
if has end_server0; then
write_cfg end_server0 1
hooks_build "$TMP/lb0" 1=linger
setsid "$SRC/deploy/local/launch.sh" -c "$TMP/end_server0.ini" -b "$TMP/lb0" --max-restarts 2 >"$TMP/end_server0.out" 2>&1 &
LP=$!
L=$TMP/end_server0/logs
wait_log "$L/worker1.log" "PFCPS_TEST_DIES_AT_END=linger" 120 || { tail -20 "$TMP/end_server0.out"; die "end_server0: worker 1 did not reach the end vote"; }
victims=$(pgrep -f -- "--config $TMP/end_server0.ini --rank [01]\$" | tr '\n' ' ')
w1=$(pgrep -f -- "pfcps-worker-test-hooks --config $TMP/end_server0.ini --rank 1" | head -1)
s0=$(pgrep -f -- "pfcps-server --config $TMP/end_server0.ini --rank 0" | head -1)
[ -n "$w1" ] && [ -n "$s0" ] || die "end_server0: the pids of worker 1 ($w1) and server 0 ($s0) not found (${victims:-none})"
kill -KILL "$w1" "$s0"
t0=$(date +%s)
wait_exit "$LP" 60 || { tail -20 "$TMP/end_server0.out"; kill -TERM "$LP"; die "end_server0: launch.sh still runs 60 s after the kill"; }
s=0; wait "$LP" || s=$?
LP=
expect_eq "end_server0: launch.sh exits 0 ($(($(date +%s) - t0)) s after the kill; no run left to join)" "$s" 0
expect_grep "end_server0: it stops what it restarted once the others ended" \
  "the run ended \(every server, or every worker not restarted, exited 0\) while the restarted worker 1 waits to join: stopping it" \
  "$TMP/end_server0.out"
ckpt_check_same end_server0
fi

# --- server0: server 0 and worker 1 killed together, both started again by hand --------------------------------
if has server0; then
at=$((4 + RANDOM % 11))
write_cfg server0 1
rm -f "$TMP"/*.log
start_cluster "$TMP/server0.ini" 2 3
wait_log "$TMP/worker0.log" "Global Step: $at " 120 || { show_logs; die "server0: worker 0 did not reach step $at"; }
if [ "${S0_ORDER:-$((RANDOM % 2))}" = 1 ]; then
  # worker 1 first: the rendezvous begins its replacement, then server 0 is lost in the middle of it
  order="worker 1, then server 0 0.2 s later (inside the replacement)"
  kill -KILL "${WPIDS[1]}"
  wait_log "$TMP/server0.log" "worker\[1\] .* lost: the other workers stop" 30 ||
    { show_logs; die "server0: the rendezvous did not take worker 1's loss for a replacement"; }
  sleep 0.2
  kill -KILL "${SPIDS[0]}"
else
  order="server 0 and worker 1 in one kill"
  kill -KILL "${SPIDS[0]}" "${WPIDS[1]}"
fi
t0=$(date +%s.%N)
# Server 0 comes back with an edited config (another lr, momentum and seed): the run keeps its own, which the
# members hand the restarted rendezvous, and the replacement trains with it (else the bits differ).
start_daemon "$TMP/server0-again.log" "$SERVER" --config "$TMP/server0.ini" --rank 0 --set lr=0.2 --set momentum=0.5 \
  --set seed=1
SPIDS[0]=$DPID
start_daemon "$TMP/worker1-again.log" "$WORKER" --config "$TMP/server0.ini" --rank 1
W1=$DPID
wait_log "$TMP/server0-again.log" "worker\[1\] replaced in place" 60 ||
  { show_logs; tail -30 "$TMP/server0-again.log" "$TMP/worker1-again.log"; die "server0: worker 1 was not replaced"; }
echo "server0: $order, killed after worker 0 logged step $at; worker 1 replaced" \
  "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN {printf "%.2f", a - b}') s after the kill (both restarts included);" \
  "$(grep -o -m1 "redoing from step [0-9]*" "$TMP/worker0.log")"
all_exit_0 server0 "${WPIDS[0]}" "${WPIDS[2]}" "$W1"
expect_grep "server0: the restarted rendezvous kept the run's config, naming what its own changes" \
  "config differs from the running run's in 3 keys: the run keeps its own .*: lr = 0.1 \(0.2\), momentum = 0.9 \(0.5\), seed = 7 \(1\)" \
  "$TMP/server0-again.log"
expect_grep "server0: the restarted rendezvous adopted the run without worker 1" \
  "adopted the running run [0-9a-f]+: every member but server 0 and worker\[1\] resumed" "$TMP/server0-again.log"
expect_grep "server0: worker 0 took the close for server 0's failover" "failover \(epoch [0-9]+\): server\[0\] lost" \
  "$TMP/worker0.log"
expect_grep "server0: the servers undid the redo step's pushes" \
  "rolled back \(epoch [0-9]+\): every push of step [0-9]+ and later undone on both copies" "$TMP/server1.log"
expect_grep "server0: the replacement retired server 0's copies from its start" \
  "servers failed over and not rejoined: 1 of 2" "$TMP/worker1-again.log"
if grep -q "falling back to the checkpoint re-form\|the run is broken" "$TMP/server0-again.log" "$TMP/server1.log"; then
  fail "server0: the run fell back to the re-form"
else
  ok "server0: no re-form"
fi
grep -m1 "rejoined\|rejoin aborted" "$TMP/server0-again.log" | sed "s/^/info: server 0 started again: /" ||
  echo "info: server 0 started again: did not rejoin before the run ended"
ckpt_check_same server0
fi

# --- launcher: launch.sh --max-restarts starts the lost worker again (killed; then another one stopped) -------
if has launcher; then
write_cfg launcher 1
setsid "$SRC/deploy/local/launch.sh" -c "$TMP/launcher.ini" -b "$BUILD" --max-restarts 2 >"$TMP/launch.out" 2>&1 &
LP=$!
at=$((4 + RANDOM % 5))
wait_log "$TMP/launcher/logs/worker0.log" "Global Step: $at " 120 || { tail -20 "$TMP/launch.out"; die "launcher: worker 0 did not reach step $at"; }
victim=$(pgrep -f -- "pfcps-worker --config $TMP/launcher.ini --rank 2" | head -1)
[ -n "$victim" ] || die "launcher: worker 2's pid not found"
kill -KILL "$victim"
wait_log "$TMP/launcher/logs/server0.log" "worker\[2\] replaced in place" 60 ||
  { tail -20 "$TMP/launch.out"; die "launcher: worker 2 was not replaced in place"; }
wait_log "$TMP/launcher/logs/worker0.log" "Global Step: $((at + 5)) " 120 ||
  { tail -20 "$TMP/launch.out"; die "launcher: worker 0 did not reach step $((at + 5))"; }
victim=$(pgrep -f -- "pfcps-worker --config $TMP/launcher.ini --rank 1" | head -1)
[ -n "$victim" ] || die "launcher: worker 1's pid not found"
kill -STOP "$victim" # past the silence limit (2.5 s): continued once the rendezvous removed it
wait_log "$TMP/launcher/logs/server0.log" "worker\[1\] ([0-9.:]*) lost" 30 ||
  { kill -CONT "$victim"; tail -20 "$TMP/launch.out"; die "launcher: the stopped worker 1 was not removed"; }
kill -CONT "$victim"
s=0; wait "$LP" || s=$?
LP=
expect_eq "launcher: launch.sh exits 0" "$s" 0
expect_grep "launcher: it starts the killed worker 2 again alone" \
  "worker 2 exited with status 137 .*restart 1/2 of worker 2 alone, with the same command line: it replaces itself in place" "$TMP/launch.out"
expect_grep "launcher: the stopped worker 1 exits 76 on finding itself removed" "removed from the run .*exiting 76" \
  "$TMP/launcher/logs/worker1.log"
expect_grep "launcher: it starts worker 1 again alone" "worker 1 exited with status 76 .*restart 2/2 of worker 1 alone" \
  "$TMP/launch.out"
expect_grep "launcher: worker 1 was replaced in place" "worker\[1\] replaced in place" "$TMP/launcher/logs/server0.log"
ckpt_check_same launcher
fi

# --- timeout: no replacement comes ----------------------------------------------------------------------------------
if has timeout; then
write_cfg timeout 1
echo "ctl_timeout = 3" >>"$TMP/timeout.ini" # the fallback 3 s after the loss (a later key overrides)
rm -f "$TMP"/*.log
start_cluster "$TMP/timeout.ini" 2 3
wait_log "$TMP/worker0.log" "Global Step: 5 " 120 || { show_logs; die "timeout: worker 0 did not reach step 5"; }
kill -KILL "${WPIDS[1]}"
wait_log "$TMP/server0.log" "replacement failed: no replacement joined within ctl_timeout" 60 ||
  { show_logs; die "timeout: the rendezvous did not give up on the replacement"; }
for p in "${WPIDS[0]}" "${WPIDS[2]}" "${SPIDS[@]}"; do
  wait_exit "$p" 90 || { show_logs; die "timeout: pid $p still runs after the fallback"; }
done
ok "timeout: every member stopped after the fallback to the re-form"
# The members stopping for the re-form are not losses: no failover, no second fallback. (Which of their
# disconnects server 0 sees before it stops itself varies; it never takes one for a loss.)
if grep -q "failover:\|) lost and .*falling back" "$TMP/server0.log"; then
  fail "timeout: a member stopping for the re-form was taken for a loss: $(grep -m1 "failover:\|) lost and .*falling back" "$TMP/server0.log")"
else
  ok "timeout: no failover or second fallback after the re-form was told"
fi
grep -m1 "stopped for the checkpoint re-form" "$TMP/server0.log" | sed "s/^/info: /"
fi
# --- second: a second worker lost while the replacement waits ---------------------------------------------------
if has second; then
write_cfg second 1
rm -f "$TMP"/*.log
start_cluster "$TMP/second.ini" 2 3
wait_log "$TMP/worker0.log" "Global Step: 5 " 120 || { show_logs; die "second: worker 0 did not reach step 5"; }
kill -STOP "${WPIDS[2]}"
kill -KILL "${WPIDS[1]}"
start_daemon "$TMP/worker1-again.log" "$WORKER" --config "$TMP/second.ini" --rank 1
REPL=$DPID
wait_log "$TMP/server0.log" "worker\[1\]'s replacement joined" 60 || { show_logs; die "second: the replacement did not join"; }
kill -KILL "${WPIDS[2]}"
wait_exit "$REPL" 60 || { show_logs; die "second: the replacement still runs after the second loss"; }
s=0; wait "$REPL" || s=$?
expect_eq "second: the refused replacement exits 75 (the re-form)" "$s" 75
expect_grep "second: it says the run re-forms" "the run re-forms after a lost member: exiting 75" "$TMP/worker1-again.log"
expect_grep "second: the rendezvous fell back naming the second loss" \
  "worker\[1\] was lost and its replacement failed: worker\[2\] .* was lost too" "$TMP/server0.log"
for p in "${WPIDS[0]}" "${SPIDS[@]}"; do
  wait_exit "$p" 90 || { show_logs; die "second: pid $p still runs after the fallback"; }
  s=0; wait "$p" || s=$?
  [ "$s" -eq 75 ] || fail "second: pid $p exited $s, not 75"
done
ok "second: every other member stopped for the re-form"
fi

# --- acc: gradient_acc = 2, worker 1 killed and started again by hand ---------------------------------------------
if has acc; then
reference ref_acc "acc: reference (gradient_acc = 2)" "gradient_acc = 2"
at=$((5 + 2 * (RANDOM % 5))) # odd: the kill lands inside a window (steps at - 1, at), mostly
write_cfg acc 1 "gradient_acc = 2"
rm -f "$TMP"/*.log
start_cluster "$TMP/acc.ini" 2 3
wait_log "$TMP/worker0.log" "Global Step: $at " 120 || { show_logs; die "acc: worker 0 did not reach step $at"; }
kill -KILL "${WPIDS[1]}"
wait_log "$TMP/server0.log" "worker\[1\] .* lost: the other workers stop" 30 ||
  { show_logs; die "acc: the rendezvous did not take worker 1's loss for a replacement"; }
start_daemon "$TMP/worker1-again.log" "$WORKER" --config "$TMP/acc.ini" --rank 1
wait_log "$TMP/server0.log" "worker\[1\] replaced in place" 60 || { show_logs; die "acc: worker 1 was not replaced"; }
all_exit_0 acc "${WPIDS[0]}" "${WPIDS[2]}" "$DPID"
redo=$(grep -o -m1 "redoing from step [0-9]*" "$TMP/worker0.log" | awk '{print $4}')
echo "acc: worker 1 killed after worker 0 logged step $at; the run redid from step ${redo:-?}" \
  "($(grep -o -m1 "workers stood at steps [0-9.]*" "$TMP/server0.log"))"
if [ -n "$redo" ] && [ $((redo % 2)) -eq 0 ]; then
  ok "acc: the redo starts at a gradient_acc window's start (step $redo)"
else
  fail "acc: the redo step '${redo}' is not a window start"
fi
if grep -q "re-form" "$TMP/server0.log"; then fail "acc: the run fell back to the re-form"; else ok "acc: no re-form"; fi
cmp -s "$TMP/ref_acc/model.ckpt" "$TMP/acc/model.ckpt" && ok "acc: model.ckpt equals the uninterrupted run's" ||
  fail "acc: model.ckpt differs from the uninterrupted run's"
expect_eq "acc: final checkpoint (table and backbone SHA-256)" "$(ckpt_final_line "$TMP/acc")" "$REF"
fi

# --- local: head_mode = local, worker 2 killed under launch.sh --max-restarts 1 ---------------------------------------
if has local; then
reference ref_local "local: reference (head_mode = local)" "head_mode = local"
at=$((4 + RANDOM % 11))
write_cfg local 1 "head_mode = local"
with_s0=${LOCAL_S0:-$((RANDOM % 2))}
setsid "$SRC/deploy/local/launch.sh" -c "$TMP/local.ini" -b "$BUILD" --max-restarts 2 >"$TMP/local.out" 2>&1 &
LP=$!
wait_log "$TMP/local/logs/worker0.log" "Global Step: $at " 120 || { tail -20 "$TMP/local.out"; die "local: worker 0 did not reach step $at"; }
victim=$(pgrep -f -- "pfcps-worker --config $TMP/local.ini --rank 2" | head -1)
[ -n "$victim" ] || die "local: worker 2's pid not found"
s0=
if [ "$with_s0" = 1 ]; then
  s0=$(pgrep -f -- "pfcps-server --config $TMP/local.ini --rank 0" | head -1)
  [ -n "$s0" ] || die "local: server 0's pid not found"
fi
kill -KILL ${s0:+"$s0"} "$victim"
s=0; wait "$LP" || s=$?
LP=
expect_eq "local: launch.sh exits 0" "$s" 0
expect_grep "local: it starts the killed worker 2 again alone" \
  "worker 2 exited with status 137 .*restart [12]/2 of worker 2 alone, with the same command line: it replaces itself in place" \
  "$TMP/local.out"
if [ "$with_s0" = 1 ]; then
  expect_grep "local: the restarted server 0 hosts the adopted run's rendezvous without shards (no rejoin in local mode)" \
    "it hosts the run's rendezvous, holding no shard, until the run ends" "$TMP/local/logs/server0.log"
  # The refused rejoin is the expected way on here: logged as such, never as an error.
  s0pid=$(grep -m1 -o "pid=[0-9]* .*holding no shard" "$TMP/local/logs/server0.log" | cut -d' ' -f1)
  if grep "$s0pid .* ERROR " "$TMP/local/logs/server0.log"; then
    fail "local: the restarted server 0 logged an ERROR in a run that went on"
  else
    ok "local: the restarted server 0 logged no ERROR"
  fi
fi
expect_grep "local: worker 2 was replaced in place" "worker\[2\] replaced in place" "$TMP/local/logs/server0.log"
echo "local: worker 2${s0:+ and server 0} killed after worker 0 logged step $at; $(grep -o -m1 "redoing from step [0-9]*" "$TMP/local/logs/worker0.log")" \
  "($(grep -o -m1 "workers stood at steps [0-9.]*" "$TMP/local/logs/server0.log"))"
expect_grep "local: the servers rolled back" "rolled back to step [0-9]+ at epoch [0-9]+: [0-9]+ rows restored" \
  "$TMP/local/logs/server1.log"
if grep -q "falling back to the checkpoint re-form\|the run is broken" "$TMP/local/logs/server0.log"; then
  fail "local: the run fell back to the re-form"
else
  ok "local: no re-form"
fi
cmp -s "$TMP/ref_local/model.ckpt" "$TMP/local/model.ckpt" && ok "local: model.ckpt equals the uninterrupted run's" ||
  fail "local: model.ckpt differs from the uninterrupted run's"
expect_eq "local: final checkpoint (table and backbone SHA-256)" "$(ckpt_final_line "$TMP/local")" "$REF"
fi

# --- slow_end: the last shard write outlasts the silence limit ----------------------------------------------------
if has slow_end; then
write_cfg slow 1
s=0
PFCPS_SNAPSHOT_THROTTLE_MS=3000 "$SRC/deploy/local/launch.sh" -c "$TMP/slow.ini" -b "$BUILD" --set num_epoch=2 \
  --set snapshot_every=8 --set ctl_timeout=4 >"$TMP/slow.out" 2>&1 || s=$?
expect_eq "slow_end: launch.sh exits 0 although the last shard write took longer than the silence limit" "$s" 0
[ "$s" -eq 0 ] || tail -20 "$TMP/slow.out"
if grep -q "silent member" "$TMP/slow/logs/server0.log"; then
  fail "slow_end: the rendezvous removed a silent member"
else
  ok "slow_end: no member removed for silence"
fi
fi
expect_summary
