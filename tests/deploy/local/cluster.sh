# The prologue and helpers of the training tests (tests/deploy/local/test_*.sh). Each test starts with
#   source "$(dirname "$0")/cluster.sh" "$@"
# with the arguments tests/deploy/local/meson.build gives every one of them:
#   SERVER WORKER PFCPS (the binaries) SRC BUILD (source and build trees).
# It sets `-uo pipefail`, sources tests/expect.sh (fail, die, skip, expect_*), makes the scratch directory TMP
# and kills on exit every daemon started here (PIDS) and the process group of a launcher started by
# start_launcher (LP), then removes TMP (kept, and named, when PFCPS_KEEP_TMP is set: for debugging). Its helpers end the test with die when what they wait for fails.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../../expect.sh"
[ $# -ge 5 ] || { echo "usage: $0 SERVER WORKER PFCPS SRC BUILD" >&2; exit 2; }
SERVER=$1 WORKER=$2 PFCPS=$3 SRC=$4 BUILD=$5
TMP=$(mktemp -d)
PIDS=()
LP=
cleanup() {
  if [ -n "$LP" ]; then kill -KILL -- "-$LP" 2>/dev/null; fi
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  if [ -n "${PFCPS_KEEP_TMP:-}" ]; then echo "kept the scratch folder $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

# Config lines the tests' run files share (expanded in their heredocs):
# TINY_BACKBONE: the tiny test network (r18_w8, 16-d embeddings);
# TINY_NET: [train] of the tiny test network (TINY_BACKBONE, batch 4);
# TINY_DATA: [data] of a synthetic set of 10 classes, 8 images;
# ENDLESS_NET / ENDLESS_DATA: [train] (TINY_NET, 1000 epochs) and [data] (synthetic, 20 classes, 400 images,
#   one loader thread) of a run that trains until it is stopped;
# ONE_STEP_NET / ONE_STEP_DATA: [train] (TINY_BACKBONE, batch 2) and [data] (synthetic, 4 classes, 8 images,
#   one loader thread) of the runs that train a single step (--max-steps 1);
# ORL_NET: [train] of the ORL training runs (r18_w8, 32-d embeddings, CosFace margin, batch 8, lr 0.1);
# CKPT_NET: [train] of the checkpoint and recovery runs (ckpt_ini): ORL_NET with r18_w2, whose steps take 0.6x
#   r18_w8's on 2 cores (those tests compare runs with each other bit for bit; none needs a model that learns).
TINY_BACKBONE="network = r18_w8
embedding_size = 16"
TINY_NET="$TINY_BACKBONE
batch_size = 4"
TINY_DATA="rec = synthetic
synthetic = varied
num_classes = 10
num_image = 8"
ENDLESS_NET="$TINY_NET
num_epoch = 1000"
ENDLESS_DATA="rec = synthetic
synthetic = varied
num_classes = 20
num_image = 400
num_workers = 1"
ONE_STEP_NET="$TINY_BACKBONE
batch_size = 2"
ONE_STEP_DATA="rec = synthetic
synthetic = varied
num_classes = 4
num_image = 8
num_workers = 1"
ORL_NET="network = r18_w8
embedding_size = 32
margin_list = 1.0, 0.0, 0.35
batch_size = 8
lr = 0.1"
CKPT_NET=${ORL_NET/r18_w8/r18_w2}

# free_port: a TCP port nobody is bound to, from below the kernel's ephemeral range (tests/free_port.py: no
# connection's source port takes it before the rendezvous binds it).
free_port() { python3 "$SRC/tests/free_port.py"; }

# run_ini FILE SERVERS WORKERS SECRET [LINE...] < TRAIN_AND_DATA: writes the run file FILE: the [train] and
# [data] sections read from stdin, then [cluster] with servers and workers (omitted when "-"), a rendezvous
# on 127.0.0.1 at a free port (also left in PORT), secret (omitted when empty) and each further LINE.
run_ini() {
  local file=$1 servers=$2 workers=$3 secret=$4 line; shift 4
  PORT=$(free_port)
  {
    cat
    echo "[cluster]"
    [ "$servers" = - ] || echo "servers = $servers"
    [ "$workers" = - ] || echo "workers = $workers"
    echo "rendezvous = 127.0.0.1:$PORT"
    [ -z "$secret" ] || echo "secret = $secret"
    for line in "$@"; do echo "$line"; done
  } >"$file"
}

# pack_orl N: packs the first N ORL identities (data/orl/s1..sN) into $TMP/train.rec/.idx with `pfcps pack`.
pack_orl() {
  local i
  mkdir -p "$TMP/stage"
  for ((i = 1; i <= $1; i++)); do ln -sfn "$SRC/data/orl/s$i" "$TMP/stage/s$i"; done
  "$PFCPS" pack --quiet "$TMP/stage" "$TMP/train" || die "pack"
}

# start_cluster CONFIG S W [worker args...]: starts S servers and W workers; pids in SPIDS / WPIDS,
# logs in $TMP/server<r>.log / worker<r>.log. Worker args may contain {r} for the rank.
start_cluster() {
  local cfg=$1 S=$2 W=$3; shift 3
  SPIDS=(); WPIDS=()
  for ((r = 0; r < S; r++)); do
    "$SERVER" --config "$cfg" --rank "$r" >"$TMP/server$r.log" 2>&1 &
    SPIDS+=($!); PIDS+=($!)
  done
  for ((r = 0; r < W; r++)); do
    local args=("${@//\{r\}/$r}")
    "$WORKER" --config "$cfg" --rank "$r" "${args[@]}" >"$TMP/worker$r.log" 2>&1 &
    WPIDS+=($!); PIDS+=($!)
  done
}

# run_cluster MESSAGE CONFIG S W [worker args...]: start_cluster, then every worker must exit 0 (else the logs
# are shown and the test fails with MESSAGE), then stop_servers.
run_cluster() {
  local msg=$1; shift
  start_cluster "$@"
  wait_all "${WPIDS[@]}" || { show_logs; die "$msg"; }
  stop_servers
}

# start_endless S W SECRET MESSAGE: writes $TMP/run.ini for a run on ENDLESS_NET / ENDLESS_DATA with S servers
# and W workers (output in $TMP/out), starts it with traces in $TMP/trace<r> (old ones removed first) and waits
# until worker 0 has trained a step; otherwise shows the logs and fails with MESSAGE.
start_endless() {
  local servers=$1 workers=$2 secret=$3 msg=$4
  run_ini "$TMP/run.ini" "$servers" "$workers" "$secret" <<INI
[train]
$ENDLESS_NET
output = $TMP/out
[data]
$ENDLESS_DATA
INI
  rm -f "$TMP"/trace*
  start_cluster "$TMP/run.ini" "$servers" "$workers" --trace "$TMP/trace{r}"
  wait_trace "$TMP/trace0" 1 "$msg"
}

# start_daemon LOG BINARY ARGS...: starts one daemon with its output in LOG; its pid in DPID (and PIDS).
start_daemon() {
  local log=$1; shift
  "$@" >"$log" 2>&1 &
  DPID=$!; PIDS+=($!)
}

# start_launcher CONFIG: starts deploy/local/launch.sh on CONFIG with this build, in a process group of its own
# (setsid), output in $TMP/launch.out; its pid in LP (the group is killed on exit).
start_launcher() {
  setsid "$SRC/deploy/local/launch.sh" -c "$1" -b "$BUILD" >"$TMP/launch.out" 2>&1 &
  LP=$!
}

# wait_all PIDS...: waits for each; returns the first non-zero status (0 when all exited 0).
wait_all() {
  local rc=0 s
  for p in "$@"; do
    s=0; wait "$p" || s=$?
    [ "$s" -ne 0 ] && [ "$rc" -eq 0 ] && rc=$s
  done
  return $rc
}

# wait_exit PID SECONDS: polls (every 0.05 s) until PID has exited, at most SECONDS (whole seconds); returns 1
# if it still runs. The exit status is left for `wait`.
wait_exit() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.05; done
  ! kill -0 "$1" 2>/dev/null
}

# wait_log FILE PATTERN SECONDS: polls (every 0.1 s) until FILE has a line matching PATTERN (grep), at most
# SECONDS (whole seconds); returns 1 if none came.
wait_log() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  grep -q "$2" "$1" 2>/dev/null
}

