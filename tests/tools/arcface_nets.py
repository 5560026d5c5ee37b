"""arcface_torch's backbones for the export tests, with its state_dict names (insightface
recognition/arcface_torch/backbones/iresnet.py and mobilefacenet.py; the facts are in worker/model/model.h).
- IResNet: arcface_torch's layer1..layer4 with stage widths (w, 2w, 4w, 8w) so that the narrow test networks
  (r18_w16) load too. The block is bench/backbone/iresnet_torch.py's IBasicBlock (imported, not copied); that
  file's IResNet is not used: it holds its blocks in one Sequential `layers.<i>` (keys `layers.0.bn1.weight`),
  not arcface_torch's `layer1.0.bn1.weight`, and has the widths fixed at 64..512.
- MobileFaceNet(blocks=(1, 4, 6, 2), scale=2): ConvBlock / LinearBlock / DepthWise / Residual / GDC as in
  mobilefacenet.py (BatchNorm eps 1e-5 throughout, depthwise convolutions as grouped Conv2d)."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "backbone"))
from iresnet_torch import IBasicBlock  # noqa: E402

LAYERS = {"r18": [2, 2, 2, 2], "r34": [3, 4, 6, 3], "r50": [3, 4, 14, 3], "r100": [3, 13, 30, 3],
          "r200": [6, 26, 60, 6]}


class IResNet(nn.Module):
    def __init__(self, layers, width=64, num_features=512, dropout=0.0):
        super().__init__()
        w = [width, 2 * width, 4 * width, 8 * width]
        self.conv1 = nn.Conv2d(3, w[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(w[0], eps=1e-5)
        self.prelu = nn.PReLU(w[0])
        inplanes = w[0]
        for s in range(4):
            blocks = []
            for i in range(layers[s]):
                blocks.append(IBasicBlock(inplanes, w[s], 2 if i == 0 else 1))
                inplanes = w[s]
            setattr(self, "layer%d" % (s + 1), nn.Sequential(*blocks))
        self.bn2 = nn.BatchNorm2d(w[3], eps=1e-5)
        self.dropout = nn.Dropout(p=dropout, inplace=True)
        self.fc = nn.Linear(w[3] * 49, num_features)
        self.features = nn.BatchNorm1d(num_features, eps=1e-5)
        nn.init.constant_(self.features.weight, 1.0)
        self.features.weight.requires_grad = False

    def forward(self, x):
        x = self.prelu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.dropout(torch.flatten(self.bn2(x), 1))
        return self.features(self.fc(x))


def iresnet(name, num_features):
    """r18 .. r200, optionally with a width suffix _wN (worker/model/zoo.c)."""
    base, _, w = name.partition("_w")
    return IResNet(LAYERS[base], int(w) if w else 64, num_features)


class ConvBlock(nn.Module):
    def __init__(self, in_c, out_c, kernel=1, stride=1, padding=0, groups=1):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(in_c, out_c, kernel, groups=groups, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(num_features=out_c), nn.PReLU(num_parameters=out_c))

    def forward(self, x):
        return self.layers(x)


class LinearBlock(nn.Module):
    def __init__(self, in_c, out_c, kernel=1, stride=1, padding=0, groups=1):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(in_c, out_c, kernel, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(num_features=out_c))

    def forward(self, x):
        return self.layers(x)


class DepthWise(nn.Module):
    def __init__(self, in_c, out_c, residual=False, kernel=3, stride=2, padding=1, groups=1):
        super().__init__()
        self.residual = residual
        self.layers = nn.Sequential(
            ConvBlock(in_c, groups, 1, 1, 0),
            ConvBlock(groups, groups, kernel, stride, padding, groups=groups),
            LinearBlock(groups, out_c, 1, 1, 0))

    def forward(self, x):
        y = self.layers(x)
        return x + y if self.residual else y


class Residual(nn.Module):
    def __init__(self, c, num_block, groups, kernel=3, stride=1, padding=1):
        super().__init__()
        self.layers = nn.Sequential(*[DepthWise(c, c, True, kernel, stride, padding, groups)
                                      for _ in range(num_block)])

    def forward(self, x):
        return self.layers(x)


class GDC(nn.Module):
    def __init__(self, embedding_size):
        super().__init__()
        self.layers = nn.Sequential(
            LinearBlock(512, 512, 7, 1, 0, groups=512), nn.Flatten(),
            nn.Linear(512, embedding_size, bias=False), nn.BatchNorm1d(embedding_size))

    def forward(self, x):
        return self.layers(x)


class MobileFaceNet(nn.Module):
    def __init__(self, num_features=512, blocks=(1, 4, 6, 2), scale=2):
        super().__init__()
        s = scale
        self.layers = nn.ModuleList()
        self.layers.append(ConvBlock(3, 64 * s, 3, 2, 1))
        if blocks[0] == 1:
            self.layers.append(ConvBlock(64 * s, 64 * s, 3, 1, 1, groups=64))
        else:
            self.layers.append(Residual(64 * s, blocks[0], 128))
        self.layers.extend([
            DepthWise(64 * s, 64 * s, False, 3, 2, 1, groups=128),
            Residual(64 * s, blocks[1], 128),
            DepthWise(64 * s, 128 * s, False, 3, 2, 1, groups=256),
            Residual(128 * s, blocks[2], 256),
            DepthWise(128 * s, 128 * s, False, 3, 2, 1, groups=512),
            Residual(128 * s, blocks[3], 256),
        ])
        self.conv_sep = ConvBlock(128 * s, 512, 1, 1, 0)
        self.features = GDC(num_features)

    def forward(self, x):
        for f in self.layers:
            x = f(x)
        return self.features(self.conv_sep(x))


def backbone(name, num_features):
    return MobileFaceNet(num_features) if name == "mbf" else iresnet(name, num_features)
