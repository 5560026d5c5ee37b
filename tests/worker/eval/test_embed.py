"""`pfcps embed` against PyTorch: a tiny iresnet (r18_w8, D 16) written here from the architecture's facts
(arcface_torch backbones/iresnet.py; worker/model/model.h), loaded with the checkpoint's tensors read from
the model.ckpt layout (worker/model/model.h), run in float64 eval mode on inputs preprocessed here
(PGM parsed here, padding / bilinear resize, PIL's JPEG decode, (x/255 - 0.5)/0.5), to 1e-4:
  - ORL PGMs (92x112) from a list file with --pad (centred on a black 112x112 canvas), with and without --flip
    (flip: the flipped image's embedding added);
  - the same images without --pad: resized (half-pixel bilinear, OpenCV INTER_LINEAR), the note printed;
  - a folder input: recursive, sorted by path bytes (10.pgm before 2.pgm);
  - a .bin set pickled here from JPEGs packed by `pfcps pack`, with --flip, and the RecordIO pack itself
    (the same rows in the same order).
Usage: test_embed.py PFCPS MAKE_CKPT SRC. Exit 77 when a module is missing."""
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    from torch import nn
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

PFCPS, MAKE_CKPT, SRC = sys.argv[1:4]
tmp = tempfile.mkdtemp(prefix="pfcps-embed-")
fails = 0


def check(cond, msg):
    global fails
    print(("ok   " if cond else "FAIL ") + msg)
    fails += not cond


def run(*args):
    r = subprocess.run([PFCPS] + list(args), capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit("pfcps %s: exit %d" % (" ".join(args), r.returncode))
    return r.stdout


# ---- the checkpoint (model.h: header 64 + checksum 8, tensor table, extras, payload) ----
ckpt = os.path.join(tmp, "model.ckpt")
subprocess.run([MAKE_CKPT, ckpt, "r18_w8", "16", "7"], check=True)
sys.path.insert(0, os.path.join(SRC, "tests"))
import pfcps_ckpt  # noqa: E402
ck = pfcps_ckpt.read(ckpt)
raw, payload, table, net, D, ntens = bytes(ck.raw), ck.payload, ck.tensors, ck.network, ck.dim, len(ck.tensors)
state = {n: torch.from_numpy(np.frombuffer(raw, "<f4", int(np.prod(s)), payload + o).reshape(s).astype(np.float64))
         for n, s, o in table}
print("checkpoint: %s D %d, %d tensors" % (net, D, ntens))


# ---- iresnet from the facts (arcface_torch backbones/iresnet.py) ----
class IBasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin, eps=1e-5)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout, eps=1e-5)
        self.prelu = nn.PReLU(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout, eps=1e-5)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout, eps=1e-5))

    def forward(self, x):
        out = self.bn3(self.conv2(self.prelu(self.bn2(self.conv1(self.bn1(x))))))
        return out + (self.downsample(x) if self.downsample is not None else x)


class IResNet(nn.Module):
    def __init__(self, layers, widths, d):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0], eps=1e-5)
        self.prelu = nn.PReLU(widths[0])
        cin = widths[0]
        for s, (n, w) in enumerate(zip(layers, widths)):
            blocks = []
            for i in range(n):
                blocks.append(IBasicBlock(cin, w, 2 if i == 0 else 1))
                cin = w
            setattr(self, "layer%d" % (s + 1), nn.Sequential(*blocks))
        self.bn2 = nn.BatchNorm2d(widths[3], eps=1e-5)
        self.dropout = nn.Dropout(p=0.0)
        self.fc = nn.Linear(widths[3] * 49, d)
        self.features = nn.BatchNorm1d(d, eps=1e-5)

    def forward(self, x):
        x = self.prelu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.features(self.fc(self.dropout(torch.flatten(self.bn2(x), 1))))


assert net == "r18_w8"
model = IResNet([2, 2, 2, 2], [8, 16, 32, 64], D).double().eval()
sd = model.state_dict()
missing = [k for k in sd if k not in state and not k.endswith("num_batches_tracked")]
extra = [k for k in state if k not in sd]
check(not missing and not extra, "checkpoint names = PyTorch state_dict names (missing %s, extra %s)" % (missing, extra))
model.load_state_dict({k: state.get(k, sd[k]) for k in sd})


def forward(rgb_list, flip=False):
    x = np.stack([((im.astype(np.float32) / np.float32(255)) - np.float32(0.5)) / np.float32(0.5) for im in rgb_list])
    x = torch.from_numpy(x.transpose(0, 3, 1, 2).astype(np.float64))
    with torch.no_grad():
        e = model(x)
        if flip:
            e = e + model(torch.flip(x, dims=[3]))
    return e.numpy()


def close(name, got, want):
    err = np.max(np.abs(got - want)) / max(1.0, np.max(np.abs(want)))
    check(got.shape == want.shape and err <= 1e-4, "%s: %s vs PyTorch float64, max rel err %.2e" % (name, got.shape, err))


def read_pgm(path):
    b = open(path, "rb").read()
    f = b.split(maxsplit=4)
    assert f[0] == b"P5" and int(f[3]) == 255
    w, h = int(f[1]), int(f[2])
    g = np.frombuffer(f[4][-w * h:], np.uint8).reshape(h, w)
    return np.repeat(g[:, :, None], 3, axis=2)


def pad112(im):
    h, w, _ = im.shape
    out = np.zeros((112, 112, 3), np.uint8)
    oy, ox = (112 - h) // 2, (112 - w) // 2
    out[oy:oy + h, ox:ox + w] = im
    return out


