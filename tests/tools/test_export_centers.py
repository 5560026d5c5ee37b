"""`pfcps export --centers`: partition files written here in the format of worker/train.c's dump_partition
(records of u64 little-endian class id + D float32; rank r holds classes c mod W == r) export to one safetensors
file that the `safetensors` package reads back with every row exact and in class order, D from RUN/model.ckpt
or --dim; refused with exit 1 and a message naming the file and the problem: a missing class (an id then out of
range), a duplicate id, an id out of range, a truncated file, a gap in the ranks, no partitions, no model.ckpt
without --dim; usage errors exit 2.
Usage: test_export_centers.py PFCPS MAKE_CKPT. Exit 77 when a module is missing."""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

PFCPS, MAKE_CKPT = sys.argv[1:3]
tmp = tempfile.mkdtemp(prefix="pfcps-centers-")
fails = 0


def check(cond, msg):
    global fails
    print(("ok   " if cond else "FAIL ") + msg)
    fails += not cond


def pfcps(*args):
    r = subprocess.run([PFCPS, "export"] + list(args), capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def write_parts(run, rows, W, ids_of=None, tail=b""):
    """rows: (C, D) float32; partition r gets classes c mod W == r in order (ids_of(r) overrides the ids)."""
    cdir = os.path.join(run, "centers")
    shutil.rmtree(cdir, ignore_errors=True)
    os.makedirs(cdir)
    for r in range(W):
        ids = ids_of(r) if ids_of else list(range(r, len(rows), W))
        with open(os.path.join(cdir, "partition.rank%d" % r), "wb") as f:
            for c in ids:
                f.write(struct.pack("<Q", c) + rows[c % len(rows)].astype("<f4").tobytes())
            if r == W - 1:
                f.write(tail)


rng = np.random.default_rng(5)
run = os.path.join(tmp, "run")
os.makedirs(run)
subprocess.run([MAKE_CKPT, os.path.join(run, "model.ckpt"), "r18_w8", "16", "1"], check=True)
C, D, W = 103, 16, 3
rows = rng.standard_normal((C, D)).astype(np.float32)
write_parts(run, rows, W)
out = os.path.join(tmp, "centers.safetensors")
rc, msg = pfcps("--centers", run, out)
check(rc == 0, "export: exit %d: %s" % (rc, msg.strip()))
if rc == 0:
    t = load_file(out)
    with safe_open(out, "np") as f:
        meta = f.metadata()
    check(list(t) == ["centers"] and t["centers"].dtype == np.float32 and t["centers"].shape == (C, D),
          "one tensor centers %s %s" % (t["centers"].dtype, t["centers"].shape))
    check(np.array_equal(t["centers"], rows), "every row exact, in class order")
    check(meta == {"format": "pt", "producer": "pfcps", "num_classes": str(C), "embedding_size": str(D),
                   "world_size": str(W)}, "metadata %s" % meta)

# --dim without model.ckpt; one partition; a .partial file beside is ignored
run2 = os.path.join(tmp, "run2")
os.makedirs(run2)
rows2 = rng.standard_normal((7, 5)).astype(np.float32)
write_parts(run2, rows2, 1, ids_of=lambda r: [3, 0, 6, 1, 5, 2, 4])
open(os.path.join(run2, "centers", "partition.rank1.partial"), "wb").write(b"junk")
rc, msg = pfcps("--centers", "--dim", "5", run2, out)
check(rc == 0 and np.array_equal(load_file(out)["centers"], rows2), "--dim 5, ids out of order: exit %d %s" % (rc, msg.strip()))
rc, msg = pfcps("--centers", run2, out)
check(rc == 1 and "model.ckpt: cannot open" in msg and "--dim" in msg, "no model.ckpt, no --dim: %s" % msg.strip())


def refused(what, want, *args):
    dst = os.path.join(tmp, "bad.safetensors")
    rc, msg = pfcps(*(args or ("--centers", run, dst)))
    ok = rc == 1 and want in msg and not os.path.exists(dst) and not os.path.exists(dst + ".tmp")
    check(ok, "%s refused: exit %d: %s" % (what, rc, msg.strip()))


p = lambda r: os.path.join(run, "centers", "partition.rank%d" % r)  # noqa: E731
# class 50 missing: 102 records, so rank 0's last id (102, its record 34) is out of range "or a class missing"
write_parts(run, rows, W, ids_of=lambda r: [c for c in range(r, C, W) if c != 50])
refused("missing class", "%s record 34: class id 102 out of range: the files hold 102 records, so ids must be "
        "0..101 (an id out of range, or a class missing)" % p(0))
write_parts(run, rows, W, ids_of=lambda r: [c if c != 50 else 47 for c in range(r, C, W)])
refused("duplicate id", "%s record 16: class id 47 appears a second time" % p(2))
write_parts(run, rows, W, ids_of=lambda r: [c if c != 4 else 1 << 40 for c in range(r, C, W)])
refused("id out of range", "%s record 1: class id 1099511627776 out of range" % p(1))
write_parts(run, rows, W, tail=b"\x01\x02\x03")
refused("truncated file", "%s: %d bytes is not a whole number of records of 8 + 4 x 16 bytes" % (p(2), 34 * 72 + 3))
write_parts(run, rows, W)
os.remove(p(1))
refused("gap in ranks", "%s: missing, but partition.rank2 is present" % p(1))
shutil.rmtree(os.path.join(run, "centers"))
os.makedirs(os.path.join(run, "centers"))
refused("no partitions", "no partition.rank<r> files")
refused("D from a mismatched --dim", "not a whole number of records", "--centers", "--dim", "7", run2,
        os.path.join(tmp, "bad.safetensors"))

for args, want in [(("--centers", run), "needs RUN_OUTPUT and OUT"),
                   (("--centers", "--format", "onnx", run, out), "exclude each other"),
                   (("--format", "tflite", run, out), "expected safetensors or onnx"),
                   (("--centers", "--dim", "0", run, out), "--dim needs an integer"),
                   (("--format", "onnx", "--opset", "11", run, out), "--opset needs an opset this exporter writes"),
                   ((run, out), "needs --format safetensors|onnx or --centers")]:
    rc, msg = pfcps(*args)
    check(rc == 2 and want in msg, "usage %s: exit %d: %s" % (" ".join(args[:-1]), rc, msg.strip().splitlines()[0]))
rc, msg = pfcps("--format", "onnx", os.path.join(run2, "centers", "partition.rank0"), out)
check(rc == 1 and "not a pfcps backbone checkpoint" in msg, "onnx of a non-checkpoint: %s" % msg.strip())

shutil.rmtree(tmp)
print("%d failure(s)" % fails)
sys.exit(1 if fails else 0)
