#!/usr/bin/env bash
# bench/scale/run.sh: identity scale of the head path, pfcps against a PyTorch Partial FC peer, in one run.
#
#   bench/scale/run.sh BUILD_DIR [--classes 1000000,2000000] [--series r,k] [--rate 0.1] [--sampled 100000]
#                      [--dim 512] [--batch 128] [--servers 2] [--provider tcp] [--wire fp32]
#                      [--steps 40] [--warmup 10] [--steady 10] [--peer-steps 20] [--no-peer] [--plan] [--lazy]
#                      [--scrape [--pairs 1]] [--pfc-update dense|sparse] [--replicas 0|1] [--optimizer sgd|adamw]
#   (or: ninja -C BUILD_DIR bench-scale, which runs the defaults)
#
# Per series (r: fixed sample rate --rate; k: fixed --sampled rows per step, sample_rate = k / C) and per C:
#   1. pfcps: `servers` pfcps-server daemons + 1 bench/scale/scale_worker (the head path of a worker's step:
#      sample, pull, CPU head forward/backward, push, wait; synthetic embeddings) on 127.0.0.1, --steps steps;
#      warm-up = median of the first --warmup steps, steady = median of the last --steady;
#   2. the peer: bench/scale/peer_pfc.py (PartialFC_V2's semantics in PyTorch, 2 threads), same C, D, B and
#      rows per step, --peer-steps steps (warm-up = median of the first 5, steady = of the last --steady);
#   3. two table rows: ms/step of both (wall), ratio peer / pfcps, warm-up / steady, the phases of the pfcps
#      step, and CPU seconds per step (pfcps: worker + servers; peer: its process), whose ratio is steadier than
#      the wall one on a shared machine (bench/head measures CPU time for the same reason); RSS, bytes per
#      identity and per step, page faults.
# --pfc-update: the servers' update of unsampled rows (pfc_update; default dense, the config's default).
# --optimizer: the class centers' optimizer on the servers (optimizer; default sgd): adamw keeps two moments per
# row and, under dense, replays the zero-gradient steps a row skipped.
# --replicas 1: every shard also has a hot-standby copy on the next server (config key replicas): the worker
# pushes to both copies and waits for both acknowledgements; each server holds and updates two shards.
# --plan: first measures this host's figures (bench/scale/host_figures: the head's SGEMMs on B x k x D with 2
# threads and one thread's memcpy bandwidth; bench/ps/ps_bench: the pull rate over the provider at D, 2 servers,
# 1 client, as the loopback "link"), then adds per row what `pfcps plan` predicts for the step with those
# figures (W = 1, k rows, `servers` servers, no backbone) and which term it says bounds it.
# --scrape: the cost of Prometheus metrics instead (no peer, r series): per C, pfcps twice in one run, first
# with metrics off (no metrics_address), then with metrics_address = 127.0.0.1:0 on every member and a loop
# that GETs every member's /metrics once a second (curl, in the background, as a 1 s scrape interval would);
# one table: warm-up and steady ms/step of both, the ratios on / off (apart), CPU s per step (worker +
# servers) and its ratio, GETs answered. --pairs N: N such pairs per C, a row each (odd pairs: off then on;
# even pairs: on then off).
# The series are updated in both runs (the registry is always on); what differs is serving and scraping.
# One process group at a time (pfcps, then the peer), so the two never compete for memory or the 2 cores.
# Memory: a C that would take pfcps or the peer above PFCPS_SCALE_MEM_GIB (default 20) or MemAvailable - 1 GiB
# is reported "does not fit" and not started. OpenBLAS / OpenMP threads: 2 for the worker and the peer.
# Raw outputs (worker lines, per-step traces, server logs) stay in PFCPS_SCALE_OUT (default a temp folder,
# printed at the end).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
root=$(cd "$here/../.." && pwd)
[ $# -ge 1 ] || { sed -n '2,6p' "$0" >&2; exit 2; }
B_DIR=$(cd "$1" && pwd) || exit 2
shift
classes=1000000,2000000 series=r,k rate=0.1 sampled=100000 dim=512 batch=128 servers=2 provider=tcp wire=fp32
steps=40 warmup=10 steady=10 peer_steps=20 peer=1 plan=0 lazy=0 scrape=0 pairs=1 pfc_update=dense replicas=0 optimizer=sgd
while [ $# -gt 0 ]; do
  case $1 in
    --classes) classes=$2; shift ;;
    --series) series=$2; shift ;;
    --rate) rate=$2; shift ;;
    --sampled) sampled=$2; shift ;;
    --dim) dim=$2; shift ;;
    --batch) batch=$2; shift ;;
    --servers) servers=$2; shift ;;
    --provider) provider=$2; shift ;;
    --wire) wire=$2; shift ;;
    --steps) steps=$2; shift ;;
    --warmup) warmup=$2; shift ;;
    --steady) steady=$2; shift ;;
    --peer-steps) peer_steps=$2; shift ;;
    --no-peer) peer=0 ;;
    --plan) plan=1 ;;
    --lazy) lazy=1 ;;
    --pfc-update) pfc_update=$2; shift ;;
    --replicas) replicas=$2; shift ;;
    --optimizer) optimizer=$2; shift ;;
    --scrape) scrape=1 peer=0 series=r ;;
    --pairs) pairs=$2; shift ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
