#!/usr/bin/env bash
# pfcps trains as arcface_torch trains: 30 steps of pfcps (servers and workers on loopback) side by side with an
# independent PyTorch re-implementation of train_v2.py's step (arcface_parity.py, Debian's torch), both from
# the same initial backbone (model.pt, read by pfcps through `pretrained`) and class centers (a safetensors
# `weight`, through `pretrained_centers`), on the same real faces (ORL, 20 identities, stored as PNG so both
# sides see the same pixels). The reference takes each worker's batch (record keys and flips) and the sampled
# class ids of each step from pfcps's --trace-batch lines, and computes everything else itself. Compared: every
# step's loss and lr, the final backbone (every tensor, rank 0's BatchNorm statistics) and every class center.
# The target is the reference in float64; the tolerance is what float32 arithmetic alone costs arcface_torch over
# these steps: the same reference in float32 with 1 and 2 threads and with torch's native convolutions in place
# of oneDNN's (under the fp16 gradient hook, train_v2.py's and pfcps's default, the trajectory depends on which
# float32 implementation ran: measured 0.09 and 0.19 of the backbone's update for oneDNN's and the native
# kernels, 0.15 for both without the hook), against the float64 one. pfcps must stay
# within 3 times that, in each measure (arcface_parity.py compare: per-step loss, the backbone's update, the
# BatchNorm statistics, each class center's update), and the closest float32 reference must stay within 0.5
# of the float64 one (else the run is chaotic and the test proves nothing: lr 0.001 keeps it smoother than
# arcface_torch's lr 0.1, which on 8 images a step makes float32 and float64 runs part within a few steps).
# Runs (batch 8 per worker, r18_w8, D = 16, ArcFace margin 0.5, s = 64, lr 0.001, warmup 4.8 of 48 steps):
#   w1_s1_st_dense_r1       1 worker, 1 server, straight_through, dense, sample_rate 1.0
#   w2_s3_st_dense_r01      2 workers, 3 servers, straight_through, dense, sample_rate 0.1 (unsampled rows move)
#   w1_s3_exact_dense_r01   1 worker, 3 servers, exact margin gradient, dense, 0.1
#   w2_s3_st_sparse_r01     2 workers, 3 servers, straight_through, sparse (only sampled rows move), 0.1
#   w2_s3_st_dense_r01_acc3 as w2_s3_st_dense_r01 with gradient_acc = 3
#   w1_s1_st_dense_r1_adamw   as w1_s1_st_dense_r1 with optimizer = adamw (backbone and class centers: torch.optim.AdamW)
#   w2_s3_st_dense_r01_adamw  as w2_s3_st_dense_r01 with optimizer = adamw (unsampled rows replayed on the servers)
# negative controls: the sparse run against the dense run's references must fail, and so must the gradient_acc
# run against the references without accumulation, and the AdamW run against references whose class centers
# train with SGD (AdamW for the backbone only); and the w1_s1 step through
# pfcps.torch.PartialFC (python/) against the same references.
# PFCPS_PARITY_RUNS=name,name restricts the runs; PFCPS_PARITY_STEPS (default 30) sets their length;
# PFCPS_PARITY_DEVICE (default cpu) is pfcps's `device` (cuda: the CUDA device and GPU head, fp32, on a machine
# with a GPU; one GPU runs the one-worker runs only). The deviations are printed.
source "$(dirname "$0")/cluster.sh" "$@"
ref_python torch numpy PIL safetensors
export OMP_NUM_THREADS=1
PY=$SRC/tests/deploy/local/arcface_parity.py
STEPS=${PFCPS_PARITY_STEPS:-30} CLASSES=20 DIM=16 NET=r18_w8 LR=0.001 BATCH=8
"$PFCPS_PYTHON" "$PY" prepare "$TMP" "$SRC/data/orl" $CLASSES $DIM $NET 7 || die "prepare"

