"""Writes arcface_torch-style .bin verification sets for tests/worker/eval/test_binset.c.

Usage: make_binsets.py OUTDIR
  expected.dat   the truth, written here without pickle: u32 N, N issame bytes, then 2N x (u32 len, bytes)
  py3_p3.bin, py3_p4.bin, py3_p5.bin   pickle.dump((bins, issame), protocol=3/4/5), bins a list of bytes
  py2_p2.bin     what Python 2's pickle.dump(..., protocol=2) writes for (list of str, list of bool),
                 written opcode by opcode: PROTO 2, EMPTY_LIST, BINPUT, MARK, SHORT_BINSTRING / BINSTRING
                 (+ BINPUT), APPENDS (batches of 1000, as pickle's _batch_appends), NEWTRUE / NEWFALSE,
                 TUPLE2, BINPUT, STOP
  py2_p0.bin     the same with Python 2's protocol 1 bools (INT "I01\n" / "I00\n") and single APPENDs,
                 a repeated image as BINGET (the memo, as a pickler writes for the same object twice)
  bad_*.bin      hostile or malformed pickles; bad.txt lists `name<TAB>substring the refusal must contain`
The images are random bytes (the reader never decodes them); one is over 255 bytes (BINSTRING) and one
over 64 KiB (BINBYTES in protocol 3+)."""
import os
import pickle
import random
import struct
import sys
from collections import OrderedDict

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = random.Random(13)
N = 7
bins = [bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 5, 200, 255, 256, 3000])))
        for _ in range(2 * N)]
bins[3] = bytes(rng.randrange(256) for _ in range(70000))
issame = [rng.random() < 0.5 for _ in range(N)]
issame[0], issame[1] = True, False


def w(name, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)


exp = struct.pack("<I", N) + bytes(int(b) for b in issame)
for b in bins:
    exp += struct.pack("<I", len(b)) + b
w("expected.dat", exp)
for p in (3, 4, 5):
    w("py3_p%d.bin" % p, pickle.dumps((bins, issame), protocol=p))


def py2_str(b):
    return (b"U" + bytes([len(b)]) + b) if len(b) < 256 else (b"T" + struct.pack("<i", len(b)) + b)


def py2_p2():
    o = b"\x80\x02" + b"]q\x00"
    memo = 1
    for k in range(0, len(bins), 1000):
        o += b"("
        for b in bins[k:k + 1000]:
            o += py2_str(b) + b"q" + bytes([memo])
            memo += 1
        o += b"e"
    o += b"]q" + bytes([memo])
    memo += 1
    o += b"(" + b"".join(b"\x88" if s else b"\x89" for s in issame) + b"e"
    o += b"\x86q" + bytes([memo]) + b"."
    return o


def py2_p0():
    # protocol 1 style: EMPTY_LIST, APPEND one by one, bools as INT, image 5 repeated from the memo (BINGET)
    o = b"]q\x00"
    memo = 1
    where = {}
    for i, b in enumerate(bins):
        if i == 5:
            o += b"h" + bytes([where[2]]) + b"a"
            continue
        o += py2_str(b) + b"q" + bytes([memo]) + b"a"
        where[i] = memo
        memo += 1
    o += b"]r" + struct.pack("<I", memo)
    for s in issame:
        o += (b"I01\n" if s else b"I00\n") + b"a"
    o += b"\x86."
    return o


w("py2_p2.bin", py2_p2())
bins_p0 = list(bins)
bins_p0[5] = bins[2]
w("py2_p0.bin", py2_p0())
exp0 = struct.pack("<I", N) + bytes(int(b) for b in issame)
for b in bins_p0:
    exp0 += struct.pack("<I", len(b)) + b
w("expected_p0.dat", exp0)

# hostile / malformed, each with the substring its refusal names
bad = []


def b_(name, data, want):
    w("bad_" + name + ".bin", data)
    bad.append("bad_%s.bin\t%s" % (name, want))


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


b_("reduce", pickle.dumps((bins[:2], [Evil()]), protocol=2), "GLOBAL")
b_("reduce4", pickle.dumps((bins[:2], [Evil()]), protocol=4), "not allowed")
b_("py3_p2_bytes", pickle.dumps((bins[:2], [True]), protocol=2), "GLOBAL")  # py3 bytes at protocol 2: codecs.encode
b_("dict", pickle.dumps((bins[:2], OrderedDict(a=1)), protocol=4), "not allowed")
b_("unicode", pickle.dumps((["a", "b"], [True]), protocol=4), "SHORT_BINUNICODE")
b_("int", pickle.dumps((bins[:2], [1]), protocol=4), "BININT1")
b_("huge_binbytes8", b"\x80\x04\x8e" + struct.pack("<Q", 1 << 62) + b"xx", "truncated")
b_("huge_binbytes", b"\x80\x03B" + struct.pack("<I", 0xFFFFFFF0) + b"xx", "truncated")
b_("negative_binstring", b"\x80\x02T" + struct.pack("<i", -5) + b"xx", "negative")
b_("huge_frame", b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"].", "FRAME")
b_("deep_marks", b"\x80\x02" + b"(" * 100000 + b".", "more than 8 MARKs open")
b_("deep_lists", b"\x80\x02" + b"]" * 100000 + b"a" * 99999 + b".", "values nested deeper than 8")
b_("memo_skip", b"\x80\x02]r" + struct.pack("<I", 0xFFFFFFFF) + b".", "memo index")
b_("memo_unset", b"\x80\x02h\x05.", "never stored")
b_("list_top", pickle.dumps([bins[:2], [True]], protocol=4), "expected a tuple")
b_("tuple3", pickle.dumps((bins[:2], [True], [True]), protocol=4), "expected a tuple")
b_("count", pickle.dumps((bins[:3], [True]), protocol=4), "3 images for 1 pairs")
b_("no_pairs", pickle.dumps(([], []), protocol=4), "at least one pair")
b_("bool_image", pickle.dumps(([True, b"x"], [True]), protocol=4), "image 0 is a bool")
b_("bytes_issame", pickle.dumps(([b"x", b"y"], [b"z"]), protocol=4), "issame[0] is a bytes")
b_("append_tuple", b"\x80\x02)\x88a.", "APPEND")
b_("appends_nomark", b"\x80\x02]\x88e.", "without a MARK")
b_("underflow", b"\x80\x02\x86.", "underflow")
b_("proto9", b"\x80\x09].", "protocol 9")
b_("empty", b"", "no STOP")
b_("not_opcode", b"\x80\x02\xff", "not a pickle opcode")
b_("mark_mark_tuple", b"((t", "no STOP")  # found by fuzz_binset: a TUPLE on an empty stack wrote through NULL
b_("trailing_stack", b"\x80\x02]].", "STOP")
w("bad.txt", ("\n".join(bad) + "\n").encode())

# The hand-written Python 2 pickles are real pickles: Python's own loader reads them as arcface_torch does.
for name, want in (("py2_p2.bin", bins), ("py2_p0.bin", bins_p0)):
    with open(os.path.join(out, name), "rb") as f:
        got = pickle.load(f, encoding="bytes")
    assert got == (want, issame), name
