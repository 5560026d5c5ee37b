#!/usr/bin/env bash
# Every process trains with server 0's config. A worker started with its own values for some keys (here
# --set lr=0.3 --set num_epoch=3 while server 0 has lr = 0.05 and the default num_epoch 20) drops them with a
# warning naming each such key with both values. Keys left at their default, keys equal to the run's,
# `rendezvous` and the member-local `join_timeout` (here 90) are not named.
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1
run_ini "$TMP/run.ini" - - keys-secret <<INI
[train]
$ONE_STEP_NET
lr = 0.05
output = $TMP/out
[data]
$ONE_STEP_DATA
INI
run_cluster "the worker failed" "$TMP/run.ini" 1 1 --set lr=0.3 --set num_epoch=3 --set "rendezvous=localhost:$PORT" --set join_timeout=90 --max-steps 1
w=$(grep "WARN this worker's config sets" "$TMP/worker0.log") || { show_logs; die "no warning about the worker's own keys"; }
echo "$w" | sed 's/^.* WARN //'
grep -qF "2 keys that the run does not use" <<<"$w" || die "wrong key count"
grep -qF "lr = 0.3 (0.05)" <<<"$w" || die "lr not named with both values"
grep -qF "num_epoch = 3 (20)" <<<"$w" || die "num_epoch not named with both values"
grep -q "rendezvous\|embedding_size\|join_timeout" <<<"$w" && die "a key that is not different, or member-local, was named"
grep -qE ": lr +0.05$" "$TMP/worker0.log" || die "the run did not train with server 0's lr"
echo PASS
