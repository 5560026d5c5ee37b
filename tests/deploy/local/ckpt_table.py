#!/usr/bin/env python3
"""An independent reader of the class-center table of a checkpoint (the checkpoint tests' reference).

Reads <root>/step-<T>/shard-<s>-of-<S>.snap (common/snapfile.h: magic "PFCPSNP1", u32 LE header length, a
protobuf SnapshotHeader of proto/ctl.proto, the payload from byte 4096: per block of block_rows local rows the
block's weights (n x D fp32) then its momentum (n x D fp32); local row k of shard s is class k * S + s), checks
each payload against the header's SHA-256, and rebuilds the table in class order. Nothing of pfcps is used.
A file with header field 18 (dense) set (pfc_update = dense) starts with mu, wd and the lr of steps 0 .. T-1
(float64), and each block ends with its rows' steps (int64): a row stored as after s steps is brought to step T
here with the closed form of steps s .. T-1 of zero-gradient torch SGD, as docs/arcface_parity.md ("Dense update
at sparse cost") writes it: M = A_{T-1} A_{T-2} ... A_s folded from the latest step down in float64,
A_t = [[mu, wd], [-lr_t mu, 1 - lr_t wd]] (a NaN lr: a skipped step, left out), then per element
v' = fp32(M00 v + M01 w), w' = fp32(M10 v + M11 w).
A file with header field 19 (adamw) set (optimizer = adamw) starts with beta1, beta2, eps, wd and the lr of steps
0 .. T-1 (float64, dense or not), and each block holds its weights, first moments and second moments (n x D fp32
each; dense: then the rows' steps): a dense row stored as after s steps is brought to step T here by running the
zero-gradient steps s .. T-1 of torch 1.13's AdamW in float32 (each operation rounded to float32; t counts the
steps whose lr is not NaN): w = w * fp32(1 - lr wd); m = m * fp32(b1) + fp32(1 - b1) * 0;
v = v * fp32(b2) + (fp32(1 - b2) * 0) * 0; w = w + (fp32(-lr / (1 - b1^t)) * m) / (sqrt(v) / fp32(sqrt(1 - b2^t)) +
fp32(eps)). Its digest covers weights, first and second moments of each class.

  ckpt_table.py digest ROOT STEP
      prints the SHA-256 of the table in class order (weights then momentum of class 0, 1, ...): what
      `pfcps ckpt-info` prints as `table`, computed here from the files alone.
  ckpt_table.py dump-equal ROOT STEP PREFIX W
      the worker dumps PREFIX.rank<w> (w < W; `pfcps-worker --dump-centers`: records of u64 class id and D fp32)
      must hold every class exactly once with exactly the weights saved in checkpoint STEP (bitwise).
"""
import glob
import hashlib
import math
import os
import re
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from pfcps_snap import Snap  # noqa: E402

HDR_AREA = 4096


def header(raw, path):
    """The SnapshotHeader's fields {number: value} (tests/pfcps_snap.py's reader); exits naming path if bad."""
    try:
        return Snap(raw).fields
    except (AssertionError, ValueError, IndexError, struct.error) as e:
        sys.exit(f"{path}: {e}")


def catch_up(w, m, D, lrs, first, T, mu, wd):
    """Row (w, m: D fp32 bytes each) stored as after `first` steps, as it stands after T (module docstring)."""
    M = None
    for t in range(T - 1, first - 1, -1):
        lr = lrs[t]
        if math.isnan(lr):
            continue
        A = (mu, wd, -lr * mu, 1.0 - lr * wd)
        M = A if M is None else (M[0] * A[0] + M[1] * A[2], M[0] * A[1] + M[1] * A[3],
                                 M[2] * A[0] + M[3] * A[2], M[2] * A[1] + M[3] * A[3])
    if M is None:
        return w, m
    wv, mv = struct.unpack(f"<{D}f", w), struct.unpack(f"<{D}f", m)
    m2 = struct.pack(f"<{D}f", *[M[0] * v + M[1] * x for v, x in zip(mv, wv)])
    w2 = struct.pack(f"<{D}f", *[M[2] * v + M[3] * x for v, x in zip(mv, wv)])
    return w2, m2


