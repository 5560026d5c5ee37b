"""Writes the float64 PyTorch reference cases the C reference tests compare against (the layout and the math
are in tests/reference/README.md, copied into the output folder):
  OUT/head/head_<margin>_<grad_mode>_N<N>_K<K>_D<D>   4 margins x 2 gradient modes x 3 sizes
  OUT/head/sgd_rows_R<R>_D<D>                         one SGD step (momentum, weight decay) on R rows
  OUT/head/dense_skip_K<K>_R<R>_D<D>                  K zero-gradient SGD steps (PartialFC_V2's update of
                                                      unsampled rows) on R rows, lr of each step given
  OUT/backbone/iresnet_tiny_1111_w8, iresnet_small_2222_w16
                                                      one training-mode forward and backward of a narrow
                                                      arcface_torch iresnet (tests/tools/arcface_nets.py)
Inputs are float32 drawn from a generator seeded by the case name (the same folder every run); every
expected output is computed in float64 on the CPU.

Usage: make_reference.py OUT [--inputs-from DIR] [--compare DIR]
  --inputs-from DIR  take each case's inputs (and initial parameters) from DIR, an existing reference set of
                     this layout, instead of drawing them: the outputs then reproduce DIR's to rounding
  --compare DIR      after writing, print the largest absolute difference between OUT's and DIR's
                     expected outputs (same inputs assumed) and exit 1 when one exceeds 1e-9
Exit status: 0 written; 1 a comparison failed; 3 a module is missing (torch or numpy; the message names it)."""
import argparse
import json
import os
import shutil
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))

MARGINS = {  # name: (m1, m2, m3); the logit of the target class is s * (cos(m1 * theta + m2) - m3)
    "arcface": (1.0, 0.5, 0.0),
    "cosface": (1.0, 0.0, 0.4),
    "combined": (1.0, 0.3, 0.2),
    "sphereface_like": (1.35, 0.0, 0.0),
}
GRAD_MODES = ("exact", "straight_through")
HEAD_SIZES = ((5, 7, 512), (8, 50, 16), (32, 1000, 128))  # (N, K, D)
SCALE = 64.0
SGD_SIZES = ((10, 16), (300, 512))  # (R, D)
SGD = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005}
DENSE_SKIPS = ((1, 20, 64), (7, 20, 64), (300, 8, 512))  # (K, R, D)
BACKBONES = (  # (case, layers, width of the first stage, num_features, batch)
    ("iresnet_tiny_1111_w8", (1, 1, 1, 1), 8, 32, 2),
    ("iresnet_small_2222_w16", (2, 2, 2, 2), 16, 64, 3),
)
BN_EPS, BN_MOMENTUM, PRELU_INIT, CONV_STD = 1e-5, 0.1, 0.25, 0.1
COMPARE_TOL = 1e-9


def import_modules():
    """torch and numpy, or exit 3 naming the one that is missing."""
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print("MISSING: %s lacks the module %s (Debian: python3-torch, python3-numpy)" % (sys.executable, e.name),
              file=sys.stderr)
        sys.exit(3)


def generator(name):
    """A torch generator seeded by the case name: each case's inputs are fixed and independent of the others."""
    import torch
    g = torch.Generator()
    g.manual_seed(zlib.crc32(name.encode()))
    return g


def save(folder, name, tensor):
    """folder/name.npy (numpy format 1.0), subfolders created."""
    import numpy as np
    path = os.path.join(folder, name + ".npy")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, tensor.detach().cpu().numpy())


def load(folder, name):
    import numpy as np
    import torch
    return torch.from_numpy(np.load(os.path.join(folder, name + ".npy")))


def write_meta(folder, meta, indent=1):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(meta, f, indent=indent)


