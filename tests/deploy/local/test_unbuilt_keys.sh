#!/usr/bin/env bash
# Keys that arcface_torch configs carry but that mean nothing here are never ignored silently: fp16 = true
# on the CPU device (no half path) and save_all_states = true (pfcps's checkpoints are snapshot_every's) train
# on with a warning. (device = cuda is built: its refusals without a GPU are test_device_refusals.sh; resume and
# snapshot_every are built: test_recovery.sh.)
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1
write_cfg() { # write_cfg TRAIN_LINE CLUSTER_LINE
  run_ini "$TMP/run.ini" 1 1 keys-secret "$2" <<INI
[train]
$TINY_NET
num_epoch = 1
output = $TMP/out
$1
[data]
$TINY_DATA
num_workers = 1
INI
}
warned() {
  local line=$1 sline=$2 text=$3 who=$4
  write_cfg "$line" "$sline"
  run_cluster "'$line$sline': the worker failed" "$TMP/run.ini" 1 1
  grep -q "WARN.*$text" "$TMP/$who.log" || { show_logs; die "'$line$sline': no warning '$text' in $who.log"; }
  echo "ok warned '$line$sline': $(grep -m1 "WARN.*$text" "$TMP/$who.log" | sed 's/^.* WARN //' | cut -c1-110)"
}
warned "fp16 = true" "" "fp16 = true: the CPU device has no half-precision path" worker0
warned "bf16 = true" "" "bf16 = true: the CPU device has no half-precision path" worker0
warned "save_all_states = true" "" "save_all_states = true" worker0
echo PASS
