#!/usr/bin/env bash
# Recovery soak: ROUNDS rounds (default 20) of a 2 + 2 run on 10 ORL identities (snapshot_every 4) under
# `launch.sh --max-restarts 3`, each with kill -9 of a random member (server 0, server 1, worker 0 or worker 1)
# at a random moment after the first checkpoint. Every round must end with exit 0 and a model.ckpt and final
# checkpoint (pfcps ckpt-info table and backbone SHA-256) identical to an uninterrupted run's.
# Prints one line per round and a summary: rounds passed, restarts, the step resumed from, wall time of a round
# vs the uninterrupted run.
# usage: bench/recovery/soak.sh [-b BUILD] [ROUNDS]
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$SRC/build
[ "${1:-}" = -b ] && { BUILD=$2; shift 2; }
ROUNDS=${1:-20}
PFCPS=$BUILD/tools/pfcps
export OMP_NUM_THREADS=1 PFCPS_SECRET=soak-secret
TMP=$(mktemp -d)
trap 'pkill -KILL -f "$TMP/" 2>/dev/null; rm -rf "$TMP"' EXIT
mkdir -p "$TMP/stage"
for i in $(seq 1 10); do ln -s "$SRC/data/orl/s$i" "$TMP/stage/s$i"; done
"$PFCPS" pack --quiet "$TMP/stage" "$TMP/train" || exit 1
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
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
[data]
rec = $TMP/train
num_classes = 10
num_workers = 1
[cluster]
servers = 2
workers = 2
rendezvous = 127.0.0.1:$(port)
[server]
snapshot_every = 4
INI
}
final() {
  local s; s=$("$PFCPS" ckpt-info --newest "$1")
  "$PFCPS" ckpt-info "$1" | grep "^step $s: complete" | sed 's/  [0-9.]* MB//'
}
cfg ref
t0=$(date +%s.%N)
"$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/ref.ini" >"$TMP/ref.out" 2>&1 || { tail "$TMP/ref.out"; exit 1; }
t_ref=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
REF=$(final "$TMP/ref")
echo "reference: $t_ref s; $REF"
RANDOM=$$
pass=0; restarts=0; lost=0; t_sum=0
victims=("pfcps-server --config X --rank 0" "pfcps-server --config X --rank 1" "pfcps-worker --config X --rank 0" "pfcps-worker --config X --rank 1")
for ((k = 1; k <= ROUNDS; k++)); do
  name=r$k
  cfg "$name"
  v=${victims[RANDOM % 4]}
  v=${v/X/$TMP/$name.ini}
  t0=$(date +%s.%N)
  setsid "$SRC/deploy/local/launch.sh" -b "$BUILD" --max-restarts 3 -c "$TMP/$name.ini" >"$TMP/$name.out" 2>&1 &
  lp=$!
  # wait for the first checkpoint, then a random 0-6 s more
  for ((i = 0; i < 600; i++)); do
    s=$("$PFCPS" ckpt-info --newest "$TMP/$name" 2>/dev/null || echo 0); [ "${s:-0}" -ge 4 ] && break; sleep 0.1
  done
  sleep "$((RANDOM % 6)).$((RANDOM % 10))"
  pid=$(pgrep -f "$v" | head -1)
  [ -n "$pid" ] && kill -KILL "$pid"
  rc=0; wait "$lp" || rc=$?
  t=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  n=$(grep -c "restart [0-9]*/3" "$TMP/$name.out")
  from=$(sed -n 's/.*from checkpoint step \([0-9]*\).*/\1/p' "$TMP/$name.out" | head -1)
  got=$(final "$TMP/$name")
  ok=no
  [ "$rc" -eq 0 ] && [ "$got" = "$REF" ] && cmp -s "$TMP/ref/model.ckpt" "$TMP/$name/model.ckpt" && ok=yes
  [ $ok = yes ] && pass=$((pass + 1))
  restarts=$((restarts + n))
  echo "round $k: kill -9 of ${v%% *} rank ${v##* } ${pid:+(pid $pid)}: exit $rc, $n restart(s) from step ${from:-?}, $t s, identical: $ok"
  t_sum=$(python3 -c "print($t_sum + $t)")
  rm -rf "$TMP/$name"
done
echo "summary: $pass/$ROUNDS rounds identical to the uninterrupted run, $restarts restarts, mean round $(python3 -c "print(round($t_sum / $ROUNDS, 1))") s vs $t_ref s uninterrupted"
[ "$pass" -eq "$ROUNDS" ]