def f32(x):
    """x rounded to float32 (a float32 operation done in double and rounded once gives the float32 result)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def adamw_catch_up(w, m, v, D, lrs, first, T, hp):
    """Row (w, m, v: D fp32 bytes each) stored as after `first` steps, replayed to T (module docstring)."""
    b1, b2, eps, wd = hp
    n = sum(1 for t in range(first) if not math.isnan(lrs[t]))
    if all(math.isnan(lrs[t]) for t in range(first, T)):
        return w, m, v
    W, M, V = (list(struct.unpack(f"<{D}f", x)) for x in (w, m, v))
    b1f, omb1, b2f, omb2, epsf = f32(b1), f32(1.0 - b1), f32(b2), f32(1.0 - b2), f32(eps)
    for t in range(first, T):
        lr = lrs[t]
        if math.isnan(lr):
            continue
        n += 1
        decay, nss = f32(1.0 - lr * wd), f32(-(lr / (1.0 - b1 ** n)))
        bc2s = f32(math.sqrt(1.0 - b2 ** n))
        for j in range(D):
            wj = f32(W[j] * decay)
            M[j] = f32(f32(M[j] * b1f) + f32(omb1 * 0.0))
            V[j] = f32(f32(V[j] * b2f) + f32(f32(omb2 * 0.0) * 0.0))
            den = f32(f32(f32(math.sqrt(V[j])) / bc2s) + epsf)
            W[j] = f32(wj + f32(f32(nss * M[j]) / den))
    return tuple(struct.pack(f"<{D}f", *x) for x in (W, M, V))


def table(root, step):
    """{class: (weights bytes, momentum bytes[, second moment bytes])}, C, D from the shard files of checkpoint
    step."""
    d = os.path.join(root, f"step-{step}")
    files = sorted(glob.glob(os.path.join(d, "shard-*-of-*.snap")))
    if not files:
        sys.exit(f"{d}: no shard files")
    S = int(re.search(r"-of-(\d+)\.snap$", files[0]).group(1))
    if len(files) != S:
        sys.exit(f"{d}: {len(files)} shard files, the names say {S}")
    rows, C, D = {}, None, None
    for s in range(S):
        p = os.path.join(d, f"shard-{s}-of-{S}.snap")
        raw = open(p, "rb").read()
        h = header(raw, p)
        C, D = h.get(4, 0), h.get(5, 0)
        nrows, block, nbytes = h.get(10, 0), h.get(13, 0), h.get(8, 0)
        if h.get(6, 0) != step or h.get(3, 0) != S or h.get(2, 0) != s:
            sys.exit(f"{p}: header says step {h.get(6)}, shard {h.get(2)} of {h.get(3)}")
        pay = raw[HDR_AREA:]
        dense, adamw = bool(h.get(18, 0)), bool(h.get(19, 0))
        want = nrows * (D * 8 + 8) + (step + 2) * 8 if dense else nrows * D * 8
        if adamw:
            want = nrows * (D * 12 + (8 if dense else 0)) + (step + 4) * 8
        if len(pay) != nbytes or nbytes != want:
            sys.exit(f"{p}: {len(pay)} payload bytes, header says {nbytes} ({nrows} rows of {D}, dense {dense})")
        if hashlib.sha256(pay).digest() != h.get(9):
            sys.exit(f"{p}: payload SHA-256 differs from the header's")
        off, r0 = 0, 0
        if adamw:
            hp = struct.unpack_from("<4d", pay, 0)
            lrs = struct.unpack_from(f"<{step}d", pay, 32)
            off = 32 + 8 * step
        elif dense:
            mu, wd = struct.unpack_from("<2d", pay, 0)
            lrs = struct.unpack_from(f"<{step}d", pay, 16)
            off = 16 + 8 * step
        while r0 < nrows:
            n = min(block, nrows - r0)
            for k in range(n):
                w = pay[off + k * D * 4: off + (k + 1) * D * 4]
                m = pay[off + (n + k) * D * 4: off + (n + k + 1) * D * 4]
                if adamw:
                    v = pay[off + (2 * n + k) * D * 4: off + (2 * n + k + 1) * D * 4]
                    rs = step
                    if dense:
                        (rs,) = struct.unpack_from("<q", pay, off + 3 * n * D * 4 + 8 * k)
                    if rs < step:
                        w, m, v = adamw_catch_up(w, m, v, D, lrs, rs, step, hp)
                    rows[(r0 + k) * S + s] = (w, m, v)
                    continue
                if dense:
                    (rs,) = struct.unpack_from("<q", pay, off + 2 * n * D * 4 + 8 * k)
                    w, m = catch_up(w, m, D, lrs, rs, step, mu, wd)
                rows[(r0 + k) * S + s] = (w, m)
            off += (3 if adamw else 2) * n * D * 4 + (8 * n if dense else 0)
            r0 += n
    if sorted(rows) != list(range(C)):
        sys.exit(f"{d}: the shards hold {len(rows)} classes, C = {C}")
    return rows, C, D


def main():
    cmd = sys.argv[1]
    root, step = sys.argv[2], int(sys.argv[3])
    rows, C, D = table(root, step)
    if cmd == "digest":
        h = hashlib.sha256()
        for c in range(C):
            for part in rows[c]:  # weights, momentum (AdamW: weights, first and second moment)
                h.update(part)
        print(h.hexdigest())
    elif cmd == "dump-equal":
        prefix, W = sys.argv[4], int(sys.argv[5])
        seen = set()
        for w in range(W):
            b = open(f"{prefix}.rank{w}", "rb").read()
            rec = 8 + 4 * D
            if len(b) % rec:
                sys.exit(f"{prefix}.rank{w}: {len(b)} bytes, not records of {rec}")
            for i in range(0, len(b), rec):
                (c,) = struct.unpack_from("<Q", b, i)
                if c >= C or c in seen:
                    sys.exit(f"{prefix}.rank{w}: class {c} out of range or twice")
                seen.add(c)
                if b[i + 8:i + rec] != rows[c][0]:
                    sys.exit(f"class {c}: the table as loaded differs from checkpoint step {step}")
        if len(seen) != C:
            sys.exit(f"the dumps hold {len(seen)} of {C} classes")
        print(f"{C} classes of {D} equal checkpoint step {step}")
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
