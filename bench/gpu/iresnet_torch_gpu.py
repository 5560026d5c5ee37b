"""The training step of bench/gpu/bench_gpu.c in PyTorch: iresnet (bench/backbone/iresnet_torch.py)
forward in training mode, ArcFace head over K class centers (F.normalize, cosine GEMM, margin
cos(acos(t) + 0.5) on the target, scale 64, cross-entropy, straight-through margin gradient as
arcface_torch), backward, SGD (momentum 0.9, weight decay 5e-4) on backbone and centers.
fp32 with TF32 off (as pfcps's CUDA device) unless --tf32; --amp runs the backbone under
torch.autocast(float16) with a GradScaler (arcface_torch's fp16 = True) for information.

Usage: iresnet_torch_gpu.py NETWORK BATCH ITERS K [--device cuda|cpu] [--tf32] [--amp]
Prints: torch ... samples/s X, peak GPU memory M GiB"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "backbone"))
from iresnet_torch import LAYERS, IResNet  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("network")
    ap.add_argument("batch", type=int)
    ap.add_argument("iters", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--amp", action="store_true")
    a = ap.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = a.tf32
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.manual_seed(0)
    model = IResNet(LAYERS[a.network]).to(dev).train()
    centers = torch.nn.Parameter(torch.empty(a.k, 512, device=dev).uniform_(-0.01, 0.01))
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad] + [centers], lr=0.1,
                          momentum=0.9, weight_decay=5e-4)
    scaler = torch.amp.GradScaler("cuda", growth_interval=100) if a.amp else None
    x = torch.rand(a.batch, 3, 112, 112, device=dev) * 2 - 1
    labels = torch.randint(0, a.k, (a.batch,), device=dev)
    s, m2 = 64.0, 0.5

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast(device_type=dev.type, dtype=torch.float16, enabled=a.amp):
            emb = model(x)
        emb = emb.float()
        cos = F.linear(F.normalize(emb), F.normalize(centers)).clamp(-1, 1)
        t = cos.gather(1, labels[:, None])
        with torch.no_grad():  # straight-through: the margin changes the value only
            delta = torch.cos(torch.acos(t.clamp(-1 + 1e-7, 1 - 1e-7)) + m2) - t
        logits = cos.scatter_add(1, labels[:, None], delta) * s
        loss = F.cross_entropy(logits, labels)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    for _ in range(2):  # warm-up: cudnn.benchmark search
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        loss = step()
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0
    mode = "amp-fp16" if a.amp else ("tf32" if a.tf32 else "fp32")
    print(f"torch {torch.__version__} {a.device} {mode} {a.network} batch {a.batch} K {a.k}: "
          f"loss {loss.item():.4f}, {a.iters} steps in {dt:.3f} s, samples/s {a.iters * a.batch / dt:.2f}, "
          f"peak GPU memory {peak:.2f} GiB")


if __name__ == "__main__":
    main()
