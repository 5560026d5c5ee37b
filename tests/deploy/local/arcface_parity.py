"""An independent PyTorch re-implementation of arcface_torch's training step (train_v2.py with PartialFC_V2,
CombinedMarginLoss, PolynomialLRWarmup, SGD over the backbone and the class centers), written from
arcface_torch's documented behaviour (docs/arcface_parity.md, section "The training step of train_v2.py"),
run side by side with pfcps on real face images (data/orl).

    arcface_parity.py prepare OUT ORL CLASSES D NETWORK SEED
        OUT/train.rec, OUT/train.idx: an im2rec-style RecordIO pack (no header record; keys 0..N-1) of the
            first CLASSES ORL identities (up to 10 images each), every image padded to 112x112 RGB and stored as PNG
            (lossless: pfcps's loader and this script see the same pixels); labels 0..CLASSES-1
        OUT/model.pt: the initial backbone, arcface_torch's IResNet (tests/tools/arcface_nets.py) with its
            initialisation (convolutions N(0, 0.1), BatchNorm (1, 0), PReLU 0.25), torch.save(state_dict)
        OUT/centers.safetensors: the initial class centers, `weight` (CLASSES x D, N(0, 0.01), as PartialFC_V2)
    arcface_parity.py train OUT RESULT --trace T0 [T1 ...] --network N --dim D --lr LR --warmup-epoch E
                      --num-epoch E --margin-grad exact|straight_through --update dense|sparse
                      [--threads K] [--double]
        trains from OUT's initial state for as many steps as the traces have lines, worker rank r's batch of
        each step taken from trace Tr (the .idx keys and flips pfcps's loader drew: pfcps-worker --trace-batch)
        and the step's class-center columns from the union of every trace's sampled ids (PartialFC_V2 samples
        with torch.rand; feeding pfcps's ids makes the same columns take part). Writes RESULT (torch.save):
        losses, lrs, the backbone state_dict (rank 0's BatchNorm statistics) and the class centers.
    arcface_parity.py module OUT RESULT --run RUN_INI --trace T0 --snapshots DIR ...: the same step with
        pfcps.torch.PartialFC (python/) as the Partial FC, one torch rank, against the servers of RUN_INI
        (module_train below).
    arcface_parity.py compare NAME RUN REF64 REF32 ...: see compare() below (RUN: a pfcps run's folder or a
        RESULT file).

The step, as train_v2.py runs it with W ranks of B images (global step g, 1-based):
  every rank: embeddings = backbone(its images) (train mode; each rank's BatchNorm uses its own batch and keeps
      its own running statistics, DDP broadcast_buffers=False);
  PartialFC_V2: the embeddings of all ranks gathered; logits = normalize(e) . normalize(W[ids])^T clamped to
      [-1, 1]; CombinedMarginLoss (m1 = 1, m3 = 0): the target logit becomes cos(acos(c) + m2) -- under
      torch.no_grad() in arcface_torch (gradient straight through, `straight_through`), or differentiated
      (`exact`, pfcps's option); times s = 64; loss = DistCrossEntropyFunc's: -mean over the W*B rows of log(clamp_min(p_target, 1e-30));
  backward: the gradient of that global mean loss (AllGatherFunc's reduce and DDP's average together), DDP's
      average under train_v2.py's fp16_compress_hook (--grad-comm fp16, the default: each rank's gradient
      rounded to fp16, divided by W and summed in fp16; ddp_fp16_grads) or in the float type (--grad-comm fp32);
  clip_grad_norm_(backbone.parameters(), 5) (the class centers are not clipped);
  SGD([backbone, centers], lr, momentum 0.9, weight_decay 5e-4): with `dense` the whole C x D table is the
      parameter, so every row moves every step (PartialFC_V2); with `sparse` only the rows of ids are updated
      (Partial FC v1; torch SGD's formula applied to those rows); --optimizer adamw (dense only):
      AdamW([backbone, centers], lr, weight_decay 5e-4) with torch's default betas and eps instead;
  the lr of step g: PolynomialLRWarmup (power 1) after g - 1 scheduler steps, warmup w = num_image // (W*B) *
      warmup_epoch, total t = num_image // (W*B) * num_epoch.
Every computation is torch's own (float32, or float64 with --double); nothing is taken from pfcps except the
batch composition and the sampled ids (traced)."""
import argparse
import copy
import io
import json
import os
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REC_MAGIC = 0xCED7230A
IMG = 112
MOMENTUM, WEIGHT_DECAY, M2, CLIP = 0.9, 5e-4, 0.5, 5.0
SCALE = 64.0  # train --scale sets it


def need_modules():
    try:
        import numpy  # noqa: F401
        import PIL  # noqa: F401
        import safetensors  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIP: %s lacks the module %s (tests/pyenv.sh installs it)" % (sys.executable, e.name))
        sys.exit(77)


def net_module():
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
    import arcface_nets
    return arcface_nets


