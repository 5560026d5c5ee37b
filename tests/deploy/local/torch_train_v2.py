"""A training script written like arcface_torch's train_v2.py (our own, small): a tiny backbone, arcface_torch's
margin (a CombinedMarginLoss-like object), SGD over the backbone's and the Partial FC's parameter groups, a
PolynomialLRWarmup-like schedule, clip_grad_norm_(5), DDP over gloo when torch.distributed has several ranks.
The two lines that differ between the head implementations are marked "the two-line change".

    torch_train_v2.py make-centers OUT.safetensors C D SEED
    torch_train_v2.py train --head pfcps --run RUN.ini --steps N --batch B --out LOSSES.json [--dtype float32]
    torch_train_v2.py train --head reference --centers F.safetensors --world W ...   (one process, global batch)
        --ids PREFIX: the pfcps run writes every step's sampled ids (PREFIX.rank<r>.json), the reference samples
        the same ids (sample_rate < 1)
        --module-head pfcps|torch: the module's head (pfcps's CPU head, or its head in torch ops)
        --save PREFIX --save-at T: after step T (global steps done) each rank saves arcface_torch's checkpoint
            (global_step, backbone, the module's state_dict, optimizer, scheduler) to PREFIX.rank<r>.pt
        --resume PREFIX: each rank loads PREFIX.rank<r>.pt before its first step, as train_v2.py resumes, and
            trains from its global_step on
        --skip-opt-at T1,T2: optimizer.step() is not called at those steps (what GradScaler does on an inf
            gradient); the scheduler still steps. Reference: --skip-centers skipped (default: the table stays as
            it was too) or stepped (the table still takes its step: the negative control)
        --pause-after N[,N...] --pause-s S: after N global steps print "PAUSE" and sleep S seconds, then
            train on (the test kills or restarts a server meanwhile)
        --hang-after N [--hang-rank R]: after N global steps rank R (default: every rank) prints "HANG" and sleeps
            (the test kills the processes)
        --exit-after N --exit-rank R: after N global steps rank R calls sys.exit(0) (a script that ends early
            without an error: the exit handler closes the module in order, as a finished script's)
        --interruptible: Ctrl-C (SIGINT) raises KeyboardInterrupt, though a shell's background job starts with
            SIGINT ignored
        --raise-after N [--raise-rank R]: after N global steps rank R (default: every rank) raises RuntimeError
            out of the script (an uncaught exception: the module closes without leaving the run in order)
        --table-out F (reference): the final class-center table (float64, C x D) to F (torch.save)
    torch_train_v2.py errors --run RUN.ini --bad-rendezvous RUN2.ini   (the error cases of tests/deploy/local/
                                                                       test_torch_partial_fc.sh)

The reference head (`reference`) is a plain-PyTorch Partial FC, at sample rate 1.0 or on the ids the pfcps
run sampled (--ids): the whole C x D table as a torch Parameter in the optimizer's second group (PartialFC_V2's
layout), cosine logits clamped to [-1, 1], the margin of arcface_torch's CombinedMarginLoss (ArcFace:
cos(acos(c) + m2) on the target with its no_grad, straight-through gradient; CosFace: c - m3), scale s, cross
entropy averaged over the global batch, its value floored as DistCrossEntropy's. It runs the global batch of
all W ranks in one process: without BatchNorm in the backbone, DDP's mean over ranks of W x the local
embedding gradient (arcface_torch's AllGather backward) is the gradient of the global mean loss, which the
one-process run takes directly.

Data: every rank's batch of step t is drawn from torch.Generator seeded (seed, t, rank), so the reference can
rebuild the global batch. Exit 77 when torch is missing (the test skips)."""
import argparse
import hashlib
import json
import math
import os
import signal
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the test skips, naming what is missing
    print(f"SKIP: no torch ({e})")
    sys.exit(77)

C_IN = 3 * 8 * 8  # tiny "images" of 3 x 8 x 8