def head_case(out, name, margin, grad_mode, N, K, D, src):
    """One margin-softmax head over all K class centers: logits, mean cross-entropy loss and the gradients
    to the embeddings and the class centers through the row normalisation."""
    import torch
    import torch.nn.functional as F
    m1, m2, m3 = MARGINS[margin]
    if src:
        emb, cen, lab = (load(src, "embeddings"), load(src, "centers"), load(src, "labels"))
    else:
        g = generator(name)
        emb = torch.randn(N, D, generator=g, dtype=torch.float32)
        cen = torch.randn(K, D, generator=g, dtype=torch.float32) * 0.01
        lab = torch.randint(0, K, (N,), generator=g, dtype=torch.int64)
    e = emb.double().requires_grad_()
    w = cen.double().requires_grad_()
    cos = F.normalize(e, dim=1) @ F.normalize(w, dim=1).t()
    rows = torch.arange(N)
    t = cos[rows, lab]
    theta = torch.acos(torch.clamp(t, -1 + 1e-7, 1 - 1e-7))
    target = torch.cos(m1 * theta + m2) - m3
    if grad_mode == "straight_through":
        target = t + (target - t).detach()  # the value of the margin formula, the derivative of t
    onehot = F.one_hot(lab, K).bool()
    logits = SCALE * torch.where(onehot, target.unsqueeze(1), cos)
    loss = F.cross_entropy(logits, lab)
    loss.backward()
    folder = os.path.join(out, "head", name)
    for k, v in (("embeddings", emb), ("centers", cen), ("labels", lab), ("logits", logits),
                 ("loss", loss.reshape(1)), ("grad_embeddings", e.grad), ("grad_centers", w.grad)):
        save(folder, k, v)
    write_meta(folder, {"N": N, "K": K, "D": D, "s": SCALE, "m1": m1, "m2": m2, "m3": m3, "grad_mode": grad_mode})


def sgd_case(out, name, R, D, src):
    """One step of torch.optim.SGD (momentum, weight decay, dampening 0, no Nesterov) on R rows."""
    import torch
    if src:
        weight, grad, mom = load(src, "weight"), load(src, "grad"), load(src, "momentum")
    else:
        g = generator(name)
        weight = torch.randn(R, D, generator=g, dtype=torch.float32)
        grad = torch.randn(R, D, generator=g, dtype=torch.float32) * 0.01
        mom = torch.randn(R, D, generator=g, dtype=torch.float32) * 0.1
    p = torch.nn.Parameter(weight.double().clone())
    p.grad = grad.double().clone()
    opt = torch.optim.SGD([p], lr=SGD["lr"], momentum=SGD["momentum"], weight_decay=SGD["weight_decay"])
    opt.state[p]["momentum_buffer"] = mom.double().clone()
    opt.step()
    folder = os.path.join(out, "head", name)
    for k, v in (("weight", weight), ("grad", grad), ("momentum", mom),
                 ("momentum_out", opt.state[p]["momentum_buffer"]), ("weight_out", p.data)):
        save(folder, k, v)
    write_meta(folder, dict({"R": R, "D": D}, **SGD), indent=None)


def dense_skip_case(out, name, K, R, D, src):
    """K steps of torch.optim.SGD (momentum, weight decay) with zero gradients on R rows, the lr of step i
    from `lrs` (a linear decay, as PolynomialLRWarmup's): what PartialFC_V2 does to a row no step sampled."""
    import torch
    if src:
        weight, mom, lrs = load(src, "weight"), load(src, "momentum"), load(src, "lrs")
    else:
        g = generator(name)
        weight = torch.randn(R, D, generator=g, dtype=torch.float32) * 0.05
        mom = torch.randn(R, D, generator=g, dtype=torch.float32) * 0.01
        lrs = torch.tensor([0.1 * (1.0 - (i + 40) / 1000.0) for i in range(K)], dtype=torch.float64)
    p = torch.nn.Parameter(weight.double().clone())
    opt = torch.optim.SGD([p], lr=float(lrs[0]), momentum=SGD["momentum"], weight_decay=SGD["weight_decay"])
    opt.state[p]["momentum_buffer"] = mom.double().clone()
    for i in range(K):
        opt.param_groups[0]["lr"] = float(lrs[i])
        p.grad = torch.zeros_like(p.data)
        opt.step()
    folder = os.path.join(out, "head", name)
    for k, v in (("weight", weight), ("momentum", mom), ("lrs", lrs),
                 ("momentum_out", opt.state[p]["momentum_buffer"]), ("weight_out", p.data)):
        save(folder, k, v)
    write_meta(folder, {"K": K, "R": R, "D": D, "momentum": SGD["momentum"],
                        "weight_decay": SGD["weight_decay"]}, indent=None)


