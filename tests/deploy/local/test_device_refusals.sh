#!/usr/bin/env bash
# Device keys that cannot run are refused at start, before the worker joins, with the key and the cause named:
#   device = cuda on a machine without a GPU (or a binary without the CUDA device): exit 1, the cause named
#     (on a machine with a GPU this case is skipped, and said so: there cuda must train);
#   device = nonsense: exit 1 naming the valid devices;
#   fp16 = true and bf16 = true: exit 1 naming both keys;
#   device = cpu with fp16 = true is not refused (it trains in fp32 with a warning: test_unbuilt_keys.sh).
# No server is started: a refused worker must stop before it tries to reach the rendezvous.
source "$(dirname "$0")/cluster.sh" "$@"
write_cfg() {
  run_ini "$TMP/run.ini" 1 1 refusal-secret <<INI
[train]
$TINY_NET
output = $TMP/out
$1
[data]
$TINY_DATA
INI
}
refused() {
  local lines=$1 text=$2 rc=0
  write_cfg "$lines"
  timeout 20 "$WORKER" --config "$TMP/run.ini" --rank 0 >"$TMP/worker.log" 2>&1 || rc=$?
  [ "$rc" -eq 1 ] || { cat "$TMP/worker.log"; die "'$lines': worker exit $rc, expected 1"; }
  grep -q -- "$text" "$TMP/worker.log" || { cat "$TMP/worker.log"; die "'$lines': no '$text' in the worker log"; }
  grep -q "joining the run" "$TMP/worker.log" && die "'$lines': the worker tried to join before refusing"
  echo "ok refused '${lines//$'\n'/, }': $(grep -m1 -- "$text" "$TMP/worker.log" | sed 's/^.* ERROR //' | cut -c1-150)"
}
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "skip 'device = cuda' refusal: this machine has a GPU ($(nvidia-smi -L | head -1))"
else
  # A binary built with the CUDA device names the missing GPU; one built without it names the build.
  refused "device = cuda" "config key 'device' = cuda: \(no CUDA GPU is visible\|this pfcps-worker was built without the CUDA device\)"
  refused "device = cuda
fp16 = true" "config key 'device' = cuda: "
fi
refused "device = nonsense" "key 'device': value 'nonsense' is not one of: cpu cuda cpu-fenced cpu-bf16"
refused "fp16 = true
bf16 = true" "keys 'fp16' and 'bf16' are both true"
echo PASS
