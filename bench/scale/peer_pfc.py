#!/usr/bin/env python3
"""The PyTorch peer of bench/scale: one process training a Partial FC head with PartialFC_V2's semantics.

Written from the facts of arcface_torch's PartialFC_V2 + CombinedMarginLoss + SGD (not copied):
  - the whole class-center table is ONE parameter, C x D, initialised N(0, 0.01^2);
  - each step samples the positives of the batch plus uniform negatives up to num_sample rows (PartialFC_V2:
    a uniform random key per class, 2.0 for the positives, the num_sample largest keys, sorted), remaps the
    labels to columns, and takes weight[index] (an indexing op: its backward writes a dense C x D gradient);
  - logits = normalize(emb) . normalize(w_sampled)^T, clamped to [-1, 1]; ArcFace margin on the target
    (m1 = 1, m2 = 0.5, m3 = 0): cos(acos(t) + m2), applied without gradient (straight-through, as
    CombinedMarginLoss does under torch.no_grad), times s = 64;
  - cross entropy of the softmax with p_target floored at 1e-30 (DistCrossEntropy), mean over the batch;
  - torch.optim.SGD(momentum 0.9, weight_decay) over the whole table: weight decay and momentum touch every
    one of the C x D entries every step, as in arcface_torch where the table is an optimizer parameter;
    optimizer.zero_grad() with the installed torch's default.
The embeddings are a leaf tensor with requires_grad (the backbone's input to the head); their gradient is
computed as a backbone would need it.

Prints one line `RESULT fits=1 C=... steady_ms=... warmup_ms=... steady_cpu_ms=... rss=... first_loss=... last_loss=...`
(steady_cpu_ms: the process's CPU time, user + system, per step: the median of the steady steps), or
`RESULT fits=0 need=... avail=...` when the table and its optimizer state would not fit in memory (checked
before allocating: weight + gradient + momentum + the temporaries of SGD's weight decay and of the index
backward; measured peak 4.3 tables at 1M-2M identities: 4.5 tables plus 1 GiB).
"""
import argparse
import math
import os
import resource
import sys
import time


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", type=int, required=True)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--batch", type=int, default=128)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--sample-rate", type=float)
    g.add_argument("--sampled", type=int, help="num_sample: rows sampled per step")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steady", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--mem-cap-gib", type=float, default=20.0,
                    help="refuse (fits=0) above this many GiB even if MemAvailable is larger")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    C, D, B = a.classes, a.dim, a.batch
    num_sample = a.sampled if a.sampled is not None else int(a.sample_rate * C)  # PartialFC_V2: int(r * C)
    num_sample = max(1, min(num_sample, C))
    table = C * D * 4
    need = int(4.5 * table) + (1 << 30)
    avail = min(mem_available() - (1 << 30), int(a.mem_cap_gib * (1 << 30)))
    if need > avail:
        print(f"RESULT fits=0 C={C} D={D} need={need} avail={avail}", flush=True)
        return 0

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    weight = torch.nn.Parameter(torch.normal(0.0, 0.01, (C, D)))
    opt = torch.optim.SGD([weight], lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
    s, m2 = 64.0, 0.5
    floor = -math.log(1e-30)
    rows = torch.arange(B)
    times, cpus, losses = [], [], []

    def cpu_now():
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    for step in range(a.steps):
        labels = torch.randint(0, C, (B,))
        emb = (torch.rand(B, D) * 2 - 1).requires_grad_()
        t0, c0 = time.perf_counter(), cpu_now()
        # PartialFC_V2's sample: positives first (key 2.0), then the largest uniform keys; sorted.
        with torch.no_grad():
            positive = torch.unique(labels, sorted=True)
            if num_sample - positive.numel() >= 0:
                perm = torch.rand(C)
                perm[positive] = 2.0
                index = torch.topk(perm, k=num_sample)[1]
                index = index.sort()[0]
            else:
                index = positive
            local = torch.searchsorted(index, labels)
        w = weight[index]
        logits = F.linear(F.normalize(emb), F.normalize(w)).clamp(-1, 1)
        with torch.no_grad():  # CombinedMarginLoss, ArcFace branch: straight-through margin
            t = logits[rows, local]
            logits[rows, local] = torch.cos(torch.acos(t) + m2)
        z = logits * s
        logp = F.log_softmax(z, dim=1)
        loss = (-logp[rows, local]).clamp(max=floor).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
        cpus.append(cpu_now() - c0)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            print(f"peer: loss {losses[-1]} at step {step}", file=sys.stderr)
            return 1

    def median(v):
        v = sorted(v)
        n = len(v)
        return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"RESULT fits=1 C={C} D={D} B={B} k={num_sample} steps={a.steps} "
          f"warmup_ms={1e3 * median(times[:a.warmup]):.1f} steady_ms={1e3 * median(times[-a.steady:]):.1f} "
          f"steady_cpu_ms={1e3 * median(cpus[-a.steady:]):.1f} rss={rss} first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f} torch={torch.__version__} "
          f"threads={a.threads}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
