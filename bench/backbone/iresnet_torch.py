"""arcface_torch's iresnet rewritten from its published structure (for bench/backbone only):
stem conv3x3(3->64) BN PReLU; 4 stages (64/128/256/512, first block stride 2) of IBasicBlock
(BN, conv3x3, BN, PReLU, conv3x3 stride s, BN, + shortcut conv1x1+BN where shape changes);
head BN2d, flatten, dropout(0), Linear(512*49 -> D), BatchNorm1d(D) with fixed weight.
Usage: iresnet_torch.py NETWORK BATCH ITERS THREADS [WARMUP] -> prints one line as bench_backbone does:
the WARMUP (default 1) warm-up steps' time (first step apart), then the steady state: ITERS timed steps,
their total and median, and samples/s = ITERS * BATCH / total, for forward (training mode) + backward."""
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402
from torch import nn

LAYERS = {"r18": [2, 2, 2, 2], "r34": [3, 4, 6, 3], "r50": [3, 4, 14, 3],
          "r100": [3, 13, 30, 3], "r200": [6, 26, 60, 6]}


class IBasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(inplanes, eps=1e-5)
        self.conv1 = nn.Conv2d(inplanes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes, eps=1e-5)
        self.prelu = nn.PReLU(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes, eps=1e-5)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes, eps=1e-5))

    def forward(self, x):
        out = self.bn3(self.conv2(self.prelu(self.bn2(self.conv1(self.bn1(x))))))
        return out + (self.downsample(x) if self.downsample is not None else x)


class IResNet(nn.Module):
    def __init__(self, layers, num_features=512):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64, eps=1e-5)
        self.prelu = nn.PReLU(64)
        blocks, inplanes = [], 64
        for planes, n in zip([64, 128, 256, 512], layers):
            for i in range(n):
                blocks.append(IBasicBlock(inplanes, planes, 2 if i == 0 else 1))
                inplanes = planes
        self.layers = nn.Sequential(*blocks)
        self.bn2 = nn.BatchNorm2d(512, eps=1e-5)
        self.dropout = nn.Dropout(p=0.0, inplace=True)
        self.fc = nn.Linear(512 * 49, num_features)
        self.features = nn.BatchNorm1d(num_features, eps=1e-5)
        nn.init.constant_(self.features.weight, 1.0)
        self.features.weight.requires_grad = False
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0, 0.1)

    def forward(self, x):
        x = self.layers(self.prelu(self.bn1(self.conv1(x))))
        x = self.dropout(torch.flatten(self.bn2(x), 1))
        return self.features(self.fc(x))


def main():
    net, batch, iters, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    warmup = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    torch.set_num_threads(threads)
    model = IResNet(LAYERS[net]).train()
    params = sum(p.numel() for p in model.parameters())
    x = torch.rand(batch, 3, 112, 112) * 2 - 1
    g = torch.randn(batch, 512) * 1e-3
    t = []
    for _ in range(warmup + iters):
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=False)
        model(x).backward(g)
        t.append(time.perf_counter() - t0)
    warm, steady = t[:warmup], t[warmup:]
    print(f"torch {torch.__version__} {net} batch {batch} threads {torch.get_num_threads()} params {params}: "
          f"warm-up {warmup} steps {sum(warm):.3f} s first {warm[0] if warm else 0.0:.3f} s, "
          f"steady {iters} steps {sum(steady):.3f} s median {statistics.median(steady):.3f} s, "
          f"samples/s {iters * batch / sum(steady):.2f}")


if __name__ == "__main__":
    main()