# wait_trace FILE STEPS MESSAGE: waits (at most 60 s) until the --trace FILE holds STEPS steps (for 1: is not
# empty); otherwise shows the logs and fails with MESSAGE.
wait_trace() {
  local i
  for ((i = 0; i < 600; i++)); do trace_has "$1" "$2" && return 0; sleep 0.1; done
  trace_has "$1" "$2" || { show_logs; die "$3"; }
}
trace_has() { [ -s "$1" ] && { [ "$2" -le 1 ] || [ "$(wc -l <"$1")" -ge "$2" ]; }; }

# loss_means TRACE: prints the mean loss of the first 5 steps of the --trace file TRACE and of its last 5.
loss_means() {
  awk '{l[NR]=$2} END {f=0; e=0; for(i=1;i<=5;i++){f+=l[i]; e+=l[NR-5+i]} print f/5, e/5}' "$1"
}
# loss_fell FIRST LAST [FACTOR]: true when LAST < FACTOR x FIRST (default 0.6: the loss fell by a clear margin).
loss_fell() { awk -v f="$1" -v l="$2" -v k="${3:-0.6}" 'BEGIN {exit !(l < k * f)}'; }

# stop_servers: SIGTERM to every server; each must exit 0, or 75 when it had already stopped because the run
# broke (a worker failed: the server says "the run is broken").
stop_servers() {
  local p s r=0
  for p in "${SPIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${SPIDS[@]}"; do
    s=0; wait "$p" || s=$?
    if [ "$s" -eq 75 ] && grep -q "the run is broken" "$TMP/server$r.log"; then s=0; fi
    [ "$s" -eq 0 ] || { tail -5 "$TMP"/server*.log; die "server $r exited $s on SIGTERM"; }
    r=$((r + 1))
  done
}

