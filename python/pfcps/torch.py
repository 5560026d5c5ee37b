"""arcface_torch's PartialFC_V2 interface with the class centers on pfcps servers.

    module_partial_fc = pfcps.torch.PartialFC(margin_loss, cfg.embedding_size, cfg.num_classes,
                                              cfg.sample_rate, cfg.fp16, run="run.ini")
    opt = torch.optim.SGD(params=[{"params": backbone.parameters()},
                                  {"params": module_partial_fc.parameters()}], lr=..., momentum=..., weight_decay=...)
    loss = module_partial_fc(local_embeddings, local_labels)
    loss.backward()

Each torch rank joins the run named by `run` (a pfcps config file; the join secret from its `secret` key or
PFCPS_SECRET) as pfcps worker torch.distributed.get_rank() of get_world_size() (rank 0 of 1 without
torch.distributed). A call is one step of pfcps's C worker (worker/train.c, the head path): the labels of
every rank are allgathered over pfcps's ring, this rank samples its partition (classes c mod W == rank:
every positive plus uniform negatives up to int(sample_rate x partition), the run's sample_rounding), pulls
those rows from the
servers, and the CPU head (worker/head) computes the margin softmax over the allgathered W x B embeddings
with the softmax's max and sum allreduced: the loss is the mean over the global batch, the same on every
rank. backward() pushes the sampled rows' gradients to the servers (which apply SGD with the run's momentum
and weight_decay at the lr of the optimizer's param group holding this module's parameter) and returns
W x dL/d(local embeddings), arcface_torch's AllGather backward, for DDP's averaging.

The module's only parameter, `lr_carrier` (a 0-d tensor that never gets a gradient, so the optimizer leaves
it alone), is how the lr reaches the servers: the module finds the optimizer param group that holds it and
reads that group's `lr` at each backward, so the script's SGD / PolynomialLRWarmup lines stay unchanged.
Not supported (documented in docs/python.md): the GPU head (CUDA tensors are copied to the host), fp16
(the head runs in float32; fp16=True is accepted), gradient accumulation (every backward is an update of
the class centers), GradScaler's skipped steps for the class centers, checkpoint/resume of the module.
"""
import atexit
import gc
import os
import weakref

import torch

from . import _C
from ._C import PfcpsError


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
    # The run's margin_combine decides how the triple combines (pfcps._C's head_init: arcface_torch's rules by
    # default, refusing m1 != 1 with m3 = 0 as CombinedMarginLoss raises; `full` keeps any triple).
    return s, m1, m2, m3, thr


def _dist():
    d = torch.distributed
    if d.is_available() and d.is_initialized():
        return d.get_rank(), d.get_world_size()
    return 0, 1


_live = weakref.WeakSet()


@atexit.register
def _close_all():
    for m in list(_live):
        try:
            m.close()
        except Exception:
            pass


class _PartialFCFunction(torch.autograd.Function):
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
        module = ctx.module
        w = module._worker
        if not w.pending or w.step != ctx.step:
            raise _error(f"pfcps PartialFC: backward of step {ctx.step}, but that step was already ended (by a later "
                         f"forward, or a backward before); one forward, then its backward, per step")
        w.backward(module._lr())
        g = ctx.grad
        ctx.grad = None
        g = g * (float(module.world_size) * float(grad_loss.detach().to("cpu", torch.float64)))
        return g.to(ctx.emb_device, ctx.emb_dtype), None, None


