#!/usr/bin/env bash
# Server 0 and the rendezvous (replicas = 1; docs/architecture.md, "Hot-standby shards", "Server 0 and the
# rendezvous"): losing server 0, which runs the rendezvous, is a failover like the loss of any other server.
# Reference: cluster.sh recovery_ref (2 servers + 2 workers, replicas = 0, 10 ORL identities in a table of 40
# classes sampled at 0.25, pfc_update = dense, 36 steps, snapshot_every 4, uninterrupted, worker 0's --trace).
# Then, without a supervisor (nothing restarts):
#   kill:  replicas = 1, 2 servers: kill -9 of server 0 once worker 0 has logged a random step in 6..20; every
#          member takes the close of its control connection as server 0's failover: shard 0 goes on on its
#          backup on server 1, the run trains to its end without a rendezvous and every process exits 0 (the
#          workers tell the live servers they are done over the data plane);
#   stop:  replicas = 1, 2 servers: SIGSTOP of server 0 at a random step, SIGCONT 2 s later (shorter than the
#          silence limit of 3 s at ctl_timeout = 12): the run pauses (server 1's lease runs out, so it answers
#          nothing meanwhile) and goes on; the rendezvous removes nobody (it counts the members' silence from
#          when it runs again) and every process exits 0.
#   stoplong: replicas = 1, 2 servers, under deploy/local/launch.sh --max-restarts 1: SIGSTOP of server 0 at a
#          random step for longer than twice the silence limit: every member takes the rendezvous that echoes
#          nothing for 6 s as lost, as if its connection closed (server 0's failover: shard 0 goes on on server
#          1) while server 0 is still stopped; then SIGCONT: server 0 finds it did not run for longer than the
#          silence limit, closes every connection, is fenced and exits 76; the launcher starts it again alone
#          (its rendezvous adopts the run); launch.sh exits 0 with the reference's model.ckpt and final
#          checkpoint (the stale primary changed nothing). Then the same without --max-restarts: server 0 exits 76,
#          launch.sh lets the run go on without its rendezvous, and it ends with the reference's bytes.
#   launcher: replicas = 1, 3 servers, under deploy/local/launch.sh --max-restarts 1: kill -9 of server 0 at step
#          8; the launcher starts it again alone with the same command line; its new rendezvous adopts the
#          running run from the members' reconnects (Resume), server 0 rejoins as a learner (it copies shard 0
#          from server 1 and shard 2 from server 2 at a checkpoint the workers take) and every shard has two
#          copies again; launch.sh exits 0 with the reference's model.ckpt and final checkpoint;
#   worker: (only when asked for: its own test, train_server0_worker) replicas = 1, ctl_timeout = 2: kill -9 of
#          server 0, then of worker 1: no rendezvous is left to say so, so server 1 waits for the workers' done
#          notices until no worker sent anything for 4 x ctl_timeout, then is fenced and exits 75 (the re-form);
#          worker 0's step fails, it waits up to 2 x ctl_timeout for a restarted rendezvous to say a worker was
#          lost, then exits 75 too, naming why; nobody hangs.
# Each run must end with worker 0 having trained steps 1..36 once each with the reference's losses (its
# --trace equal to the reference's), no checkpoint loaded, and a model.ckpt and final checkpoint (`pfcps
# ckpt-info` table and backbone SHA-256, computed from the files) equal to the reference's. The time from the
# kill to the next step worker 0 completes is printed.
# usage: test_server0.sh SERVER WORKER PFCPS SRC BUILD [CASES] (CASES: default "kill stop stoplong launcher")
source "$(dirname "$0")/cluster.sh" "$@"
CASES=${6:-kill stop stoplong launcher}
has() { [[ " $CASES " == *" $1 "* ]]; }
export OMP_NUM_THREADS=1 PFCPS_SECRET=server0-secret
pack_orl 10

# write_cfg NAME [LINE...]: $TMP/NAME.ini (cluster.sh ckpt_ini: 6 epochs, 2 servers + 2 workers, keep 2, 40
# classes at 0.25, dense updates, a log line every step).
write_cfg() {
  local name=$1; shift
  ckpt_ini "$name" 6 2 2 2 40 "sample_rate = 0.25" "pfc_update = dense" "frequent = 1" "$@"
}

