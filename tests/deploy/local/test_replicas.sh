#!/usr/bin/env bash
# Hot-standby shards (replicas = 1): a lost server costs no restart, no checkpoint load and no step computed
# twice, and the run ends with the bits of an uninterrupted run.
# Reference: cluster.sh recovery_ref (2 servers + 2 workers, replicas = 0, 10 ORL identities in a table of 40
# classes sampled at 0.25, pfc_update = dense: most rows move by the closed form of the steps they skipped, 36
# steps, snapshot_every 4, uninterrupted). Then, each without a launcher or supervisor (nothing restarts):
#   kill:  replicas = 1, 2 servers: kill -9 of server 1 once worker 0 has logged a random step in 6..20; shard 1
#          goes on on its backup copy on server 0; server 1 started again with the same command line rejoins
#          (it copies its shards at a checkpoint the workers take: test_rejoin.sh) and exits 0 with the others;
#   stop:  replicas = 1, 3 servers: SIGSTOP of server 1 at a random step; the rendezvous removes it once it has
#          been silent for ctl_member_silence_s (3 s at ctl_timeout = 12) and shard 1 goes on on server 2; after
#          another 2 s SIGCONT: the stale server's lease ran out while it was stopped, so it takes no message,
#          learns it was removed and exits 75, changing nothing;
#   launcher: the kill case under deploy/local/launch.sh: it names the lost server, goes on and exits 0 with the
#          reference's model.ckpt and final checkpoint;
#   both:  replicas = 1, 3 servers: kill -9 of server 1, then of server 2, which held shard 1's other copy: the
#          rendezvous names the loss of both copies and every member exits 75 for the checkpoint re-form;
#   bothnow: replicas = 1, 2 servers killed at once (server 0 too: no rendezvous is left): the workers find
#          server 1 lost after an eighth of their data-plane timeout and exit 75 within 15 s (not after 48 s).
#   bothring: as bothnow, with worker 1 stopped (SIGSTOP) just before the kill: worker 0 waits for it in a ring
#          collective, where it asks no server; its own probes of the servers there find the shard without a copy
#          and it exits 75 within 12 s (not after the ring's 32 s and 16 s more).
# Each run must end with every worker exiting 0, the surviving servers exiting 0, every step trained once
# (worker 0's --trace lists steps 1..36 once each), no checkpoint loaded, the failover and the "one server
# failure away" warning logged, and a model.ckpt and final checkpoint (`pfcps ckpt-info` table and backbone
# SHA-256, computed from the files) equal to the reference's. The time from the kill to the next step worker
# 0 completes is printed.
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1 PFCPS_SECRET=replicas-secret
pack_orl 10

# write_cfg NAME SERVERS [LINE...]: $TMP/NAME.ini (cluster.sh ckpt_ini: 6 epochs, SERVERS + 2, keep 2, 40 classes
# at 0.25, dense updates, a log line every step).
write_cfg() {
  local name=$1 servers=$2; shift 2
  ckpt_ini "$name" 6 "$servers" 2 2 40 "sample_rate = 0.25" "pfc_update = dense" "frequent = 1" "$@"
}

# iso_s LINE: the seconds since the epoch of a log line's leading ISO time.
iso_s() { date -u -d "$(cut -d' ' -f1 <<<"$1" | sed 's/Z$//; s/T/ /')" +%s.%N; }