class Margin:
    """CombinedMarginLoss's attributes (s, m1, m2, m3, interclass_filtering_threshold), as arcface_torch's
    train_v2.py builds it from cfg.margin_list. exact (reference only): the ArcFace margin's own gradient
    (d cos(acos(c) + m2) / dc, pfcps's margin_grad = exact) instead of arcface_torch's straight-through one."""

    def __init__(self, s, m1, m2, m3, interclass_filtering_threshold=0, exact=False):
        self.s, self.m1, self.m2, self.m3 = s, m1, m2, m3
        self.interclass_filtering_threshold = interclass_filtering_threshold
        self.exact = exact

    def __call__(self, logits, labels):
        """arcface_torch's CombinedMarginLoss.forward, restated: logits (N, C) cosines, labels (N)."""
        rows = torch.arange(labels.shape[0])
        if self.interclass_filtering_threshold > 0:
            with torch.no_grad():
                dirty = (logits > self.interclass_filtering_threshold).to(logits.dtype)
                dirty[rows, labels] = 0
            logits = (1 - dirty) * logits
        target = logits[rows, labels]
        if self.m1 == 1.0 and self.m3 == 0.0 and self.exact:
            moved = torch.cos(torch.acos(target.clamp(-1 + 1e-7, 1 - 1e-7)) + self.m2)
            logits = logits.clone()
            logits[rows, labels] = moved
        elif self.m1 == 1.0 and self.m3 == 0.0:
            with torch.no_grad():  # straight-through, as arcface_torch's in-place arccos/cos under no_grad
                moved = torch.cos(torch.acos(target) + self.m2)
            logits = logits.clone()
            logits[rows, labels] = target + (moved - target).detach()
        else:
            logits = logits.clone()
            logits[rows, labels] = target - self.m3
        return logits * self.s


class ReferencePartialFC(torch.nn.Module):
    """Plain-PyTorch Partial FC at sample rate 1.0 (see the top of the file)."""

    def __init__(self, margin_loss, weight):
        super().__init__()
        self.margin_loss = margin_loss
        self.weight = torch.nn.Parameter(weight.clone())

    def forward(self, embeddings, labels, ids=None):
        """ids: the sampled class ids of the step (sorted; every label among them), or None for all classes.
        As PartialFC_V2, the gradient reaches the sampled rows only, while SGD's weight decay and momentum move
        every row of the table."""
        labels = labels.reshape(-1)
        weight = self.weight
        if ids is not None:
            weight = self.weight[ids]
            cols = torch.searchsorted(ids, labels).clamp(max=len(ids) - 1)
            if not torch.equal(ids[cols], labels):
                raise SystemExit("the sampled ids miss a positive class of the batch")
            labels = cols
        logits = F.linear(F.normalize(embeddings), F.normalize(weight)).clamp(-1, 1)
        logits = self.margin_loss(logits, labels)
        # arcface_torch's DistCrossEntropy: the value floors p_target at 1e-30 (a row counts at most
        # -log(1e-30) = 69.0776), the gradient is softmax - onehot whatever the floor.
        ce = F.cross_entropy(logits, labels, reduction="none")
        floored = torch.clamp(ce, max=-math.log(1e-30))
        return ce.mean() + (floored.mean() - ce.mean()).detach()


def backbone(D, dtype):
    """A tiny network without BatchNorm (see the top of the file): flatten, linear, PReLU, linear."""
    torch.manual_seed(1234)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(C_IN, 64), torch.nn.PReLU(64),
                              torch.nn.Linear(64, D))
    return net.to(dtype)


