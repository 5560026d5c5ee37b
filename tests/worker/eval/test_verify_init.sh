#!/usr/bin/env bash
# `pfcps verify --init NETWORK:D:SEED` (the untrained-network baseline) is the network training starts from.
# The independent model: a real run (1 server, 1 worker, seed 777, r18_w8 D 16) trained for one step
# (--max-steps 1) saves its backbone. Under `lr_scheduler = poly_scheduler` with warmup (warmup_epoch > 0) the
# learning rate of step 1 is base_lr * 0 / warmup_steps = 0 (the older PolyScheduler's get_lr(0); the default
# PolynomialLRWarmup runs step 1 at base_lr; lr_schedule.c), so SGD leaves every parameter
# as setup_backbone made it (model_init(seed) on rank 0, broadcast); only the BN running statistics moved (a
# train-mode forward updates them). Setting those back to BatchNorm's initial state (running mean 0, running
# var 1, as PyTorch constructs it) in the saved file (checksum recomputed: FNV-1a 64, model.h) gives the
# model training started from, through the worker's own config / seed / broadcast / save path.
# Checks: verify on that file == verify --init r18_w8:16:777 (every output line); the unpatched file (BN
# statistics of one step) and --init with seed 778 both differ (the comparison sees parameters and BN state);
# --init refusals (bad spec, with --pixels, with a checkpoint too, unknown network).
# Arguments: SERVER WORKER PFCPS SRC BUILD
source "$4/tests/deploy/local/cluster.sh" "$@"
ORL=$SRC/data/orl
{ printf '1\t20\n'; sed -n 2,21p "$ORL/pairs_s31-s40.txt"; sed -n 47,66p "$ORL/pairs_s31-s40.txt"; } >"$TMP/pairs.txt"

run_ini "$TMP/run.ini" 1 1 "verify-init-test-secret-0123" <<INI
[train]
$ONE_STEP_NET
seed = 777
lr = 0.1
num_epoch = 2
warmup_epoch = 1
lr_scheduler = poly_scheduler
frequent = 1
output = $TMP/out
[data]
$ONE_STEP_DATA
INI
run_cluster "the one-step run failed" "$TMP/run.ini" 1 1 --max-steps 1
[ -f "$TMP/out/model.ckpt" ] || die "the one-step run saved no model.ckpt"

python3 - "$TMP/out/model.ckpt" "$TMP/init.ckpt" "$SRC/tests" <<'PY' || die "patching the checkpoint"
import sys
sys.path.insert(0, sys.argv[3])
import pfcps_ckpt
ck = pfcps_ckpt.read(sys.argv[1])
stats = 0
for name, _, _ in ck.tensors:
    for suffix, value in ((".running_mean", 0.0), (".running_var", 1.0)):
        if name.endswith(suffix):
            ck.fill(name, value)
            stats += 1
assert stats >= 2, "no BN running statistics in the table"
ck.reseal()
open(sys.argv[2], "wb").write(ck.raw)
print("patched %d running-statistics tensors of %d" % (stats, len(ck.tensors)))
PY

v() { "$PFCPS" verify --folds 4 --pad "$@" 2>"$TMP/err" || { cat "$TMP/err"; echo "exit $?"; }; }
want=$(v "$TMP/init.ckpt" "$TMP/pairs.txt" --images "$ORL")
got=$(v --init r18_w8:16:777 "$TMP/pairs.txt" --images "$ORL")
echo "$got"
grep -q "Accuracy-Flip" <<<"$got" || fail "no Accuracy-Flip line from --init: $got"
grep -q "untrained r18_w8 (D 16), model_init seed 777" "$TMP/err" || fail "stderr does not name the untrained network: $(cat "$TMP/err")"
[ "$got" = "$want" ] && ok "--init r18_w8:16:777 == the one-step run's parameters with BN statistics at 0/1" ||
  fail "--init differs from the run's initial model:"$'\n'"$got"$'\n'"vs"$'\n'"$want"
stepped=$(v "$TMP/out/model.ckpt" "$TMP/pairs.txt" --images "$ORL")
other=$(v --init r18_w8:16:778 "$TMP/pairs.txt" --images "$ORL")
xn() { grep XNorm <<<"$1"; }
[ "$(xn "$stepped")" != "$(xn "$want")" ] && ok "the unpatched checkpoint (one step's BN statistics) differs: $(xn "$stepped")" ||
  fail "the one-step checkpoint scores as the initial model: the check would not see BN state"
[ "$(xn "$other")" != "$(xn "$want")" ] && ok "seed 778 differs: $(xn "$other")" || fail "seed 778 gives the same model"

# expect EXIT_STATUS TEXT ARGS...: `pfcps ARGS` exits EXIT_STATUS and prints TEXT.
expect() {
  local want_rc=$1 w=$2; shift 2
  expect_rc "pfcps $*" "$want_rc" "$w" "$PFCPS" "$@"
}
expect 2 "--init needs NETWORK:D[:SEED]" verify --init r18_w8 "$TMP/pairs.txt" --images "$ORL"
expect 2 "--init needs NETWORK:D[:SEED]" verify --init r18_w8:16:x "$TMP/pairs.txt" --images "$ORL"
expect 2 "--init needs NETWORK:D[:SEED]" verify --init r18_w8:0 "$TMP/pairs.txt" --images "$ORL"
expect 2 "--init and --pixels are two baselines" verify --init r18_w8:16 --pixels "$TMP/pairs.txt" --images "$ORL"
expect 2 "with --init, needs SET only" verify --init r18_w8:16 "$TMP/init.ckpt" "$TMP/pairs.txt" --images "$ORL"
expect 2 "with --pixels, needs SET only" verify --pixels "$TMP/init.ckpt" "$TMP/pairs.txt" --images "$ORL"
expect 1 "network 'r7'" verify --init r7:16 "$TMP/pairs.txt" --images "$ORL"
expect_summary