# check_run NAME VICTIM SERVERS: the checks every case shares (see the top).
check_run() {
  local name=$1 victim=$2
  ckpt_check_same "$name"
  expect_eq "$name: worker 0 trained steps 1..36 once each" \
    "$(awk '{print $1}' "$TMP/trace0" | sort -n | uniq | tr '\n' ' ')" "$(seq 1 36 | tr "\n" " ")"
  expect_eq "$name: worker 0's trace has 36 lines" "$(wc -l <"$TMP/trace0")" 36
  expect_grep "$name: server 0 announced the failover of server $victim" \
    "failover: server\[$victim\] .* lost: shard $victim goes on on its backup" "$TMP/server0.log"
  expect_grep "$name: the log says the run is one failure away from the re-form" \
    "one server failure away from the checkpoint re-form" "$TMP/server0.log"
  expect_grep "$name: worker 1 took the failover" "failover \(epoch 1\)" "$TMP/worker1.log"
  # Server 0 holds shard 0 and the hot-standby copy of the last shard: one provider line for each endpoint.
  expect_eq "$name: server 0's provider lines name each copy once" \
    "$(grep -o "shard [0-9]*[^:]*: fabric provider" "$TMP/server0.log" | LC_ALL=C sort | tr '\n' ';')" \
    "shard 0: fabric provider;shard $(($3 - 1)) (hot-standby copy): fabric provider;"
  if grep -q "resuming at checkpoint\|loading checkpoint" "$TMP"/worker*.log "$TMP"/server*.log; then
    fail "$name: a member loaded a checkpoint"
  else
    ok "$name: no member loaded a checkpoint"
  fi
}

# wait_servers NAME PIDS...: each surviving server must exit 0 once the workers are done.
wait_servers() {
  local name=$1 p s; shift
  for p in "$@"; do
    s=0
    wait_exit "$p" 60 || { show_logs; die "$name: server pid $p did not stop after the workers"; }
    wait "$p" || s=$?
    expect_eq "$name: surviving server (pid $p) exit status" "$s" 0
  done
}

recovery_ref

RANDOM=$$
# --- kill: kill -9 of server 1 of 2 ----------------------------------------------------------------------------
at=$((6 + RANDOM % 15))
write_cfg kill 2 "replicas = 1" "ctl_timeout = 20"
rm -f "$TMP"/trace*
start_cluster "$TMP/kill.ini" 2 2 --trace "$TMP/trace{r}"
wait_log "$TMP/worker0.log" "Global Step: $at " 120 || { show_logs; die "kill: worker 0 did not reach step $at"; }
t_kill=$(date -u +%s.%N)
kill -KILL "${SPIDS[1]}"
# A restarted server 1 (a supervisor's restart) rejoins as a learner; the run ends as the uninterrupted one.
wait_log "$TMP/server0.log" "failover: server\[1\]" 30 || { show_logs; die "kill: server 1 was not failed over"; }
start_daemon "$TMP/server1-again.log" "$SERVER" --config "$TMP/kill.ini" --rank 1
again=$DPID
wait_all "${WPIDS[@]}" || { show_logs; die "kill: a worker failed after server 1 was killed"; }
wait_servers kill "${SPIDS[0]}" "$again"
# It rejoined, unless the run ended before the workers took its copy (it then stopped with the run).
grep -m1 "rejoin: both copies loaded\|stopped before the run formed" "$TMP/server1-again.log" | sed "s/^/info: /"
next=$(awk -v t="$t_kill" '/Global Step: / {print}' "$TMP/worker0.log" | while read -r line; do
  s=$(iso_s "$line"); if awk -v a="$s" -v b="$t_kill" 'BEGIN {exit !(a > b)}'; then echo "$s"; break; fi; done)
[ -n "$next" ] && echo "kill: killed at step $at; worker 0 completed its next step $(awk -v a="$next" -v b="$t_kill" 'BEGIN {printf "%.2f", a - b}') s after the kill"
check_run kill 1 2

