"""arcface_torch's PartialFC_V2 interface with the class centers on pfcps servers.

    module_partial_fc = pfcps.torch.PartialFC(margin_loss, cfg.embedding_size, cfg.num_classes,
                                              cfg.sample_rate, cfg.fp16, run="run.ini")
    opt = torch.optim.SGD(params=[{"params": backbone.parameters()},
                                  {"params": module_partial_fc.parameters()}], lr=..., momentum=..., weight_decay=...)
    loss = module_partial_fc(local_embeddings, local_labels)
    loss.backward()

Each torch rank joins the run named by `run` (a pfcps config file; the join secret from its `secret` key or
PFCPS_SECRET) as pfcps worker torch.distributed.get_rank() of get_world_size() (rank 0 of 1 without
torch.distributed): in the constructor, or, when the config says resume = true, at the first forward, so that
a state given to load_state_dict in between names the checkpoint this member resumes. A call is one step of
pfcps's C worker (worker/train.c, the head path): the labels of every rank are allgathered over pfcps's ring,
this rank samples its partition (classes c mod W == rank: every positive plus uniform negatives up to
int(sample_rate x partition), the run's sample_rounding), pulls those rows from the servers, and the head
computes the margin softmax over the allgathered W x B embeddings with the softmax's max and sum allreduced:
the loss is the mean over the global batch, the same on every rank. Two heads: pfcps's CPU head
(worker/head, over pfcps's ring) or a head in torch ops on the embeddings' device (head="torch"; the
default for CUDA tensors), which allgathers and allreduces with torch.distributed and moves the rows through
pinned host memory. backward() queues the push of the sampled rows' gradients (the servers apply SGD with the
run's momentum and weight_decay, or AdamW under optimizer = adamw, at the lr of the optimizer's param group
holding this module's parameter);
it goes at the next forward, state_dict() or close(). backward returns W x dL/d(local embeddings),
arcface_torch's AllGather backward, for DDP's averaging.

The module's parameter `lr_carrier` (a 0-d tensor that never gets a gradient, so the optimizer leaves it
alone) is how the lr reaches the servers: the module finds the optimizer param group that holds it and reads
that group's `lr` at each backward, so the script's SGD / PolynomialLRWarmup lines stay unchanged.
state_dict() names the servers' checkpoint of the step it is taken at (it asks the servers for it; the
table stays on the servers); load_state_dict() before the first forward resumes it.
Not supported (docs/python.md): fp16 (the head runs in float32; fp16=True is accepted), gradient accumulation
(every backward is an update of the class centers).
GradScaler: a step whose optimizer.step() did not run (the scaler found an inf or NaN gradient) leaves the class
centers as they were (the module counts the optimizer's steps and drops that step's push), with the default
checkpoints=True; with checkpoints=False the push has already gone at backward.
"""
import atexit
import sys
import gc
import math
import os
import types
import warnings
import weakref

import torch
import torch.nn.functional as F

from . import _C
from ._C import PfcpsError


_STATE_FORMAT = "pfcps.torch.PartialFC state 1"
_LOSS_FLOOR = -math.log(1e-30)  # arcface_torch's clamp_min(1e-30) of p_target: a row counts at most 69.0776


def _error(msg, code=-22):
    e = PfcpsError(msg)
    e.code = code
    return e


def _margin_of(margin_loss):
    """(s, m1, m2, m3, interclass_filtering_threshold) of a CombinedMarginLoss-like object."""
    try:
        s, m1, m2, m3 = (float(getattr(margin_loss, a)) for a in ("s", "m1", "m2", "m3"))
    except AttributeError as e:
        raise TypeError("margin_loss must carry arcface_torch CombinedMarginLoss's attributes s, m1, m2, m3 "
                        f"(and optionally interclass_filtering_threshold): {e}") from None
    thr = float(getattr(margin_loss, "interclass_filtering_threshold", 0.0) or 0.0)
    # The run's margin_combine decides how the triple combines (pfcps._C's check_head and head_init:
    # arcface_torch's rules by default, refusing m1 != 1 with m3 = 0 as CombinedMarginLoss raises; `full` keeps
    # any triple).
    return s, m1, m2, m3, thr


def _dist():
    d = torch.distributed
    if d.is_available() and d.is_initialized():
        return d.get_rank(), d.get_world_size()
    return 0, 1