# iso_s LINE: the seconds since the epoch of a log line's leading ISO time.
iso_s() { date -u -d "$(cut -d' ' -f1 <<<"$1" | sed 's/Z$//; s/T/ /')" +%s.%N; }

# wait_member NAME PID WHAT: PID must exit 0 within 60 s.
wait_member() {
  local s=0
  wait_exit "$2" 60 || { show_logs; die "$1: $3 (pid $2) did not stop"; }
  wait "$2" || s=$?
  expect_eq "$1: $3 exit status" "$s" 0
}

# check_run NAME: the checks every case shares (see the top).
check_run() {
  local name=$1
  ckpt_check_same "$name"
  if cmp -s "$TMP/ref-trace0" "$TMP/trace0"; then
    ok "$name: worker 0's trace (steps 1..36, losses) equals the reference's"
  else
    fail "$name: worker 0's trace differs from the reference's"
    diff "$TMP/ref-trace0" "$TMP/trace0" | head -5
  fi
  if grep -q "resuming at checkpoint\|loading checkpoint" "$TMP"/worker*.log "$TMP"/server*.log; then
    fail "$name: a member loaded a checkpoint"
  else
    ok "$name: no member loaded a checkpoint"
  fi
}

if has kill || has stop || has stoplong || has launcher; then
recovery_ref
fi

