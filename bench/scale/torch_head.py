"""The head step of pfcps.torch.PartialFC (python/): what bench/scale/scale_worker measures for the C worker,
through the torch module, against the same running pfcps-server daemons:

    torch_head.py --run RUN.ini --steps N --warmup N --steady N [--wait-fill LOG,LOG,...]

Per step: `loss = module(embeddings, labels); loss.backward()` (sample, pull, CPU head forward + backward,
push, wait: the module's whole step), timed from the call to the end of backward, with the step's synthetic
batch (labels uniform in [0, C), embeddings uniform in [-1, 1), a leaf tensor that requires its gradient,
from torch.Generator seeded by the step) made before the clock starts. The lr comes from an SGD param group
holding the module's parameter, as in a training script. Prints `RESULT steady_ms=... warmup_ms=... k=...
first_loss=... last_loss=...`: medians of the first --warmup and the last --steady steps, and of the phases
(sample, pull, head, push: the extension's own clocks, as scale_worker's) over the last --steady, and the
process' CPU seconds per step (user + system, all threads; mean over the last --steady, as scale_worker's
worker_cpu_s_per_step).
--wait-fill: as scale_worker's, waits until every named server log says that every class center was
generated (center_init = eager) before step 0."""
import argparse
import configparser
import statistics
import sys
import time

import torch

import pfcps.torch


class Margin:
    """arcface_torch's CombinedMarginLoss attributes (ArcFace: s 64, m2 0.5), what the module reads."""
    s, m1, m2, m3, interclass_filtering_threshold = 64.0, 1.0, 0.5, 0.0, 0.0


def wait_fill(logs):
    t0 = time.time()
    for log in logs.split(","):
        while "every class center generated" not in open(log, errors="replace").read():
            if time.time() - t0 > 1800:
                sys.exit(f"{log} never said that every class center was generated")
            time.sleep(0.1)
    return time.time() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--run", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steady", type=int, default=10)
    p.add_argument("--wait-fill")
    a = p.parse_args()
    # The run's C, D, B and sample rate, read from its file (the module must be built with the run's values).
    cp = configparser.ConfigParser(strict=False)
    cp.read(a.run)
    get = lambda key: next(cp[s][key] for s in cp.sections() if key in cp[s])
    C, D, B = int(get("num_classes")), int(get("embedding_size")), int(get("batch_size"))
    rate = float(get("sample_rate"))
    module = pfcps.torch.PartialFC(Margin(), D, C, rate, run=a.run)
    opt = torch.optim.SGD([{"params": module.parameters()}], lr=float(get("lr")),
                          momentum=float(get("momentum")), weight_decay=float(get("weight_decay")))
    fill = wait_fill(a.wait_fill) if a.wait_fill else 0.0
    times, losses, phases, cpus = [], [], [], []
    for step in range(a.steps):
        g = torch.Generator().manual_seed(7 * 1000003 + step)
        labels = torch.randint(0, C, (B,), generator=g)
        emb = (torch.rand(B, D, generator=g) * 2 - 1).requires_grad_()
        c0, t0 = time.process_time(), time.perf_counter()
        loss = module(emb, labels)
        loss.backward()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        phases.append(module._worker.phases)
        losses.append(float(loss))
        opt.step()
    module.close()
    warm = statistics.median(times[:a.warmup]) * 1e3
    steady = statistics.median(times[-a.steady:]) * 1e3
    ph = {name: statistics.median(p[name] for p in phases[-a.steady:]) * 1e3
          for name in ("sample", "pull", "head", "push")}
    print(f"RESULT C={C} D={D} B={B} r={rate:g} k={module._worker.k} steps={a.steps} warmup_ms={warm:.1f} "
          f"steady_ms={steady:.1f} sample_ms={ph['sample']:.1f} pull_ms={ph['pull']:.1f} head_ms={ph['head']:.1f} "
          f"push_ms={ph['push']:.1f} worker_cpu_s_per_step={sum(cpus[-a.steady:]) / a.steady:.3f} "
          f"fill_s={fill:.2f} first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f}")


if __name__ == "__main__":
    main()