SERVER=$B_DIR/server/pfcps-server
WORKER=$B_DIR/bench/scale/scale_worker
for x in "$SERVER" "$WORKER"; do
  [ -x "$x" ] || { echo "run.sh: $x is not built (ninja -C $B_DIR server/pfcps-server bench/scale/scale_worker)" >&2; exit 2; }
done
PY=${PFCPS_PYTHON:-/usr/bin/python3}
if [ "$peer" = 1 ] && ! "$PY" -c "import torch" 2>/dev/null; then
  echo "run.sh: no torch in $PY (tests/pyenv.sh installs Debian's python3-torch): running without the peer" >&2
  peer=0
fi
cap_gib=${PFCPS_SCALE_MEM_GIB:-20}
out=${PFCPS_SCALE_OUT:-$(mktemp -d /tmp/pfcps-scale.XXXXXX)}
mkdir -p "$out"
export PFCPS_SECRET=${PFCPS_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2
# OpenBLAS's idle threads spin (sched_yield) for 2^28 cycles after each GEMM by default: on 2 cores shared with
# the servers that took ~0.45 CPU s per step at 2M from them (measured). 2^4 cycles: they sleep at once.
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-4}
# The same for the head's OpenMP threads: libgomp's default spins up to 300000 times after each parallel
# region; on 2 cores shared with the servers that cost 0.18 CPU s per step at 2M (3.22 -> 3.04, measured).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
trap 'exit 130' INT TERM

mem_avail() { awk '/^MemAvailable:/ {print $2 * 1024}' /proc/meminfo; }
free_port() { "$PY" "$here/../../tests/free_port.py"; } # below the ephemeral range (see that file)
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; } # field KEY "RESULT ... KEY=V ..."
gib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1073741824 }'; }

# scrape_loop TAG LOG...: until killed, once a second GETs /metrics of every member whose LOG says `metrics on
# HOST:PORT`; the count of answered GETs so far is in $out/TAG.scrapes.
scrape_loop() {
  local tag=$1 n=0 f a; shift
  while :; do
    for f in "$@"; do
      a=$(sed -n 's/.*metrics on \([^ ]*\).*/\1/p' "$f" 2>/dev/null | head -1)
      [ -n "$a" ] && curl -fs -o /dev/null --max-time 5 "http://$a/metrics" && n=$((n + 1))
    done
    echo "$n" >"$out/$tag.scrapes"
    sleep 1
  done
}

