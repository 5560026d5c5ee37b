"""`pfcps verify --pixels` (the raw-pixel baseline) against numpy + scikit-learn: each image's embedding is its
network input, computed here independently (PIL decodes the ORL PGM and replicates grey to RGB; centred on a
black 112x112 canvas as `--pad` / `pfcps pack --pad` do; (x/255 - 0.5)/0.5 in CHW order; with flip the
horizontally flipped image's vector is added), then arcface_torch's verification protocol written here
(eval/verification.py: XNorm = mean L2 norm of every row of both lists; rows L2-normalised; squared distance;
thresholds np.arange(0, 4, 0.01), predicted same when dist < t; sklearn KFold(shuffle=False); per fold the first
threshold maximising the other folds' accuracy). Accuracy mean and std as printed (%1.5f) equal the reference
printed so, XNorm within 1e-6 (+ its print's rounding), every fold's threshold exactly:
  - the whole unseen quick-start set data/orl/pairs_s31-s40.txt (900 pairs, 10 folds), with flip;
  - 40 of its pairs (20 same, 20 different) without flip, 4 folds.
Usage: test_verify_pixels.py PFCPS SRC. Exit 77 when numpy, scikit-learn or PIL is missing."""
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from PIL import Image
    from sklearn.model_selection import KFold
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

PFCPS, SRC = sys.argv[1:3]
ORL = os.path.join(SRC, "data", "orl")
tmp = tempfile.mkdtemp(prefix="pfcps-pixels-")
fails = 0


def check(cond, msg):
    global fails
    print(("ok   " if cond else "FAIL ") + msg)
    fails += not cond


cache = {}


def pixels(path, flip):
    key = (path, flip)
    if key not in cache:
        rgb = np.asarray(Image.open(path).convert("RGB"), np.uint8)
        h, w, _ = rgb.shape
        assert h <= 112 and w <= 112, path
        canvas = np.zeros((112, 112, 3), np.uint8)
        oy, ox = (112 - h) // 2, (112 - w) // 2
        canvas[oy:oy + h, ox:ox + w] = rgb
        if flip:
            canvas = canvas[:, ::-1]
        x = (canvas.astype(np.float64) / 255.0 - 0.5) / 0.5
        cache[key] = x.transpose(2, 0, 1).reshape(-1)  # CHW
    return cache[key]


def read_pairs(path):
    lines = open(path).read().splitlines()
    paths, issame = [], []
    for ln in lines[1:]:
        f = ln.split()
        if len(f) == 3:
            a, b, same = (f[0], f[1]), (f[0], f[2]), True
        else:
            a, b, same = (f[0], f[1]), (f[2], f[3]), False
        for ident, num in (a, b):
            paths.append(os.path.join(ORL, ident, "%d.pgm" % int(num)))
        issame.append(same)
    return paths, np.array(issame)


def reference(paths, issame, folds, flip):
    lists = [np.stack([pixels(p, False) for p in paths])]
    if flip:
        lists.append(np.stack([pixels(p, True) for p in paths]))
    xnorm = np.mean([np.linalg.norm(r) for e in lists for r in e])
    s = sum(lists)
    s = s / np.maximum(np.linalg.norm(s, axis=1, keepdims=True), 1e-300)
    dist = np.sum(np.square(s[0::2] - s[1::2]), 1)
    thresholds = np.arange(0, 4, 0.01)

    def acc(t, idx):
        return float(np.sum(np.less(dist[idx], t) == issame[idx])) / len(idx)

    idx = np.arange(len(issame))
    accs, best = [], []
    for tr, te in KFold(n_splits=folds, shuffle=False).split(idx):
        a = np.array([acc(t, tr) for t in thresholds])
        b = int(np.argmax(a))
        best.append(round(float(thresholds[b]), 2))
        accs.append(acc(thresholds[b], te))
    return float(np.mean(accs)), float(np.std(accs)), float(xnorm), best


def pfcps(args, name):
    r = subprocess.run([PFCPS, "verify", "--pixels", "--pad"] + args, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit("pfcps verify --pixels: exit %d" % r.returncode)
    out = r.stdout
    m = re.search(r"^\[%s\] Accuracy(?:-Flip)?: ([0-9.]+)\+-([0-9.]+)$" % re.escape(name), out, re.M)
    x = re.search(r"^\[%s\] XNorm: ([0-9.]+)$" % re.escape(name), out, re.M)
    t = re.search(r"per fold: ([0-9. ]+)\)$", out, re.M)
    assert m and x and t, out
    return float(m.group(1)), float(m.group(2)), float(x.group(1)), [float(v) for v in t.group(1).split()], out


def compare(label, got, want):
    gm, gs, gx, gt, out = got
    wm, ws, wx, wt = want
    # pfcps prints the accuracy as %1.5f+-%1.5f: equal to the reference printed so (the accuracies are
    # multiples of 1/pairs-per-fold: exact); XNorm is printed %f: within 1e-6 plus the print's half unit
    ok = ("%1.5f" % gm, "%1.5f" % gs) == ("%1.5f" % wm, "%1.5f" % ws) and abs(gx - wx) <= 1e-6 + 5e-7 and gt == wt
    check(ok, "%s: pfcps %.5f+-%.5f xnorm %.6f thresholds %s | numpy+sklearn %.6f+-%.6f xnorm %.6f thresholds %s"
          % (label, gm, gs, gx, gt, wm, ws, wx, wt))


full = os.path.join(ORL, "pairs_s31-s40.txt")
paths, issame = read_pairs(full)
check(len(issame) == 900 and issame.sum() == 450, "the set: 900 pairs, 450 same")
compare("pairs_s31-s40, flip, 10 folds", pfcps([full, "--images", ORL], "pairs_s31-s40"),
        reference(paths, issame, 10, True))

lines = open(full).read().splitlines()
sub = os.path.join(tmp, "sub.txt")
with open(sub, "w") as f:
    f.write("\n".join(["1\t20"] + lines[1:21] + lines[46:66]) + "\n")
paths, issame = read_pairs(sub)
compare("40 pairs, no flip, 4 folds", pfcps(["--no-flip", "--folds", "4", sub, "--images", ORL], "sub"),
        reference(paths, issame, 4, False))
sys.exit(1 if fails else 0)