def batch(seed, step, rank, B, C, dtype):
    """Rank `rank`'s batch of step `step`: labels (B) uniform in [0, C) and images (B, 3, 8, 8), each its class's
    fixed random prototype plus noise of a third of its scale, so that the loss can fall."""
    protos = torch.randn(C, 3, 8, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    g = torch.Generator().manual_seed(seed * 1000003 + step * 1009 + rank)
    labels = torch.randint(0, C, (B,), generator=g)
    images = protos[labels] + torch.randn(B, 3, 8, 8, generator=g, dtype=torch.float64) / 3
    return images.to(dtype), labels


class PolynomialLRWarmup(torch.optim.lr_scheduler._LRScheduler):
    """arcface_torch's PolynomialLRWarmup (warm-up linear in steps, then (1 - t / T)^power), restated."""

    def __init__(self, optimizer, warmup_iters, total_iters, power=2.0):
        self.warmup_iters, self.total_iters, self.power = warmup_iters, total_iters, power
        super().__init__(optimizer)

    def get_lr(self):
        t = self.last_epoch
        if t < self.warmup_iters:
            f = (t + 1) / self.warmup_iters
        else:
            f = (1.0 - (t - self.warmup_iters) / max(1, self.total_iters - self.warmup_iters)) ** self.power
        return [base * f for base in self.base_lrs]


def params_sha(net):
    """SHA-256 of the backbone's parameters (float32 bytes, in order): equal only for bit-identical weights."""
    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def train(a):
    dtype = getattr(torch, a.dtype)
    torch.set_num_threads(1)
    dist = torch.distributed
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if a.head == "pfcps" and world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    margin = Margin(a.s, *a.margin, exact=a.margin_grad == "exact")
    net = backbone(a.D, dtype)
    ck = None
    if a.resume:  # arcface_torch's resume: the backbone first, the Partial FC after its construction
        ck = torch.load(f"{a.resume}.rank{rank}.pt")
        net.load_state_dict(ck["state_dict_backbone"])
    if a.head == "pfcps":
        import pfcps.torch
        # the two-line change (1 of 2): arcface_torch's PartialFC_V2 -> pfcps.torch.PartialFC with run=
        module = pfcps.torch.PartialFC(margin, a.D, a.C, a.sample_rate, False, run=a.run, head=a.module_head,
                                       checkpoints=not a.no_checkpoints)
        steps_world = world
    else:
        from safetensors.torch import load_file
        module = ReferencePartialFC(margin, load_file(a.centers)["weight"].to(dtype))
        steps_world = a.world  # one process trains the global batch of a.world ranks
    if ck is not None:
        module.load_state_dict(ck["state_dict_softmax_fc"])
    model = net
    if a.head == "pfcps" and world > 1:
        model = torch.nn.parallel.DistributedDataParallel(net)
    # the two-line change (2 of 2): none here; arcface_torch's optimizer line, unchanged
    opt = torch.optim.SGD(params=[{"params": net.parameters()}, {"params": module.parameters()}], lr=a.lr,
                          momentum=0.9, weight_decay=a.wd)
    sched = PolynomialLRWarmup(opt, a.warmup, a.steps)
    start = 0
    if ck is not None:
        opt.load_state_dict(ck["state_optimizer"])
        sched.load_state_dict(ck["state_lr_scheduler"])
        start = ck["global_step"]
    losses, lrs, ids_seen = [], [], []
    sampled = None
    if a.head == "reference" and a.ids:
        # Every rank's sampled ids of every step, as the pfcps run wrote them (--ids): the reference samples
        # the same columns (the ranks' partitions are disjoint: their union is the step's sample).
        per_rank = [json.load(open(f"{a.ids}.rank{r}.json")) for r in range(steps_world)]
        sampled = [torch.tensor(sorted(sum((pr[t] for pr in per_rank), [])), dtype=torch.int64)
                   for t in range(a.steps)]
    t0 = time.time()
    for step in range(start, a.steps):
        if a.head == "pfcps":
            images, labels = batch(a.seed, step, rank, a.batch, a.C, dtype)
        else:
            parts = [batch(a.seed, step, r, a.batch, a.C, dtype) for r in range(steps_world)]
            images = torch.cat([p[0] for p in parts])
            labels = torch.cat([p[1] for p in parts])
        emb = model(images)
        if a.head == "pfcps":
            loss = module(emb, labels)
            ids_seen.append(module.sampled_ids().tolist())
        else:
            loss = module(emb, labels, sampled[step] if sampled is not None else None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 5)
        lrs.append(opt.param_groups[1]["lr"])
        if step not in a.skip_opt_at:
            opt.step()
        elif a.skip_centers == "stepped":  # (reference) the backbone's step skipped, the table's taken
            for p in net.parameters():
                p.grad = None  # SGD leaves a parameter without a gradient alone (no decay, no momentum)
            opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(float(loss))
        if a.save and step + 1 == a.save_at:  # arcface_torch's save_all_states checkpoint, each rank its own
            torch.save({"epoch": 0, "global_step": step + 1, "state_dict_backbone": net.state_dict(),
                        "state_dict_softmax_fc": module.state_dict(), "state_optimizer": opt.state_dict(),
                        "state_lr_scheduler": sched.state_dict()}, f"{a.save}.rank{rank}.pt")
        if step + 1 in a.pause_after:
            print(f"PAUSE after {step + 1} steps", flush=True)
            time.sleep(a.pause_s)
        if a.hang_after and step + 1 == a.hang_after and a.hang_rank in (None, rank):
            print(f"HANG after {step + 1} steps", flush=True)
            time.sleep(600)
        if a.raise_after and step + 1 == a.raise_after and a.raise_rank in (None, rank):
            raise RuntimeError(f"the script fails after {step + 1} steps")
        if a.exit_after and step + 1 == a.exit_after and a.exit_rank == rank:
            print(f"EXIT after {step + 1} steps", flush=True)
            sys.exit(0)
    secs = time.time() - t0
    module_step = None
    if a.head == "pfcps":
        module_step = module.step
        module.close()
        if a.ids:
            with open(f"{a.ids}.rank{rank}.json", "w") as f:
                json.dump(ids_seen, f)
    elif a.table_out:
        torch.save(module.weight.detach().to(torch.float64), a.table_out)
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump({"losses": losses, "lrs": lrs, "seconds": secs, "first_step": start,
                       "backbone_sha256": params_sha(net), "module_step": module_step}, f)
    print(f"rank {rank}: steps {start}..{a.steps - 1}, loss {losses[0]:.6f} -> {losses[-1]:.6f} in {secs:.2f} s")


def make_centers(a):
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(a.seed)
    w = torch.randn(a.C, a.D, generator=g, dtype=torch.float64) * 0.01
    save_file({"weight": w.to(torch.float32)}, a.out)


def expect_error(name, fn, needle, max_s=None):
    """Runs fn; it must raise pfcps.PfcpsError whose message holds `needle`, within max_s seconds."""
    import pfcps
    t0 = time.time()
    try:
        fn()
    except pfcps.PfcpsError as e:
        dt = time.time() - t0
        msg = str(e)
        if needle not in msg:
            print(f"FAIL {name}: PfcpsError without '{needle}': {msg}")
            return 1
        if max_s is not None and dt > max_s:
            print(f"FAIL {name}: raised after {dt:.1f} s, more than {max_s} s: {msg}")
            return 1
        print(f"ok   {name}: PfcpsError after {dt:.2f} s: {msg}")
        return 0
    print(f"FAIL {name}: no PfcpsError")
    return 1


def errors(a):
    """The error cases: unreachable rendezvous, wrong secret, then (joined) a label out of range, a batch-size
    change, and a lost server; each must raise pfcps.PfcpsError carrying pfcps's message."""
    import pfcps.torch
    torch.set_num_threads(1)
    fails = 0
    margin = Margin(64.0, 1.0, 0.5, 0.0)
    mk = lambda run, sets=(): pfcps.torch.PartialFC(margin, a.D, a.C, 1.0, run=run, sets=sets)
    # A config file that is not there: pfcps's config loader names it.
    fails += expect_error("missing_config", lambda: mk(a.run + ".missing"), ".missing")
    # Nobody listens at the rendezvous of a.bad_rendezvous (join_timeout = 2 there).
    fails += expect_error("unreachable", lambda: mk(a.bad_rendezvous), "", max_s=2 + 8)
    # A wrong secret: the rendezvous refuses the join.
    fails += expect_error("wrong_secret", lambda: mk(a.run, ["secret=not-the-run-secret"]), "secret", max_s=30)
    # Refused before joining (within 2 s, far below a join's join_timeout of 10 s), each naming the problem: the
    # run's num_classes other than the module's; the config's workers other than the torch world size (1 here);
    # a margin arcface_torch's CombinedMarginLoss has no formula for; head_mode = local; gradient_acc != 1.
    fails += expect_error("class_mismatch", lambda: pfcps.torch.PartialFC(margin, a.D, a.C + 1, 1.0, run=a.run),
                          f"num_classes={a.C + 1}, embedding_size={a.D} asked, but {a.run} has num_classes = {a.C}",
                          max_s=2)
    fails += expect_error("world_mismatch", lambda: mk(a.run, ["workers=2"]),
                          "has workers = 2, but torch.distributed's world size is 1", max_s=2)
    fails += expect_error("margin_refused", lambda: pfcps.torch.PartialFC(Margin(64.0, 1.35, 0.0, 0.0), a.D, a.C,
                                                                          1.0, run=a.run),
                          "m1 must be 1 unless m3 > 0", max_s=2)
    fails += expect_error("head_mode_local", lambda: mk(a.run, ["head_mode=local"]), "'head_mode' = local",
                          max_s=2)
    fails += expect_error("gradient_acc", lambda: mk(a.run, ["gradient_acc=3"]), "'gradient_acc' = 3", max_s=2)
    # A key the module's endpoints are opened with (servers), other than the run's: the rendezvous refuses the
    # join before the rank takes a seat, naming the key with both values, so the run stays formed and the
    # cases below join it.
    fails += expect_error("endpoint_keys", lambda: mk(a.run, ["servers=3"]),
                          "worker[0] was started with a config that differs from the run's in 1 key its endpoints "
                          "are opened with (the worker's value first, the run's in parentheses): servers = 3 (2)",
                          max_s=5)
    # The module of the cases below pushes at each backward (checkpoints=False); the training runs cover the
    # default, pushes sent at the next forward.
    m = pfcps.torch.PartialFC(margin, a.D, a.C, 1.0, run=a.run, checkpoints=False)
    net = backbone(a.D, torch.float32)
    opt = torch.optim.SGD([{"params": net.parameters()}, {"params": m.parameters()}], lr=0.1, momentum=0.9,
                          weight_decay=5e-4)

    def step(labels, B=None):
        images, _ = batch(7, 0, 0, B or len(labels), a.C, torch.float32)
        loss = m(net(images), torch.tensor(labels))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return float(loss)

    good = [i % a.C for i in range(a.batch)]
    print(f"step 0 loss {step(good):.4f}")
    bad = list(good)
    bad[1] = a.C
    fails += expect_error("label_high", lambda: step(bad), f"label {a.C}")
    bad[1] = -1
    fails += expect_error("label_negative", lambda: step(bad), "label -1")
    # The worker stays usable after a refused label: the next step trains.
    try:
        print(f"after the refused labels: loss {step(good):.4f}")
    except Exception as e:
        print(f"FAIL label_recovery: {e}")
        fails += 1
    fails += expect_error("batch_change", lambda: step(good + [0]), "batch size changed")
    fails += expect_error("no_checkpoints", m.state_dict, "built with checkpoints=False")

    def two_forwards():  # the second forward ends the first's step (skipped): its backward must refuse
        images, _ = batch(7, 0, 0, len(good), a.C, torch.float32)
        first = m(net(images), torch.tensor(good))
        second = m(net(images), torch.tensor(good))
        second.backward()
        first.backward()
    fails += expect_error("stale_backward", two_forwards, "already ended")
    # Forwards under no_grad end their steps at once, skipped: the servers move no row (PS_PUSH_SKIPPED), so two
    # of them on the same batch give the same loss, bit for bit.
    images, _ = batch(7, 0, 0, len(good), a.C, torch.float32)
    with torch.no_grad():
        l1, l2 = float(m(net(images), torch.tensor(good))), float(m(net(images), torch.tensor(good)))
    print(f"{'ok  ' if l1 == l2 else 'FAIL'} no_grad_skip: two no_grad forwards: {l1!r} and {l2!r}")
    fails += 0 if l1 == l2 else 1
    # An inf in the embeddings (fp16 overflow under autocast): the loss comes back not finite, nothing raises,
    # and even with optimizer.step() called (only the module's group has a gradient: the backbone's are
    # dropped) the step pushes nothing: a no_grad forward on the same batch gives the same loss, bit for bit.
    try:
        emb = net(images).detach().clone()
        emb[0, 0] = float("inf")
        bad_loss = m(emb.requires_grad_(), torch.tensor(good))
        bad_loss.backward()
        for p in net.parameters():
            p.grad = None
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            l3 = float(m(net(images), torch.tensor(good)))
        same = not math.isfinite(float(bad_loss)) and l3 == l1
        print(f"{'ok  ' if same else 'FAIL'} nonfinite: the loss was {float(bad_loss)!r}; the next no_grad forward "
              f"{l3!r} (before: {l1!r})")
        fails += 0 if same else 1
    except Exception as e:
        print(f"FAIL nonfinite: {type(e).__name__}: {e}")
        fails += 1
    opt.zero_grad()
    try:  # and the module trains on
        print(f"after the stale backward: loss {step(good):.4f}")
    except Exception as e:
        print(f"FAIL stale_recovery: {e}")
        fails += 1
    # A lost server: the test kills server 1 once it sees this line, then the next step must fail within
    # the client's bound (4 x ctl_timeout).
    print("KILL-SERVER-1", flush=True)
    time.sleep(float(a.kill_wait))
    fails += expect_error("server_lost", lambda: step(good), "server", max_s=4 * 2 + 10)
    fails += expect_error("after_failure", lambda: step(good), "")
    print(f"errors: {fails} failed")
    return 1 if fails else 0


def sigint(a):
    """Ctrl-C (SIGINT to this process, 1 s after the call began) while the module waits: in its join (nobody at
    the rendezvous, join_timeout 30 s), or, with --stop-pid P, in a step (server P stopped with SIGSTOP after 3
    steps; ctl_timeout 10 s, so the data plane waits 40 s). KeyboardInterrupt must come out of the call within
    2 s of the signal, with its traceback (the script prints "ok   NAME" first, then re-raises it)."""
    import pfcps.torch
    import threading
    signal.signal(signal.SIGINT, signal.default_int_handler)  # background jobs of a shell start ignoring it
    torch.set_num_threads(1)
    margin = Margin(64.0, 1.0, 0.5, 0.0)
    name = "sigint_step" if a.stop_pid else "sigint_join"

    def interrupted(fn):
        t = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
        t0 = time.time()
        t.start()
        try:
            fn()
        except KeyboardInterrupt:
            dt = time.time() - t0 - 1.0
            print(f"{'ok  ' if dt < 2 else 'FAIL'} {name}: KeyboardInterrupt {dt:.2f} s after the SIGINT", flush=True)
            raise
        print(f"FAIL {name}: the call returned without KeyboardInterrupt after {time.time() - t0:.1f} s", flush=True)
        return 1

    if not a.stop_pid:
        return interrupted(lambda: pfcps.torch.PartialFC(margin, a.D, a.C, 1.0, run=a.run))
    m = pfcps.torch.PartialFC(margin, a.D, a.C, 1.0, run=a.run)
    net = backbone(a.D, torch.float32)
    opt = torch.optim.SGD([{"params": net.parameters()}, {"params": m.parameters()}], lr=0.1, momentum=0.9,
                          weight_decay=5e-4)

    def step(s):
        images, labels = batch(7, s, 0, a.batch, a.C, torch.float32)
        loss = m(net(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()

    for s in range(3):
        step(s)
    os.kill(a.stop_pid, signal.SIGSTOP)
    try:
        return interrupted(lambda: [step(s) for s in range(3, 10)])
    finally:
        os.kill(a.stop_pid, signal.SIGCONT)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("make-centers")
    c.add_argument("out")
    c.add_argument("C", type=int)
    c.add_argument("D", type=int)
    c.add_argument("seed", type=int)
    for name in ("train", "errors", "sigint"):
        t = sub.add_parser(name)
        t.add_argument("--run")
        t.add_argument("--C", type=int, required=True)
        t.add_argument("--D", type=int, required=True)
        t.add_argument("--batch", type=int, default=4)
        t.add_argument("--out")
        if name == "train":
            t.add_argument("--head", choices=["pfcps", "reference"], required=True)
            t.add_argument("--centers")
            t.add_argument("--world", type=int, default=1)
            t.add_argument("--steps", type=int, default=10)
            t.add_argument("--seed", type=int, default=1)
            t.add_argument("--lr", type=float, default=0.1)
            t.add_argument("--wd", type=float, default=5e-4)
            t.add_argument("--warmup", type=int, default=3)
            t.add_argument("--sample-rate", type=float, default=1.0)
            t.add_argument("--s", type=float, default=64.0)
            t.add_argument("--margin", type=float, nargs=3, default=[1.0, 0.5, 0.0])
            t.add_argument("--dtype", default="float32")
            t.add_argument("--ids", help="pfcps: write each step's sampled ids to IDS.rank<r>.json; reference: "
                                         "sample those ids (every rank's) instead of all classes")
            t.add_argument("--module-head", default="pfcps", choices=["pfcps", "torch", "auto"])
            t.add_argument("--no-checkpoints", action="store_true", help="PartialFC(checkpoints=False): each push "
                                                                          "at its backward")
            t.add_argument("--margin-grad", default="straight_through", choices=["straight_through", "exact"])
            t.add_argument("--save")
            t.add_argument("--skip-opt-at", type=lambda v: {int(x) for x in v.split(",") if x}, default=set())
            t.add_argument("--skip-centers", default="skipped", choices=["skipped", "stepped"])
            t.add_argument("--save-at", type=int, default=0)
            t.add_argument("--resume")
            t.add_argument("--hang-after", type=int, default=0)
            t.add_argument("--hang-rank", type=int, default=None)
            t.add_argument("--interruptible", action="store_true")
            t.add_argument("--exit-after", type=int, default=0)
            t.add_argument("--exit-rank", type=int, default=0)
            t.add_argument("--raise-after", type=int, default=0)
            t.add_argument("--raise-rank", type=int, default=None)
            t.add_argument("--pause-after", type=lambda v: {int(x) for x in v.split(",")}, default=set())
            t.add_argument("--pause-s", type=float, default=3.0)
            t.add_argument("--table-out")
        elif name == "errors":
            t.add_argument("--bad-rendezvous", required=True)
            t.add_argument("--kill-wait", default="2")
        else:
            t.add_argument("--stop-pid", type=int, default=0)
    a = p.parse_args()
    if a.cmd == "make-centers":
        make_centers(a)
        return 0
    if a.cmd == "train":
        if a.interruptible:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        train(a)
        return 0
    if a.cmd == "sigint":
        return sigint(a)
    return errors(a)


if __name__ == "__main__":
    sys.exit(main())