def resize112(im):
    # half-pixel bilinear (OpenCV INTER_LINEAR), in float32 as worker/data/image.c documents
    h, w, _ = im.shape
    out = np.zeros((112, 112, 3), np.uint8)
    sx, sy = np.float32(w) / np.float32(112), np.float32(h) / np.float32(112)
    src = im.astype(np.float32)
    for y in range(112):
        fy = max(np.float32((np.float32(y) + np.float32(0.5)) * sy - np.float32(0.5)), np.float32(0))
        y0 = min(int(fy), h - 1)
        y1 = min(y0 + 1, h - 1)
        wy = min(np.float32(fy - np.float32(y0)), np.float32(1))
        for x in range(112):
            fx = max(np.float32((np.float32(x) + np.float32(0.5)) * sx - np.float32(0.5)), np.float32(0))
            x0 = min(int(fx), w - 1)
            x1 = min(x0 + 1, w - 1)
            wx = min(np.float32(fx - np.float32(x0)), np.float32(1))
            one = np.float32(1)
            v = (src[y0, x0] * (one - wx) + src[y0, x1] * wx) * (one - wy) + (src[y1, x0] * (one - wx) + src[y1, x1] * wx) * wy
            out[y, x] = np.clip((v + np.float32(0.5)).astype(np.int32), 0, 255)
    return out


# ---- ORL PGMs through a list file ----
paths = [os.path.join(SRC, "data/orl/s%d/%d.pgm" % (s, i)) for s, i in ((31, 1), (31, 2), (35, 10), (40, 3), (33, 7))]
lst = os.path.join(tmp, "list.txt")
open(lst, "w").write("\n".join(paths) + "\n")
imgs = [read_pgm(p) for p in paths]
out = os.path.join(tmp, "e.npy")
run("embed", "--pad", "--batch", "2", ckpt, lst, out)
close("ORL list, --pad", np.load(out), forward([pad112(i) for i in imgs]))
msg = run("embed", "--pad", "--flip", ckpt, lst, out)
close("ORL list, --pad --flip", np.load(out), forward([pad112(i) for i in imgs], flip=True))
check("5 of 5 images were not 112x112" in msg and "padded" in msg, "the padding is reported: " + msg.strip())
msg = run("embed", ckpt, lst, out)
close("ORL list, resized", np.load(out), forward([resize112(i) for i in imgs]))
check("5 of 5 images were not 112x112 and were resized" in msg, "the resize is reported")
check(np.load(out).dtype == np.float32, ".npy is float32")

# ---- a folder: recursive, byte-order sorted ----
fold = os.path.join(tmp, "folder")
os.makedirs(os.path.join(fold, "b"))
order = []
for name, p in (("b/2.pgm", paths[0]), ("b/10.pgm", paths[1]), ("a.pgm", paths[2])):
    shutil.copy(p, os.path.join(fold, name))
run("embed", "--pad", ckpt, fold, out)
want = forward([pad112(imgs[2]), pad112(imgs[1]), pad112(imgs[0])])  # a.pgm, b/10.pgm, b/2.pgm
close("folder (a.pgm, b/10.pgm, b/2.pgm)", np.load(out), want)

# ---- a .bin set of JPEGs packed by pfcps pack, and the pack itself ----
try:
    from PIL import Image
    import io
except ImportError:
    Image = None
stage = os.path.join(tmp, "stage")
os.makedirs(stage)
for s in (31, 32):
    os.symlink(os.path.join(SRC, "data/orl/s%d" % s), os.path.join(stage, "s%d" % s))
run("pack", "--resize", "--quiet", stage, os.path.join(tmp, "pack"))
jpegs = []
rec = open(os.path.join(tmp, "pack.rec"), "rb").read()
for line in open(os.path.join(tmp, "pack.idx")):
    key, off = map(int, line.split())
    magic, lrec = struct.unpack_from("<II", rec, off)
    assert magic == 0xCED7230A and lrec >> 29 == 0
    flag = struct.unpack_from("<I", rec, off + 8)[0]
    body = rec[off + 8 + 24 + 4 * flag:off + 8 + (lrec & ((1 << 29) - 1))]
    if body[:3] == b"\xff\xd8\xff":
        jpegs.append(body)
jpegs = jpegs[:8]
binp = os.path.join(tmp, "set.bin")
with open(binp, "wb") as f:
    pickle.dump((jpegs, [True, False, True, False]), f, protocol=4)
run("embed", "--flip", ckpt, binp, out)
got_bin = np.load(out)
if Image is None:
    print("note: PIL missing: the .bin embeddings are not checked against PyTorch")
else:
    rgb = [np.asarray(Image.open(io.BytesIO(j)).convert("RGB")) for j in jpegs]
    close(".bin set (JPEG, PIL decode), --flip", got_bin, forward(rgb, flip=True))
run("embed", "--flip", ckpt, os.path.join(tmp, "pack"), out)
got_rec = np.load(out)
# (oneDNN may pick other kernels for another batch size: equal to float32 rounding, not bitwise)
d = np.max(np.abs(got_rec[:8] - got_bin)) / max(1.0, np.max(np.abs(got_bin)))
check(got_rec.shape[0] == 20 and d <= 1e-5,
      "RecordIO input: %d rows, the first 8 equal the .bin rows (same JPEGs, same order), max rel diff %.2e"
      % (got_rec.shape[0], d))

shutil.rmtree(tmp)
print("FAIL" if fails else "ok")
sys.exit(1 if fails else 0)