# ---------------------------------------------------------------------------------------------------- prepare
def face_png(path):
    """An ORL PGM (92x112 grey) centred on a black 112x112 RGB canvas, as PNG bytes; and the RGB array."""
    import numpy as np
    from PIL import Image
    grey = np.asarray(Image.open(path).convert("L"))
    h, w = grey.shape
    assert h <= IMG and w <= IMG, path
    canvas = np.zeros((IMG, IMG, 3), np.uint8)
    y0, x0 = (IMG - h) // 2, (IMG - w) // 2
    canvas[y0:y0 + h, x0:x0 + w, :] = grey[:, :, None]
    buf = io.BytesIO()
    Image.fromarray(canvas, "RGB").save(buf, "PNG")
    return buf.getvalue()


def write_rec(prefix, records):
    """records: [(label, image bytes)] -> prefix.rec / prefix.idx, MXNet RecordIO (one chunk per record)."""
    with open(prefix + ".rec", "wb") as rec, open(prefix + ".idx", "w") as idx:
        for key, (label, img) in enumerate(records):
            payload = struct.pack("<IfQQ", 0, float(label), key, 0) + img
            for off in range(0, len(payload) - 3, 4):  # a magic word at an aligned offset would need chunks
                assert struct.unpack_from("<I", payload, off)[0] != REC_MAGIC, "magic inside a record"
            idx.write("%d\t%d\n" % (key, rec.tell()))
            rec.write(struct.pack("<II", REC_MAGIC, len(payload)) + payload)
            rec.write(b"\0" * (-len(payload) % 4))


def prepare(a):
    import torch
    from safetensors.torch import save_file
    records = []
    for c in range(a.classes):
        folder = os.path.join(a.orl, "s%d" % (c + 1))
        for f in sorted(os.listdir(folder), key=lambda n: (len(n), n)):
            if f.endswith(".pgm"):
                records.append((c, face_png(os.path.join(folder, f))))
    write_rec(os.path.join(a.out, "train"), records)
    torch.manual_seed(a.seed)
    net = net_module().backbone(a.network, a.dim)
    for m in net.modules():  # arcface_torch iresnet.py's initialisation
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.normal_(m.weight, 0, 0.1)
    torch.save(net.state_dict(), os.path.join(a.out, "model.pt"))
    weight = torch.normal(0, a.center_std, (a.classes, a.dim))
    save_file({"weight": weight.contiguous()}, os.path.join(a.out, "centers.safetensors"))
    print("prepared %d images of %d classes, %s D=%d in %s" % (len(records), a.classes, a.network, a.dim, a.out))


# ------------------------------------------------------------------------------------------------------ train
def read_rec(prefix):
    """{key: (label, RGB uint8 array)} of an im2rec pack written by write_rec (read back independently)."""
    import numpy as np
    from PIL import Image
    out = {}
    raw = open(prefix + ".rec", "rb").read()
    for line in open(prefix + ".idx"):
        key, off = map(int, line.split())
        magic, lrec = struct.unpack_from("<II", raw, off)
        assert magic == REC_MAGIC and lrec >> 29 == 0
        flag, label, _, _ = struct.unpack_from("<IfQQ", raw, off + 8)
        img = raw[off + 8 + 24:off + 8 + (lrec & ((1 << 29) - 1))]
        out[key] = (int(label), np.asarray(Image.open(io.BytesIO(img)).convert("RGB")))
    return out


def read_trace(path):
    """[(step, loss, lr, keys, flips, centers)] of a pfcps-worker --trace --trace-batch file."""
    rows = []
    for line in open(path):
        f = line.split()
        kv = dict(x.split("=", 1) for x in f[3:])
        ids = [int(v) for v in kv["centers"].split(",")] if kv.get("centers") else []
        rows.append((int(f[0]), float(f[1]), float(f[2]), [int(v) for v in kv["keys"].split(",")],
                     [c == "1" for c in kv["flips"]], ids))
    return rows


class PolynomialLRWarmup:
    """arcface_torch lr_scheduler.py's PolynomialLRWarmup.get_lr (power 1), recursive as written there: the
    constructor's step leaves the base lr; l <= w: base * l / w; w < l <= t: lr * ((1 - (l - w) / (t - w)) /
    (1 - (l - 1 - w) / (t - w))); l > t: unchanged."""

    def __init__(self, base, warmup, total):
        self.base, self.w, self.t, self.l, self.lr = base, warmup, total, 0, base

    def step(self):
        self.l += 1
        l, w, t = self.l, self.w, self.t
        if l <= w:
            self.lr = self.base * l / w
        elif l <= t:
            self.lr = self.lr * ((1.0 - (l - w) / (t - w)) / (1.0 - (l - 1 - w) / (t - w)))