_live = weakref.WeakSet()


@atexit.register
def _close_all():
    # An exception that ended the script (KeyboardInterrupt included: the interpreter sets sys.last_value, or
    # sys.last_exc from 3.12, before the exit handlers run) is not the end of training: the modules close
    # without leaving in order, so that the run takes this rank as lost and re-forms rather than ending.
    in_order = getattr(sys, "last_exc", None) is None and getattr(sys, "last_value", None) is None
    for m in list(_live):
        try:
            if in_order:
                m.close()
            else:
                m._worker.close(in_order=False, reason="the script ends with an exception")
        except Exception:
            pass


class _PartialFCFunction(torch.autograd.Function):
    """pfcps's CPU head (pfcps._C forward: sampling, pull, head forward and backward in one call)."""

    @staticmethod
    def forward(ctx, embeddings, labels, module):
        w = module._worker
        emb = embeddings.detach().to("cpu", torch.float32).contiguous()
        lab = labels.detach().to("cpu", torch.int64).contiguous()
        grad = torch.empty_like(emb)
        loss = w.forward(emb.numpy(), lab.numpy(), grad.numpy())
        ctx.module = module
        ctx.step = w.step  # the step this forward ran; its backward must end that step
        ctx.grad = grad
        ctx.emb_device, ctx.emb_dtype = embeddings.device, embeddings.dtype
        return torch.tensor(loss, dtype=torch.float32, device=embeddings.device)

    @staticmethod
    def backward(ctx, grad_loss):
        return _backward(ctx, grad_loss)


def _count_steps(opt):
    """Wraps opt.step (once) so that opt._pfcps_optimizer_steps counts the optimizer steps that ran. The
    wrapper is a bound method, as torch's lr schedulers expect when they wrap step() themselves, and carries
    their marks (_with_counter, _wrapped_by_lr_sched) so a scheduler built before it does not warn."""
    if hasattr(opt, "_pfcps_optimizer_steps"):
        return
    inner = opt.step

    def step(self, *args, **kwargs):
        out = inner(*args, **kwargs)
        self._pfcps_optimizer_steps += 1
        return out
    for mark in ("_with_counter", "_wrapped_by_lr_sched"):
        if hasattr(inner, mark):
            setattr(step, mark, getattr(inner, mark))
    opt._pfcps_optimizer_steps = 0
    opt.step = types.MethodType(step, opt)


def _backward(ctx, grad_loss):
    """Both heads' backward: queues the rows' push at the optimizer group's lr and returns W x the embeddings'
    gradient of the global mean loss, times the incoming gradient."""
    module = ctx.module
    w = module._worker
    if not w.pending or w.step != ctx.step:
        raise _error(f"pfcps PartialFC: backward of step {ctx.step}, but that step was already ended (by a later "
                     f"forward, or a backward before); one forward, then its backward, per step")
    w.backward(module._lr(), not module.checkpoints)
    if module.checkpoints:  # the push is queued: whether it counts is settled once optimizer.step() ran or not
        module._opt_mark = module._opt_steps()
    g = ctx.grad
    ctx.grad = None
    g = g * (float(module.world_size) * float(grad_loss.detach().to("cpu", torch.float64)))
    return g.to(ctx.emb_device, ctx.emb_dtype), None, None


