#!/usr/bin/env bash
# Quick start: set-up, build, pack a real face dataset into RecordIO (once), then train on a local
# cluster of 2 pfcps-server + 2 pfcps-worker daemons on 127.0.0.1 (libfabric tcp provider) and print
# a summary, then score the unseen identities s31..s40 (data/orl/pairs_s31-s40.txt) with the trained model and,
# computed in the same run, two baselines it should beat: the untrained network (same network, D and seed, as
# training starts it) and raw pixels. Extra arguments are passed to the launcher (e.g. --set num_epoch=2).
# When the launcher fails (a config it refuses, a daemon that dies) the script exits with its status and
# prints no summary.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup-deps.sh
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"

build=build
if [ ! -f "$build/build.ninja" ]; then meson setup "$build" >/dev/null; fi
echo "quickstart: building (meson compile -C $build)"
meson compile -C "$build" >/dev/null

config=deploy/configs/quickstart.ini
out=work_dirs/quickstart
data=$out/data/train
if [ ! -f "$data.rec" ] || [ ! -f "$data.idx" ]; then
  # Train on identities s1..s30; s31..s40 stay unseen (data/orl/pairs_s31-s40.txt for verification).
  stage=$out/data/stage
  rm -rf "$stage"; mkdir -p "$stage"
  for i in $(seq 1 30); do ln -sfn "$(pwd)/data/orl/s$i" "$stage/s$i"; done
  echo "quickstart: packing data/orl s1..s30 into $data.rec"
  "$build/tools/pfcps" pack "$stage" "$data"
  rm -rf "$stage"
fi
"$build/tools/pfcps" rec-info "$data"

export PFCPS_SECRET=${PFCPS_SECRET:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
# Servers and CPU workers share these cores: OpenBLAS's idle threads sleep at once instead of spinning ~0.1 s.
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-4}
echo "quickstart: training ($config) with 2 servers + 2 workers on 127.0.0.1"
start=$(date +%s)
log=$out/training.log
# training.log is appended to by every run in $out: the summary reads this run's part only.
log_at=$(stat -c %s "$log" 2>/dev/null || echo 0)
rc=0
deploy/local/launch.sh -c "$config" -b "$build" "$@" || rc=$?
end=$(date +%s)

# A failed launch (a refused config, a daemon that died) has no summary: the training log may be a previous
# run's. The launcher has said why on stderr.
if [ "$rc" -ne 0 ]; then
  if [ "$rc" -gt 128 ]; then
    echo "quickstart: the launcher stopped on a signal (exit $rc); no summary" >&2
  else
    echo "quickstart: the launcher failed (exit $rc, its message above); no summary" >&2
  fi
  if [ -f "$log" ] && [ "$(stat -c %Y "$log")" -ge "$start" ]; then
    echo "quickstart: this run's training log: $log; daemon logs: $out/logs/" >&2
  fi
  exit "$rc"
fi
this_run=$(tail -c +$((log_at + 1)) "$log")
first=$(grep -m1 -o 'Loss [0-9.]*' <<<"$this_run" | awk '{print $2}')
last=$(grep -o 'Loss [0-9.]*' <<<"$this_run" | tail -n 1 | awk '{print $2}')
steps=$(grep -o 'Global Step: [0-9]*' <<<"$this_run" | tail -n 1 | awk '{print $3}')
speed=$(grep -o 'training done: .*' <<<"$this_run" | tail -n 1 | grep -o '[0-9.]* samples/sec' || true)
echo
echo "quickstart summary"
echo "  steps          ${steps:-0} (2 workers x batch 8)"
echo "  loss           first logged ${first:-?} -> last logged ${last:-?}"
echo "  speed          ${speed:-?} in $((end - start)) s wall"
echo "  backbone       $out/model.ckpt"
echo "  training log   $log"
echo "  daemon logs    $out/logs/"

# Verification on the unseen identities: arcface_torch's protocol (10 folds, image + flip), images padded onto
# 112x112 as `pfcps pack` packed the training images (--pad). The baselines use the run's network, D and seed
# (the --set arguments given to this script count, as the daemons read them).
if [ -f "$out/model.ckpt" ]; then
  sets=()
  args=("$@")
  for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
      --set|-s) sets+=(--set "${args[i + 1]:-}"); i=$((i + 1)) ;;
      --set=*) sets+=(--set "${args[i]#--set=}") ;;
    esac
  done
  read -r network dim seed < <("$build/tools/pfcps" config-get -c "$config" "${sets[@]}" network embedding_size seed | tr '\n' ' ') || true
  pairs=data/orl/pairs_s31-s40.txt
  echo
  echo "quickstart verification on unseen identities ($pairs: s31..s40, 900 pairs, 10 folds, image + flip)"
  printf '  %-34s %-18s %s\n' "model" "Accuracy-Flip" "command"
  # verification runs alone now: every core
  vthreads=$(nproc 2>/dev/null || echo 1)
  for what in trained init pixels; do
    case $what in
      trained) label="trained $network (D $dim)"; cmd=("$build/tools/pfcps" verify --pad "$out/model.ckpt" "$pairs" --images data/orl) ;;
      init) label="untrained $network (seed $seed)"; cmd=("$build/tools/pfcps" verify --pad --init "$network:$dim:$seed" "$pairs" --images data/orl) ;;
      pixels) label="raw pixels (3x112x112)"; cmd=("$build/tools/pfcps" verify --pad --pixels "$pairs" --images data/orl) ;;
    esac
    acc=$(OMP_NUM_THREADS=$vthreads "${cmd[@]}" 2>"$out/verify-$what.err" | grep -o 'Accuracy-Flip: [0-9.+-]*' | awk '{print $2}') || true
    if [ -z "$acc" ]; then acc="failed ($out/verify-$what.err)"; rc=1; fi
    printf '  %-34s %-18s %s\n' "$label" "$acc" "${cmd[*]}"
  done
fi
exit $rc