# parity NAME WORKERS SERVERS MARGIN_GRAD UPDATE RATE [FROM]: pfcps's run $TMP/NAME (traces, model.ckpt,
# the class centers dumped), the references and the comparison. FROM: a folder of arcface_torch's
# checkpoint_gpu_<r>.pt files that both pfcps (pretrained, pretrained_centers) and the references continue from.
# COMM (environment, default fp16): backbone_grad_comm of pfcps and --grad-comm of the references; ACC (default
# 1): gradient_acc of both; OPT (default sgd): optimizer of both.
# selected NAME: the run is in PFCPS_PARITY_RUNS (or that is unset).
selected() { [ -z "${PFCPS_PARITY_RUNS:-}" ] || [[ ",$PFCPS_PARITY_RUNS," == *",$1,"* ]]; }
parity() {
  local name=$1 W=$2 S=$3 mg=$4 up=$5 rate=$6 from=${7:-} r comm=${COMM:-fp16} acc=${ACC:-1} opt=${OPT:-sgd}
  selected "$name" || return 0
  local dir=$TMP/$name warm num_epoch
  mkdir -p "$dir"
  # 198 images (s8 lacks one): 24 steps per epoch with one worker, 12 with two; warmup 4.8 steps
  # (arcface_torch's fractional warmup), schedules of 48 steps (the 30 steps cross epoch boundaries).
  if [ "$W" = 1 ]; then warm=0.2 num_epoch=2; else warm=0.4 num_epoch=4; fi
  local bb=$TMP/model.pt centers=$TMP/centers.safetensors
  if [ -n "$from" ]; then bb=$from/checkpoint_gpu_0.pt centers=$from/checkpoint_gpu_0.pt; fi
  run_ini "$dir/run.ini" "$S" "$W" "parity-test-secret-0123456789abcdef" <<INI
[train]
device = ${PFCPS_PARITY_DEVICE:-cpu}
network = $NET
embedding_size = $DIM
batch_size = $BATCH
lr = $LR
warmup_epoch = $warm
num_epoch = $num_epoch
margin_list = 1.0, 0.5, 0.0
margin_grad = $mg
pfc_update = $up
backbone_grad_comm = $comm
gradient_acc = $acc
optimizer = $opt
sample_rate = $rate
momentum = 0.9
weight_decay = 5e-4
pretrained = $bb
pretrained_centers = $centers
output = $dir/out
frequent = 10
[data]
rec = $TMP/train
num_classes = $CLASSES
num_workers = 1
INI
  run_cluster "$name: the pfcps run failed" "$dir/run.ini" "$S" "$W" --max-steps $STEPS \
    --trace "$dir/trace{r}" --trace-batch --dump-centers "$dir/centers"
  local traces=()
  for ((r = 0; r < W; r++)); do traces+=("$dir/trace$r"); done
  local common=(--trace "${traces[@]}" --network $NET --dim $DIM --lr $LR --warmup-epoch $warm
    --num-epoch $num_epoch --margin-grad "$mg" --update "$up" --grad-comm "$comm" --gradient-acc "$acc" --optimizer "$opt" ${from:+--resume "$from"})
  "$PFCPS_PYTHON" "$PY" train "$TMP" "$dir/ref_f64.pt" "${common[@]}" --double || die "$name: reference, float64"
  "$PFCPS_PYTHON" "$PY" train "$TMP" "$dir/ref_t1.pt" "${common[@]}" --threads 1 || die "$name: reference"
  "$PFCPS_PYTHON" "$PY" train "$TMP" "$dir/ref_t2.pt" "${common[@]}" --threads 2 || die "$name: reference, 2 threads"
  "$PFCPS_PYTHON" "$PY" train "$TMP" "$dir/ref_nm.pt" "${common[@]}" --threads 1 --no-mkldnn ||
    die "$name: reference, torch's native convolutions"
  "$PFCPS_PYTHON" "$PY" compare "$name" "$dir" "$dir/ref_f64.pt" "$dir/ref_t1.pt" "$dir/ref_t2.pt" "$dir/ref_nm.pt" \
    --init "${from:-$TMP}" --json "$TMP/parity.json" ||
    fail "$name: pfcps differs from the reference (above)"
}

parity w1_s1_st_dense_r1 1 1 straight_through dense 1.0

