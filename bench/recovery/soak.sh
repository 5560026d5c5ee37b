#!/usr/bin/env bash
# Recovery soak: ROUNDS rounds (default 20) of a 2 + 2 run on 10 ORL identities (snapshot_every 4, 36 steps)
# under `launch.sh --max-restarts 3`, each with kill -9 of a random member (server 0, server 1, worker 0 or
# worker 1) once worker 0 has logged a random step in 5..34 (after the first checkpoint, before the last step).
# Every round must end with exit 0 and a model.ckpt and final checkpoint (pfcps ckpt-info table and backbone
# SHA-256) identical to an uninterrupted run's.
# With --replicas 1 every shard also has a hot-standby copy (config key replicas): a killed server, server 0
# included (every member then fails it over itself: docs/architecture.md, "Server 0 and the rendezvous"), fails
# over to the backups and is started again by the launcher, which it rejoins (server 0 through a new
# rendezvous that adopts the run); a killed worker, started again alone by the launcher, is replaced in place
# (the others redo the step it was lost in); the reference stays an uninterrupted replicas = 0 run.
# Prints one line per round and a summary: rounds passed, restarts, the step resumed from, the time from the
# kill to the next step worker 0 completes (its log line's time; after a re-form, the first step of the
# restarted run) and the steps computed again (the last step
# worker 0 had logged before the kill minus the step resumed from), wall time of a round vs the uninterrupted
# run.
# usage: bench/recovery/soak.sh [-b BUILD] [--replicas 0|1] [ROUNDS]
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$SRC/build
[ "${1:-}" = -b ] && { BUILD=$2; shift 2; }
REPLICAS=0
[ "${1:-}" = --replicas ] && { REPLICAS=$2; shift 2; }
ROUNDS=${1:-20}
PFCPS=$BUILD/tools/pfcps # used by common.sh (final, recovery_stage)
export PFCPS
export OMP_NUM_THREADS=1 PFCPS_SECRET=soak-secret
TMP=$(mktemp -d)
trap 'pkill -KILL -f "$TMP/" 2>/dev/null; rm -rf "$TMP"' EXIT
. "$SRC/bench/recovery/common.sh"
recovery_stage || exit 1
# cfg NAME REPLICAS
cfg() {
  recovery_ini "$1" 2 2 "$2" 10 "ctl_timeout = 30"
}
cfg ref 0
t0=$(date +%s.%N)
"$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/ref.ini" >"$TMP/ref.out" 2>&1 || { tail "$TMP/ref.out"; exit 1; }
t_ref=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
REF=$(final "$TMP/ref")
echo "reference: $t_ref s; $REF"
RANDOM=$$
pass=0; restarts=0; t_sum=0; sum_step=0; n_step=0; sum_again=0
victims=("pfcps-server --config X --rank 0" "pfcps-server --config X --rank 1" "pfcps-worker --config X --rank 0" "pfcps-worker --config X --rank 1")
for ((k = 1; k <= ROUNDS; k++)); do
  name=r$k
  cfg "$name" "$REPLICAS"
  v=${victims[RANDOM % 4]}
  v=${v/X/$TMP/$name.ini}
  t0=$(date +%s.%N)
  setsid "$SRC/deploy/local/launch.sh" -b "$BUILD" --max-restarts 3 -c "$TMP/$name.ini" >"$TMP/$name.out" 2>&1 &
  lp=$!
  # a random step after the first checkpoint (step 4) and before the last (36): once worker 0 logged it
  at=$((5 + RANDOM % 30))
  for ((i = 0; i < 1200; i++)); do
    grep -q "Global Step: $at " "$TMP/$name/logs/worker0.log" 2>/dev/null && break; sleep 0.05
  done
  pid=$(pgrep -f "$v" | head -1)
  t_kill=$(date -u +%s.%N)
  [ -n "$pid" ] && kill -KILL "$pid"
  rc=0; wait "$lp" || rc=$?
  t=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  n=$(grep -c "restart [0-9]*/3" "$TMP/$name.out")
  from=$(sed -n 's/.*from checkpoint step \([0-9]*\).*/\1/p' "$TMP/$name.out" | head -1)
  w0=$TMP/$name/logs/worker0.log
  # after a re-form: the restarted run's first step (a step of the old run may still complete after the kill)
  t_from=$t_kill
  [ "$n" -gt 0 ] && t_from=$(first_after "$w0" "joined: " "$t_kill")
  t_step=$(first_after "$w0" "Global Step: " "${t_from:-$t_kill}")
  d_step=none # no step after the kill: the run had ended (a kill during its shutdown)
  [ -n "$t_step" ] && d_step=$(python3 -c "print(f'{$t_step - $t_kill:.2f}')")
  at=$(last_step_before "$w0" "$t_kill")
  # a worker replaced in place: the survivors redo from step R (0-based), so the steps done past R run again
  redo=$(grep -ho "redoing from step [0-9]*" "$TMP/$name/logs/"worker*.log 2>/dev/null | head -1 | awk '{print $4}')
  how="no recovery needed"
  if grep -q "from checkpoint step" "$TMP/$name.out"; then how=re-form
  elif [ -n "$redo" ]; then how="replaced in place"; from=
  elif grep -q "failover (epoch" "$w0"; then how=failover
  fi
  again=$(( n > 0 ? at - ${from:-$at} : 0 ))
  [ -n "$redo" ] && again=$(( at > redo ? at - redo : 0 ))
  got=$(final "$TMP/$name")
  ok=no
  [ "$rc" -eq 0 ] && [ "$got" = "$REF" ] && cmp -s "$TMP/ref/model.ckpt" "$TMP/$name/model.ckpt" && ok=yes
  [ $ok = yes ] && pass=$((pass + 1))
  restarts=$((restarts + n))
  echo "round $k: kill -9 of ${v%% *} rank ${v##* } ${pid:+(pid $pid)} after step $at: exit $rc, $how, $n restart(s)" \
    "${from:+from step $from }${redo:+redo from step $redo }($again step(s) again), next step completed after $d_step s," \
    "$t s, identical: $ok"
  t_sum=$(python3 -c "print($t_sum + $t)")
  [ "$d_step" != none ] && { sum_step=$(python3 -c "print($sum_step + $d_step)"); n_step=$((n_step + 1)); }
  sum_again=$((sum_again + again))
  rm -rf "${TMP:?}/$name"
done
echo "summary (replicas = $REPLICAS): $pass/$ROUNDS rounds identical to the uninterrupted run, $restarts restarts," \
  "$sum_again steps computed again, mean kill -> next completed step $(python3 -c "print(round($sum_step / max($n_step, 1), 2))") s ($n_step rounds with a step after the kill)," \
  "mean round $(python3 -c "print(round($t_sum / $ROUNDS, 1))") s vs $t_ref s uninterrupted"
[ "$pass" -eq "$ROUNDS" ]
