"""pretrained_centers (server/centers_load.c): the servers start from class centers given in a file.
Files written here:
  - safetensors (header written by hand: JSON + raw bytes) with a C x D float32 `weight` and `momentum`, and
    one with `centers` alone (pfcps export --centers' name; momentum then 0);
  - arcface_torch's checkpoint_gpu_<rank>.pt set as torch.save writes it with save_all_states: 3 ranks of
    C = 10 (classes [0, 4), [4, 7), [7, 10)), each state_dict_softmax_fc/weight its range, and state_optimizer
    from a real torch.optim.SGD step (momentum) over a backbone group and the head's group, global_step, epoch.
test_centers_load creates every shard of S (1, 2, 3) and loads the file: the table (weights and momentum, in
class order) must equal the file's (the concatenation of the ranks') bit for bit. Bad inputs are refused with
a message naming the file and the tensor: wrong C, wrong D, wrong dtype, NaN and infinity (naming the row), a
missing tensor, a missing rank file, rank files whose rows do not add up to C or do not follow the split.
Usage: test_centers_load.py TEST_CENTERS_LOAD. Exit 77 when torch or numpy is missing."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

TOOL = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="pfcps-centers-load-")
fails = 0
rng = np.random.default_rng(26)


def check(cond, msg):
    global fails
    print(("ok   " if cond else "FAIL ") + msg)
    fails += not cond


def write_st(path, tensors):
    """safetensors by hand: u64 header length, JSON header padded with spaces to 8 bytes, data in order."""
    header, data, off = {}, b"", 0
    names = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.float16): "F16"}
    for name, a in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        data += b
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + data)


def load(path, C, D, S):
    out = os.path.join(tmp, "table.f32")
    r = subprocess.run([TOOL, path, str(C), str(D), str(S), out], capture_output=True, text=True)
    if r.returncode != 0:
        return None, None, r.returncode, r.stderr.strip()
    t = np.fromfile(out, dtype=np.float32)
    return t[:C * D].reshape(C, D), t[C * D:].reshape(C, D), 0, r.stderr.strip()


def same_bits(a, b):
    return a is not None and a.shape == b.shape and a.tobytes() == b.tobytes()


def refused(path, C, D, S, *want):
    w, _, rc, err = load(path, C, D, S)
    ok = rc == 1 and all(s in err for s in want)
    check(ok, "refused %s: %s" % (os.path.basename(path), err if ok else "rc %d, stderr %r, wanted %r" % (rc, err, want)))


# ---- (1) safetensors ----
C, D = 11, 6
W = rng.standard_normal((C, D), dtype=np.float32)
M = rng.standard_normal((C, D), dtype=np.float32)
st_w = os.path.join(tmp, "weight.safetensors")
write_st(st_w, {"weight": W, "momentum": M})
st_c = os.path.join(tmp, "centers.safetensors")
write_st(st_c, {"centers": W})
for S in (1, 3):
    w, m, rc, err = load(st_w, C, D, S)
    check(same_bits(w, W) and same_bits(m, M), "safetensors 'weight' + 'momentum', %d server(s): table bit-exact (%s)" % (S, err[-200:]))
    w, m, rc, err = load(st_c, C, D, S)
    check(same_bits(w, W) and same_bits(m, np.zeros_like(W)), "safetensors 'centers', %d server(s): table bit-exact, momentum 0" % S)

# ---- (2) arcface_torch's checkpoint_gpu_<rank>.pt set ----
CT, DT, WR = 10, 4, 3
ranges = [(0, 4), (4, 7), (7, 10)]


def write_rank_set(folder, rows_of=None, mutate=None, ranks=range(WR)):
    """Writes checkpoint_gpu_<r>.pt like arcface_torch's save_all_states; returns (weights, momentum) in class
    order. rows_of(r) overrides a rank's (first, end); mutate(r, ckpt) may change the dict before torch.save."""
    os.makedirs(folder, exist_ok=True)
    ws, ms = [], []
    for r in ranks:
        a, b = rows_of(r) if rows_of else ranges[r]
        torch.manual_seed(100 + r)
        backbone = torch.nn.Linear(3, DT)
        fc = torch.nn.Parameter(torch.randn(b - a, DT))
        opt = torch.optim.SGD([{"params": backbone.parameters()}, {"params": [fc]}], lr=0.1, momentum=0.9,
                              weight_decay=5e-4)
        loss = (backbone(torch.randn(2, 3)).sum() + (fc * torch.randn(b - a, DT)).sum())
        loss.backward()
        opt.step()
        ckpt = {"epoch": 3, "global_step": 1234, "state_dict_backbone": backbone.state_dict(),
                "state_dict_softmax_fc": {"weight": fc.detach()}, "state_optimizer": opt.state_dict(),
                "state_lr_scheduler": {"last_epoch": 1234}}
        ws.append(fc.detach().numpy().copy())
        ms.append(opt.state[fc]["momentum_buffer"].numpy().copy())
        if mutate:
            mutate(r, ckpt)
        torch.save(ckpt, os.path.join(folder, "checkpoint_gpu_%d.pt" % r))
    return np.concatenate(ws), np.concatenate(ms)


