"""`pfcps export` checked by the readers it exports for.
Weights: make_ckpt's random checkpoint, exported to safetensors and loaded into PyTorch's arcface_torch backbone
(tests/tools/arcface_nets.py), whose batch-norm running statistics are then set in PyTorch to the statistics of a
batch of 16 inputs (train mode, cumulative average), as a trained network's are: activations stay O(1), so an
absolute 1e-4 bound means what it says (random statistics give outputs of 1e3 and float32 rounding alone above
1e-4). That state_dict, written by safetensors.torch.save_file, is read back by pfcps (model_load_pretrained)
and saved as a checkpoint, which is what the exports below start from.
  - safetensors: the `safetensors` package loads the file; load_state_dict(strict=True) takes it; a re-export
    equals PyTorch's own file tensor by tensor; PyTorch's eval output (float64) equals pfcps's own eval forward
    (tests/worker/model/export_forward.c: model_forward, train = 0, CPU device) to 1e-4, for r18_w16 and mbf;
    r50 (D 512) loads strictly (structure only);
  - ONNX: onnx.checker.check_model(full_check) passes; the input is `data` (N,3,112,112) with a symbolic N,
    the output `embedding` (N,D); onnxruntime's output equals pfcps's eval forward to 1e-4 for r18_w16 and mbf
    at batch 1 and 5 (opset 13), and for r18_w16 at opset 17; r50 passes the checker and runs.
Usage: test_export.py PFCPS MAKE_CKPT EXPORT_FORWARD. Exit 77 when a module is missing."""
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from torch import nn
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arcface_nets import backbone  # noqa: E402

PFCPS, MAKE_CKPT, FORWARD = sys.argv[1:4]
tmp = tempfile.mkdtemp(prefix="pfcps-export-")
fails = 0
TOL = 1e-4


def check(cond, msg):
    global fails
    print(("ok   " if cond else "FAIL ") + msg)
    fails += not cond


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit("%s: exit %d" % (" ".join(args), r.returncode))
    return r.stdout


def pfcps_forward(ckpt, x, *pretrained):
    xin, out = os.path.join(tmp, "x.npy"), os.path.join(tmp, "y.npy")
    np.save(xin, x)
    run(FORWARD, ckpt, xin, out, *pretrained)
    return np.load(out)


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