class PartialFC(torch.nn.Module):
    """PartialFC(margin_loss, embedding_size, num_classes, sample_rate=1.0, fp16=False, *, run, sets=(), lr=None)

    margin_loss: arcface_torch's CombinedMarginLoss or any object with s, m1, m2, m3 (and
    interclass_filtering_threshold); its values are the head's, whatever the run config says.
    embedding_size, num_classes: must equal the run's (server 0's config), else ValueError.
    sample_rate: in [0, 1], this module's (pfcps sampling: positives plus uniform negatives per partition).
    run: path of the pfcps config file the servers were started with (rendezvous, servers, workers, secret).
    sets: "key=value" overrides of that file, as `--set` on a pfcps command line.
    lr: the class centers' lr when no optimizer param group holds this module's parameter (else the group's lr
    wins; assign module.lr to change it).
    Raises PfcpsError with pfcps's message when the join fails (servers or rendezvous unreachable within
    ctl_timeout, wrong secret) or the run does not match."""

    def __init__(self, margin_loss, embedding_size, num_classes, sample_rate=1.0, fp16=False, *, run,
                 sets=(), lr=None):
        super().__init__()
        self.s, self.m1, self.m2, self.m3, self.interclass_filtering_threshold = _margin_of(margin_loss)
        if not 0.0 <= float(sample_rate) <= 1.0:
            raise ValueError(f"sample_rate {sample_rate} outside [0, 1]")
        self.embedding_size = int(embedding_size)
        self.num_classes = int(num_classes)
        self.sample_rate = float(sample_rate)
        self.fp16 = bool(fp16)
        self.lr = lr
        self.rank, self.world_size = _dist()
        self.run = os.fspath(run)
        self._worker = _C.Worker(self.run, self.rank, self.world_size, [str(s) for s in sets],
                                 num_classes=self.num_classes, embedding_size=self.embedding_size)
        from . import _restore_stop_signals
        _restore_stop_signals()  # in case joining loaded another provider library that installs handlers
        cfg = self._worker.run_config
        self.run_config = cfg
        if cfg["num_classes"] != self.num_classes or cfg["embedding_size"] != self.embedding_size:
            self._worker.close()
            raise ValueError(f"PartialFC(embedding_size={self.embedding_size}, num_classes={self.num_classes}) but "
                             f"the run {self.run} has embedding_size = {cfg['embedding_size']}, num_classes = "
                             f"{cfg['num_classes']}")
        self.lr_carrier = torch.nn.Parameter(torch.zeros(()))
        self._group = None
        self.batch_size = None
        _live.add(self)

    @property
    def step(self):
        """The global step of the next forward (0-based): the steps this module has run."""
        return self._worker.step

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

    def _lr(self):
        g = self._find_group()
        if g is None:
            if self.lr is None:
                raise _error("pfcps PartialFC: no optimizer param group holds this module's parameters (add "
                             "{'params': module.parameters()} to the optimizer, or set module.lr)")
            return float(self.lr)
        cfg = self.run_config
        for key, want in (("momentum", cfg["momentum"]), ("weight_decay", cfg["weight_decay"])):
            have = g.get(key, 0.0)
            if abs(float(have) - want) > 1e-12 * max(1.0, abs(want)):
                raise _error(f"pfcps PartialFC: the optimizer's {key} is {have} but the servers apply the run's "
                             f"{key} = {want} (set it in {self.run})")
        if "betas" in g or g.get("nesterov", False) or g.get("dampening", 0) != 0:
            raise _error("pfcps PartialFC: the servers apply SGD (momentum, weight decay, no dampening or "
                         "Nesterov); this optimizer group asks for something else")
        return float(g["lr"])

    def forward(self, local_embeddings, local_labels):
        """loss = module(local_embeddings (B, D) float, local_labels (B) or (B, 1) int): the global mean
        margin-softmax loss (0-d float32 tensor on the embeddings' device). Raises PfcpsError: a label outside
        [0, num_classes) (nothing sent; the module stays usable), a batch size other than the first call's,
        a server or ring failure (the module is unusable from then on)."""
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
        if self.batch_size is None:
            self._worker.head_init(B, self.sample_rate, self.s, self.m1, self.m2, self.m3,
                                   self.interclass_filtering_threshold)
            self.batch_size = B
        elif B != self.batch_size:
            raise _error(f"pfcps PartialFC: batch size changed from {self.batch_size} to {B}: pfcps's head is "
                         "sized at the first step (every rank's batch must keep that size: drop_last=True)")
        loss = _PartialFCFunction.apply(e, labels, self)
        if not (torch.is_grad_enabled() and e.requires_grad):
            self._worker.skip()  # no backward will come: the step ends with an empty, skipped push
        return loss

    def sampled_ids(self):
        """The class ids this rank sampled at the last forward (int64 tensor, ascending): its rows of the step,
        every positive of the global batch in its partition (classes c mod W == rank) plus its negatives."""
        b = self._worker.sampled_ids()
        return torch.frombuffer(bytearray(b), dtype=torch.int64) if b else torch.empty(0, dtype=torch.int64)

    def close(self):
        """Leaves the run in order (the servers end the run when every worker has left)."""
        self._worker.close()

    def extra_repr(self):
        return (f"embedding_size={self.embedding_size}, num_classes={self.num_classes}, "
                f"sample_rate={self.sample_rate}, rank={self.rank}/{self.world_size}, run={self.run!r}")
