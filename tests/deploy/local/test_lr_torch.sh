#!/usr/bin/env bash
# The lr of every step of real runs (the --trace file's third column, printed with 17 digits) against
# arcface_torch's PolynomialLRWarmup as train_v2.py drives it, run by PyTorch itself: a subclass of torch's
# scheduler base class (torch.optim.lr_scheduler._LRScheduler, Debian's torch) written here from
# lr_scheduler.py's documented get_lr (the constructor's own step leaves the optimizer's lr; l <= warmup:
# base * l / warmup; then the previous lr times ((1 - (l - w)/(t - w)) / (1 - (l - 1 - w)/(t - w)))^power,
# power 1; l > t: unchanged), with train_v2.py's loop order (optimizer step at param_groups[0]['lr'], then
# scheduler.step()) and lengths (w = num_image // total_batch * warmup_epoch, t = num_image // total_batch *
# num_epoch). Every lr must be the same double. Also against the closed form base * (1 - (g - 1 - w)/(t - w))
# written from the formula (rounding only), and `lr_scheduler = poly_scheduler` against the older
# PolyScheduler's closed form at g - 1. Runs (synthetic data, 24 images, batch 2, 2 epochs):
#   1 worker, warmup_epoch 0.25 (w 3, t 24); 2 workers (total batch 4), warmup_epoch 0.5 (w 3, t 12);
#   warmup_epoch -1 (3millions.py: w -12, t 24, decay from step 1); poly_scheduler with warmup_epoch 0.25.
# Needs PFCPS_PYTHON with torch (tests/pyenv.sh; SKIP without).
# Arguments: SERVER WORKER PFCPS SRC BUILD
source "$(dirname "$0")/cluster.sh" "$@"
ref_python torch

# run NAME WORKERS WARMUP_EPOCH [LINE...]: a run on 24 synthetic images, batch 2, 2 epochs, lr 0.1; traces in
# $TMP/NAME.trace<r>.
run() {
  local name=$1 workers=$2 warmup=$3; shift 3
  run_ini "$TMP/$name.ini" 1 "$workers" "lr-torch-test-secret-0123456789" <<INI
[train]
$ONE_STEP_NET
lr = 0.1
num_epoch = 2
warmup_epoch = $warmup
$(printf '%s\n' "$@")
output = $TMP/$name.out
[data]
rec = synthetic
synthetic = varied
num_classes = 4
num_image = 24
num_workers = 1
INI
  run_cluster "$name: the run failed" "$TMP/$name.ini" 1 "$workers" --trace "$TMP/$name.trace{r}"
}
run w3 1 0.25
run w3_2workers 2 0.5
run minus1 1 -1
run poly 1 0.25 "lr_scheduler = poly_scheduler"
cmp -s "$TMP/w3_2workers.trace0" "$TMP/w3_2workers.trace1" || fail "the two workers traced different steps"

"$PFCPS_PYTHON" - "$TMP" <<'PY' || fail "lr sequences (above)"
import sys
import warnings

import torch

tmp = sys.argv[1]
warnings.filterwarnings("ignore")


class PolynomialLRWarmup(torch.optim.lr_scheduler._LRScheduler):
    """arcface_torch's schedule from its documented get_lr (attributes set before the base constructor runs its
    first step, which returns the optimizer's lr at last_epoch 0 either way)."""

    def __init__(self, optimizer, warmup_iters, total_iters, power=1.0):
        self.warmup_iters, self.total_iters, self.power = warmup_iters, total_iters, power
        super().__init__(optimizer)

    def get_lr(self):
        l, w, t = self.last_epoch, self.warmup_iters, self.total_iters
        if l == 0 or l > t:
            return [g["lr"] for g in self.optimizer.param_groups]
        if l <= w:
            return [base * l / w for base in self.base_lrs]
        f = ((1.0 - (l - w) / (t - w)) / (1.0 - (l - 1 - w) / (t - w))) ** self.power
        return [g["lr"] * f for g in self.optimizer.param_groups]


def torch_lrs(base, num_image, total_batch, warmup_epoch, num_epoch, steps):
    """The lr of optimizer steps 1..steps as train_v2.py runs them."""
    w = num_image // total_batch * warmup_epoch
    t = num_image // total_batch * num_epoch
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base, momentum=0.9, weight_decay=5e-4)
    sched = PolynomialLRWarmup(opt, w, t)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        p.grad = torch.zeros(1)
        opt.step()
        sched.step()
    return out, w, t


def trace(name):
    rows = [line.split() for line in open("%s/%s.trace0" % (tmp, name))]
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1)), "%s: steps not 1..n" % name
    return [float(r[2]) for r in rows]


fails = 0
for name, total_batch, warmup_epoch in (("w3", 2, 0.25), ("w3_2workers", 4, 0.5), ("minus1", 2, -1)):
    got = trace(name)
    want, w, t = torch_lrs(0.1, 24, total_batch, warmup_epoch, 2, len(got))
    bad = [g for g in range(len(got)) if got[g] != want[g]]
    # Closed form of the lr of step g + 1 (after g scheduler steps): g = 0: base; 1 <= g <= w: base * g / w;
    # g > w: base * (1 - (g - w) / (t - w)); w <= 0: base * (1 - g / t).
    closed = []
    for g in range(len(got)):
        if g == 0:
            closed.append(0.1)
        elif w > 0 and g <= w:
            closed.append(0.1 * g / w)
        else:
            ww = w if w > 0 else 0
            closed.append(0.1 * (1 - (g - ww) / (t - ww)))
    far = max(abs(a - b) for a, b in zip(got, closed))
    print("%s: w %s t %s, %d steps, lr %s ... %s; torch: %d differ; closed form: max |diff| %.2e" % (
        name, w, t, len(got), ", ".join("%.6g" % x for x in got[:5]), "%.6g" % got[-1], len(bad), far))
    if t != len(got) or bad or far > 1e-15:
        fails += 1
        for g in bad[:5]:
            print("FAIL: %s step %d: pfcps %r, torch %r" % (name, g + 1, got[g], want[g]))
        if t != len(got):
            print("FAIL: %s: %d steps traced, schedule of %d" % (name, len(got), t))
        if far > 1e-15:
            print("FAIL: %s: closed form off by %.3g" % (name, far))

# poly_scheduler: PolyScheduler.get_lr(g - 1) for step g (w 3, t 24, power 2).
got = trace("poly")
w, t = 3, 24
want = [0.1 * (g / w) if g < w else 0.1 * (1 - (g - w) / (t - w)) ** 2 for g in range(len(got))]
far = max(abs(a - b) for a, b in zip(got, want))
print("poly: %d steps, lr %s ...; PolyScheduler closed form: max |diff| %.2e" % (
    len(got), ", ".join("%.6g" % x for x in got[:5]), far))
if far > 1e-16 or got[0] != 0:
    fails += 1
    print("FAIL: poly_scheduler lr off by %.3g (first step %r)" % (far, got[0]))
sys.exit(1 if fails else 0)
PY
ok "lr of every step of 4 runs as arcface_torch's schedules give them"
expect_summary