rng = np.random.default_rng(11)
for net, D, compare in [("r18_w16", 32, True), ("mbf", 64, True), ("r50", 512, False)]:
    ckpt = os.path.join(tmp, net + ".ckpt")
    st, ox = os.path.join(tmp, net + ".safetensors"), os.path.join(tmp, net + ".onnx")
    run(MAKE_CKPT, ckpt, net, str(D), "7")
    run(PFCPS, "export", "--format", "safetensors", ckpt, st)
    run(PFCPS, "export", "--format", "onnx", ckpt, ox)

    # ---- safetensors -> PyTorch ----
    sd = load_file(st)
    with safe_open(st, "pt") as f:
        meta = f.metadata()
    check(meta.get("network") == net and meta.get("embedding_size") == str(D) and meta.get("format") == "pt",
          "%s: metadata %s" % (net, meta))
    model = backbone(net, D)
    try:
        model.load_state_dict(sd, strict=True)
        check(True, "%s: load_state_dict(strict=True) of %d tensors" % (net, len(sd)))
    except RuntimeError as e:
        check(False, "%s: load_state_dict(strict=True): %s" % (net, e))
        continue
    check(all(sd[k].dtype == (torch.int64 if k.endswith("num_batches_tracked") else torch.float32) for k in sd),
          "%s: F32 tensors, I64 num_batches_tracked" % net)
    x5 = rng.uniform(-1, 1, (5, 3, 112, 112)).astype(np.float32)
    if compare:
        model = model.double()
        calibrate(model, torch.from_numpy(rng.uniform(-1, 1, (16, 3, 112, 112))))
        st_torch, ckpt2 = os.path.join(tmp, net + ".torch.safetensors"), os.path.join(tmp, net + ".2.ckpt")
        save_file({k: v.float() if v.is_floating_point() else v for k, v in model.state_dict().items()}, st_torch)
        # pfcps reads PyTorch's file (model_load_pretrained) and saves it as the checkpoint exported below
        ref = pfcps_forward(ckpt, x5, st_torch, ckpt2)
        ckpt = ckpt2
        run(PFCPS, "export", "--format", "safetensors", ckpt, st)
        run(PFCPS, "export", "--format", "onnx", ckpt, ox)
        sd2, sdt = load_file(st), load_file(st_torch)
        check(sorted(sd2) == sorted(sdt) and all(torch.equal(sd2[k], sdt[k]) or k.endswith("num_batches_tracked")
                                                  for k in sdt),
              "%s: PyTorch's save_file -> pfcps -> export: every tensor identical" % net)
        model = backbone(net, D)
        model.load_state_dict(sd2, strict=True)
        model = model.double().eval()
        with torch.no_grad():
            y = model(torch.from_numpy(x5).double()).numpy()
        d = float(np.abs(y - ref).max())
        check(d < TOL, "%s: PyTorch (float64, eval) vs pfcps eval forward, batch 5: max |diff| %.3g "
              "(|y| max %.3g)" % (net, d, float(np.abs(y).max())))

    # ---- ONNX ----
    mo = onnx.load(ox)
    try:
        onnx.checker.check_model(mo, full_check=True)
        check(True, "%s: onnx.checker.check_model(full_check=True), opset %d, IR %d"
              % (net, mo.opset_import[0].version, mo.ir_version))
    except onnx.checker.ValidationError as e:
        check(False, "%s: onnx checker: %s" % (net, e))
    gi, go = mo.graph.input[0], mo.graph.output[0]
    dims = [d.dim_param or d.dim_value for d in gi.type.tensor_type.shape.dim]
    odims = [d.dim_param or d.dim_value for d in go.type.tensor_type.shape.dim]
    check(gi.name == "data" and dims == ["N", 3, 112, 112] and go.name == "embedding" and odims == ["N", D],
          "%s: input %s %s, output %s %s" % (net, gi.name, dims, go.name, odims))
    ops = sorted({n.op_type for n in mo.graph.node})
    check("Dropout" not in ops, "%s: operators %s" % (net, ops))
    sess = ort.InferenceSession(ox, providers=["CPUExecutionProvider"])
    if compare:
        for B in (1, 5):
            xb = x5[:B]
            y = sess.run(None, {"data": xb})[0]
            ref = pfcps_forward(ckpt, xb)
            d = float(np.abs(y - ref).max())
            check(y.shape == (B, D) and d < TOL,
                  "%s: onnxruntime %s vs pfcps eval forward, batch %d: max |diff| %.3g"
                  % (net, ort.__version__, B, d))
    else:
        y = sess.run(None, {"data": x5[:1]})[0]
        check(y.shape == (1, D) and np.isfinite(y).all(), "%s: onnxruntime runs, output %s" % (net, y.shape))

# another opset
ckpt, ox = os.path.join(tmp, "r18_w16.2.ckpt"), os.path.join(tmp, "r18_w16_17.onnx")
run(PFCPS, "export", "--format", "onnx", "--opset", "17", ckpt, ox)
mo = onnx.load(ox)
onnx.checker.check_model(mo, full_check=True)
x = rng.uniform(-1, 1, (3, 3, 112, 112)).astype(np.float32)
y = ort.InferenceSession(ox, providers=["CPUExecutionProvider"]).run(None, {"data": x})[0]
d = float(np.abs(y - pfcps_forward(ckpt, x)).max())
check(mo.opset_import[0].version == 17 and mo.ir_version == 8 and d < TOL,
      "r18_w16 opset 17 (IR %d): checker passes, onnxruntime vs pfcps batch 3: max |diff| %.3g" % (mo.ir_version, d))

shutil.rmtree(tmp)
print("%d failure(s)" % fails)
sys.exit(1 if fails else 0)