show_logs() { for f in "$TMP"/*.log; do echo "--- $f"; tail -15 "$f"; done; }

# ckpt_ini NAME EPOCHS S W KEEP CLASSES [LINE...]: the checkpoint tests' run file $TMP/NAME.ini: CKPT_NET, seed
# 7, one warmup epoch, EPOCHS epochs, output $TMP/NAME, data $TMP/train (pack_orl) with CLASSES classes, S
# servers and W workers, snapshot_every 4, snapshot_keep KEEP, then each LINE (a later key overrides).
ckpt_ini() {
  local name=$1 epochs=$2 s=$3 w=$4 keep=$5 classes=$6; shift 6
  run_ini "$TMP/$name.ini" "$s" "$w" "" "$@" <<INI
[train]
$CKPT_NET
num_epoch = $epochs
warmup_epoch = 1
output = $TMP/$name
seed = 7
[data]
rec = $TMP/train
num_classes = $classes
num_workers = 1
[server]
snapshot_every = 4
snapshot_keep = $keep
INI
}

# ckpt_launch NAME: deploy/local/launch.sh on $TMP/NAME.ini (output in $TMP/NAME.out); it must exit 0.
ckpt_launch() {
  "$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/$1.ini" >"$TMP/$1.out" 2>&1 ||
    { tail -30 "$TMP/$1.out"; die "$1: the launcher failed"; }
}

# ckpt_final_line DIR: "step N: table <sha> backbone <sha>" of the newest complete checkpoint (ckpt-info).
ckpt_final_line() {
  local step
  step=$("$PFCPS" ckpt-info --newest "$1")
  echo "step $step: $(ckpt_hashes "$1" "$step")"
}

# ckpt_check_same NAME: $TMP/NAME's model.ckpt equals $TMP/ref's and its final checkpoint line is $REF (the
# uninterrupted run's ckpt_final_line).
ckpt_check_same() {
  cmp -s "$TMP/ref/model.ckpt" "$TMP/$1/model.ckpt" && ok "$1: model.ckpt equals the uninterrupted run's" ||
    fail "$1: model.ckpt differs from the uninterrupted run's"
  expect_eq "$1: final checkpoint (table and backbone SHA-256)" "$(ckpt_final_line "$TMP/$1")" "$REF"
}

# ckpt_hashes DIR STEP: "table <sha> backbone <sha>" of checkpoint STEP when `pfcps ckpt-info` says it is complete.
ckpt_hashes() {
  "$PFCPS" ckpt-info "$1" | sed -n "s/^step $2: complete .*\(table [0-9a-f]\{64\}  backbone [0-9a-f]\{64\}\).*/\1/p"
}