def batch_tensor(data, keys, flips, dtype):
    """(B, 3, 112, 112): torchvision's ToTensor then Normalize(0.5, 0.5) ((x / 255 - 0.5) / 0.5), mirrored
    where flipped (RandomHorizontalFlip's outcome, taken from the trace); and the labels."""
    import numpy as np
    import torch
    imgs, labels = [], []
    for k, f in zip(keys, flips):
        label, rgb = data[k]
        x = torch.from_numpy(np.array(rgb)).permute(2, 0, 1).to(torch.float32) / 255.0
        x = (x - 0.5) / 0.5
        imgs.append(torch.flip(x, dims=[2]) if f else x)
        labels.append(label)
    return torch.stack(imgs).to(dtype), torch.tensor(labels)


def margin_logits(cos, target_col, grad_mode):
    """CombinedMarginLoss (m1 = 1, m2 = M2, m3 = 0) then * s. cos: (N, K) clamped cosines; target_col: (N,)
    column of each row's class. straight_through: the margin under no_grad (arcface_torch); exact: the
    target's cos(acos(c) + m2) differentiated, acos's argument clamped to [-1 + 1e-7, 1 - 1e-7]."""
    import torch
    rows = torch.arange(cos.shape[0])
    if grad_mode == "straight_through":
        logits = cos.clone()
        with torch.no_grad():
            t = logits[rows, target_col]
            logits[rows, target_col] = torch.cos(torch.acos(t) + M2)
        return logits * SCALE
    c = cos[rows, target_col].clamp(-1 + 1e-7, 1 - 1e-7)
    onehot = torch.zeros_like(cos)
    onehot[rows, target_col] = 1.0
    tgt = torch.cos(torch.acos(c) + M2)
    return (cos + onehot * (tgt - cos[rows, target_col]).unsqueeze(1)) * SCALE


def fp16_compress(grads, W):
    """torch DDP's fp16_compress_hook (torch.distributed.algorithms.ddp_comm_hooks.default_hooks) over the W
    ranks' gradients of one parameter: each cast to float16 and div_(W) in float16, all_reduce (sum) in float16
    (each addition rounded to float16; the ranks in order 0..W-1, gloo's order for W <= 2), back to the
    parameter's dtype."""
    import torch
    acc = None
    for g in grads:
        h = g.to(torch.float16).div_(W)
        acc = h if acc is None else acc + h
    return acc.to(grads[0].dtype)


def ddp_fp16_grads(loss, embs, params, W):
    """backward of the global mean loss as W DDP ranks under fp16_compress_hook: rank r's backbone gradient is
    its own backward from W x dL/d(its embeddings) (AllGatherFunc's backward) added to the parameter's .grad
    (the same on every rank: the sum of earlier micro-batches under gradient_acc, else none), and the
    parameters' .grad the hook's mean of the W (fp16_compress; DDP without no_sync communicates that running
    sum at every backward); every other leaf (the class centers) accumulates its plain gradient."""
    import torch
    trainable = [p for p in params if p.requires_grad]
    prev = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in trainable]
    d_embs = torch.autograd.grad(loss, embs, retain_graph=True)
    per_rank = [torch.autograd.grad(e, trainable, grad_outputs=d * W, retain_graph=True, allow_unused=True)
                for e, d in zip(embs, d_embs)]
    loss.backward()  # the class centers' gradient (and a backbone gradient replaced below)
    for i, p in enumerate(trainable):
        gs = [prev[i] + g[i] if g[i] is not None else prev[i] for g in per_rank]
        p.grad = fp16_compress(gs, W)


def share_parameters(dst, src):
    """dst (a deep copy of src) with src's Parameter objects: one set of weights, dst's own buffers (a DDP rank's
    BatchNorm running statistics, which broadcast_buffers=False keeps per rank)."""
    for (_, md), (_, ms) in zip(dst.named_modules(), src.named_modules()):
        for k in list(md._parameters):
            md._parameters[k] = ms._parameters[k]
    return dst


def dist_cross_entropy():
    """PartialFC_V2's DistCrossEntropyFunc on one process: forward p = exp(z - max) / sum (in the logits'
    dtype), loss = -mean(log(clamp_min(p_target, 1e-30))); backward (p - onehot) / N, without the clamp."""
    import torch

    class DistCrossEntropyFunc(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, label):
            z = logits - logits.max(dim=1, keepdim=True)[0]
            p = z.exp()
            p = p / p.sum(dim=1, keepdim=True)
            rows = torch.arange(logits.shape[0])
            ctx.save_for_backward(p, label)
            return -p[rows, label].clamp_min(1e-30).log().mean()

        @staticmethod
        def backward(ctx, g):
            p, label = ctx.saved_tensors
            grad = p.clone()
            grad[torch.arange(p.shape[0]), label] -= 1.0
            return grad * (g / p.shape[0]), None

    return DistCrossEntropyFunc