good = os.path.join(tmp, "pt_good")
WT, MT = write_rank_set(good)
for S in (1, 2, 3):
    for r in (0, 2):
        w, m, rc, err = load(os.path.join(good, "checkpoint_gpu_%d.pt" % r), CT, DT, S)
        check(same_bits(w, WT) and same_bits(m, MT),
              "checkpoint_gpu_0..2.pt (via rank %d's file), %d server(s): centers and momentum = the concatenation" % (r, S))
        if S == 2 and r == 0:
            check("global_step = 1234, epoch = 3" in err, "global_step and epoch logged: %s" % err.replace("\n", " | ")[:300])
# without state_optimizer: momentum 0
nomom = os.path.join(tmp, "pt_nomom")
WN, _ = write_rank_set(nomom, mutate=lambda r, c: c.pop("state_optimizer"))
w, m, rc, err = load(os.path.join(nomom, "checkpoint_gpu_0.pt"), CT, DT, 2)
check(same_bits(w, WN) and same_bits(m, np.zeros_like(WN)), "rank files without state_optimizer: centers loaded, momentum 0")

# ---- (3) refusals ----
bad = lambda name: os.path.join(tmp, name)
write_st(bad("c9.safetensors"), {"weight": W[:9]})
refused(bad("c9.safetensors"), C, D, 1, "c9.safetensors", "tensor 'weight'", "[9, 6]", "not [11, 6]")
write_st(bad("d5.safetensors"), {"centers": W[:, :5]})
refused(bad("d5.safetensors"), C, D, 3, "d5.safetensors", "tensor 'centers'", "[11, 5]")
write_st(bad("f64.safetensors"), {"weight": W.astype(np.float64)})
refused(bad("f64.safetensors"), C, D, 1, "f64.safetensors", "tensor 'weight'", "dtype F64")
Wn = W.copy(); Wn[7, 2] = np.nan
write_st(bad("nan.safetensors"), {"weight": Wn})
refused(bad("nan.safetensors"), C, D, 3, "nan.safetensors", "tensor 'weight'", "row 7", "element 2", "NaN")
Mi = M.copy(); Mi[4, 0] = -np.inf
write_st(bad("inf.safetensors"), {"weight": W, "momentum": Mi})
refused(bad("inf.safetensors"), C, D, 2, "inf.safetensors", "tensor 'momentum'", "row 4", "infinite")
write_st(bad("other.safetensors"), {"fc.weight": W})
refused(bad("other.safetensors"), C, D, 1, "other.safetensors", "no tensor 'weight'", "'centers'")
write_st(bad("both.safetensors"), {"weight": W, "centers": W})
refused(bad("both.safetensors"), C, D, 1, "both.safetensors", "'weight' and 'centers' both present")
write_st(bad("mom.safetensors"), {"weight": W, "momentum_buffer": M[:, :3]})
refused(bad("mom.safetensors"), C, D, 1, "mom.safetensors", "tensor 'momentum_buffer'", "[11, 3]")
refused(bad("absent.safetensors"), C, D, 1, "absent.safetensors")