def backbone_case(out, name, layers, width, num_features, batch, src):
    """A narrow arcface_torch iresnet: initial parameters, one training-mode forward and backward in float64,
    the BatchNorm running statistics it leaves and an eval-mode forward with them."""
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "tools"))
    from arcface_nets import IResNet
    torch.manual_seed(zlib.crc32(name.encode()))
    net = IResNet(list(layers), width, num_features)
    for m in net.modules():  # arcface_torch's initialisation of the convolutions; PReLU 0.25, BN (1, 0)
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.normal_(m.weight, 0, CONV_STD)
        elif isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            m.momentum = BN_MOMENTUM
    params = dict(net.named_parameters())
    if src:
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(load(src, "params/" + k))
        x, gy = load(src, "input"), load(src, "grad_output")
    else:
        g = generator(name)
        x = torch.randn(batch, 3, 112, 112, generator=g, dtype=torch.float32)
        gy = torch.randn(batch, num_features, generator=g, dtype=torch.float32)
    folder = os.path.join(out, "backbone", name)
    for k, p in params.items():
        save(folder, "params/" + k, p)
    net = net.double().train()
    xd = x.double().requires_grad_()
    y = net(xd)
    y.backward(gy.double())
    save(folder, "input", x)
    save(folder, "grad_output", gy)
    save(folder, "output", y)
    save(folder, "grad_input", xd.grad)
    for k, p in net.named_parameters():
        if p.requires_grad:
            save(folder, "grads/" + k, p.grad)
    for k, b in net.named_buffers():
        if k.endswith("running_mean") or k.endswith("running_var"):
            save(folder, "running/" + k, b)
    with torch.no_grad():
        save(folder, "eval_output", net.eval()(xd))
    write_meta(folder, {"layers": list(layers), "widths": [width << s for s in range(4)],
                        "num_features": num_features, "batch": batch, "input": "3x112x112", "bn_eps": BN_EPS,
                        "bn_momentum": BN_MOMENTUM, "prelu_init": PRELU_INIT,
                        "conv_init": "normal(0,%g)" % CONV_STD, "param_order": list(params)})


def cases():
    """(group, name, writer(out, src)) for every case, in a fixed order."""
    for margin in MARGINS:
        for mode in GRAD_MODES:
            for N, K, D in HEAD_SIZES:
                name = "head_%s_%s_N%d_K%d_D%d" % (margin, mode, N, K, D)
                yield "head", name, (lambda o, s, a=(name, margin, mode, N, K, D): head_case(o, *a, s))
    for R, D in SGD_SIZES:
        name = "sgd_rows_R%d_D%d" % (R, D)
        yield "head", name, (lambda o, s, a=(name, R, D): sgd_case(o, *a, s))
    for K, R, D in DENSE_SKIPS:
        name = "dense_skip_K%d_R%d_D%d" % (K, R, D)
        yield "head", name, (lambda o, s, a=(name, K, R, D): dense_skip_case(o, *a, s))
    for b in BACKBONES:
        yield "backbone", b[0], (lambda o, s, a=b: backbone_case(o, *a, s))


def expected_files(folder):
    """The .npy files under folder that hold expected outputs (not the inputs), relative to folder."""
    inputs = {"embeddings", "centers", "labels", "weight", "grad", "momentum", "input", "grad_output", "lrs"}
    found = []
    for root, _, files in os.walk(folder):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), folder)
            if f.endswith(".npy") and not rel.startswith("params") and f[:-4] not in inputs:
                found.append(rel)
    return sorted(found)


def compare(out, other):
    """Largest absolute difference of every expected output of out against other; 1 when one exceeds the
    tolerance or a file or shape differs, else 0."""
    import numpy as np
    worst, bad = 0.0, 0
    for group, name, _ in cases():
        a_dir, b_dir = os.path.join(out, group, name), os.path.join(other, group, name)
        if sorted(os.listdir(a_dir)) != sorted(os.listdir(b_dir)):
            print("%s: files differ" % name)
            bad += 1
        for rel in expected_files(a_dir):
            a, b = np.load(os.path.join(a_dir, rel)), np.load(os.path.join(b_dir, rel))
            if a.shape != b.shape or a.dtype != b.dtype:
                print("%s/%s: %s %s vs %s %s" % (name, rel, a.dtype, a.shape, b.dtype, b.shape))
                bad += 1
                continue
            d = float(np.max(np.abs(a - b))) if a.size else 0.0
            worst = max(worst, d)
            if d > COMPARE_TOL:
                print("%s/%s: max |difference| %.3e" % (name, rel, d))
                bad += 1
    print("compare %s with %s: largest absolute difference %.3e, %d problem(s)" % (out, other, worst, bad))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--inputs-from", dest="src")
    ap.add_argument("--compare")
    args = ap.parse_args()
    import_modules()
    import torch
    torch.set_num_threads(1)  # one summation order: the same bytes on every machine with this torch
    os.makedirs(args.out, exist_ok=True)
    shutil.copyfile(os.path.join(HERE, "README.md"), os.path.join(args.out, "README.md"))
    for group, name, write in cases():
        write(args.out, os.path.join(args.src, group, name) if args.src else None)
    n = sum(1 for _ in cases())
    print("make_reference: %d cases in %s (torch %s)" % (n, args.out, torch.__version__))
    return compare(args.out, args.compare) if args.compare else 0


if __name__ == "__main__":
    sys.exit(main())