def _torch_head(emb_all, rows, cols, p, world):
    """The margin softmax of pfcps's head (worker/head/head.h, its formulas restated) in torch ops on
    emb_all's device: emb_all (n, D) the global batch, rows (k, D) this rank's sampled class centers, cols (n)
    each row's target column among them (-1: another rank's). Softmax max and sum, and the target terms, are
    allreduced over torch.distributed's default group when world > 1. Returns (loss: float64 0-d, rows with
    their target on no rank: int, dL/d emb_all (n, D): this rank's columns' part, dL/d rows (k, D))."""
    dist = torch.distributed
    n, k = emb_all.shape[0], rows.shape[0]
    dev = emb_all.device
    idx = (cols >= 0).nonzero().squeeze(1)
    tc = cols[idx]
    with torch.enable_grad():
        e = emb_all.detach().requires_grad_(True)
        wr = rows.detach().requires_grad_(True)
        c = torch.mm(F.normalize(e, dim=1, eps=1e-12), F.normalize(wr, dim=1, eps=1e-12).t()).clamp(-1, 1)
        z = c
        if p["threshold"] > 0:  # interclass filtering: a non-target cosine above the threshold counts 0, no gradient
            with torch.no_grad():
                dirty = c > p["threshold"]
                dirty[idx, tc] = False
            z = z.masked_fill(dirty, 0.0)
        tgt = c[idx, tc]
        if p["m1"] == 1.0 and p["m2"] == 0.0:
            moved = tgt - p["m3"]
        else:
            t = tgt.clamp(-1 + 1e-7, 1 - 1e-7)
            moved = torch.cos(p["m1"] * torch.acos(t) + p["m2"]) - p["m3"]
        v = moved if p["margin_grad"] == "exact" else tgt + (moved - tgt).detach()
        z = z.index_put((idx, tc), v) * p["s"]
    with torch.no_grad():
        zmax = z.max(dim=1).values if k > 0 else torch.full((n,), -math.inf, dtype=z.dtype, device=dev)
        if world > 1:
            dist.all_reduce(zmax, op=dist.ReduceOp.MAX)
        ez = torch.exp(z - zmax[:, None])
        ssum = ez.sum(dim=1, dtype=torch.float64)
        red = torch.zeros(n, 2, dtype=torch.float64, device=dev)  # z_target - max, has-target
        red[idx, 0] = (z[idx, tc] - zmax[idx]).double()
        red[idx, 1] = 1.0
        if world > 1:
            dist.all_reduce(ssum)
            dist.all_reduce(red)
        missing = red[:, 1] == 0
        row = torch.clamp(torch.log(ssum) - red[:, 0], max=_LOSS_FLOOR)
        row[missing] = _LOSS_FLOOR
        loss = row.mean()
        g = ez / ssum.to(ez.dtype)[:, None]
        g[idx, tc] -= 1.0
        g /= n
    with torch.enable_grad():
        ge, gw = torch.autograd.grad(z, (e, wr), g)
    return loss, int(missing.sum()), ge, gw


class _TorchHeadFunction(torch.autograd.Function):
    """The head in torch ops on the embeddings' device (_torch_head): pfcps._C samples and pulls, the rows
    reach the device through a pinned host buffer (CUDA) and their gradient comes back the same way."""

    @staticmethod
    def forward(ctx, embeddings, labels, module):
        w = module._worker
        dist = torch.distributed
        W, r = module.world_size, module.rank
        lab = labels.detach().to("cpu", torch.int64).contiguous()
        k = w.pull(lab.numpy())
        dev = embeddings.device
        D = module.embedding_size
        emb = embeddings.detach().to(torch.float32).contiguous()
        B = emb.shape[0]
        if W > 1:
            parts = [torch.empty_like(emb) for _ in range(W)]
            dist.all_gather(parts, emb)
            emb_all = torch.cat(parts)
        else:
            emb_all = emb
        cols = torch.frombuffer(bytearray(w.labels_local()), dtype=torch.int64).to(dev)
        rows = module._rows_to(dev, k, D)
        loss, missing, ge_all, gw = _torch_head(emb_all, rows, cols, module._head, W)
        if missing:
            w.fail(f"{missing} rows of the global batch found their target class on no worker (a label or "
                   f"sampling fault)")
        if not math.isfinite(float(loss)):
            w.nonfinite(float(loss))  # the step goes on; its push goes empty (the centers keep no inf or NaN)
        module._grad_rows_from(gw, k, D)
        if W > 1:
            dist.all_reduce(ge_all)
        ctx.module = module
        ctx.step = w.step
        ctx.grad = ge_all[r * B:(r + 1) * B]
        ctx.emb_device, ctx.emb_dtype = embeddings.device, embeddings.dtype
        return loss.to(torch.float32)

    @staticmethod
    def backward(ctx, grad_loss):
        return _backward(ctx, grad_loss)


