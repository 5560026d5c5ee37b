"""pfcps reads arcface_torch's own files as torch writes them (worker/model/torch_pt.c), checked by torch itself.
PyTorch builds arcface_torch's backbones (tests/tools/arcface_nets.py: r18_w8 and mbf) with random weights and
random BN affine parameters, sets the BN running statistics to those of a batch of 16 inputs (so activations
stay O(1) and an absolute bound means what it says, as in tests/tools/test_export.py), and writes:
  - model.pt: torch.save(backbone.state_dict()) (float32), as arcface_torch's rank 0 does;
  - checkpoint_gpu_0.pt: torch.save of arcface_torch's save_all_states dict (epoch, global_step,
    state_dict_backbone, state_dict_softmax_fc, state_optimizer of a real SGD step with momentum over the
    backbone and the centers, state_lr_scheduler of a real PolynomialLR);
  - the same state_dict with a transposed view (fc.weight with strides (1, out)) and the BN running means as
    views at offsets of one shared storage; and with every float tensor an nn.Parameter.
pfcps (test_torch_pt --forward: model_load_pretrained then the eval forward, float32) must equal PyTorch's eval
forward in float64 of the same float32 weights within 1e-4, for every file; the checkpoint's centers and
center momentum (test_torch_pt --tensor) equal torch's bytes. Refused, naming the problem: a pickle that would
call os.system (and the command never runs), float64 / float16 / NaN / missing tensors, a storage entry cut
short, a truncated archive, a legacy (non-zip) torch.save file, a TorchScript archive.
Usage: test_torch_pt.py TEST_TORCH_PT. Exit 77 when torch or numpy is missing."""
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

try:
    import numpy as np
    import torch
    from torch import nn
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from arcface_nets import backbone  # noqa: E402

TOOL = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="pfcps-torch-pt-")
fails = 0
TOL = 1e-4
B = 5


def check(cond, msg):
    global fails
    print(("ok   " if cond else "FAIL ") + msg)
    fails += not cond


