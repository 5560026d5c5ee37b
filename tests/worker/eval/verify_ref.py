"""Independent implementation of arcface_torch's verification protocol (eval/verification.py), written from
its description, checking test_verify.c's results.txt to 1e-6. Usage: verify_ref.py DIR. Exit 77 when numpy
or scikit-learn is missing."""
import os
import sys

try:
    import numpy as np
    from sklearn.model_selection import KFold
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

d = sys.argv[1]
fails = 0
for line in open(os.path.join(d, "results.txt")):
    f = line.split()
    name, folds, flip = f[0], int(f[1]), int(f[2])
    got_mean, got_std, got_xnorm = float(f[3]), float(f[4]), float(f[5])
    got_thr = [float(x) for x in f[6:]]
    emb = np.load(os.path.join(d, name + "_emb.npy")).astype(np.float64)
    issame = np.load(os.path.join(d, name + "_issame.npy")).reshape(-1) > 0.5
    assert np.load(os.path.join(d, name + "_emb.npy")).dtype == np.float32
    lists = [emb]
    if flip:
        lists.append(np.load(os.path.join(d, name + "_flip.npy")).astype(np.float64))
    xnorm = np.mean([np.linalg.norm(r) for e in lists for r in e])
    s = sum(lists)
    s = s / np.maximum(np.linalg.norm(s, axis=1, keepdims=True), 1e-300)
    e1, e2 = s[0::2], s[1::2]
    dist = np.sum(np.square(e1 - e2), 1)
    thresholds = np.arange(0, 4, 0.01)
    n = len(issame)

    def acc(t, idx):
        pred = np.less(dist[idx], t)
        return float(np.sum(pred == issame[idx])) / len(idx)

    idx = np.arange(n)
    splits = [(idx, idx)] if folds == 1 else list(KFold(n_splits=folds, shuffle=False).split(idx))
    accs, best = [], []
    for tr, te in splits:
        a = np.array([acc(t, tr) for t in thresholds])
        b = int(np.argmax(a))
        best.append(thresholds[b])
        accs.append(acc(thresholds[b], te))
    want_mean, want_std = np.mean(accs), np.std(accs)
    errs = [abs(got_mean - want_mean), abs(got_std - want_std), abs(got_xnorm - xnorm)]
    errs += [abs(a - b) for a, b in zip(got_thr, best)]
    ok = max(errs) <= 1e-6 and len(got_thr) == len(best)
    print("%s: pfcps %.6f+-%.6f xnorm %.6f | numpy+sklearn %.6f+-%.6f xnorm %.6f | thresholds %s vs %s: %s"
          % (name, got_mean, got_std, got_xnorm, want_mean, want_std, xnorm, got_thr, [round(x, 2) for x in best],
             "ok" if ok else "FAIL (max diff %g)" % max(errs)))
    fails += not ok
sys.exit(1 if fails else 0)