# recovery_ref: the uninterrupted reference run the recovery tests (test_replicas.sh, test_server0.sh,
# test_rejoin.sh) compare with: $TMP/ref.ini (ckpt_ini: 6 epochs = 36 steps, 2 servers + 2 workers, keep 2, 40
# classes at 0.25, dense updates, a log line every step, replicas = 0), trained uninterrupted with worker 0's
# --trace. Leaves $TMP/ref/model.ckpt, $TMP/ref-trace0 and REF (ckpt_final_line of its final checkpoint).
# The run is done once per build for the same binaries, data and config: the three files are kept under
# $BUILD/tests/recovery-ref/KEY (KEY: SHA-256 of the three binaries, the packed data, OMP_NUM_THREADS and the
# run file without its per-test paths and port), written under a lock, so that the tests running at the same
# time or after it reuse them instead of training the same 36 steps again.
recovery_ref() {
  ckpt_ini ref 6 2 2 2 40 "sample_rate = 0.25" "pfc_update = dense" "frequent = 1"
  local key dir lock
  key=$({ sha256sum "$SERVER" "$WORKER" "$PFCPS" "$TMP/train.rec" "$TMP/train.idx" | cut -d' ' -f1
    echo "OMP_NUM_THREADS=${OMP_NUM_THREADS:-}"
    grep -v "^\(output\|rec\|rendezvous\) = " "$TMP/ref.ini"; } | sha256sum | cut -c1-16)
  dir=$BUILD/tests/recovery-ref/$key
  mkdir -p "$BUILD/tests/recovery-ref" || die "reference: cannot create $BUILD/tests/recovery-ref"
  lock=$BUILD/tests/recovery-ref/$key.lock
  exec {lockfd}>"$lock" || die "reference: cannot open $lock"
  flock "$lockfd" || die "reference: cannot lock $lock"
  if [ -s "$dir/final" ] && [ -s "$dir/model.ckpt" ] && [ -s "$dir/trace0" ]; then
    echo "reference: the uninterrupted run trained earlier for these binaries, data and config ($dir)"
  else
    start_cluster "$TMP/ref.ini" 2 2 --trace "$TMP/ref-trace{r}"
    wait_all "${WPIDS[@]}" || { show_logs; die "reference: a worker failed"; }
    local p s
    for p in "${SPIDS[@]}"; do
      s=0; wait "$p" || s=$?
      [ "$s" -eq 0 ] || { show_logs; die "reference: server pid $p exited $s"; }
    done
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp" &&
      cp "$TMP/ref/model.ckpt" "$dir.tmp/model.ckpt" && cp "$TMP/ref-trace0" "$dir.tmp/trace0" &&
      ckpt_final_line "$TMP/ref" >"$dir.tmp/final" && rm -rf "$dir" && mv "$dir.tmp" "$dir" ||
      die "reference: cannot keep it in $dir"
  fi
  mkdir -p "$TMP/ref" && cp "$dir/model.ckpt" "$TMP/ref/model.ckpt" && cp "$dir/trace0" "$TMP/ref-trace0" ||
    die "reference: cannot copy it from $dir"
  REF=$(cat "$dir/final")
  exec {lockfd}>&-
  expect_grep "reference: 36 steps, final checkpoint complete" \
    "^step 36: table [0-9a-f]{64}  backbone [0-9a-f]{64}$" - <<<"$REF"
  expect_eq "reference: worker 0's trace has 36 lines" "$(wc -l <"$TMP/ref-trace0")" 36
}