def pfcps_forward(net, D, path, x):
    xin, out = os.path.join(tmp, "x.f32"), os.path.join(tmp, "y.f32")
    x.astype(np.float32).tofile(xin)
    r = subprocess.run([TOOL, "--forward", net, str(D), path, str(len(x)), xin, out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return np.fromfile(out, dtype=np.float32).reshape(len(x), D), ""


def pfcps_tensor(path, key):
    out = os.path.join(tmp, "t.bin")
    r = subprocess.run([TOOL, "--tensor", path, key, out], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return open(out, "rb").read(), r.stdout.strip()


def refused(net, D, path, want, what):
    y, err = pfcps_forward(net, D, path, np.zeros((1, 3, 112, 112), np.float32))
    check(y is None and want in err, "%s: refused (%s)" % (what, err))


def calibrate(model, x):
    """BN running statistics := the statistics of batch x (momentum None: cumulative average of one batch)."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        model(x)
    model.eval()


def save_zip_with(src, dst, name, data):
    """dst := src with entry `name` replaced by `data` (the other entries copied as they are)."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zo:
        for info in zi.infolist():
            zo.writestr(info, data if info.filename == name else zi.read(info.filename))


torch.manual_seed(5)
rng = np.random.default_rng(5)
x = rng.uniform(-1, 1, (B, 3, 112, 112)).astype(np.float32)
for net, D in [("r18_w8", 32), ("mbf", 64)]:
    model = backbone(net, D).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name != "features.weight":
                p.add_(torch.empty_like(p).uniform_(-0.2, 0.2))
    calibrate(model, torch.from_numpy(rng.uniform(-1, 1, (16, 3, 112, 112))))
    sd = collections.OrderedDict((k, v.float() if v.is_floating_point() else v)
                                 for k, v in model.state_dict().items())
    sd._metadata = model.state_dict()._metadata
    ref_model = backbone(net, D)
    ref_model.load_state_dict(sd, strict=True)
    ref_model = ref_model.double().eval()
    with torch.no_grad():
        ref = ref_model(torch.from_numpy(x).double()).numpy()

    # ---- model.pt ----
    mpt = os.path.join(tmp, net + "_model.pt")
    torch.save(sd, mpt)
    y, err = pfcps_forward(net, D, mpt, x)
    d = float(np.abs(y - ref).max()) if y is not None else float("inf")
    check(d < TOL, "%s: model.pt (torch %s, %d tensors): pfcps vs PyTorch float64 eval, batch %d: max |diff| %.3g "
          "(|y| max %.3g) %s" % (net, torch.__version__, len(sd), B, d, float(np.abs(ref).max()), err))
    y_pt = y

    # ---- checkpoint_gpu_0.pt, as arcface_torch's save_all_states writes it ----
    n_r = 7
    centers = torch.nn.Parameter(torch.normal(0, 0.01, (n_r, D)))
    bb = backbone(net, D)
    bb.load_state_dict(sd)
    opt = torch.optim.SGD([{"params": bb.parameters()}, {"params": centers}], lr=0.1, momentum=0.9,
                          weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=100, power=2.0)
    bb.train()
    loss = (bb(torch.from_numpy(x[:2])) @ centers.t()).square().mean()
    loss.backward()
    opt.step()
    sched.step()
    P = len(list(bb.parameters()))
    ck = os.path.join(tmp, "checkpoint_gpu_0.pt")
    torch.save({"epoch": 3, "global_step": 1234, "state_dict_backbone": sd,
                "state_dict_softmax_fc": collections.OrderedDict(weight=centers.detach()),
                "state_optimizer": opt.state_dict(), "state_lr_scheduler": sched.state_dict()}, ck)
    y, err = pfcps_forward(net, D, ck, x)
    check(y is not None and np.array_equal(y, y_pt),
          "%s: checkpoint_gpu_0.pt (its state_dict_backbone): the same embeddings as model.pt, bit for bit %s"
          % (net, err))
    raw, desc = pfcps_tensor(ck, "state_dict_softmax_fc/weight")
    check(raw == centers.detach().numpy().tobytes() and desc == "F32 [%d, %d]" % (n_r, D),
          "%s: state_dict_softmax_fc/weight: %s, torch's bytes" % (net, desc))
    mom = opt.state_dict()["state"][P]["momentum_buffer"]
    raw, desc = pfcps_tensor(ck, "state_optimizer/state/%d/momentum_buffer" % P)
    check(raw == mom.numpy().tobytes() and desc == "F32 [%d, %d]" % (n_r, D),
          "%s: state_optimizer/state/%d/momentum_buffer (the centers' momentum): %s, torch's bytes"
          % (net, P, desc))

    # ---- views: a transposed fc.weight, running means at offsets of one storage ----
    nc = collections.OrderedDict(sd)
    key = "fc.weight" if net != "mbf" else "features.layers.2.weight"
    nc[key] = sd[key].t().contiguous().t()
    means = [k for k in sd if k.endswith("running_mean")]
    flat = torch.cat([sd[k].flatten() for k in means])
    at = 0
    for k in means:
        n = sd[k].numel()
        nc[k] = flat[at:at + n].view(sd[k].shape)
        at += n
    check(not nc[key].is_contiguous() and nc[means[-1]].storage_offset() > 0,
          "%s: %s has strides %s, %s storage offset %d" % (net, key, nc[key].stride(), means[-1],
                                                            nc[means[-1]].storage_offset()))
    vpt = os.path.join(tmp, net + "_views.pt")
    torch.save(nc, vpt)
    y, err = pfcps_forward(net, D, vpt, x)
    check(y is not None and np.array_equal(y, y_pt),
          "%s: strided and offset views: the same embeddings as model.pt, bit for bit %s" % (net, err))
    # ---- parameters as nn.Parameter (state_dict(keep_vars=True)): torch._utils._rebuild_parameter ----
    kv = collections.OrderedDict((k, nn.Parameter(v, requires_grad=not k.startswith("features."))
                                  if v.is_floating_point() else v) for k, v in sd.items())
    torch.save(kv, vpt)
    y, err = pfcps_forward(net, D, vpt, x)
    check(y is not None and np.array_equal(y, y_pt),
          "%s: a state_dict of nn.Parameter: the same embeddings as model.pt, bit for bit %s" % (net, err))

# ---- refusals (r18_w8's state_dict, sd from the loop's first network) ----
net, D = "r18_w8", 32
model = backbone(net, D)
sd = collections.OrderedDict((k, v.clone()) for k, v in model.state_dict().items())
bad = os.path.join(tmp, "bad.pt")
marker = os.path.join(tmp, "pwned")


class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + marker,))


e = collections.OrderedDict(sd)
e["evil"] = Evil()
torch.save(e, bad)
refused(net, D, bad, "pickle GLOBAL 'posix system' at offset", "a pickle calling os.system")
check(not os.path.exists(marker), "os.system never ran (no %s)" % marker)

for what, edit, want in [
        ("conv1.weight as float64", lambda s: s.__setitem__("conv1.weight", s["conv1.weight"].double()),
         "tensor 'conv1.weight' is F64, expected F32"),
        ("a NaN in fc.weight", lambda s: s["fc.weight"].view(-1).__setitem__(5, float("nan")),
         "tensor 'fc.weight' element 5 is NaN"),
        ("bn2.running_var missing", lambda s: s.pop("bn2.running_var"),
         "tensor 'bn2.running_var' missing (network r18_w8, D 32)"),
        ("an extra tensor", lambda s: s.__setitem__("head.weight", torch.zeros(3)),
         "tensor 'head.weight' is not part of network r18_w8")]:
    s = collections.OrderedDict((k, v.clone()) for k, v in sd.items())
    edit(s)
    torch.save(s, bad)
    refused(net, D, bad, want, what)
torch.save(model.half().state_dict(), bad)
refused(net, D, bad, "is F16, expected F32", "a float16 state_dict")

good = os.path.join(tmp, "good.pt")
torch.save(sd, good)
with zipfile.ZipFile(good) as z:
    names = z.namelist()
    folder = names[0].split("/")[0]
    storage = "%s/data/0" % folder
    short = z.read(storage)[:-4]
save_zip_with(good, bad, storage, short)
refused(net, D, bad, "%s holds %d bytes, the pickle declares" % (storage, len(short)), "a storage entry cut short")
data = open(good, "rb").read()
open(bad, "wb").write(data[:len(data) // 2])
refused(net, D, bad, "not a readable zip archive", "model.pt cut in half")
torch.save(sd, bad, _use_new_zipfile_serialization=False)
refused(net, D, bad, "a legacy torch.save file", "a legacy torch.save file")
torch.jit.trace(backbone(net, D).eval(), torch.zeros(1, 3, 112, 112)).save(bad)
refused(net, D, bad, "a TorchScript archive (torch.jit.save)", "a TorchScript archive")

shutil.rmtree(tmp)
print("%d failure(s)" % fails)
sys.exit(1 if fails else 0)
