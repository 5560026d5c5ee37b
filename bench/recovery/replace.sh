#!/usr/bin/env bash
# Worker replacement soak (docs/architecture.md, "Worker replacement in place"): ROUNDS rounds (default 5) of a
# run on 10 ORL identities (snapshot_every 4, 6 epochs) with SERVERS servers (default 2), WORKERS workers
# (default 3) and replicas = 1, each with kill -9 of a random worker, worker 0 included (--victim N: always
# worker N) at a random moment: a random delay of 0..0.5 s after worker 0 logged a random step in 3..WORKERS-
# dependent end - 4, so kills fall anywhere in a step. The script then starts the killed worker again with the same command line at once (as its supervisor
# would: launch.sh --max-restarts, Kubernetes, systemd); it joins as its own replacement. Every round must end
# with every member exiting 0 and a model.ckpt and final checkpoint (pfcps ckpt-info table and worker 0's
# backbone SHA-256) identical to an uninterrupted replicas = 0 run's. Prints per round where the workers stood
# and what the servers held (the rendezvous' decision line), the time from the kill to the rendezvous'
# "replaced in place" line (the restart's start-up included) and to the first step worker 0 completes after its
# redo; then a summary; first, the whole-run wall time of an uninterrupted run with replicas = 0 and = 1.
# --classes N: the 10-identity run with a class-center table of N classes, D = 512, sample_rate 0.1, one
# checkpoint at the end (N = 2000000: 8.2 GB, 16.4 GB with both copies).
# --acc K: gradient_acc = K in every run (the reference's too): the redo starts at a window start.
# --with-server: each kill also takes a random server other than 0 (one kill: the machine holding both died);
# both are started again at once, the server after the worker: the server is failed over, the worker replaced
# in place, and the server rejoins after the replacement (or stops with the run, exiting 0, if it ended first).
# --with-server0: the same with server 0, the rendezvous' host: the members take the close as server 0's
# failover, resume at its restarted rendezvous, which adopts the run without the worker and replaces it in
# place; server 0 then rejoins.
# --at-end: each kill lands at the end of training instead, a random 0..0.3 s after worker 0 logged the last step
# (in the final save, the end vote, or after it): a worker lost before the vote is replaced and its replacement
# writes its final outputs; one lost after it ends the run without it (docs/architecture.md, "The end of training
# is a step boundary too"). The restarted worker, when the run ended before it could join, is stopped once every
# other member exited (as launch.sh does). Prints which way each round went and the time from the kill to the
# last member's exit.
# usage: bench/recovery/replace.sh [-b BUILD] [--victim N] [--classes N] [--acc K] [--with-server | --with-server0]
#                                  [--at-end] [ROUNDS [SERVERS [WORKERS]]]
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$SRC/build
[ "${1:-}" = -b ] && { BUILD=$2; shift 2; }
VICTIM=
[ "${1:-}" = --victim ] && { VICTIM=$2; shift 2; }
CLASSES=
[ "${1:-}" = --classes ] && { CLASSES=$2; shift 2; }
ACC=1
[ "${1:-}" = --acc ] && { ACC=$2; shift 2; }
WITH_SERVER=0
[ "${1:-}" = --with-server ] && { WITH_SERVER=1; shift; }
[ "${1:-}" = --with-server0 ] && { WITH_SERVER=0; SERVER0=1; shift; }
SERVER0=${SERVER0:-0}
AT_END=0
[ "${1:-}" = --at-end ] && { AT_END=1; shift; }
ROUNDS=${1:-5}
SERVERS=${2:-2}
WORKERS=${3:-3}
[ "$WITH_SERVER" = 1 ] && [ "$SERVERS" -lt 2 ] && { echo "replace.sh: --with-server needs 2 servers or more" >&2; exit 2; }
PFCPS=$BUILD/tools/pfcps # used by common.sh (final)
export PFCPS
export OMP_NUM_THREADS=1 PFCPS_SECRET=replace-secret
TMP=$(mktemp -d)
# PFCPS_KEEP_TMP=1 keeps the scratch folder (logs of every round) for a look after a failed round.
trap 'pkill -KILL -f "$TMP/" 2>/dev/null; if [ -n "${PFCPS_KEEP_TMP:-}" ]; then echo "kept $TMP"; else rm -rf "$TMP"; fi' EXIT
. "$SRC/bench/recovery/common.sh"
recovery_stage || exit 1
# cfg NAME REPLICAS
cfg() {
  if [ -z "$CLASSES" ]; then
    recovery_ini "$1" "$SERVERS" "$WORKERS" "$2" 40 "sample_rate = 0.25" "pfc_update = dense" \
      "gradient_acc = $ACC"
  else
    recovery_ini "$1" "$SERVERS" "$WORKERS" "$2" "$CLASSES" "pfc_update = dense" "embedding_size = 512" \
      "sample_rate = 0.1" "snapshot_every = 1000" "snapshot_keep = 1" "gradient_acc = $ACC"
  fi
}
elapsed() { python3 -c "print(f'{$(date +%s.%N) - $1:.1f}')"; }
cfg ref 0
t0=$(date +%s.%N)
"$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/ref.ini" >"$TMP/ref.out" 2>&1 || { tail "$TMP/ref.out"; exit 1; }
t_ref=$(elapsed "$t0")
REF=$(final "$TMP/ref")
TOTAL=$(sed -n 's/^step \([0-9]*\):.*/\1/p' <<<"$REF")
echo "reference (replicas = 0, uninterrupted): $t_ref s, $TOTAL steps; $REF"
cfg rep 1
t0=$(date +%s.%N)
"$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/rep.ini" >"$TMP/rep.out" 2>&1 || { tail "$TMP/rep.out"; exit 1; }
t_rep=$(elapsed "$t0")
same=no
[ "$(final "$TMP/rep")" = "$REF" ] && cmp -s "$TMP/ref/model.ckpt" "$TMP/rep/model.ckpt" && same=yes
echo "replicas = 1, uninterrupted: $t_rep s (x$(python3 -c "print(round($t_rep / $t_ref, 2))") of replicas = 0, whole run" \
  "with start-up); identical: $same"