gap = os.path.join(tmp, "pt_gap")
write_rank_set(gap)
os.remove(os.path.join(gap, "checkpoint_gpu_1.pt"))
refused(os.path.join(gap, "checkpoint_gpu_0.pt"), CT, DT, 2, "checkpoint_gpu_1.pt", "missing")
short = os.path.join(tmp, "pt_sum")
write_rank_set(short, rows_of=lambda r: [(0, 4), (4, 7), (7, 9)][r])
refused(os.path.join(short, "checkpoint_gpu_0.pt"), CT, DT, 2, "add up to 9", "4 + 3 + 2", "num_classes 10")
split = os.path.join(tmp, "pt_split")
write_rank_set(split, rows_of=lambda r: [(0, 3), (3, 7), (7, 10)][r])
refused(os.path.join(split, "checkpoint_gpu_2.pt"), CT, DT, 2, "checkpoint_gpu_0.pt", "state_dict_softmax_fc/weight",
        "has 3 rows, not 4", "[0, 4)")
f64 = os.path.join(tmp, "pt_f64")


def to_f64(r, c):
    if r == 1:
        c["state_dict_softmax_fc"]["weight"] = c["state_dict_softmax_fc"]["weight"].double()


write_rank_set(f64, mutate=to_f64)
refused(os.path.join(f64, "checkpoint_gpu_0.pt"), CT, DT, 2, "checkpoint_gpu_1.pt", "state_dict_softmax_fc/weight", "dtype F64")
refused(os.path.join(good, "checkpoint_gpu_0.pt"), CT, 5, 2, "checkpoint_gpu_0.pt", "state_dict_softmax_fc/weight", "[4, 4]", "not [rows, 5]")
refused(os.path.join(good, "checkpoint_gpu_0.pt"), 12, DT, 2, "add up to 10", "num_classes 12")
nan = os.path.join(tmp, "pt_nan")


def put_nan(r, c):
    if r == 2:
        c["state_dict_softmax_fc"]["weight"][1, 3] = float("nan")


write_rank_set(nan, mutate=put_nan)
refused(os.path.join(nan, "checkpoint_gpu_0.pt"), CT, DT, 3, "checkpoint_gpu_2.pt", "state_dict_softmax_fc/weight", "row 1 (class 8)", "element 3", "NaN")
nofc = os.path.join(tmp, "pt_nofc")
write_rank_set(nofc, mutate=lambda r, c: c.pop("state_dict_softmax_fc") if r == 0 else None)
refused(os.path.join(nofc, "checkpoint_gpu_1.pt"), CT, DT, 1, "checkpoint_gpu_0.pt", "no tensor 'state_dict_softmax_fc/weight'")
mom = os.path.join(tmp, "pt_mom")


def bad_mom(r, c):
    if r == 1:
        P = c["state_optimizer"]["param_groups"][1]["params"][0]
        c["state_optimizer"]["state"][P]["momentum_buffer"] = torch.zeros(3, DT + 1)


write_rank_set(mom, mutate=bad_mom)
refused(os.path.join(mom, "checkpoint_gpu_0.pt"), CT, DT, 2, "checkpoint_gpu_1.pt", "momentum_buffer", "[3, 5]", "not [3, 4]")
steps = os.path.join(tmp, "pt_steps")
write_rank_set(steps, mutate=lambda r, c: c.update(global_step=1240) if r == 2 else None)
refused(os.path.join(steps, "checkpoint_gpu_0.pt"), CT, DT, 2, "checkpoint_gpu_2.pt", "global_step = 1240",
        "checkpoint_gpu_0.pt has 1234", "not from the same step")
other = os.path.join(tmp, "model.pt")
torch.save({"weight": torch.zeros(CT, DT)}, other)
refused(other, CT, DT, 1, "model.pt", "checkpoint_gpu_<rank>.pt")

shutil.rmtree(tmp)
print("%d failure(s)" % fails)
sys.exit(1 if fails else 0)
