#!/usr/bin/env bash
# bench/scale/torch_vs_c.sh: the head step of pfcps.torch.PartialFC (python/) against the C worker's head path
# (bench/scale/scale_worker) and the PyTorch Partial FC peer (bench/scale/peer_pfc.py), in one run.
#
#   bench/scale/torch_vs_c.sh BUILD_DIR PYTHON [--classes 2000000] [--rate 0.1] [--dim 512] [--batch 128]
#                             [--servers 2] [--steps 30] [--warmup 5] [--steady 10] [--pairs 1] [--no-peer]
#
# PYTHON: an interpreter with torch and the pfcps package installed (pip install ./python; built with the same
# buildtype as BUILD_DIR for a like-for-like head, e.g. --config-settings=setup-args=-Dbuildtype=debugoptimized).
# Per C and pair: `servers` pfcps-server daemons (center_init = eager; each measured step starts once every
# center is generated) + scale_worker, then fresh servers + bench/scale/torch_head.py (the module's
# `loss = module(emb, labels); loss.backward()`), in alternating order across pairs, then the peer
# (PartialFC_V2 semantics in PyTorch, same C, D, B and rows; 12 steps, steady = the last 10, as run.sh
# --peer-steps 12). One row each: steady ms per step (median of the last --steady steps) with its phases
# (medians), the module / C worker ratio (whole step and head phase), the worker process' CPU seconds per
# step (steadier than wall time on a shared machine) and peer / module. OpenBLAS / OpenMP
# threads: 2. Raw outputs in PFCPS_SCALE_OUT (default a temp folder, printed at the end).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
[ $# -ge 2 ] || { sed -n '2,7p' "$0" >&2; exit 2; }
B_DIR=$(cd "$1" && pwd) || exit 2
PY=$2
shift 2
classes=2000000 rate=0.1 dim=512 batch=128 servers=2 steps=30 warmup=5 steady=10 pairs=1 peer=1
while [ $# -gt 0 ]; do
  case $1 in
    --classes) classes=$2; shift ;;
    --rate) rate=$2; shift ;;
    --dim) dim=$2; shift ;;
    --batch) batch=$2; shift ;;
    --servers) servers=$2; shift ;;
    --steps) steps=$2; shift ;;
    --warmup) warmup=$2; shift ;;
    --steady) steady=$2; shift ;;
    --pairs) pairs=$2; shift ;;
    --no-peer) peer=0 ;;
    *) echo "torch_vs_c.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
SERVER=$B_DIR/server/pfcps-server
WORKER=$B_DIR/bench/scale/scale_worker
for x in "$SERVER" "$WORKER"; do
  [ -x "$x" ] || { echo "torch_vs_c.sh: $x is not built" >&2; exit 2; }
done
"$PY" -c "import torch, pfcps.torch" || { echo "torch_vs_c.sh: $PY lacks torch or pfcps" >&2; exit 2; }
export OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2
out=${PFCPS_SCALE_OUT:-$(mktemp -d)}
mkdir -p "$out"
pids=()
trap 'for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done' EXIT
free_port() { "$PY" "$here/../../tests/free_port.py"; } # below the ephemeral range (see that file)
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; }

# one TAG KIND C: servers + the C worker (KIND c) or the torch module (KIND torch); prints its RESULT line.
one() {
  local tag=$1 kind=$2 C=$3 port ini s
  port=$(free_port)
  ini=$out/$tag.ini
  cat >"$ini" <<INI
[train]
num_classes = $C
embedding_size = $dim
batch_size = $batch
sample_rate = $rate
margin_list = 1.0, 0.5, 0.0
scale = 64
lr = 0.1
momentum = 0.9
weight_decay = 5e-4
seed = 7
[data]
rec = synthetic
synthetic = varied
output = $out/$tag.out
[cluster]
servers = $servers
workers = 1
rendezvous = 127.0.0.1:$port
secret = bench-secret
ctl_timeout = 120
INI
  local spids=() logs=()
  for ((s = 0; s < servers; s++)); do
    "$SERVER" --config "$ini" --rank $s >"$out/$tag.server$s.log" 2>&1 &
    spids+=($!); pids+=($!)
    logs+=("$out/$tag.server$s.log")
  done
  local fill rc
  fill=$(IFS=,; echo "${logs[*]}")
  if [ "$kind" = c ]; then
    "$WORKER" --config "$ini" --rank 0 --steps "$steps" --warmup "$warmup" --steady "$steady" \
      --wait-fill "$fill" >"$out/$tag.worker.log" 2>&1
  else
    "$PY" "$here/torch_head.py" --run "$ini" --steps "$steps" --warmup "$warmup" --steady "$steady" \
      --wait-fill "$fill" >"$out/$tag.worker.log" 2>&1
  fi
  rc=$?
  finish_run "$tag" "$rc" torch_vs_c.sh
}

printf '# bench/scale/torch_vs_c: D = %s, B = %s, r = %s, %s servers + 1 worker (tcp), %s steps (steady: median of the last %s); %s\n' \
  "$dim" "$batch" "$rate" "$servers" "$steps" "$steady" "$(date -u '+%Y-%m-%d %H:%M UTC')"
printf '# machine: %s cores, %s GiB, load average %s\n' "$(nproc)" "$(free -g | awk '/^Mem:/ {print $2}')" "$(cut -d' ' -f1-3 /proc/loadavg)"
rows=()
IFS=, read -ra CL <<<"$classes"
for C in "${CL[@]}"; do
  for ((p = 1; p <= pairs; p++)); do
    if ((p % 2)); then
      c=$(one c.$C.$p c "$C"); t=$(one torch.$C.$p torch "$C")
    else
      t=$(one torch.$C.$p torch "$C"); c=$(one c.$C.$p c "$C")
    fi
    k=$(field k "$t") cs=$(field steady_ms "$c") ts=$(field steady_ms "$t") ps=
    if [ "$peer" = 1 ] && [ -n "$k" ]; then
      pres=$("$PY" "$here/peer_pfc.py" --classes "$C" --dim "$dim" --batch "$batch" --sampled "$k" \
        --steps 12 --warmup 5 --steady 10 --threads 2 2>"$out/peer.$C.$p.log" | grep '^RESULT')
      ps=$(field steady_ms "$pres")
    fi
    ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
    phases() { echo "$(field sample_ms "$1") + $(field pull_ms "$1") + $(field head_ms "$1") + $(field push_ms "$1")"; }
    cc=$(field worker_cpu_s_per_step "$c") tc=$(field worker_cpu_s_per_step "$t")
    rows+=("| $C | $p | $k | $cs ($(phases "$c")) | $ts ($(phases "$t")) | **$(ratio "$ts" "$cs")** | $(ratio "$(field head_ms "$t")" "$(field head_ms "$c")") | $cc / $tc (**$(ratio "$tc" "$cc")**) | ${ps:-n/a} | **$(ratio "$ps" "$ts")** |")
  done
done
echo
echo "| C | pair | k | C worker ms/step (sample + pull + head + push) | torch module ms/step (same phases) | module / C worker | head: module / C worker | worker CPU s/step: C / module (module / C) | peer ms/step | peer / module |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "# raw outputs: $out"
