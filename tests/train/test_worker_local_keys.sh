#!/usr/bin/env bash
# Every process trains with server 0's config. A worker started with its own values for some keys (here
# --set lr=0.3 --set num_epoch=3 while server 0 has lr = 0.05 and the default num_epoch 20) used to drop them
# without a word; it now warns, naming each such key with both values. Keys left at their default, keys equal
# to the run's and `rendezvous` are not named.
set -uo pipefail
SERVER=$1 WORKER=$2
TMP=$(mktemp -d)
source "$(dirname "$0")/cluster.sh"
export OMP_NUM_THREADS=1
port=$(free_port)
cat >"$TMP/run.ini" <<INI
[train]
network = r18_w8
embedding_size = 16
batch_size = 2
lr = 0.05
output = $TMP/out
[data]
rec = synthetic
num_classes = 4
num_image = 8
num_workers = 1
[cluster]
rendezvous = 127.0.0.1:$port
secret = keys-secret
INI
"$SERVER" --config "$TMP/run.ini" --rank 0 >"$TMP/server0.log" 2>&1 &
SPIDS=($!); PIDS+=($!)
"$WORKER" --config "$TMP/run.ini" --rank 0 --set lr=0.3 --set num_epoch=3 --set "rendezvous=localhost:$port" \
  --max-steps 1 >"$TMP/worker0.log" 2>&1 &
WPIDS=($!); PIDS+=($!)
wait_all "${WPIDS[@]}" || { show_logs; fail "the worker failed"; }
stop_servers
w=$(grep "WARN this worker's config sets" "$TMP/worker0.log") || { show_logs; fail "no warning about the worker's own keys"; }
echo "$w" | sed 's/^.* WARN //'
grep -qF "2 keys that the run does not use" <<<"$w" || fail "wrong key count"
grep -qF "'lr = 0.3' (the run has 'lr = 0.05')" <<<"$w" || fail "lr not named with both values"
grep -qF "'num_epoch = 3' (the run has 'num_epoch = 20')" <<<"$w" || fail "num_epoch not named with both values"
grep -q "rendezvous\|embedding_size" <<<"$w" && fail "a key that is not different was named"
grep -qE ": lr +0.05$" "$TMP/worker0.log" || fail "the run did not train with server 0's lr"
echo PASS