# One pfcps run: servers + scale_worker. Prints the worker's RESULT line (empty on failure). METRICS = 1: every
# member serves metrics on 127.0.0.1:0 and scrape_loop scrapes them while the run lasts.
run_pfcps() { # C rate tag [metrics]
  local C=$1 r=$2 tag=$3 metrics=${4:-0} port ini
  port=$(free_port)
  ini=$out/$tag.ini
  cat >"$ini" <<INI
[train]
num_classes = $C
embedding_size = $dim
batch_size = $batch
sample_rate = $r
margin_list = 1.0, 0.5, 0.0
scale = 64
margin_grad = straight_through
pfc_update = $pfc_update
optimizer = $optimizer
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
provider = $provider
wire_dtype = $wire
rendezvous = 127.0.0.1:$port
$([ "$metrics" = 1 ] && echo "metrics_address = 127.0.0.1:0")
[server]
center_init = $([ "$lazy" = 1 ] && echo lazy || echo eager)
replicas = $replicas
INI
  local spids=()
  for ((s = 0; s < servers; s++)); do
    "$SERVER" --config "$ini" --rank $s >"$out/$tag.server$s.log" 2>&1 &
    spids+=($!)
    pids+=($!)
  done
  local list logs=()
  list=$(IFS=,; echo "${spids[*]}")
  for ((s = 0; s < servers; s++)); do logs+=("$out/$tag.server$s.log"); done
  # center_init = eager (the servers' default): the steps start once the servers generated every class center
  # (reported apart as fill_s); --lazy measures the first-touch path instead.
  local wait=() scraper=
  [ "$lazy" = 1 ] || wait=(--wait-fill "$(IFS=,; echo "${logs[*]}")")
  if [ "$metrics" = 1 ]; then
    : >"$out/$tag.worker.log"
    scrape_loop "$tag" "${logs[@]}" "$out/$tag.worker.log" &
    scraper=$!
  fi
  "$WORKER" --config "$ini" --rank 0 --steps "$steps" --warmup "$warmup" --steady "$steady" \
    --server-pids "$list" --trace "$out/$tag.trace" "${wait[@]}" >"$out/$tag.worker.log" 2>&1
  local rc=$?
  if [ -n "$scraper" ]; then kill "$scraper" 2>/dev/null; wait "$scraper" 2>/dev/null; fi
  # A failed run: the servers' threads as they are (for example a pull that never got its reply), before stopping.
  if [ $rc -ne 0 ] && command -v gdb >/dev/null; then
    for ((s = 0; s < servers; s++)); do
      gdb -p "${spids[$s]}" -batch -ex "thread apply all bt" >"$out/$tag.server$s.stacks" 2>&1
    done
  fi
  finish_run "$tag" "$rc" run.sh
}

printf '# bench/scale: D = %s, B = %s, %s servers + 1 worker, provider %s, wire %s; pfcps %s steps (warm-up: first %s, steady: last %s), peer %s steps; %s\n' \
  "$dim" "$batch" "$servers" "$provider" "$wire" "$steps" "$warmup" "$steady" "$peer_steps" "$(date -u '+%Y-%m-%d %H:%M UTC')"
printf '# machine: %s cores, %s GiB, load average %s\n' "$(nproc)" "$(free -g | awk '/^Mem:/ {print $2}')" "$(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$plan" = 1 ]; then
  for x in "$B_DIR/tools/pfcps" "$B_DIR/bench/scale/host_figures" "$B_DIR/bench/ps/ps_bench"; do
    [ -x "$x" ] || { echo "run.sh: --plan needs $x (ninja -C $B_DIR tools/pfcps bench/scale/host_figures bench/ps/ps_bench)" >&2; exit 2; }
  done
  figs=$("$B_DIR/bench/scale/host_figures" "$batch" "$sampled" "$dim" 3)
  gemm=$(field gemm_gflops "$figs") membw=$(field mem_gbs "$figs")
  psb=$("$B_DIR/bench/ps/ps_bench" --provider "$provider" --dim "$dim" --rows 4096 --classes 1000000 --clients 1 \
    --servers "$servers" --head-mode global --rounds 3 2>&1)
  link_gbs=$(sed -n 's/^pull: best [^,]*, \([0-9.]*\) GB\/s.*/\1/p' <<<"$psb")
  [ -n "$gemm" ] && [ -n "$membw" ] && [ -n "$link_gbs" ] || { echo "run.sh: --plan: figures not measured: $figs $psb" >&2; exit 1; }
  link_gbps=$(awk -v g="$link_gbs" 'BEGIN { printf "%.3g", 8 * g }')
  printf '# plan figures (measured now): head SGEMMs %s GFLOP/s (B x %s x D, 2 threads), memcpy %s GB/s (1 thread), ps_bench pull %s GB/s = %s Gbit/s (%s)\n' \
    "$gemm" "$sampled" "$membw" "$link_gbs" "$link_gbps" "$provider"