RANDOM=$$
if has kill; then
# --- kill: kill -9 of server 0 of 2, not restarted ----------------------------------------------------------------
at=$((6 + RANDOM % 15))
write_cfg kill "replicas = 1" "ctl_timeout = 20"
rm -f "$TMP"/trace* "$TMP"/*.log
start_cluster "$TMP/kill.ini" 2 2 --trace "$TMP/trace{r}"
wait_log "$TMP/worker0.log" "Global Step: $at " 120 || { show_logs; die "kill: worker 0 did not reach step $at"; }
t_kill=$(date -u +%s.%N)
kill -KILL "${SPIDS[0]}"
wait "${SPIDS[0]}" 2>/dev/null
for p in "${WPIDS[@]}"; do wait_member kill "$p" worker; done
wait_member kill "${SPIDS[1]}" "server 1"
next=$(awk '/Global Step: / {print}' "$TMP/worker0.log" | while read -r line; do
  s=$(iso_s "$line"); if awk -v a="$s" -v b="$t_kill" 'BEGIN {exit !(a > b)}'; then echo "$s"; break; fi; done)
[ -n "$next" ] && echo "kill: killed server 0 at step $at; worker 0 completed its next step $(awk -v a="$next" -v b="$t_kill" 'BEGIN {printf "%.2f", a - b}') s after the kill"
check_run kill
expect_grep "kill: worker 1 took the close as server 0's failover" \
  "failover \(epoch 1\): server\[0\] lost .*the rendezvous is lost with server 0: training goes on" "$TMP/worker1.log"
expect_grep "kill: server 1 promoted its backup of shard 0" "shard 0: its primary is lost: this copy now serves it" \
  "$TMP/server1.log"
expect_grep "kill: server 1 says shard 1 lost its backup" "shard 1 lost its backup copy \(server 0\)" "$TMP/server1.log"
expect_grep "kill: server 1 stopped once every worker was done" "every worker said it finished training" "$TMP/server1.log"

fi

if has stop; then
# --- stop: SIGSTOP of server 0 of 2, SIGCONT 2 s later (within the silence limit) -----------------------------------
at=$((6 + RANDOM % 15))
write_cfg stop "replicas = 1" "ctl_timeout = 12"
rm -f "$TMP"/trace* "$TMP"/*.log
start_cluster "$TMP/stop.ini" 2 2 --trace "$TMP/trace{r}"
wait_log "$TMP/worker0.log" "Global Step: $at " 120 || { show_logs; die "stop: worker 0 did not reach step $at"; }
kill -STOP "${SPIDS[0]}"
sleep 2
kill -CONT "${SPIDS[0]}"
for p in "${WPIDS[@]}"; do wait_member stop "$p" worker; done
for p in "${SPIDS[@]}"; do wait_member stop "$p" server; done
check_run stop
expect_grep "stop: the rendezvous counted the members' silence from when it ran again" \
  "the rendezvous did not run for [0-9.]+ s" "$TMP/server0.log"
if grep -q "failover" "$TMP"/*.log; then fail "stop: a failover was decided"; else ok "stop: no failover"; fi
fi

if has stoplong; then
# stop_long NAME [LAUNCH ARGS...]: a launch.sh run of NAME.ini (replicas = 1, ctl_timeout = 12: silence limit 3 s)
# whose server 0 is stopped at step $at until worker 1 fails it over (the members give up 6 s after their last
# echoed heartbeat), then continued: every member named the silent rendezvous, launch.sh exits 0, server 0 says
# it is fenced and exits 76, and the run ends with the reference's bytes. launch.sh's output in $TMP/NAME.out.
stop_long() {
  local name=$1 L=$TMP/$1/logs victim t_stop f s=0; shift
  write_cfg "$name" "replicas = 1" "ctl_timeout = 12"
  setsid "$SRC/deploy/local/launch.sh" -c "$TMP/$name.ini" -b "$BUILD" "$@" >"$TMP/$name.out" 2>&1 &
  LP=$!
  wait_log "$L/worker0.log" "Global Step: $at " 120 || { tail -20 "$TMP/$name.out"; die "$name: worker 0 did not reach step $at"; }
  victim=$(pgrep -f -- "pfcps-server --config $TMP/$name.ini --rank 0" | head -1)
  [ -n "$victim" ] || die "$name: server 0's pid not found"
  kill -STOP "$victim"
  t_stop=$(date +%s.%N)
  wait_log "$L/worker1.log" "failover (epoch 1): server\\[0\\] lost" 20 ||
    { kill -CONT "$victim"; tail -20 "$TMP/$name.out"; die "$name: worker 1 did not fail the stopped server 0 over"; }
  echo "$name: worker 1 failed server 0 over $(awk -v a="$(date +%s.%N)" -v b="$t_stop" 'BEGIN {printf "%.1f", a - b}') s after its SIGSTOP"
  for f in worker0 worker1 server1; do
    wait_log "$L/$f.log" "failover (epoch 1)" 10 || true
    expect_grep "$name: $f took the silent rendezvous for lost, server 0 still stopped" \
      "failover \\(epoch 1\\): server\\[0\\] lost \\(the rendezvous at .* echoed no heartbeat for [0-9.]+ s" "$L/$f.log"
  done
  kill -CONT "$victim"
  wait "$LP" || s=$?
  LP=
  expect_eq "$name: launch.sh exits 0" "$s" 0
  expect_grep "$name: server 0, continued after the others failed it over, is fenced" \
    "stopped longer than the silence limit, so the members take it for lost .* it is fenced and exits 76" "$L/server0.log"
  expect_grep "$name: server 1 promoted its backup of shard 0" "shard 0: its primary is lost: this copy now serves it" \
    "$L/server1.log"
  ckpt_check_same "$name"
}
at=$((6 + RANDOM % 8))
# --- stoplong: under launch.sh --max-restarts 1: server 0 is restarted alone, adopts the run and rejoins ---------
stop_long stoplong --max-restarts 1
expect_grep "stoplong: launch.sh restarts server 0 alone after its exit 76" \
  "server 0 exited with status 76 .*restart 1/1 of server 0 alone" "$TMP/stoplong.out"
# --- the same without a restart: server 0 exits 76 and the run goes on without its rendezvous to its end -------
stop_long stopnorestart
expect_grep "stopnorestart: the run goes on after server 0's exit 76" \
  "server 0 died \\(status 76.*the run goes on without its rendezvous" "$TMP/stopnorestart.out"
fi

if has launcher; then
# --- launcher: kill -9 of server 0 of 3 under deploy/local/launch.sh --max-restarts 1: it restarts and rejoins --------
# Server 0's metrics on a fixed port (the others' on free ones): its restart keeps that port.
MPORT=$(free_port)
ckpt_ini launch 6 3 2 2 40 "sample_rate = 0.25" "pfc_update = dense" "frequent = 1" "replicas = 1" "ctl_timeout = 20" \
  "metrics_address = 127.0.0.1:$MPORT"
setsid "$SRC/deploy/local/launch.sh" -c "$TMP/launch.ini" -b "$BUILD" --max-restarts 1 >"$TMP/launch.out" 2>&1 &
LP=$!
wait_log "$TMP/launch/logs/worker0.log" "Global Step: 8 " 120 || { tail -20 "$TMP/launch.out"; die "launcher: worker 0 did not reach step 8"; }
victim=$(pgrep -f -- "pfcps-server --config $TMP/launch.ini --rank 0" | head -1)
[ -n "$victim" ] || die "launcher: server 0's pid not found"
kill -KILL "$victim"
# The workers wait (SIGSTOP, below the servers' 4 x ctl_timeout fence) until server 0's second process listens,
# so that the remaining 28 steps leave its rejoin time to happen however slowly a loaded host restarts it.
wpids=$(pgrep -f -- "pfcps-worker --config $TMP/launch.ini")
# shellcheck disable=SC2086
kill -STOP $wpids
for ((i = 0; i < 300; i++)); do
  [ "$(grep -c "rendezvous listening on" "$TMP/launch/logs/server0.log")" -ge 2 ] && break
  sleep 0.1
done
# shellcheck disable=SC2086
kill -CONT $wpids
s=0; wait "$LP" || s=$?
LP=
expect_eq "launcher: launch.sh exits 0 after server 0 was killed" "$s" 0
expect_grep "launcher: it restarts server 0 alone" \
  "server 0 exited with status 137 .*restart 1/1 of server 0 alone.*its rendezvous adopts the running run" "$TMP/launch.out"
L=$TMP/launch/logs
expect_grep "launcher: the restarted rendezvous adopted the run" "adopted the running run [0-9a-f]*: every member but server 0 resumed" "$L/server0.log"
expect_grep "launcher: server 0 copied shard 0 from server 1" "rejoin: copying shard 0 from server 1 \(its serving copy\)" "$L/server0.log"
expect_grep "launcher: server 0 copied shard 2 from server 2" "rejoin: copying shard 2 from server 2 \(its serving copy\)" "$L/server0.log"
expect_grep "launcher: server 0 rejoined: every shard has two copies again" "rejoin: server\[0\] .* rejoined at epoch .*every shard has two copies again" "$L/server0.log"
expect_grep "launcher: worker 1 resumed with the restarted rendezvous" "the rendezvous at .* took this member's resume" "$L/worker1.log"
n=$(grep -c "metrics on 127.0.0.1:$MPORT\b" "$L/server0.log")
expect_eq "launcher: server 0 served its metrics on port $MPORT before and after its restart" "$n" 2
ckpt_check_same launch
fi

if has worker; then
# --- worker: kill -9 of server 0, then of worker 1 ----------------------------------------------------------------
# 30 epochs (180 steps): the run must outlast both kills.
ckpt_ini worker 30 2 2 2 40 "sample_rate = 0.25" "pfc_update = dense" "frequent = 1" "replicas = 1" "ctl_timeout = 2"
rm -f "$TMP"/trace* "$TMP"/*.log
start_cluster "$TMP/worker.ini" 2 2
wait_log "$TMP/worker0.log" "Global Step: 6 " 120 || { show_logs; die "worker: worker 0 did not reach step 6"; }
kill -KILL "${SPIDS[0]}"
wait_log "$TMP/server1.log" "failover (epoch 1): server\[0\] lost" 30 || { show_logs; die "worker: server 1 did not fail server 0 over"; }
kill -KILL "${WPIDS[1]}"
t0=$(date +%s)
wait_exit "${SPIDS[1]}" 40 || { show_logs; die "worker: server 1 did not stop after worker 1 was lost"; }
s=0; wait "${SPIDS[1]}" || s=$?
expect_eq "worker: server 1 exits 75 (re-form)" "$s" 75
echo "worker: server 1 stopped $(($(date +%s) - t0)) s after worker 1 was killed"
expect_grep "worker: server 1 names why" "no worker sent anything for 8 s .* it is fenced and stops" "$TMP/server1.log"
wait_exit "${WPIDS[0]}" 40 || { show_logs; die "worker: worker 0 did not stop"; }
s=0; wait "${WPIDS[0]}" || s=$?
expect_eq "worker: worker 0 exits 75 (re-form)" "$s" 75
expect_grep "worker: worker 0 says why" "training failed while server 0 and its rendezvous are lost .*exiting 75" \
  "$TMP/worker0.log"
fi
expect_summary