def class_ranges(C, W):
    """PartialFC_V2's split of C classes over W ranks: rank r owns [start, start + n), n = C // W + (r < C % W),
    start = C // W * r + min(r, C % W)."""
    return [(C // W * r + min(r, C % W), C // W + (r < C % W)) for r in range(W)]


def save_checkpoints(folder, nets, weight, mom_rows, opt, sched, global_step, epoch):
    """arcface_torch's save_all_states files after `global_step` steps: checkpoint_gpu_<r>.pt per rank as
    train_v2.py writes them (epoch, global_step, state_dict_backbone with rank r's BatchNorm statistics,
    state_dict_softmax_fc with the rank's contiguous rows, state_optimizer: SGD's state_dict, group 0 the
    backbone's parameters, group 1 the rank's weight, state_lr_scheduler), every tensor float32; plus model.pt
    (rank 0's backbone) and centers.safetensors (the whole table) as compare --init's starting point."""
    import torch
    from safetensors.torch import save_file
    f32 = lambda sd: {k: (v.detach().float().clone() if v.is_floating_point() else v.clone()) for k, v in sd.items()}
    osd = opt.state_dict()
    nb = len(osd["param_groups"][0]["params"])
    W = len(nets)
    for r, (start, n) in enumerate(class_ranges(weight.shape[0], W)):
        st = {i: {"momentum_buffer": v["momentum_buffer"].float().clone()} for i, v in osd["state"].items()
              if i < nb}
        st[nb] = {"momentum_buffer": mom_rows[start:start + n].float().clone()}
        groups = [dict(osd["param_groups"][0])]
        g1 = dict(osd["param_groups"][0])
        g1["params"] = [nb]
        groups.append(g1)
        torch.save({"epoch": epoch, "global_step": global_step,
                    "state_dict_backbone": f32(nets[r].state_dict()),
                    "state_dict_softmax_fc": {"weight": weight.detach()[start:start + n].float().clone()},
                    "state_optimizer": {"state": st, "param_groups": groups},
                    "state_lr_scheduler": {"last_epoch": sched.l, "_last_lr": [sched.lr, sched.lr],
                                           "base_lrs": [sched.base, sched.base], "warmup_iters": sched.w,
                                           "total_iters": sched.t, "power": 1.0}},
                   os.path.join(folder, "checkpoint_gpu_%d.pt" % r))
    torch.save(f32(nets[0].state_dict()), os.path.join(folder, "model.pt"))
    save_file({"weight": weight.detach().float().contiguous()}, os.path.join(folder, "centers.safetensors"))


def load_checkpoints(folder, nets, weight, mom_rows, opt, sched, dtype):
    """The reverse of save_checkpoints, as arcface_torch resumes: each rank's backbone (rank r's file for rank
    r's statistics), the rows and their momentum from every rank's file, the backbone's momentum from rank 0's
    state_optimizer, the lr and step of the schedule. Returns global_step."""
    import torch
    cks = [torch.load(os.path.join(folder, "checkpoint_gpu_%d.pt" % r)) for r in range(len(nets))]
    with torch.no_grad():
        for r, ck in enumerate(cks):
            nets[r].load_state_dict({k: v.to(dtype) if v.is_floating_point() else v
                                     for k, v in ck["state_dict_backbone"].items()})
        for (start, n), ck in zip(class_ranges(weight.shape[0], len(nets)), cks):
            nb = ck["state_optimizer"]["param_groups"][1]["params"][0]
            weight.data[start:start + n] = ck["state_dict_softmax_fc"]["weight"].to(dtype)
            mom_rows[start:start + n] = ck["state_optimizer"]["state"][nb]["momentum_buffer"].to(dtype)
    st0 = cks[0]["state_optimizer"]
    params = list(nets[0].parameters())
    for j, i in enumerate(st0["param_groups"][0]["params"]):
        if i in st0["state"]:
            opt.state[params[j]]["momentum_buffer"] = st0["state"][i]["momentum_buffer"].to(dtype).clone()
    sched.l = cks[0]["state_lr_scheduler"]["last_epoch"]
    sched.lr = st0["param_groups"][0]["lr"]
    return cks[0]["global_step"]


def train(a):
    import torch
    from safetensors.torch import load_file
    global SCALE
    SCALE = a.scale
    torch.set_num_threads(a.threads)
    if a.no_mkldnn:  # another float32 implementation of the convolutions: torch's native kernels
        torch.backends.mkldnn.enabled = False
    DistCrossEntropy = dist_cross_entropy()
    dtype = torch.float64 if a.double else torch.float32
    traces = [read_trace(p) for p in a.trace]
    W, steps = len(traces), len(traces[0])
    assert all(len(t) == steps for t in traces), "traces of different lengths"
    data = read_rec(os.path.join(a.out, "train"))
    B = len(traces[0][0][3])
    net = net_module().backbone(a.network, a.dim)
    net.load_state_dict(torch.load(os.path.join(a.out, "model.pt")))
    net = net.to(dtype).train()
    weight = torch.nn.Parameter(load_file(os.path.join(a.out, "centers.safetensors"))["weight"].to(dtype))
    C = weight.shape[0]
    params = list(net.parameters())  # train_v2.py's group 0 (features.weight has no gradient: no state)
    groups = [{"params": params}] + ([{"params": [weight]}] if a.update == "dense" else [])
    assert a.optimizer == "sgd" or (a.update == "dense" and not a.resume and not a.save_at), \
        "--optimizer adamw is written for the dense update, from the initial state"
    if a.optimizer == "adamw" and a.centers_sgd:
        # the negative control: AdamW for the backbone, SGD for the centers (what pfcps did before the servers
        # had AdamW)
        opt = torch.optim.AdamW(groups[:1], lr=a.lr, weight_decay=WEIGHT_DECAY)
        opts = [opt, torch.optim.SGD(groups[1:], lr=a.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)]
    elif a.optimizer == "adamw":
        # train_v2.py: torch.optim.AdamW(params=[backbone, module_partial_fc], lr, weight_decay) (betas
        # (0.9, 0.999), eps 1e-8); PartialFC_V2's whole table is one parameter: every row moves every step
        opt = torch.optim.AdamW(groups, lr=a.lr, weight_decay=WEIGHT_DECAY)
        opts = [opt]
    else:
        opt = torch.optim.SGD(groups, lr=a.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        opts = [opt]
    mom = torch.zeros_like(weight.data)  # sparse: the rows' momentum, touched only where sampled
    per_epoch = len(data) // (W * B)
    sched = PolynomialLRWarmup(a.lr, per_epoch * a.warmup_epoch, per_epoch * a.num_epoch)
    nets = [net] + [share_parameters(copy.deepcopy(net), net) for _ in range(1, W)]  # rank r's BN statistics
    first = 0
    if a.resume:
        if a.update == "dense":
            opt.state[weight]["momentum_buffer"] = torch.zeros_like(weight.data)
            mom = opt.state[weight]["momentum_buffer"]
        first = load_checkpoints(a.resume, nets, weight, mom, opt, sched, dtype)
        assert traces[0][0][0] == first + 1, "the traces start at step %d, the checkpoint at %d" % (
            traces[0][0][0], first)
    losses, lrs = [], []
    acc = a.gradient_acc
    assert acc == 1 or a.update == "dense", "gradient_acc > 1 is written for the dense update only"
    for g in range(steps):
        lr = sched.lr
        for grp in [g for o in opts for g in o.param_groups]:
            grp["lr"] = lr
        ids = sorted(set(i for t in traces for i in t[g][5]))
        assert all(0 <= i < C for i in ids)
        window_start, window_end = (first + g) % acc == 0, (first + g + 1) % acc == 0
        if window_start:  # train_v2.py: zero_grad after each optimizer step
            for o in opts:
                o.zero_grad()
            weight.grad = None
        embs, labels = [], []
        for r in range(W):
            x, y = batch_tensor(data, traces[r][g][3], traces[r][g][4], dtype)
            embs.append(nets[r](x))
            labels.append(y)
        emb, label = torch.cat(embs), torch.cat(labels)
        col = {c: j for j, c in enumerate(ids)}
        target = torch.tensor([col[int(c)] for c in label])  # every positive is sampled
        sub = weight[torch.tensor(ids, dtype=torch.long)]
        cos = torch.nn.functional.linear(torch.nn.functional.normalize(emb),
                                         torch.nn.functional.normalize(sub)).clamp(-1, 1)
        loss = DistCrossEntropy.apply(margin_logits(cos, target, a.margin_grad), target)
        if a.grad_comm == "fp16":
            ddp_fp16_grads(loss, embs, params, W)
        else:
            loss.backward()
        if window_end:  # train_v2.py: `if global_step % cfg.gradient_acc == 0:` clip and step
            torch.nn.utils.clip_grad_norm_(params, CLIP)
            for o in opts:
                o.step()
        if a.update == "sparse":
            with torch.no_grad():
                idx = torch.tensor(ids, dtype=torch.long)
                w, gr = weight.data[idx], weight.grad[idx]
                m = MOMENTUM * mom[idx] + (gr + WEIGHT_DECAY * w)
                mom[idx] = m
                weight.data[idx] = w - lr * m
        sched.step()
        for grp in [g for o in opts for g in o.param_groups]:  # the scheduler writes the next step's lr
            grp["lr"] = sched.lr
        losses.append(float(loss))
        lrs.append(lr)
        if a.save_at and first + g + 1 == a.save_at:
            rows = opt.state[weight]["momentum_buffer"] if a.update == "dense" else mom
            save_checkpoints(a.save_dir, nets, weight, rows, opt, sched, a.save_at, a.save_at // per_epoch)
            break
    torch.save({"losses": losses, "lrs": lrs, "backbone": {k: v.detach().double() for k, v in
                                                          net.state_dict().items()},  # rank 0's
                "centers": weight.detach().double()}, a.result)
    print("reference: steps %d..%d, W=%d, B=%d, %s, %s, threads %d, %s: loss %.6f -> %.6f" %
          (first + 1, first + len(losses), W, B, a.margin_grad, a.update, a.threads,
           "float64" if a.double else "float32", losses[0], losses[-1]))


def module_train(a):
    """The same arcface_torch step with pfcps.torch.PartialFC in place of the reference's Partial FC (the C
    worker's sampler, pull/push and head through pfcps._C; the class centers on the servers of a.run), one torch
    rank, float32: torch's backbone from OUT/model.pt, SGD (--optimizer adamw: AdamW) over the backbone and the
    module's parameter group,
    the same schedule, clipping and batches (trace). Writes RESULT as train() does; the class centers are the
    servers' checkpoint of the last step, which the module's state_dict() asks for (read from --snapshots by
    ckpt_table.py, its own reader of the shard files)."""
    import torch
    import pfcps.torch
    torch.set_num_threads(a.threads)
    tr = read_trace(a.trace[0])
    data = read_rec(os.path.join(a.out, "train"))
    B = len(tr[0][3])
    net = net_module().backbone(a.network, a.dim)
    net.load_state_dict(torch.load(os.path.join(a.out, "model.pt")))
    net.train()

    class Margin:  # CombinedMarginLoss's attributes, ArcFace
        s, m1, m2, m3, interclass_filtering_threshold = SCALE, 1.0, M2, 0.0, 0.0

    module = pfcps.torch.PartialFC(Margin(), a.dim, a.classes, 1.0, False, run=a.run)
    params = list(net.parameters())
    groups = [{"params": params}, {"params": module.parameters()}]
    if a.optimizer == "adamw":  # the module's group too: the servers apply AdamW (the run's optimizer)
        opt = torch.optim.AdamW(groups, lr=a.lr, weight_decay=WEIGHT_DECAY)
    else:
        opt = torch.optim.SGD(groups, lr=a.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    per_epoch = len(data) // B
    sched = PolynomialLRWarmup(a.lr, per_epoch * a.warmup_epoch, per_epoch * a.num_epoch)
    losses, lrs = [], []
    for g in range(len(tr)):
        for grp in opt.param_groups:
            grp["lr"] = sched.lr
        opt.zero_grad()
        x, y = batch_tensor(data, tr[g][3], tr[g][4], torch.float32)
        loss = module(net(x), y)
        loss.backward()
        if a.grad_comm == "fp16":  # one DDP rank under fp16_compress_hook, as arcface_torch on one GPU
            for p in params:
                if p.grad is not None:
                    p.grad = fp16_compress([p.grad], 1)
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        lrs.append(sched.lr)
        sched.step()
        losses.append(float(loss))
    module.state_dict()  # the servers' checkpoint of step len(tr): the class centers after the last step
    module.close()
    sys.path.insert(0, HERE)
    from ckpt_table import table
    rows = None
    for _ in range(600):  # the servers write it while serving: wait for both shard files
        try:
            rows, C, D = table(a.snapshots, len(tr))
            break
        except SystemExit:
            time.sleep(0.1)
    if rows is None:
        sys.exit(f"no complete checkpoint {len(tr)} under {a.snapshots}")
    centers = torch.tensor([struct.unpack("<%df" % D, rows[c][0]) for c in range(C)], dtype=torch.float64)
    torch.save({"losses": losses, "lrs": lrs, "backbone": {k: v.detach().double() for k, v in
                                                          net.state_dict().items()}, "centers": centers}, a.result)
    print("pfcps.torch.PartialFC: %d steps, B=%d: loss %.6f -> %.6f" % (len(losses), B, losses[0], losses[-1]))


# ---------------------------------------------------------------------------------------------------- compare
def pfcps_result(run_dir, names, dim):
    """pfcps's run: losses and lrs (trace of rank 0), the backbone (model.ckpt, read by tests/pfcps_ckpt.py from
    the layout's description) and the class centers (--dump-centers PREFIX.rank<r> files: u64 id, D float32)."""
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", ".."))
    import pfcps_ckpt
    tr = read_trace(os.path.join(run_dir, "trace0"))
    ck = pfcps_ckpt.read(os.path.join(run_dir, "out", "model.ckpt"))
    shapes = {n: s for n, s, _ in ck.tensors}
    backbone = {}
    for n in names:
        if n in shapes:
            backbone[n] = torch.tensor(ck.values(n), dtype=torch.float64)
    rows = {}
    r = 0
    while os.path.exists(os.path.join(run_dir, "centers.rank%d" % r)):
        b = open(os.path.join(run_dir, "centers.rank%d" % r), "rb").read()
        step = 8 + 4 * dim
        for i in range(0, len(b), step):
            (cid,) = struct.unpack_from("<Q", b, i)
            rows[cid] = struct.unpack_from("<%df" % dim, b, i + 8)
        r += 1
    centers = torch.tensor([rows[c] for c in range(len(rows))], dtype=torch.float64)
    return {"losses": [t[1] for t in tr], "lrs": [t[2] for t in tr], "backbone": backbone, "centers": centers}


def deviations(x, ref, init):
    """Largest relative deviations of run x from run ref, both started from init:
    loss: per step |a - b| / |b|, the largest; lr: the same for the lr;
    backbone: the trainable parameters as one vector, ||x - ref|| / ||ref - init|| (the part of the 30 steps'
        update that differs: the parameters themselves move little at small lr);
    bn_stats: every BatchNorm running mean and variance as one vector, ||x - ref|| / ||ref||;
    centers: each class center's ||x - ref|| / ||ref - init||, the largest over rows."""
    loss = max(abs(a - b) / abs(b) for a, b in zip(x["losses"], ref["losses"]))
    lr = max(abs(a - b) / abs(b) for a, b in zip(x["lrs"], ref["lrs"]))
    acc = {"p": [0.0, 0.0], "s": [0.0, 0.0]}
    for n, v in ref["backbone"].items():
        if n.endswith("num_batches_tracked"):
            continue
        a, b = x["backbone"][n].reshape(-1).double(), v.reshape(-1).double()
        if "running_" in n:
            acc["s"][0] += float(((a - b) ** 2).sum())
            acc["s"][1] += float((b ** 2).sum())
        else:
            acc["p"][0] += float(((a - b) ** 2).sum())
            acc["p"][1] += float(((b - init["backbone"][n].reshape(-1).double()) ** 2).sum())
    cen = 0.0  # a run whose centers are not at hand (the module's stay on its servers): not compared
    if x["centers"] is not None:
        cx, cr, c0 = x["centers"].double(), ref["centers"].double(), init["centers"].double()
        cen = float(((cx - cr).norm(dim=1) / (cr - c0).norm(dim=1)).max())
    return {"loss": loss, "lr": lr, "backbone": (acc["p"][0] / acc["p"][1]) ** 0.5,
            "bn_stats": (acc["s"][0] / acc["s"][1]) ** 0.5, "centers": cen}


MAX_SPREAD = 0.5


def initial_state(folder, like):
    """The runs' common initial state (prepare's model.pt and centers.safetensors) in deviations()'s layout."""
    import torch
    from safetensors.torch import load_file
    bb = {n: v.double() for n, v in torch.load(os.path.join(folder, "model.pt")).items()}
    return {"losses": like["losses"], "lrs": like["lrs"], "backbone": bb,
            "centers": load_file(os.path.join(folder, "centers.safetensors"))["weight"].double()}


def compare(a):
    """pfcps's run (RUN) against the float64 reference (REF64: arcface_torch's step computed exactly enough to
    be the target), with tolerance from the reference itself: REF32 .. are the same reference run as
    arcface_torch runs, in float32 (with 1 and 2 threads, and with torch's native convolutions); the largest
    deviation of those from REF64 is what float32 arithmetic alone costs over these steps. pfcps's deviation in each measure must be at most FACTOR
    times that (or FLOOR)."""
    import torch
    ref = torch.load(a.refs[0])
    names = [n for n in ref["backbone"] if not n.endswith("num_batches_tracked")]
    x = torch.load(a.run) if a.run.endswith(".pt") else pfcps_result(a.run, names, ref["centers"].shape[1])
    missing = [n for n in names if n not in x["backbone"]]
    if missing:
        print("FAIL: model.ckpt lacks %s" % missing)
        return 1
    if len(x["losses"]) != len(ref["losses"]) or (x["centers"] is not None and
                                                   x["centers"].shape != ref["centers"].shape):
        print("FAIL: pfcps ran %d steps / %s centers, the reference %d / %s" %
              (len(x["losses"]), tuple(x["centers"].shape), len(ref["losses"]), tuple(ref["centers"].shape)))
        return 1
    init = initial_state(a.init, ref)
    keys = ("loss", "backbone", "bn_stats", "centers")
    spread = {k: 0.0 for k in keys}
    closest = {k: float("inf") for k in keys}
    for other in a.refs[1:]:
        d = deviations(torch.load(other), ref, init)
        for k in keys:
            spread[k] = max(spread[k], d[k])
            closest[k] = min(closest[k], d[k])
    dev = deviations(x, ref, init)
    ok = dev["lr"] <= 1e-6  # float32 lr through the push vs the reference's double
    lines = ["%s: lr max rel %.2e" % (a.name, dev["lr"])]
    for k in keys:
        if k == "centers" and x["centers"] is None:
            lines.append("  centers   not compared (this run's class centers stay on its servers)")
            continue
        tol = max(a.factor * spread[k], a.floor)
        good = dev[k] <= tol
        ok &= good
        lines.append("  %-9s pfcps vs float64 reference %.3e, torch float32 vs it %.3e (tolerance %.1e)%s" %
                     (k, dev[k], spread[k], tol, "" if good else "  <-- FAIL"))
    lines.append("  loss %.6f -> %.6f (reference %.6f -> %.6f)" %
                 (x["losses"][0], x["losses"][-1], ref["losses"][0], ref["losses"][-1]))
    # Not vacuous: a float32 reference must follow the float64 one closely (its update deviates by less than
    # MAX_SPREAD), or the run is chaotic and no tolerance derived from it would catch a wrong step. The closest
    # of the three float32 implementations counts: which one parts from the rest depends on the CPU's kernels
    # (under the fp16 gradient hook one rounding flip early on moves a whole trajectory: on an AMD Zen 4 host
    # one of them reached 0.55 of the backbone's update in w1_s1 while the others and pfcps stayed near 0.1).
    moved = all(closest[k] <= MAX_SPREAD for k in ("backbone", "centers"))
    lines.append("  closest torch float32 run vs float64: backbone %.3e, centers %.3e (chaotic above %g)"
                 % (closest["backbone"], closest["centers"], MAX_SPREAD))
    if not moved:
        lines.append("  every torch float32 run deviates from float64 by more than %g: chaotic run, nothing proven"
                     "  <-- FAIL" % MAX_SPREAD)
    print("\n".join(lines))
    with open(a.json, "a") as f:
        f.write(json.dumps({"name": a.name, "dev": dev, "spread": spread}) + "\n")
    return 0 if ok and moved else 1


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("prepare")
    q.add_argument("out")
    q.add_argument("orl")
    q.add_argument("classes", type=int)
    q.add_argument("dim", type=int)
    q.add_argument("network")
    q.add_argument("seed", type=int)
    q.add_argument("--center-std", type=float, default=0.01)
    q = sub.add_parser("train")
    q.add_argument("out")
    q.add_argument("result")
    q.add_argument("--trace", nargs="+", required=True)
    q.add_argument("--network", required=True)
    q.add_argument("--dim", type=int, required=True)
    q.add_argument("--lr", type=float, required=True)
    q.add_argument("--warmup-epoch", type=float, required=True)
    q.add_argument("--num-epoch", type=float, required=True)
    q.add_argument("--margin-grad", choices=("exact", "straight_through"), required=True)
    q.add_argument("--update", choices=("dense", "sparse"), required=True)
    q.add_argument("--grad-comm", choices=("fp16", "fp32"), default="fp16",
                   help="the backbone gradients' DDP communication (fp16: fp16_compress_hook, train_v2.py's)")
    q.add_argument("--gradient-acc", type=int, default=1,
                   help="train_v2.py's gradient_acc: an optimizer step every this many global steps")
    q.add_argument("--scale", type=float, default=64.0)
    q.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd",
                   help="train_v2.py's cfg.optimizer: torch.optim.SGD or torch.optim.AdamW over backbone and centers")
    q.add_argument("--centers-sgd", action="store_true",
                   help="with --optimizer adamw: SGD for the class centers (a negative control)")
    q.add_argument("--threads", type=int, default=1)
    q.add_argument("--double", action="store_true")
    q.add_argument("--no-mkldnn", action="store_true",
                   help="float32 convolutions by torch's native kernels instead of oneDNN's (another rounding)")
    q.add_argument("--save-at", type=int, default=0, help="after this global step write arcface_torch's files")
    q.add_argument("--save-dir", help="where --save-at writes them")
    q.add_argument("--resume", help="continue from the checkpoint_gpu_<r>.pt files in this folder")
    q = sub.add_parser("module")
    q.add_argument("out")
    q.add_argument("result")
    q.add_argument("--run", required=True, help="the pfcps run file the module joins")
    q.add_argument("--trace", nargs=1, required=True)
    q.add_argument("--network", required=True)
    q.add_argument("--dim", type=int, required=True)
    q.add_argument("--classes", type=int, required=True)
    q.add_argument("--grad-comm", choices=("fp16", "fp32"), default="fp16")
    q.add_argument("--lr", type=float, required=True)
    q.add_argument("--warmup-epoch", type=float, required=True)
    q.add_argument("--num-epoch", type=float, required=True)
    q.add_argument("--threads", type=int, default=1)
    q.add_argument("--snapshots", required=True, help="the run's checkpoint root (<output>/snapshots)")
    q.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd",
                   help="the torch optimizer over the backbone and the module (the run's optimizer)")
    q = sub.add_parser("compare")
    q.add_argument("name")
    q.add_argument("run")
    q.add_argument("refs", nargs="+")
    q.add_argument("--factor", type=float, default=3.0)
    q.add_argument("--floor", type=float, default=1e-6)
    q.add_argument("--json", required=True)
    q.add_argument("--init", required=True, help="the prepare folder (initial model.pt and centers)")
    a = p.parse_args()
    need_modules()
    if a.cmd == "prepare":
        prepare(a)
        return 0
    if a.cmd == "train":
        train(a)
        return 0
    if a.cmd == "module":
        module_train(a)
        return 0
    return compare(a)


if __name__ == "__main__":
    sys.exit(main())
