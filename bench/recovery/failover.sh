#!/usr/bin/env bash
# Failover soak (replicas = 1): ROUNDS rounds (default 5) of a run on 10 ORL identities (snapshot_every 4, 36
# steps) with SERVERS servers (default 2) and 2 workers, each with kill -9 of a random server other than 0 once
# worker 0 has logged a random step in 4..24. No launcher and no supervisor: nothing restarts. Every round must
# end with every worker exiting 0 and a model.ckpt and final checkpoint (pfcps ckpt-info table and backbone
# SHA-256) identical to an uninterrupted replicas = 0 run's. Prints per round the time from the kill to the
# next step worker 0 completes (its log line's time) and to the failover line of server 0, and a summary; first,
# the wall time of an uninterrupted run with replicas = 0 and with replicas = 1 (whole runs, start-up included).
# usage: bench/recovery/failover.sh [-b BUILD] [ROUNDS [SERVERS]]
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$SRC/build
[ "${1:-}" = -b ] && { BUILD=$2; shift 2; }
ROUNDS=${1:-5}
SERVERS=${2:-2}
PFCPS=$BUILD/tools/pfcps
export OMP_NUM_THREADS=1 PFCPS_SECRET=failover-secret
TMP=$(mktemp -d)
trap 'pkill -KILL -f "$TMP/" 2>/dev/null; rm -rf "$TMP"' EXIT
mkdir -p "$TMP/stage"
for i in $(seq 1 10); do ln -s "$SRC/data/orl/s$i" "$TMP/stage/s$i"; done
"$PFCPS" pack --quiet "$TMP/stage" "$TMP/train" || exit 1
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# cfg NAME SERVERS REPLICAS
cfg() {
  cat >"$TMP/$1.ini" <<INI
[train]
network = r18_w8
embedding_size = 32
margin_list = 1.0, 0.0, 0.35
batch_size = 8
lr = 0.1
num_epoch = 6
warmup_epoch = 1
output = $TMP/$1
seed = 7
sample_rate = 0.25
[data]
rec = $TMP/train
num_classes = 40
num_workers = 1
frequent = 1
[cluster]
servers = $2
workers = 2
rendezvous = 127.0.0.1:$(port)
ctl_timeout = 20
[server]
snapshot_every = 4
replicas = $3
INI
}
final() {
  local s; s=$("$PFCPS" ckpt-info --newest "$1")
  "$PFCPS" ckpt-info "$1" | grep "^step $s: complete" | sed 's/  [0-9.]* MB//'
}
iso_s() { date -u -d "$(cut -d' ' -f1 <<<"$1" | sed 's/Z$//; s/T/ /')" +%s.%N; }
# first_after FILE PATTERN T: the time of FILE's first line matching PATTERN logged after T (empty if none).
first_after() {
  local line s
  while read -r line; do
    s=$(iso_s "$line")
    python3 -c "import sys; sys.exit(0 if $s > $3 else 1)" && { echo "$s"; return; }
  done < <(grep -E "$2" "$1")
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
pass=0; sum_step=0; sum_fo=0
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
  at=$((4 + RANDOM % 21)); victim=$((1 + RANDOM % (SERVERS - 1)))
  for ((i = 0; i < 1200; i++)); do grep -q "Global Step: $at " "$TMP/$name.w0.log" && break; sleep 0.1; done
  t_kill=$(date -u +%s.%N)
  kill -KILL "${pids[$victim]}"
  rc=0
  for p in "${wp[@]}"; do wait "$p" || rc=$?; done
  for ((r = 0; r < SERVERS; r++)); do [ "$r" -eq "$victim" ] || wait "${pids[$r]}" || rc=$?; done
  t_step=$(first_after "$TMP/$name.w0.log" "Global Step: " "$t_kill")
  t_fo=$(first_after "$TMP/$name.s0.log" "failover: server" "$t_kill")
  d_step=$(python3 -c "print(f'{${t_step:-0} - $t_kill:.2f}')")
  d_fo=$(python3 -c "print(f'{${t_fo:-0} - $t_kill:.3f}')")
  got=$(final "$TMP/$name")
  ok=no
  [ "$rc" -eq 0 ] && [ "$got" = "$REF" ] && cmp -s "$TMP/ref/model.ckpt" "$TMP/$name/model.ckpt" && ok=yes
  [ $ok = yes ] && pass=$((pass + 1))
  echo "round $k: kill -9 of server $victim of $SERVERS at step $at: failover announced after $d_fo s, next step" \
    "completed after $d_step s; exit $rc; identical: $ok"
  sum_step=$(python3 -c "print($sum_step + $d_step)"); sum_fo=$(python3 -c "print($sum_fo + $d_fo)")
  rm -rf "$TMP/$name"
done
echo "summary: $pass/$ROUNDS rounds identical to the uninterrupted run; mean kill -> failover" \
  "$(python3 -c "print(round($sum_fo / $ROUNDS, 3))") s, kill -> next completed step $(python3 -c "print(round($sum_step / $ROUNDS, 2))") s"
[ "$pass" -eq "$ROUNDS" ]