class PartialFC(torch.nn.Module):
    """PartialFC(margin_loss, embedding_size, num_classes, sample_rate=1.0, fp16=False, *, run, sets=(), lr=None,
    head="auto")

    margin_loss: arcface_torch's CombinedMarginLoss or any object with s, m1, m2, m3 (and
    interclass_filtering_threshold); its values are the head's, whatever the run config says (the config's
    margin_combine and margin_grad apply to them).
    embedding_size, num_classes: must equal the run's (server 0's config).
    sample_rate: in [0, 1], this module's (pfcps sampling: positives plus uniform negatives per partition).
    run: path of the pfcps config file the servers were started with (rendezvous, servers, workers, secret).
    sets: "key=value" overrides of that file, as `--set` on a pfcps command line.
    lr: the class centers' lr when no optimizer param group holds this module's parameter (else the group's lr
    wins; assign module.lr to change it).
    head: "pfcps" (pfcps's CPU head), "torch" (torch ops on the embeddings' device), "auto" (torch for CUDA
    embeddings, pfcps otherwise); chosen at the first forward.
    checkpoints: True (default): each backward's push waits for the next forward, state_dict() or close(), so
    that state_dict() can ask the servers for a checkpoint of its step; the servers' SGD of a step then runs at
    the next forward, before its pull. False: the push goes at backward and the servers' SGD overlaps the rest
    of the step (the backbone's backward, the optimizer, the next forward), but state_dict() after a trained
    step raises PfcpsError.
    Every refusal raises pfcps.PfcpsError (a RuntimeError) naming the problem: the config against the module
    (embedding_size, num_classes, workers against the torch world size, the margin, head_mode) before joining;
    the join (rendezvous unreachable or run not formed within join_timeout, servers unreachable within
    ctl_timeout, wrong secret); the run against the
    module. A margin_loss without s, m1, m2, m3 raises TypeError."""

    def __init__(self, margin_loss, embedding_size, num_classes, sample_rate=1.0, fp16=False, *, run,
                 sets=(), lr=None, head="auto", checkpoints=True):
        super().__init__()
        self.s, self.m1, self.m2, self.m3, self.interclass_filtering_threshold = _margin_of(margin_loss)
        if not 0.0 <= float(sample_rate) <= 1.0:
            raise _error(f"pfcps PartialFC: sample_rate {sample_rate} outside [0, 1]")
        if head not in ("auto", "pfcps", "torch"):
            raise _error(f"pfcps PartialFC: head={head!r}: one of 'auto', 'pfcps', 'torch'")
        self.embedding_size = int(embedding_size)
        self.num_classes = int(num_classes)
        self.sample_rate = float(sample_rate)
        self.fp16 = bool(fp16)
        self.lr = lr
        self.head = head
        self.checkpoints = bool(checkpoints)
        self.rank, self.world_size = _dist()
        self.run = os.fspath(run)
        self._worker = _C.Worker(self.run, self.rank, self.world_size, [str(s) for s in sets],
                                 num_classes=self.num_classes, embedding_size=self.embedding_size)
        self.config = self._worker.config
        self._worker.check_head(self.s, self.m1, self.m2, self.m3, self.interclass_filtering_threshold)
        if self.config["snapshot_every"] > 0:
            warnings.warn(f"pfcps PartialFC: {self.run} sets snapshot_every = {self.config['snapshot_every']}, "
                          "which pfcps.torch does not use: the servers write a checkpoint at each state_dict()")
        self.lr_carrier = torch.nn.Parameter(torch.zeros(()))
        self.run_config = None
        self._group = None
        self._opt = None        # the optimizer whose param group holds lr_carrier (its step() counted)
        self._opt_mark = None   # its step count at the backward whose push is queued (None: nothing to check)
        self._resume = None  # a state given to load_state_dict before the join
        self._head = None  # the head's effective parameters (head_init), once the first forward set it up
        self._torch_head = False
        self._pinned = {}
        self.batch_size = None
        _live.add(self)
        if not self.config["resume"]:
            self._join()

    def _join(self):
        """Joins the run; a state loaded before names the checkpoint to resume (else none: from scratch)."""
        st = self._resume
        if st is not None and st["step"] > 0:
            ident = (bytes.fromhex(st["run_id"]), int(st["seed"]), bytes.fromhex(st["config_digest"]))
            self._worker.join(st["step"], ident)
        else:
            self._worker.join()
        from . import _restore_stop_signals
        _restore_stop_signals()  # in case joining loaded another provider library that installs handlers
        self._resume = None  # from here on the worker's step and identity say it
        cfg = self._worker.run_config
        self.run_config = cfg
        if cfg["num_classes"] != self.num_classes or cfg["embedding_size"] != self.embedding_size:
            self._worker.close()
            raise _error(f"pfcps PartialFC(embedding_size={self.embedding_size}, num_classes={self.num_classes}) "
                         f"but the run {self.run} has embedding_size = {cfg['embedding_size']}, num_classes = "
                         f"{cfg['num_classes']}")

    @property
    def step(self):
        """The global step of the next forward (0-based): the steps this run has done."""
        if not self._worker.joined and self._resume is not None:
            return int(self._resume["step"])
        return self._worker.step

    # ------------------------------------------------------------------------------------------ checkpoints
    def get_extra_state(self):
        """The module's part of a checkpoint: the step T it is taken at and the identity of the servers'
        checkpoint T (run id, seed, config digest), which this call asks the servers to write (the queued push
        of step T - 1 goes now, flagged; each server writes its shard while it goes on serving). Taken after
        the optimizer step, as arcface_torch saves; every rank saves its own (each lists its step at resume)."""
        st = {"format": _STATE_FORMAT, "sample_rate": self.sample_rate, "num_classes": self.num_classes,
              "embedding_size": self.embedding_size}
        w = self._worker
        if w.joined:
            self._settle()
            try:
                T = w.checkpoint()
            except PfcpsError as e:
                if self.checkpoints:
                    raise
                raise _error(f"{e} (the module was built with checkpoints=False: its pushes go at backward, so "
                             f"state_dict() cannot ask for a checkpoint; build it with checkpoints=True, the "
                             f"default)") from None
            run_id, seed, digest = w.ident
            st.update(step=T, run_id=run_id.hex(), seed=seed, config_digest=digest.hex(),
                      batch_size=self.batch_size)
        elif self._resume is not None:  # loaded, not joined yet: the same state
            st.update({k: self._resume[k] for k in ("step", "run_id", "seed", "config_digest", "batch_size")
                       if k in self._resume})
        elif self._worker.step > 0:
            raise _error("pfcps PartialFC: state_dict() after close(): the module left the run; save before "
                         "close()")
        else:
            st.update(step=0, batch_size=None)
        return st

    def set_extra_state(self, state):
        """load_state_dict's part: a state of get_extra_state, before the first forward (the join then lists
        its step; the run must resume exactly that checkpoint, else the first forward raises PfcpsError)."""
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise _error(f"pfcps PartialFC: load_state_dict: not a {_STATE_FORMAT!r} (its _extra_state is "
                         f"{type(state).__name__})")
        for key, mine in (("num_classes", self.num_classes), ("embedding_size", self.embedding_size),
                          ("sample_rate", self.sample_rate)):
            if state.get(key) != mine:
                raise _error(f"pfcps PartialFC: load_state_dict: the state was saved with {key} = "
                             f"{state.get(key)}, this module has {key} = {mine}")
        T = int(state["step"])
        if T > 0 and not all(k in state for k in ("run_id", "seed", "config_digest")):
            raise _error(f"pfcps PartialFC: load_state_dict: the state of step {T} lacks its run identity")
        w = self._worker
        if w.joined:
            if T == w.step and (T == 0 or bytes.fromhex(state["run_id"]) == w.ident[0]):
                return  # the state of where this module stands
            if not self.config["resume"]:
                raise _error(f"pfcps PartialFC: load_state_dict of checkpoint step {T}, but {self.run} has resume "
                             f"= false: the module joined in its constructor and the servers started afresh "
                             f"(set resume = true in {self.run}, for the servers too: the module then joins at "
                             f"its first forward, after load_state_dict)")
            raise _error(f"pfcps PartialFC: load_state_dict of checkpoint step {T} after the module joined the run "
                         f"(at step {w.step}): load it before the first forward")
        if w.step > 0:
            raise _error("pfcps PartialFC: load_state_dict after close()")
        self._resume = dict(state)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if prefix + "weight" in state_dict and prefix + "_extra_state" not in state_dict:
            raise _error("pfcps PartialFC: load_state_dict of arcface_torch's PartialFC_V2 state (its class-center "
                         "`weight`): pfcps's table lives on the servers; start a run from such a set with the "
                         "config key pretrained_centers = checkpoint_gpu_<rank>.pt")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # --------------------------------------------------------------------------------------------------- lr
    def _find_group(self):
        p = self.lr_carrier
        g = self._group
        if g is not None and any(q is p for q in g.get("params", ())):
            return g
        self._group = None
        for ref in gc.get_referrers(p):
            if not isinstance(ref, list):
                continue
            for d in gc.get_referrers(ref):
                if isinstance(d, dict) and d.get("params") is ref and "lr" in d:
                    self._group = d
                    return d
        return None

    def _find_optimizer(self):
        """The optimizer whose param_groups list holds this module's group (None when no group holds it), its
        step() wrapped once to count the optimizer steps that run (_settle)."""
        g = self._find_group()
        if g is None:
            return None
        opt = self._opt
        if opt is not None and any(x is g for x in opt.param_groups):
            return opt
        self._opt = None
        for lst in gc.get_referrers(g):
            if not isinstance(lst, list):
                continue
            for ref in gc.get_referrers(lst):
                owners = [ref] if isinstance(ref, torch.optim.Optimizer) else \
                    [o for o in gc.get_referrers(ref) if isinstance(o, torch.optim.Optimizer)] \
                    if isinstance(ref, dict) else []
                for o in owners:
                    if getattr(o, "param_groups", None) is lst:
                        _count_steps(o)
                        self._opt = o
                        return o
        return None

    def _opt_steps(self):
        """The optimizer steps that ran so far (the count kept by the wrapper of _count_steps), or None when
        no optimizer holds this module's parameter."""
        o = self._find_optimizer()
        return None if o is None else o._pfcps_optimizer_steps

    def _settle(self):
        """Before the queued push goes (next forward, state_dict(), close()): when optimizer.step() did not run
        since the backward that queued it (torch's GradScaler skips it on an inf or NaN gradient), the push
        becomes an empty skipped one, so the class centers stay as they were, as the skipped step leaves
        PartialFC_V2's weight and its optimizer state."""
        mark, self._opt_mark = self._opt_mark, None
        if mark is not None and self._worker.joined and self._opt_steps() == mark:
            self._worker.drop_queued()

    def _lr(self):
        g = self._find_group()
        if g is None:
            if self.lr is None:
                raise _error("pfcps PartialFC: no optimizer param group holds this module's parameters (add "
                             "{'params': module.parameters()} to the optimizer, or set module.lr)")
            return float(self.lr)
        cfg = self.run_config
        adamw = cfg.get("optimizer") == "adamw"
        keys = (("weight_decay", cfg["weight_decay"]),) if adamw else \
            (("momentum", cfg["momentum"]), ("weight_decay", cfg["weight_decay"]))
        for key, want in keys:
            have = g.get(key, 0.0)
            if abs(float(have) - want) > 1e-12 * max(1.0, abs(want)):
                raise _error(f"pfcps PartialFC: the optimizer's {key} is {have} but the servers apply the run's "
                             f"{key} = {want} (set it in {self.run})")
        if adamw:
            # the servers' AdamW: torch.optim.AdamW's defaults (server/adamw.h), no amsgrad
            if tuple(g.get("betas", ())) != (0.9, 0.999) or g.get("eps") != 1e-8 or g.get("amsgrad", False) \
                    or g.get("maximize", False):
                raise _error("pfcps PartialFC: the run has optimizer = adamw and the servers apply AdamW with "
                             "betas (0.9, 0.999), eps 1e-8, no amsgrad; this optimizer group asks for something "
                             "else (or is not AdamW)")
        elif "betas" in g or g.get("nesterov", False) or g.get("dampening", 0) != 0:
            raise _error("pfcps PartialFC: the servers apply SGD (momentum, weight decay, no dampening or "
                         "Nesterov); this optimizer group asks for something else")
        return float(g["lr"])

    # ---------------------------------------------------------------------------------------- the torch head
    def _pin(self, name, k, D):
        """A pinned host buffer of at least k x D float32 (grown as needed), its first k rows."""
        buf = self._pinned.get(name)
        if buf is None or buf.shape[0] < k:
            buf = torch.empty((max(k, 1), D), dtype=torch.float32, pin_memory=True)
            self._pinned[name] = buf
        return buf[:k]

    def _rows_to(self, device, k, D):
        """The pulled rows (k, D) on `device`: the extension's buffer itself on the CPU; on a GPU copied into a
        pinned buffer, then to the device without blocking."""
        if k == 0:
            return torch.empty((0, D), dtype=torch.float32, device=device)
        host = torch.frombuffer(self._worker.rows(), dtype=torch.float32, count=k * D).view(k, D)
        if device.type == "cpu":
            return host
        pinned = self._pin("rows", k, D)
        pinned.copy_(host)
        return pinned.to(device, non_blocking=True)

    def _grad_rows_from(self, gw, k, D):
        """Writes the rows' gradient gw (k, D, on its device) into the buffer backward pushes: on a GPU
        through a pinned buffer (the copy is waited for before the host copy)."""
        if k == 0:
            return
        host = torch.frombuffer(self._worker.grad_rows(), dtype=torch.float32, count=k * D).view(k, D)
        if gw.device.type == "cpu":
            host.copy_(gw)
            return
        pinned = self._pin("grad", k, D)
        pinned.copy_(gw, non_blocking=True)
        torch.cuda.current_stream(gw.device).synchronize()
        host.copy_(pinned)

    # ------------------------------------------------------------------------------------------------ step
    def forward(self, local_embeddings, local_labels):
        """loss = module(local_embeddings (B, D) float, local_labels (B) or (B, 1) int): the global mean
        margin-softmax loss (0-d float32 tensor on the embeddings' device). Raises PfcpsError: a label outside
        [0, num_classes) (nothing sent; the module stays usable), a batch size other than the first call's,
        a server or ring failure (the module is unusable from then on); at the first forward of a module that
        joins there, the join's errors."""
        e = local_embeddings
        if e.dim() != 2 or e.shape[1] != self.embedding_size:
            raise _error(f"pfcps PartialFC: embeddings of shape {tuple(e.shape)}, want (batch, "
                         f"{self.embedding_size})")
        labels = local_labels.reshape(-1)
        B = e.shape[0]
        if labels.shape[0] != B:
            raise _error(f"pfcps PartialFC: {labels.shape[0]} labels for {B} embeddings")
        if labels.dtype.is_floating_point:
            raise _error(f"pfcps PartialFC: labels must be integers, not {labels.dtype}")
        if not self._worker.joined:
            if self._worker.step > 0 or self.run_config is not None:
                raise _error("pfcps PartialFC: forward after close()")
            want_b = (self._resume or {}).get("batch_size")
            if want_b is not None and want_b != B:
                raise _error(f"pfcps PartialFC: batch size {B}, but the state loaded was trained with batch size "
                             f"{want_b}")
            self._join()
        if self.batch_size is None:
            self._torch_head = self.head == "torch" or (self.head == "auto" and e.is_cuda)
            self._head = self._worker.head_init(B, self.sample_rate, self.s, self.m1, self.m2, self.m3,
                                                self.interclass_filtering_threshold, not self._torch_head)
            self.batch_size = B
        elif B != self.batch_size:
            raise _error(f"pfcps PartialFC: batch size changed from {self.batch_size} to {B}: pfcps's head is "
                         "sized at the first step (every rank's batch must keep that size: drop_last=True)")
        self._settle()
        fn = _TorchHeadFunction if self._torch_head else _PartialFCFunction
        loss = fn.apply(e, labels, self)
        if not (torch.is_grad_enabled() and e.requires_grad):
            self._worker.skip()  # no backward will come: the step ends with an empty, skipped push
        return loss

    def sampled_ids(self):
        """The class ids this rank sampled at the last forward (int64 tensor, ascending): its rows of the step,
        every positive of the global batch in its partition (classes c mod W == rank) plus its negatives."""
        b = self._worker.sampled_ids()
        return torch.frombuffer(bytearray(b), dtype=torch.int64) if b else torch.empty(0, dtype=torch.int64)

    def close(self, in_order=True):
        """Leaves the run in order: the last step's push goes, the ranks meet at a barrier, and the servers end
        the run when every worker has left. With in_order=False (a script that stops on an error it caught,
        or calls sys.exit with a non-zero code: the exit handler cannot see that code) it closes without that
        leave: the run takes this rank as lost and re-forms from its newest checkpoint instead of ending. When
        the leave cannot be in order (the module failed, another rank was lost or is still inside a step) it
        closes the same way and raises PfcpsError saying why, so the script does not end as if training
        finished."""
        if in_order and self._worker.joined:
            try:
                self._settle()
            except Exception:
                self._worker.close(in_order=False)
                raise
        self._worker.close(in_order=in_order)

    def extra_repr(self):
        return (f"embedding_size={self.embedding_size}, num_classes={self.num_classes}, "
                f"sample_rate={self.sample_rate}, rank={self.rank}/{self.world_size}, run={self.run!r}, "
                f"head={self.head!r}")
