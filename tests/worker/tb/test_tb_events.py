"""Reads the event file worker/tb_writer.c wrote with TensorBoard's own code and checks every record.

usage: test_tb_events.py TB_WRITE_SCALARS

The scalars are chosen here (several tags and steps; negative, subnormal, largest, signed-zero, inf and NaN
float32 values), handed to the C helper as exact bits, and read back three ways:
  1. the raw TFRecord framing: each length and data CRC checked against tensorboard's masked_crc32c and this
     file's own bitwise CRC-32C, then tensorboard.compat.proto Event parsed from the data;
  2. tensorboard's record reader (tensorflow_stub PyRecordReader_New, which raises on a bad CRC);
  3. EventAccumulator (what `tensorboard --logdir` serves), per tag.
Every value must come back bit-for-bit as a float32 (NaN: as a NaN), with its step, wall_time and tag.
"""

import math
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def crc32c(data):
    """Bitwise CRC-32C (Castagnoli, reflected 0x82f63b78), written from RFC 3720 B.4, not from pfcps."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def same_f32(got, want_bits):
    want = struct.unpack("<f", struct.pack("<I", want_bits))[0]
    if math.isnan(want):
        return math.isnan(got)
    return f32_bits(got) == want_bits


def scalars():
    """(tag, step, wall_time, float32 bits) in write order, grouped by step (a flush after each group)."""
    values = {
        "loss": [69.07755279541016, 12.5, 0.0, -0.0, 1.0 / 3.0],
        "lr": [0.1, 1e-7, 3.4028234663852886e38, 1.1754943508222875e-38, 2.0**-149],
        "train/acc": [-1.5, -3.4028234663852886e38, -(2.0**-149), 0.999999940395355, -123456.789],
        "grad norm": [float("inf"), float("-inf"), float("nan"), 5.0, 16777217.0],
    }
    steps = [0, 1, 2, 1000, 2**40 + 3]
    t0 = 1.7e9 + 0.123456789
    groups = []
    for i, step in enumerate(steps):
        group = []
        for tag, vals in values.items():
            group.append((tag, step, t0 + 0.5 * i, f32_bits(vals[i])))
        groups.append(group)
    return groups


def read_raw(path):
    """The records of `path`, each CRC checked two ways; returns the data of each."""
    records = []
    with open(path, "rb") as f:
        blob = f.read()
    off = 0
    while off < len(blob):
        check(off + 12 <= len(blob), f"record header at {off} truncated")
        header = blob[off : off + 8]
        (n,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", blob[off + 8 : off + 12])
        check(hcrc == masked_crc32c(header), f"record at {off}: length CRC {hcrc:#x} != tensorboard's")
        check(hcrc == masked(header), f"record at {off}: length CRC {hcrc:#x} != this test's crc32c")
        data = blob[off + 12 : off + 12 + n]
        check(len(data) == n, f"record at {off}: {len(data)} of {n} bytes")
        (dcrc,) = struct.unpack("<I", blob[off + 12 + n : off + 16 + n])
        check(dcrc == masked_crc32c(data), f"record at {off}: data CRC {dcrc:#x} != tensorboard's")
        check(dcrc == masked(data), f"record at {off}: data CRC {dcrc:#x} != this test's crc32c")
        records.append(data)
        off += 16 + n
    return records


def main():
    check(crc32c(b"123456789") == 0xE3069283, "this test's crc32c fails the check value")
    check(masked_crc32c(b"123456789") == masked(b"123456789"), "the two masked CRCs disagree")
    helper = sys.argv[1]
    groups = scalars()
    want = [s for g in groups for s in g]
    lines = "".join(
        "".join(f"{step} {wall.hex()} {bits:08x} {tag}\n" for tag, step, wall, bits in g) + "flush\n"
        for g in groups
    )
    with tempfile.TemporaryDirectory(prefix="pfcps_tb_events_") as tmp:
        logdir = os.path.join(tmp, "output", "tensorboard")
        before = time.time()
        out = subprocess.run([helper, logdir], input=lines, capture_output=True, text=True)
        after = time.time()
        check(out.returncode == 0, f"{helper} exited {out.returncode}: {out.stderr}")
        if out.returncode != 0:
            return
        path = out.stdout.strip()
        check(os.listdir(logdir) == [os.path.basename(path)], f"{logdir} holds {os.listdir(logdir)}")

        # EventFileWriter's name: events.out.tfevents.{%010d time}.{hostname}.{pid}.{n}
        m = re.fullmatch(r"events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)", os.path.basename(path))
        check(m is not None, f"file name {path}")
        if m:
            check(int(before) - 1 <= int(m.group(1)) <= after + 1, f"time in {path}")
            check(m.group(2) == socket.gethostname(), f"host {m.group(2)} != {socket.gethostname()}")

        # 1. Raw framing, both CRCs, the Event protos.
        records = read_raw(path)
        check(len(records) == 1 + len(want), f"{len(records)} records, want {1 + len(want)}")
        first = event_pb2.Event.FromString(records[0])
        check(first.WhichOneof("what") == "file_version", f"first event is {first.WhichOneof('what')}")
        check(first.file_version == "brain.Event:2", f"file_version {first.file_version!r}")
        check(before - 1 <= first.wall_time <= after + 1, f"first wall_time {first.wall_time}")
        for rec, (tag, step, wall, bits) in zip(records[1:], want):
            ev = event_pb2.Event.FromString(rec)
            check(ev.WhichOneof("what") == "summary", f"{tag}@{step}: event holds {ev.WhichOneof('what')}")
            check(len(ev.summary.value) == 1, f"{tag}@{step}: {len(ev.summary.value)} values")
            v = ev.summary.value[0]
            check(v.tag == tag and ev.step == step and ev.wall_time == wall,
                  f"{v.tag}@{ev.step} t={ev.wall_time!r}, want {tag}@{step} t={wall!r}")
            check(v.WhichOneof("value") == "simple_value", f"{tag}@{step}: value is {v.WhichOneof('value')}")
            check(same_f32(v.simple_value, bits), f"{tag}@{step}: {v.simple_value!r}, want bits {bits:08x}")

        # 2. TensorBoard's record reader (raises DataLossError on a CRC mismatch).
        reader = pywrap_tensorflow.PyRecordReader_New(path)
        n = 0
        try:
            while True:
                reader.GetNext()
                check(reader.record() == records[n], f"record {n} differs through PyRecordReader_New")
                n += 1
        except errors.OutOfRangeError:
            pass
        except errors.DataLossError as e:
            check(False, f"PyRecordReader_New: {e}")
        check(n == len(records), f"PyRecordReader_New read {n} of {len(records)} records")

        # 3. EventAccumulator: what `tensorboard --logdir` shows.
        acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
        acc.Reload()
        tags = sorted({t for t, _, _, _ in want})
        check(sorted(acc.Tags()["scalars"]) == tags, f"scalar tags {acc.Tags()['scalars']}, want {tags}")
        for tag in tags:
            got = acc.Scalars(tag) if tag in acc.Tags()["scalars"] else []
            exp = [(s, w, b) for t, s, w, b in want if t == tag]
            check(len(got) == len(exp), f"{tag}: {len(got)} scalars, want {len(exp)}")
            for g, (step, wall, bits) in zip(got, exp):
                check(g.step == step and g.wall_time == wall, f"{tag}: step {g.step} t={g.wall_time!r}")
                check(same_f32(g.value, bits), f"{tag}@{step}: {g.value!r}, want bits {bits:08x}")
        print(f"{path}: {len(records)} records, {len(want)} scalars over {len(tags)} tags read back")

    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("tb_events: all checks passed")


if __name__ == "__main__":
    main()