fi
IFS=, read -ra CL <<<"$classes"
if [ "$scrape" = 1 ]; then
  command -v curl >/dev/null || { echo "run.sh: --scrape needs curl" >&2; exit 2; }
  rows=()
  cpu() { awk -v a="$(field worker_cpu_s_per_step "$1")" -v b="$(field server_cpu_s_per_step "$1")" 'BEGIN { printf "%.3f", a + b }'; }
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
  for C in "${CL[@]}"; do
    for ((p = 1; p <= pairs; p++)); do
      # Odd pairs run off first, even pairs on first, so that an order effect (the page cache, the memory
      # the first run leaves) shows as a difference between the pairs instead of hiding in every ratio.
      if ((p % 2)); then
        off=$(run_pfcps "$C" "$rate" scrape-off.$C.$p 0)
        on=$(run_pfcps "$C" "$rate" scrape-on.$C.$p 1)
      else
        on=$(run_pfcps "$C" "$rate" scrape-on.$C.$p 1)
        off=$(run_pfcps "$C" "$rate" scrape-off.$C.$p 0)
      fi
      if [ -z "$off" ] || [ -z "$on" ]; then
        rows+=("| $C | $p | failed (see $out/scrape-*.$C.$p.worker.log) | | | | | | | | | | |")
        continue
      fi
      wo=$(field warmup_ms "$off") wn=$(field warmup_ms "$on") so=$(field steady_ms "$off") sn=$(field steady_ms "$on")
      co=$(cpu "$off") cn=$(cpu "$on")
      rows+=("| $C | $p | $(field k "$on") | $wo | $wn | **$(ratio "$wn" "$wo")** | $so | $sn | **$(ratio "$sn" "$so")** | $co | $cn | **$(ratio "$cn" "$co")** | $(cat "$out/scrape-on.$C.$p.scrapes" 2>/dev/null) |")
    done
  done
  echo
  echo "## Metrics on (every member's /metrics scraped once a second) against off: step time"
  echo "| C | pair | k | off warm-up ms | on warm-up ms | warm-up on / off | off steady ms | on steady ms | steady on / off | off CPU s / step (worker + servers, steady) | on CPU s / step | CPU on / off | GETs answered |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "# raw outputs: $out"
  exit 0
