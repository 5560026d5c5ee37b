#!/usr/bin/env bash
# Keys that arcface_torch configs carry but this build does not implement are never ignored silently:
# resume = true stops the worker at start (exit 1, message naming the key) before any step; fp16 = true
# on the CPU device (no half path) and save_all_states = true train on with a warning; snapshot_every > 0
# makes the server warn. (device = cuda is built: its refusals without a GPU are test_device_refusals.sh.)
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
refused() {
  local line=$1 text=$2 rc=0
  write_cfg "$line" ""
  rm -f "$TMP/trace"
  start_cluster "$TMP/run.ini" 1 1 --trace "$TMP/trace"
  wait "${WPIDS[0]}" || rc=$?
  stop_servers
  [ "$rc" -eq 1 ] || fail "'$line': worker exit $rc, expected 1"
  grep -q "$text" "$TMP/worker0.log" || { show_logs; fail "'$line': no '$text' in the worker log"; }
  [ ! -s "$TMP/trace" ] || fail "'$line': the worker trained before refusing"
  echo "ok refused '$line': $(grep -m1 "$text" "$TMP/worker0.log" | sed 's/^.* ERROR //' | cut -c1-110)"
}
warned() {
  local line=$1 sline=$2 text=$3 who=$4
  write_cfg "$line" "$sline"
  run_cluster "'$line$sline': the worker failed" "$TMP/run.ini" 1 1
  grep -q "WARN.*$text" "$TMP/$who.log" || { show_logs; fail "'$line$sline': no warning '$text' in $who.log"; }
  echo "ok warned '$line$sline': $(grep -m1 "WARN.*$text" "$TMP/$who.log" | sed 's/^.* WARN //' | cut -c1-110)"
}
refused "resume = true" "resume = true: resuming is not implemented yet"
warned "fp16 = true" "" "fp16 = true: the CPU device has no half-precision path" worker0
warned "bf16 = true" "" "bf16 = true: the CPU device has no half-precision path" worker0
warned "save_all_states = true" "" "save_all_states = true" worker0
warned "" "snapshot_every = 5" "snapshot_every = 5" server0
echo PASS