# The same step through pfcps.torch.PartialFC (python/, the PyTorch module): torch's own backbone from model.pt,
# the module as the Partial FC against 1 server, the batches of w1_s1_st_dense_r1's trace; compared with the same
# references: loss, backbone, BatchNorm statistics and the class centers (the server's checkpoint of the last
# step, which the module's state_dict() asks for). The package is built and installed as
# tests/deploy/local/test_torch_partial_fc.sh does (pip, no network; its own build folder).
# module_parity RUN OPTIMIZER: the module against RUN's references (RUN's run.ini, its optimizer).
module_parity() {
  local dir=$TMP/$1 mdir=$TMP/module_$1 opt=$2
  [ -f "$dir/ref_f64.pt" ] || return 0
  "$PFCPS_PYTHON" -c "import mesonpy" 2>/dev/null || ref_skip "$PFCPS_PYTHON has no mesonpy (tests/pyenv.sh installs it)"
  [ -d "$TMP/site/pfcps" ] ||  # installed once per run of this script
    "$PFCPS_PYTHON" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps --target "$TMP/site" \
      --config-settings=build-dir="$BUILD/python-pkg-parity" "$SRC/python" >"$TMP/pip.log" 2>&1 ||
    { tail -30 "$TMP/pip.log"; die "pip install ./python failed"; }
  mkdir -p "$mdir"
  sed -e "s|^output = .*|output = $mdir/out|" "$dir/run.ini" >"$mdir/run.ini"
  local port
  port=$(free_port)
  sed -i "s|^rendezvous = .*|rendezvous = 127.0.0.1:$port|" "$mdir/run.ini"
  "$SERVER" --config "$mdir/run.ini" --rank 0 >"$TMP/module_server0.log" 2>&1 &
  PIDS+=($!)
  local sp=$!
  PYTHONPATH=$TMP/site timeout 600 "$PFCPS_PYTHON" "$PY" module "$TMP" "$mdir/result.pt" --run "$mdir/run.ini" \
    --trace "$dir/trace0" --network $NET --dim $DIM --classes $CLASSES --lr $LR --warmup-epoch 0.2 --num-epoch 2 \
    --snapshots "$mdir/out/snapshots" --optimizer "$opt" \
    >"$TMP/module.log" 2>&1 || { tail -20 "$TMP/module.log" "$TMP/module_server0.log"; die "the pfcps.torch run failed"; }
  grep "^pfcps.torch" "$TMP/module.log"
  kill -TERM "$sp" 2>/dev/null
  wait "$sp" 2>/dev/null
  "$PFCPS_PYTHON" "$PY" compare "pfcps.torch.PartialFC ($opt)" "$mdir/result.pt" "$dir/ref_f64.pt" "$dir/ref_t1.pt" \
    "$dir/ref_t2.pt" "$dir/ref_nm.pt" --init "$TMP" --json "$TMP/parity.json" ||
    fail "pfcps.torch.PartialFC ($opt) differs from the reference (above)"
}
if selected module; then module_parity w1_s1_st_dense_r1 sgd; fi
parity w2_s3_st_dense_r01 2 3 straight_through dense 0.1
parity w1_s3_exact_dense_r01 1 3 exact dense 0.1
parity w2_s3_st_sparse_r01 2 3 straight_through sparse 0.1
# arcface_torch's gradient_acc = 3: an optimizer step (backbone and class centers, each row decayed once) every
# 3 global steps on the summed gradients, the lr schedule per global step.
ACC=3 parity w2_s3_st_dense_r01_acc3 2 3 straight_through dense 0.1

# optimizer = adamw (arcface_torch's AdamW configs): torch.optim.AdamW over the backbone and the whole table; the
# servers apply AdamW to the pushed rows and replay the zero-gradient steps of the rows a step did not sample.
OPT=adamw parity w1_s1_st_dense_r1_adamw 1 1 straight_through dense 1.0
OPT=adamw parity w2_s3_st_dense_r01_adamw 2 3 straight_through dense 0.1

# The AdamW run against references whose class centers train with SGD (momentum 0.9, weight decay) while the
# backbone trains with AdamW must be refused: the comparison tells the centers' optimizer.
centers_sgd_refused() {
  local d=$TMP/w1_s1_st_dense_r1_adamw
  [ -f "$d/ref_f64.pt" ] || return 0
  local common=(--trace "$d/trace0" --network $NET --dim $DIM --lr $LR --warmup-epoch 0.2 --num-epoch 2
    --margin-grad straight_through --update dense --optimizer adamw --centers-sgd)
  "$PFCPS_PYTHON" "$PY" train "$TMP" "$d/csgd_f64.pt" "${common[@]}" --double || die "centers-SGD reference, float64"
  "$PFCPS_PYTHON" "$PY" train "$TMP" "$d/csgd_t1.pt" "${common[@]}" --threads 1 || die "centers-SGD reference"
  if "$PFCPS_PYTHON" "$PY" compare adamw_vs_sgd_centers_reference "$d" "$d/csgd_f64.pt" "$d/csgd_t1.pt" \
    --init "$TMP" --json "$TMP/negative.json"; then
    fail "adamw_vs_sgd_centers_reference passed: the comparison cannot tell AdamW class centers from SGD ones"
  else
    ok "adamw_vs_sgd_centers_reference is refused (above): the comparison tells AdamW class centers from SGD ones"
  fi
}
if selected w1_s1_st_dense_r1_adamw; then centers_sgd_refused; fi
# The module under optimizer = adamw: torch.optim.AdamW over the backbone and the module's group, the servers
# applying AdamW; against the AdamW run's references.
if selected module_adamw; then module_parity w1_s1_st_dense_r1_adamw adamw; fi