fi
IFS=, read -ra SL <<<"$series"
for ser in "${SL[@]}"; do
  case $ser in
    r) title="fixed r = $rate" ;;
    k) title="fixed k = $sampled rows per step" ;;
    *) echo "run.sh: series '$ser' is not r or k" >&2; exit 2 ;;
  esac
  trows=() mrows=()
  for C in "${CL[@]}"; do
    if [ "$ser" = r ]; then
      r=$rate
      k=$(awk -v r="$rate" -v c="$C" 'BEGIN { k = r * c; printf "%d", (k == int(k)) ? k : int(k) + 1 }')
    else
      k=$sampled
      r=$(awk -v k="$sampled" -v c="$C" 'BEGIN { printf "%.12g", k / c }')
    fi
    tag=$ser.$C
    # pfcps: the table (8 D + 9 bytes per identity, 12 D + 9 under adamw), the servers' buffers (128 messages of ~1 MiB each, a step's
    # push chunks k x (8 + 4 D) and pull replies k x D x 4), the worker (measured: 3.0-3.1 x k x D x 4 at
    # k = 100k-200k, D = 512, since the head stopped keeping normalized centers; 3.3 x + 0.3 GB here) and
    # 1 GiB. An underestimate here once let the kernel's OOM killer stop a server at 4M, r = 0.1.
    need=$(awk -v c="$C" -v d="$dim" -v k="$k" -v s="$servers" \
      -v per="$([ "$optimizer" = adamw ] && echo 12 || echo 8)" \
      'BEGIN { printf "%.0f", c * (per * d + 9) + s * 128 * 2 ^ 20 + k * (8 + 8 * d) + 3.3 * k * d * 4 + 0.3e9 + 2 ^ 30 }')
    lim=$(awk -v a="$(mem_avail)" -v g="$cap_gib" 'BEGIN { l = a - 2 ^ 30; c = g * 2 ^ 30; printf "%.0f", l < c ? l : c }')
    res="" why=""
    if awk -v n="$need" -v l="$lim" 'BEGIN { exit !(n <= l) }'; then
      res=$(run_pfcps "$C" "$r" "$tag")
      [ -n "$res" ] || why="failed (see $out/$tag.worker.log)"
    else
      why="does not fit (needs ~$(gib "$need") GiB, limit $(gib "$lim"))"
      echo "run.sh: pfcps at C = $C: $why" >&2
    fi
    pres=""
    if [ "$peer" = 1 ]; then
      pres=$("$PY" "$here/peer_pfc.py" --classes "$C" --dim "$dim" --batch "$batch" --sampled "$k" \
        --steps "$peer_steps" --warmup 5 --steady "$steady" --threads 2 --mem-cap-gib "$cap_gib" 2>"$out/$tag.peer.err" | grep '^RESULT')
      echo "$pres" >"$out/$tag.peer.log"
    fi
    sm="" kk=$k pcpu=""
    if [ -n "$res" ]; then
      wm=$(field warmup_ms "$res") sm=$(field steady_ms "$res") kk=$(field k "$res")
      pf="$wm ($(field warmup_new "$res")) | $sm ($(field steady_new "$res")) | $(awk -v a="$wm" -v b="$sm" 'BEGIN { printf "%.2f", a / b }')"
      ph="$(field sample_ms "$res") / $(field pull_ms "$res") / $(field head_ms "$res") / $(field push_ms "$res")"
      mem="$(gib "$(field servers_rss "$res")") | $(field server_bytes_per_id "$res") | $(field server_bytes_per_row "$res") ($(field rows_touched "$res")) | $(gib "$(field worker_rss "$res")")"
      mb=$(awk -v b="$(field bytes_per_step "$res")" 'BEGIN { printf "%.1f", b / 1e6 }')
      flt="$(field worker_minflt_per_step "$res"), $(field server_minflt_per_step "$res") | $(field worker_cpu_s_per_step "$res"), $(field server_cpu_s_per_step "$res")"
      pcpu=$(awk -v a="$(field worker_cpu_s_per_step "$res")" -v b="$(field server_cpu_s_per_step "$res")" 'BEGIN { printf "%.2f", a + b }')
      loss="$(field first_loss "$res") -> $(field last_loss "$res")"
    else
      pf="$why | | " ph="" mem="$why | | | " mb="" flt=" | " loss=""
    fi
    if [ "$peer" = 0 ]; then
      pw="not run" ps="" prss="" ratio="" qcpu="" cratio=""
    elif [ -z "$pres" ]; then
      pw="failed (see $out/$tag.peer.err)" ps="" prss="" ratio="" qcpu="" cratio=""
    elif [ "$(field fits "$pres")" = 0 ]; then
      pw="does not fit (needs $(gib "$(field need "$pres")") GiB)" ps="" prss="" ratio="" qcpu="" cratio=""
    else
      pw=$(field warmup_ms "$pres") ps=$(field steady_ms "$pres") prss=$(gib "$(field rss "$pres")")
      qcpu=$(awk -v a="$(field steady_cpu_ms "$pres")" 'BEGIN { printf "%.2f", a / 1e3 }')
      ratio="" cratio=""
      [ -n "$sm" ] && ratio=$(awk -v a="$ps" -v b="$sm" 'BEGIN { printf "**%.2f**", a / b }')
      [ -n "$pcpu" ] && cratio=$(awk -v a="$qcpu" -v b="$pcpu" 'BEGIN { printf "%.2f", a / b }')
    fi
    pred=""
    if [ "$plan" = 1 ]; then
      pred=$("$B_DIR/tools/pfcps" plan --identities "$C" --dim "$dim" --sampled "$kk" --workers 1 --batch "$batch" \
        --servers "$servers" --wire "$wire" --link-gbps "$link_gbps" --mem-bw "$membw" --gemm-gflops "$gemm" \
        --server-mem 1000 2>&1 | sed -n 's/.*step = .* = \([0-9.]*\) ms; bound: \(.*\)/\1 (\2)/p' | head -1)
    fi
    trows+=("| $C | $kk | $pf | $pred | $ph | $pw | $ps | $ratio | $pcpu | $qcpu | $cratio |")
    mrows+=("| $C | $kk | $mem | $prss | $mb | $flt | $loss |")
  done
  echo
  echo "## $title: step time"
  echo "| C | k | pfcps warm-up ms (new rows) | pfcps steady ms (new rows) | warm-up / steady | plan ms (bound) | pfcps sample / pull / head / push ms | peer warm-up ms | peer steady ms | peer / pfcps | pfcps CPU s / step | peer CPU s / step | peer / pfcps CPU |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${trows[@]}"
  echo
  echo "## $title: memory and traffic"
  echo "| C | k | servers peak RSS GiB | server B/id (peak / C) | server B per row created (rows) | worker peak RSS GiB | peer peak RSS GiB | MB on the wire / step | minor faults / step: worker, servers | CPU s / step: worker, servers | loss first -> last |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${mrows[@]}"
done
echo
echo "# raw outputs: $out"