rm -rf "$TMP/rep"
RANDOM=$$
pass=0; sum_rep=0; sum_step=0; n_t=0
for ((k = 1; k <= ROUNDS; k++)); do
  name=r$k
  cfg "$name" 1
  pids=()
  for ((r = 0; r < SERVERS; r++)); do
    "$BUILD/server/pfcps-server" --config "$TMP/$name.ini" --rank "$r" >"$TMP/$name.s$r.log" 2>&1 &
    pids+=($!)
  done
  wp=()
  for ((r = 0; r < WORKERS; r++)); do
    "$BUILD/worker/pfcps-worker" --config "$TMP/$name.ini" --rank "$r" >"$TMP/$name.w$r.log" 2>&1 &
    wp+=($!)
  done
  at=$((3 + RANDOM % (TOTAL - 6)))
  victim=${VICTIM:-$((RANDOM % WORKERS))}
  delay=$(python3 -c "print($RANDOM % 500 / 1000)")
  sv=
  [ "$WITH_SERVER" = 1 ] && sv=$((1 + RANDOM % (SERVERS - 1)))
  [ "$SERVER0" = 1 ] && sv=0
  if [ "$AT_END" = 1 ]; then
    # The end of a run takes tens of milliseconds: the log is watched every 0.5 ms and the kill comes 0..25 ms
    # after worker 0's last step line (its time printed by the watcher).
    delay=$(python3 -c "print($RANDOM % 26 / 1000)")
    t_kill=$(python3 - "$TMP/$name.w0.log" "Global Step: $TOTAL " "$delay" "${wp[$victim]}" <<'PY'
import os, signal, sys, time
log, pat, delay, pid = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
end = time.time() + 600
while time.time() < end:
    try:
        with open(log, errors="replace") as f:
            if pat in f.read():
                break
    except FileNotFoundError:
        pass
    time.sleep(0.0005)
time.sleep(delay)
t = time.time()
try:
    os.kill(pid, signal.SIGKILL)
    print(f"{t:.6f}")
except ProcessLookupError:
    print(f"{t:.6f} gone")
PY
)
    gone=
    [[ "$t_kill" == *gone ]] && { gone=" (it had exited already)"; t_kill=${t_kill% gone}; }
  else
  for ((i = 0; i < 1200; i++)); do grep -q "Global Step: $at " "$TMP/$name.w0.log" && break; sleep 0.1; done
  sleep "$delay"
  t_kill=$(date -u +%s.%N)
  fi
  kill -KILL "${wp[$victim]}" ${sv:+"${pids[$sv]}"} 2>/dev/null
  wait "${wp[$victim]}" 2>/dev/null
  "$BUILD/worker/pfcps-worker" --config "$TMP/$name.ini" --rank "$victim" >"$TMP/$name.w$victim.again.log" 2>&1 &
  wp[$victim]=$!
  if [ -n "$sv" ]; then
    wait "${pids[$sv]}" 2>/dev/null
    "$BUILD/server/pfcps-server" --config "$TMP/$name.ini" --rank "$sv" >"$TMP/$name.s$sv.again.log" 2>&1 &
    pids[$sv]=$!
  fi
  rc=0
  if [ "$AT_END" = 1 ]; then
    # The others first; the restarted worker last: when the run ended before it joined, it is stopped (SIGTERM,
    # as launch.sh does: exit 0, or 143 when the signal came before its handler).
    for r in "${!wp[@]}"; do [ "$r" = "$victim" ] || wait "${wp[$r]}" || rc=$?; done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    stopped=
    if kill -0 "${wp[$victim]}" 2>/dev/null; then kill -TERM "${wp[$victim]}"; stopped=" (its restart stopped: the run had ended)"; fi
    s=0; wait "${wp[$victim]}" || s=$?
    [ "$s" -eq 0 ] || { [ -n "$stopped" ] && [ "$s" -eq 143 ]; } || rc=$s
    t_end=$(date -u +%s.%N)
  else
    for p in "${wp[@]}"; do wait "$p" || rc=$?; done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  fi
  # Worker 0 logs the steps; a survivor logs the redo (worker 1 when worker 0 was the victim, whose replacement
  # then logs the steps).
  w0=$TMP/$name.w0.log wr=$TMP/$name.w0.log
  [ "$victim" = 0 ] && { w0=$TMP/$name.w0.again.log; wr=$TMP/$name.w1.log; }
  rvlog=$TMP/$name.s0.log # the rendezvous' log: server 0's (its restarted process' when it was killed)
  [ "$sv" = 0 ] && rvlog=$TMP/$name.s0.again.log
  t_rep=$(first_after "$rvlog" "worker\[$victim\] replaced in place" "$t_kill")
  t_redo=$(first_after "$wr" "redoing from step" "$t_kill")
  t_step=$([ -n "$t_redo" ] && first_after "$w0" "Global Step: " "$t_redo")
  decision=$(sed -n 's/.*every worker redoes \(step [0-9]* (workers stood at steps [0-9.]*, the servers held [0-9]* of its pushes)\).*/\1/p' "$rvlog" | head -1)
  got=$(final "$TMP/$name")
  ok=no
  [ "$rc" -eq 0 ] && [ "$got" = "$REF" ] && cmp -s "$TMP/ref/model.ckpt" "$TMP/$name/model.ckpt" && ok=yes
  [ "$ok" = yes ] && pass=$((pass + 1))
  if [ -n "$t_rep" ] && [ -n "$t_step" ]; then
    d_rep=$(python3 -c "print(f'{$t_rep - $t_kill:.2f}')"); d_step=$(python3 -c "print(f'{$t_step - $t_kill:.2f}')")
    sum_rep=$(python3 -c "print($sum_rep + $d_rep)"); sum_step=$(python3 -c "print($sum_step + $d_step)"); n_t=$((n_t + 1))
  else
    d_rep=never; d_step=never
  fi
  if [ "$AT_END" = 1 ]; then
    how="another way (see $TMP/$name.*)"
    [ -n "$gone" ] && how="nothing lost"
    if grep -q "worker\[$victim\] replaced in place" "$rvlog"; then
      how="lost before the end vote: replaced, its replacement wrote its final outputs"
    elif grep -q "worker\[$victim\] (.*) was lost after the end of training" "$rvlog"; then
      how="lost after the end vote: the run ended without it"
    elif grep -q "control plane: worker\[$victim\] left the run" "$rvlog"; then
      how="killed after it left the run: nothing lost"
    fi
    grep -q "falling back to the checkpoint re-form" "$rvlog" && how="$how; RE-FORMED"
    echo "round $k: kill -9 of worker $victim of $WORKERS ${delay} s after the last step ($TOTAL)$gone: $how$stopped;" \
      "last member out $(python3 -c "print(f'{$t_end - $t_kill:.2f}')") s after the kill; exit $rc; identical: $ok"
    [ -n "${PFCPS_KEEP_TMP:-}" ] || rm -rf "${TMP:?}/$name"
    continue
  fi
  rejoined=
  [ -n "$sv" ] && rejoined=$(grep -q "rejoin: both copies loaded" "$TMP/$name.s$sv.again.log" && echo ", server $sv rejoined" || echo ", server $sv did not rejoin before the end")
  echo "round $k: kill -9 of worker $victim of $WORKERS${sv:+ and server $sv of $SERVERS} ${delay} s after step $at:" \
    "${decision:-no decision}; replaced after $d_rep s, next step completed after $d_step s$rejoined; exit $rc;" \
    "identical: $ok"
  [ -n "${PFCPS_KEEP_TMP:-}" ] || rm -rf "${TMP:?}/$name"
done
[ "$n_t" -gt 0 ] || n_t=1
if [ "$AT_END" = 1 ]; then
  echo "summary: $pass/$ROUNDS rounds identical to the uninterrupted run, each with a worker killed at the end"
  [ "$pass" -eq "$ROUNDS" ]
  exit
fi
echo "summary: $pass/$ROUNDS rounds identical to the uninterrupted run; mean kill -> replaced in place" \
  "$(python3 -c "print(round($sum_rep / $n_t, 2))") s, kill -> next completed step $(python3 -c "print(round($sum_step / $n_t, 2))") s (restart included)"
[ "$pass" -eq "$ROUNDS" ]
