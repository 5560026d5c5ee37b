#!/usr/bin/env bash
# Failover soak (replicas = 1): ROUNDS rounds (default 5) of a run on 10 ORL identities (snapshot_every 4, 36
# steps) with SERVERS servers (default 2) and 2 workers, each with kill -9 of a random server (server 0, which
# runs the rendezvous, included: docs/architecture.md, "Server 0 and the rendezvous"; --victim N: always server
# N) once worker 0 has logged a random step in 4..24. No launcher and no supervisor: nothing restarts. Every round must
# end with every worker exiting 0 and a model.ckpt and final checkpoint (pfcps ckpt-info table and backbone
# SHA-256) identical to an uninterrupted replicas = 0 run's. Prints per round the time from the kill to the
# next step worker 0 completes (its log line's time) and to the failover line of the server holding the lost
# shard's backup (its "failover (epoch 1)" line), and a summary; first,
# the wall time of an uninterrupted run with replicas = 0 and with replicas = 1 (whole runs, start-up included).
# --rejoin: each round also starts the killed server again with the same command line once the failover is
# announced (it rejoins: docs/architecture.md, "Hot-standby shards", Rejoin; the victim is then never server
# 0, whose own log this round's timings read; tests/deploy/local/test_server0.sh restarts server 0) and
# prints the time from its start
# to the rendezvous' "rejoined" line, how long the workers held their pushes for the copy (worker 0's log), and
# worker 0's step time around the copy: the median of the steps before the kill and the step that held.
# --quickstart: the quick start's run instead (deploy/configs/quickstart.ini: 30 ORL identities, r18_w16,
# D = 128, 144 steps), with snapshot_every 4, replicas, a log line every step and this script's rendezvous.
# --classes N: the 10-identity run with a class-center table of N classes (the 10 identities' labels among
# them), D = 512, sample_rate 0.1, one checkpoint at the end (snapshot_every 36, snapshot_keep 1): the
# failover at a table of realistic size (N = 2000000: 8.2 GB, 16.4 GB with both copies).
# usage: bench/recovery/failover.sh [-b BUILD] [--rejoin] [--victim N] [--quickstart] [--classes N] [ROUNDS [SERVERS]]
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$SRC/build
[ "${1:-}" = -b ] && { BUILD=$2; shift 2; }
REJOIN=0
[ "${1:-}" = --rejoin ] && { REJOIN=1; shift; }
VICTIM=
[ "${1:-}" = --victim ] && { VICTIM=$2; shift 2; }
QUICK=0
[ "${1:-}" = --quickstart ] && { QUICK=1; shift; }
CLASSES=
[ "${1:-}" = --classes ] && { CLASSES=$2; shift 2; }
[ "$REJOIN" = 1 ] && [ "$VICTIM" = 0 ] && { echo "--rejoin: the victim must not be server 0 (its log is read)" >&2; exit 2; }
ROUNDS=${1:-5}
SERVERS=${2:-2}
PFCPS=$BUILD/tools/pfcps
export OMP_NUM_THREADS=1 PFCPS_SECRET=failover-secret
TMP=$(mktemp -d)
trap 'pkill -KILL -f "$TMP/" 2>/dev/null; rm -rf "$TMP"' EXIT
. "$SRC/bench/recovery/common.sh"
if [ "$QUICK" = 1 ]; then
  mkdir -p "$TMP/stage"
  for i in $(seq 1 30); do ln -sfn "$SRC/data/orl/s$i" "$TMP/stage/s$i"; done
  "$PFCPS" pack --quiet "$TMP/stage" "$TMP/train" || exit 1
else
  recovery_stage || exit 1
fi
# cfg NAME SERVERS REPLICAS
cfg() {
  if [ "$QUICK" = 1 ]; then
    # The quick start's config, then this run's keys (a later key overrides; sections do not matter).
    { cat "$SRC/deploy/configs/quickstart.ini"
      printf '[train]\noutput = %s\nfrequent = 1\n[data]\nrec = %s\n[cluster]\nservers = %s\nrendezvous = 127.0.0.1:%s\nctl_timeout = 20\njoin_timeout = 20\n[server]\nsnapshot_every = 4\nreplicas = %s\n' \
        "$TMP/$1" "$TMP/train" "$2" "$(port)" "$3"; } >"$TMP/$1.ini"
    return
  fi
  if [ -z "$CLASSES" ]; then
    recovery_ini "$1" "$2" 2 "$3" 40 "sample_rate = 0.25"
  else
    recovery_ini "$1" "$2" 2 "$3" "$CLASSES" "embedding_size = 512" "sample_rate = 0.1" "snapshot_every = 36" \
      "snapshot_keep = 1"
  fi
}
cfg ref "$SERVERS" 0
t0=$(date +%s.%N)
"$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/ref.ini" >"$TMP/ref.out" 2>&1 || { tail "$TMP/ref.out"; exit 1; }
t_ref=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")
REF=$(final "$TMP/ref")
echo "reference (replicas = 0, uninterrupted): $t_ref s; $REF"
cfg rep "$SERVERS" 1
t0=$(date +%s.%N)
"$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/rep.ini" >"$TMP/rep.out" 2>&1 || { tail "$TMP/rep.out"; exit 1; }
t_rep=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")
same=no
[ "$(final "$TMP/rep")" = "$REF" ] && cmp -s "$TMP/ref/model.ckpt" "$TMP/rep/model.ckpt" && same=yes
echo "replicas = 1, uninterrupted: $t_rep s (x$(python3 -c "print(round($t_rep / $t_ref, 2))") of replicas = 0, whole run" \
  "with start-up); identical: $same"
