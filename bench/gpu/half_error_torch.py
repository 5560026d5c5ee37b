"""The error of PyTorch's mixed precision on the network of test_model_half --batch (tests/worker/model):
iresnet (tests/tools/arcface_nets.py) with layers 1 1 1 1, widths 8 16 32 64, embedding 32, batch 8, training
mode; random input and embedding gradient in [-1, 1]. One fp32 run (TF32 off) against autocast fp16 (the
embedding gradient times GradScaler's loss scale, 2^16 halved while a gradient overflows, divided out after) and
autocast bf16, cuDNN in benchmark mode (arcface_torch's setting: the fastest algorithm per shape). As
arcface_torch's iresnet (and pfcps's half devices), the body runs under autocast and fc and the features
BatchNorm1d in fp32.
Prints per precision the relative L2 error of the output, the input gradient and all parameter gradients as
one vector, also in units of the format's unit roundoff u (fp16 2^-11, bf16 2^-8): the peer for the bounds of
test_model_half --batch on cuda-fp16 / cuda-bf16 (and, with --device cpu, bf16 only, for cpu-bf16).

Usage: half_error_torch.py [SEEDS (default 4)] [--device cuda|cpu]"""
import argparse
import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "tools"))
from arcface_nets import IResNet  # noqa: E402


def rel(a, b):
    return (torch.linalg.vector_norm((a - b).double()) / torch.linalg.vector_norm(b.double())).item()


def forward(net, x, device, dtype):
    """arcface_torch's iresnet forward: the body under autocast, fc and features in fp32."""
    with torch.autocast(device, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext():
        x = net.prelu(net.bn1(net.conv1(x)))
        x = net.layer4(net.layer3(net.layer2(net.layer1(x))))
        x = net.dropout(torch.flatten(net.bn2(x), 1))
    return net.features(net.fc(x.float()))


def run(net, x, g, device, dtype, scale):
    net.zero_grad(set_to_none=True)
    xx = x.clone().requires_grad_(True)
    y = forward(net, xx, device, dtype)
    (y * (g * scale)).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in net.parameters() if p.grad is not None]) / scale
    return y.float().detach(), xx.grad.detach() / scale, grads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("seeds", type=int, nargs="?", default=4)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = ap.parse_args()
    dev = a.device
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    formats = [("bf16", torch.bfloat16, 2.0 ** -8)]
    if dev == "cuda":  # CPU autocast has bf16 only
        formats.insert(0, ("fp16", torch.float16, 2.0 ** -11))
    for seed in range(a.seeds):
        torch.manual_seed(seed)
        net = IResNet([1, 1, 1, 1], width=8, num_features=32).to(dev).train()
        state = {k: v.clone() for k, v in net.state_dict().items()}
        x = torch.rand(8, 3, 112, 112, device=dev) * 2 - 1
        g = torch.rand(8, 32, device=dev) * 2 - 1
        ref = run(net, x, g, dev, torch.float32, 1.0)
        for name, dtype, u in formats:
            scale = 2.0 ** 16 if dtype == torch.float16 else 1.0
            while True:
                net.load_state_dict(state)  # the same running statistics before each forward
                got = run(net, x, g, dev, dtype, scale)
                if all(torch.isfinite(t).all() for t in got[1:]) or scale <= 1:
                    break
                scale /= 2
            net.load_state_dict(state)
            e = [rel(a, b) for a, b in zip(got, ref)]
            print(f"torch {torch.__version__} seed {seed} {name} (loss scale {scale:g}): output rel {e[0]:.3e} "
                  f"({e[0] / u:.1f}u), grad_input rel {e[1]:.3e} ({e[1] / u:.1f}u), all parameter gradients "
                  f"rel {e[2]:.3e} ({e[2] / u:.1f}u)")


if __name__ == "__main__":
    main()