# --- stop: SIGSTOP of server 1 of 3, SIGCONT after it was removed -----------------------------------------------
at=$((6 + RANDOM % 15))
write_cfg stop 3 "replicas = 1" "ctl_timeout = 12"
rm -f "$TMP"/trace* "$TMP"/*.log
start_cluster "$TMP/stop.ini" 3 2 --trace "$TMP/trace{r}"
wait_log "$TMP/worker0.log" "Global Step: $at " 120 || { show_logs; die "stop: worker 0 did not reach step $at"; }
kill -STOP "${SPIDS[1]}"
wait_log "$TMP/server0.log" "failover: server\[1\]" 30 || { kill -CONT "${SPIDS[1]}"; show_logs; die "stop: server 1 was not failed over"; }
sleep 2
kill -CONT "${SPIDS[1]}"
wait_exit "${SPIDS[1]}" 30 || { show_logs; die "stop: the stale server 1 did not exit after SIGCONT"; }
s=0; wait "${SPIDS[1]}" || s=$?
expect_eq "stop: the stale server 1 exits 75" "$s" 75
expect_grep "stop: the stale server was fenced" "this server is fenced" "$TMP/server1.log"
expect_grep "stop: the stale server's copies take nothing more" "removed from the run: this server answers and applies nothing" "$TMP/server1.log"
# Whether its progress thread saw the lapsed lease before the fence depends on which thread ran first.
grep -m1 "taking no message until it answers" "$TMP/server1.log" | sed "s/^/info: /"
wait_all "${WPIDS[@]}" || { show_logs; die "stop: a worker failed after server 1 was stopped"; }
wait_servers stop "${SPIDS[0]}" "${SPIDS[2]}"
expect_grep "stop: server 2's copy of shard 1 took over" "shard 1: its primary is lost: this copy now serves it" "$TMP/server2.log"
check_run stop 1 3

# --- launcher: the kill of server 1 under deploy/local/launch.sh, which reports it and goes on ---------------------
write_cfg launch 2 "replicas = 1" "ctl_timeout = 20"
start_launcher "$TMP/launch.ini"
wait_log "$TMP/launch/logs/worker0.log" "Global Step: 8 " 120 || { tail -20 "$TMP/launch.out"; die "launcher: worker 0 did not reach step 8"; }
victim=$(pgrep -f -- "pfcps-server --config $TMP/launch.ini --rank 1" | head -1)
[ -n "$victim" ] || die "launcher: server 1's pid not found"
kill -KILL "$victim"
s=0; wait "$LP" || s=$?
LP=
expect_eq "launcher: launch.sh exits 0 after server 1 was killed" "$s" 0
expect_grep "launcher: it names the lost server and goes on" \
  "server 1 exited with status 137 .*replicas = 1: the run goes on with its shards' backups" "$TMP/launch.out"
ckpt_check_same launch

# --- both: losing both copies of a shard falls back to the checkpoint re-form -----------------------------------
write_cfg both 3 "replicas = 1" "ctl_timeout = 20"
rm -f "$TMP"/trace* "$TMP"/*.log
start_cluster "$TMP/both.ini" 3 2
wait_log "$TMP/worker0.log" "Global Step: 6 " 120 || { show_logs; die "both: worker 0 did not reach step 6"; }
kill -KILL "${SPIDS[1]}"
wait_log "$TMP/server0.log" "failover: server\[1\]" 30 || { show_logs; die "both: server 1 was not failed over"; }
kill -KILL "${SPIDS[2]}"
# Server 0 exits 75; a worker 75, or 1 when its step in progress could not finish within the grace period
# (a post towards the dead server's copy).
for p in "${SPIDS[0]}" "${WPIDS[@]}"; do
  wait_exit "$p" 60 || { show_logs; die "both: a member did not stop after both copies of shard 1 were lost"; }
  s=0; wait "$p" || s=$?
  if [ "$p" = "${SPIDS[0]}" ]; then
    expect_eq "both: server 0 exits 75 (re-form)" "$s" 75
  elif [ "$s" -eq 75 ] || [ "$s" -eq 1 ]; then
    ok "both: worker pid $p stopped with $s"
  else
    fail "both: worker pid $p exited $s, not 75 or 1"
  fi
done
expect_grep "both: server 0 names the fallback" \
  "server\[2\] .* lost and both copies of shard 1 are lost \(servers 1 and 2\): falling back to the checkpoint re-form" \
  "$TMP/server0.log"

# --- bothnow: both servers (server 0, the rendezvous' host, included) killed at once ---------------------------
# No rendezvous is left to fail server 1 over: a worker whose pull or push waits on server 1 finds it lost after
# an eighth of its data-plane timeout (4 x ctl_timeout = 32 s here: 4 s), sees that a shard has no copy left and
# exits 75 at once, instead of after the whole timeout and then 2 x ctl_timeout for a restarted rendezvous (48 s
# before). The other worker, waiting for it in a ring collective or on the same servers, stops as soon (its
# ring's waits probe the servers: case bothring). Both must exit 75 within 15 s of the kill.
write_cfg bothnow 2 "replicas = 1" "ctl_timeout = 8"
rm -f "$TMP"/*.log
start_cluster "$TMP/bothnow.ini" 2 2
wait_log "$TMP/worker0.log" "Global Step: 6 " 120 || { show_logs; die "bothnow: worker 0 did not reach step 6"; }
t_kill=$(date +%s.%N)
kill -KILL "${SPIDS[1]}" "${SPIDS[0]}"
for w in 0 1; do
  wait_exit "${WPIDS[$w]}" 30 || { show_logs; die "bothnow: worker $w still runs 30 s after the kill"; }
  dt=$(echo "$(date +%s.%N) - $t_kill" | bc)
  s=0; wait "${WPIDS[$w]}" || s=$?
  expect_eq "bothnow: worker $w exits 75 (re-form)" "$s" 75
  if awk -v d="$dt" 'BEGIN {exit !(d < 15)}'; then ok "bothnow: worker $w stopped by $dt s after the kill (< 15 s)"
  else fail "bothnow: worker $w stopped $dt s after the kill (want < 15 s)"; fi
done
expect_grep "bothnow: the workers say no rendezvous is left to fail a server over" \
  "no rendezvous decides failovers now: a server unreachable or silent for 4.0 s is taken as lost" "$TMP/worker0.log"
cat "$TMP"/worker*.log |
  expect_grep "bothnow: a worker names the shard without a copy" "shard [01] has no live copy left" -

# --- bothring: worker 1 stopped, then both servers killed: worker 0 waits in a ring collective ---------------
# Worker 1 (SIGSTOP) answers nothing, as a worker that exited or waits on a dead server would. Worker 0 goes on
# until its next ring collective (the step's embedding allgather or gradient allreduce: it cannot reach a pull
# that waits for worker 1's push before the allreduce worker 1 is not in), where it asks no server. While it
# waits there its own probes of the servers find a shard without a live copy, and it exits 75 after about the
# loss bound (4 s), not after the ring's bound (32 s) and then 2 x ctl_timeout for a restarted rendezvous.
write_cfg bothring 2 "replicas = 1" "ctl_timeout = 8"
rm -f "$TMP"/*.log
start_cluster "$TMP/bothring.ini" 2 2
wait_log "$TMP/worker0.log" "Global Step: 6 " 120 || { show_logs; die "bothring: worker 0 did not reach step 6"; }
kill -STOP "${WPIDS[1]}"
sleep 0.5 # under the rendezvous' silence limit (2 s): worker 1 is not removed before the kill
t_kill=$(date +%s.%N)
kill -KILL "${SPIDS[1]}" "${SPIDS[0]}"
for _ in $(seq 1 300); do kill -0 "${WPIDS[0]}" 2>/dev/null || break; sleep 0.1; done
dt=$(echo "$(date +%s.%N) - $t_kill" | bc)
if kill -0 "${WPIDS[0]}" 2>/dev/null; then
  show_logs
  fail "bothring: worker 0 still runs 30 s after the kill"
else
  s=0; wait "${WPIDS[0]}" || s=$?
  expect_eq "bothring: worker 0 exits 75 (re-form)" "$s" 75
  if awk -v d="$dt" 'BEGIN {exit !(d < 12)}'; then ok "bothring: worker 0 stopped $dt s after the kill (< 12 s)"
  else fail "bothring: worker 0 stopped $dt s after the kill (want < 12 s)"; fi
fi
expect_grep "bothring: worker 0 stopped waiting in the ring when its probes found a shard without a copy" \
  "ring rank 0: collective [0-9]* step [0-9]*: stopped waiting for worker 1: shard [01] has no live copy left" \
  "$TMP/worker0.log"
kill -KILL "${WPIDS[@]}" 2>/dev/null
kill -CONT "${WPIDS[1]}" 2>/dev/null
expect_summary