rm -rf "$TMP/rep"
RANDOM=$$
pass=0; sum_step=0; sum_fo=0; sum_back=0; sum_held=0
for ((k = 1; k <= ROUNDS; k++)); do
  name=r$k
  cfg "$name" "$SERVERS" 1
  pids=()
  for ((r = 0; r < SERVERS; r++)); do
    "$BUILD/server/pfcps-server" --config "$TMP/$name.ini" --rank "$r" >"$TMP/$name.s$r.log" 2>&1 &
    pids+=($!)
  done
  wp=()
  for r in 0 1; do
    "$BUILD/worker/pfcps-worker" --config "$TMP/$name.ini" --rank "$r" >"$TMP/$name.w$r.log" 2>&1 &
    wp+=($!)
  done
  at=$((4 + RANDOM % 21))
  if [ -n "$VICTIM" ]; then victim=$VICTIM
  elif [ "$REJOIN" = 1 ]; then victim=$((1 + RANDOM % (SERVERS - 1)))
  else victim=$((RANDOM % SERVERS)); fi
  heir=$(((victim + 1) % SERVERS)) # holds the victim's backup: its log has the failover line
  for ((i = 0; i < 1200; i++)); do grep -q "Global Step: $at " "$TMP/$name.w0.log" && break; sleep 0.1; done
  t_kill=$(date -u +%s.%N)
  kill -KILL "${pids[$victim]}"
  back=
  if [ "$REJOIN" = 1 ]; then
    for ((i = 0; i < 300; i++)); do grep -q "failover: server\[$victim\]" "$TMP/$name.s0.log" && break; sleep 0.1; done
    t_start=$(date -u +%s.%N)
    "$BUILD/server/pfcps-server" --config "$TMP/$name.ini" --rank "$victim" >"$TMP/$name.s$victim.again.log" 2>&1 &
    back=$!
  fi
  rc=0
  for p in "${wp[@]}"; do wait "$p" || rc=$?; done
  for ((r = 0; r < SERVERS; r++)); do [ "$r" -eq "$victim" ] || wait "${pids[$r]}" || rc=$?; done
  [ -z "$back" ] || wait "$back" || rc=$?
  rejoin_msg=
  if [ "$REJOIN" = 1 ]; then
    t_back=$(first_after "$TMP/$name.s0.log" "rejoin: server\[$victim\] .* rejoined" "$t_start")
    held=$(sed -n 's/.*rejoin of server [0-9]*: it holds its copies again after checkpoint step [0-9]*; pushes held \([0-9.]*\) s.*/\1/p' "$TMP/$name.w0.log" | head -1)
    # worker 0's step times (differences of its log lines' times): median before the kill, and the step that
    # held (the one ending with the first log line after the hold's line).
    steps=$(grep -E "Global Step: |rejoin of server" "$TMP/$name.w0.log" | while read -r line; do
      echo "$(iso_s "$line") $(grep -q 'rejoin of server' <<<"$line" && echo H || echo S)"; done |
      python3 -c "
import sys
rows = [l.split() for l in sys.stdin]
ts = [(float(t), k) for t, k in rows]
kill = $t_kill
steps = [t for t, k in ts if k == 'S']
d = [b - a for a, b in zip(steps, steps[1:])]
before = sorted(b - a for a, b in zip(steps, steps[1:]) if b < kill)
h = [t for t, k in ts if k == 'H']
held = [b - a for a, b in zip(steps, steps[1:]) if h and a < h[0] < b]
print(f'{before[len(before) // 2]:.3f} {held[0]:.3f}' if before and held else '- -')")
    d_back=$(python3 -c "print(f'{${t_back:-0} - $t_start:.2f}')")
    [ -n "$t_back" ] || d_back=never
    rejoin_msg="; restarted: two copies again after $d_back s, pushes held ${held:--} s, worker 0 step ${steps% *} s median before, ${steps#* } s with the hold"
    [ -n "$t_back" ] && [ -n "$held" ] && { sum_back=$(python3 -c "print($sum_back + $d_back)"); sum_held=$(python3 -c "print($sum_held + $held)"); }
  fi
  t_step=$(first_after "$TMP/$name.w0.log" "Global Step: " "$t_kill")
  t_fo=$(first_after "$TMP/$name.s$heir.log" "failover \(epoch" "$t_kill")
  d_step=$(python3 -c "print(f'{${t_step:-0} - $t_kill:.2f}')")
  d_fo=$(python3 -c "print(f'{${t_fo:-0} - $t_kill:.3f}')")
  got=$(final "$TMP/$name")
  ok=no
  [ "$rc" -eq 0 ] && [ "$got" = "$REF" ] && cmp -s "$TMP/ref/model.ckpt" "$TMP/$name/model.ckpt" && ok=yes
  [ $ok = yes ] && pass=$((pass + 1))
  echo "round $k: kill -9 of server $victim of $SERVERS at step $at: failover announced after $d_fo s, next step" \
    "completed after $d_step s; exit $rc; identical: $ok$rejoin_msg"
  sum_step=$(python3 -c "print($sum_step + $d_step)"); sum_fo=$(python3 -c "print($sum_fo + $d_fo)")
  rm -rf "$TMP/$name"
done
echo "summary: $pass/$ROUNDS rounds identical to the uninterrupted run; mean kill -> failover" \
  "$(python3 -c "print(round($sum_fo / $ROUNDS, 3))") s, kill -> next completed step $(python3 -c "print(round($sum_step / $ROUNDS, 2))") s"
[ "$REJOIN" = 1 ] && echo "rejoin: mean restart -> two copies again $(python3 -c "print(round($sum_back / $ROUNDS, 2))") s," \
  "pushes held $(python3 -c "print(round($sum_held / $ROUNDS, 3))") s (rounds whose rejoin completed count; others as 0)"
[ "$pass" -eq "$ROUNDS" ]