# arcface_torch's files in: the float64 reference trains the first 12 steps (one epoch) of w2_s3_st_dense_r01
# on that run's batches and writes arcface_torch's checkpoint_gpu_0.pt and _1.pt (save_all_states; each rank's
# contiguous rows, the SGD momentum, global_step 12, epoch 1); pfcps continues from them with 1 server instead
# of 3 (pretrained and pretrained_centers name the files) up to step 30, and the references continue from the
# same files as arcface_torch resumes. pfcps's batches and sampled ids of steps 13..30 must be the
# uninterrupted run's, and the comparison as above.
A=$TMP/w2_s3_st_dense_r01
if [ -f "$A/trace1" ] && selected from_arcface_torch_s1; then
  mkdir -p "$TMP/ck"
  "$PFCPS_PYTHON" "$PY" train "$TMP" "$TMP/ck/first.pt" --trace "$A/trace0" "$A/trace1" --network $NET --dim $DIM \
    --lr $LR --warmup-epoch 0.4 --num-epoch 4 --margin-grad straight_through --update dense --double \
    --save-at 12 --save-dir "$TMP/ck" || die "the reference's checkpoint_gpu files"
  parity from_arcface_torch_s1 2 1 straight_through dense 0.1 "$TMP/ck"
  for r in 0 1; do
    cmp -s <(cut -d' ' -f4- "$TMP/from_arcface_torch_s1/trace$r") <(sed -n '13,$p' "$A/trace$r" | cut -d' ' -f4-) ||
      fail "worker $r: the continued run's batches or sampled ids differ from the uninterrupted run's steps 13..30"
  done
  expect_grep "server log: continuing at global_step 12" "continuing arcface_torch's run of .*: step clock at global_step 12 \\(epoch 1 done\\)" "$TMP/server0.log"
  expect_grep "worker log: continuing at global_step 12" "continuing arcface_torch's run of .* at global_step 12 \\(epoch 1 done\\): epoch 1, batch 0 of 12" "$TMP/worker0.log"
  expect_grep "worker log: backbone momentum" "backbone SGD momentum of [0-9]+ tensors from" "$TMP/worker0.log"
  expect_grep "worker 1 loads rank 1's file (its own BatchNorm statistics)" \
    "backbone initialised from .*/ck/checkpoint_gpu_1.pt \\(pretrained\\)" "$TMP/worker1.log"
  ! grep -q "the lr schedule here gives" "$TMP/worker0.log" || fail "the worker's lr differs from the checkpoint's"
fi

# refused NAME RUN WHAT: pfcps's run RUN compared with w2_s3_st_dense_r01's references (the same batches and
# sampled ids: sampling depends on neither the update rule nor the accumulation) must be refused; WHAT says why.
refused() {
  local d=$TMP/w2_s3_st_dense_r01
  [ -f "$d/ref_f64.pt" ] && [ -f "$2/trace0" ] || return 0
  cmp -s <(cut -d' ' -f4- "$d/trace0") <(cut -d' ' -f4- "$2/trace0") ||
    fail "$1: the runs trained on different batches or sampled ids"
  if "$PFCPS_PYTHON" "$PY" compare "$1" "$2" "$d/ref_f64.pt" "$d/ref_t1.pt" "$d/ref_t2.pt" "$d/ref_nm.pt" \
    --init "$TMP" --json "$TMP/negative.json"; then
    fail "$1 passed: the comparison cannot tell $3"
  else
    ok "$1 is refused (above): the comparison tells $3"
  fi
}
# The test can fail: the sparse run against the dense references, the gradient_acc run against references
# without accumulation.
refused sparse_vs_dense_reference "$TMP/w2_s3_st_sparse_r01" "a sparse update from a dense one"
refused acc3_vs_acc1_reference "$TMP/w2_s3_st_dense_r01_acc3" "gradient_acc = 3 from no accumulation"
expect_summary
