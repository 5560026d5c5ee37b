#!/usr/bin/env python3
"""Checkpoint .snap files (common/snapfile.h), read and forged from Python for the tests, written from the
layout's description, not from the C code: bytes [0, 4096) hold the magic "PFCPSNP1", a u32 little-endian
header length L, the header (a protobuf SnapshotHeader of proto/ctl.proto, L bytes), its SHA-256, its
HMAC-SHA256 under the checkpoint key HMAC(secret, "pfcps checkpoint v1") (zeros when header field
authenticated is false), zero padding; the payload follows. Standard library only.

  pfcps_snap.py show FILE
      prints the header fields, one "name = value" per line (bytes as hex).
  pfcps_snap.py set FILE NAME=VALUE... [--secret SECRET]
      rewrites header fields (integers; kind and dtype as text) and recomputes what a forger can: the header's
      SHA-256, and with --secret (a forger who holds the join secret) its HMAC; without --secret the HMAC
      bytes are left as they were (a forger without the secret).
"""
import hashlib
import hmac
import struct
import sys

MAGIC = b"PFCPSNP1"
AREA = 4096
# field number -> (name, kind): kind "int" (varint, signed 64-bit), "uint" (varint), "bytes", "str", "bool"
FIELDS = {1: ("format_version", "uint"), 2: ("shard_id", "int"), 3: ("num_servers", "int"),
          4: ("num_classes", "int"), 5: ("embedding_size", "int"), 6: ("step", "int"), 7: ("dtype", "str"),
          8: ("payload_bytes", "uint"), 9: ("payload_sha256", "bytes"), 10: ("rows", "int"), 11: ("kind", "str"),
          12: ("seed", "uint"), 13: ("block_rows", "int"), 14: ("num_workers", "int"), 15: ("run_id", "bytes"),
          16: ("config_digest", "bytes"), 17: ("authenticated", "bool"),
          18: ("dense", "bool"), 19: ("adamw", "bool")}
NUMBER = {name: num for num, (name, _) in FIELDS.items()}


def varint(b, i):
    v = s = 0
    while True:
        x = b[i]
        i += 1
        v |= (x & 0x7F) << s
        s += 7
        if x < 0x80:
            return v, i


def put_varint(v):
    v &= (1 << 64) - 1  # negative integers as protobuf writes them: ten bytes of two's complement
    out = bytearray()
    while True:
        x = v & 0x7F
        v >>= 7
        out.append(x | (0x80 if v else 0))
        if not v:
            return bytes(out)


def key_of(secret):
    return hmac.new(secret.encode(), b"pfcps checkpoint v1", hashlib.sha256).digest()


class Snap:
    def __init__(self, raw):
        self.raw = bytearray(raw)
        assert self.raw[:8] == MAGIC, "not a snapfile (bad magic)"
        (hl,) = struct.unpack_from("<I", self.raw, 8)
        b = self.raw[12:12 + hl]
        self.mac = bytes(self.raw[12 + hl + 32:12 + hl + 64])
        self.fields, i = {}, 0
        while i < len(b):
            key, i = varint(b, i)
            num, wt = key >> 3, key & 7
            if wt == 0:
                v, i = varint(b, i)
                if FIELDS.get(num, ("", ""))[1] == "int" and v >= 1 << 63:
                    v -= 1 << 64
            elif wt == 2:
                n, i = varint(b, i)
                v, i = bytes(b[i:i + n]), i + n
                if FIELDS.get(num, ("", ""))[1] == "str":
                    v = v.decode()
            else:
                raise ValueError("unexpected wire type %d" % wt)
            self.fields[num] = v

    def header(self):
        out = bytearray()
        for num in sorted(self.fields):
            v, kind = self.fields[num], FIELDS[num][1]
            if kind in ("bytes", "str"):
                v = v.encode() if kind == "str" else v
                out += put_varint(num << 3 | 2) + put_varint(len(v)) + v
            else:
                out += put_varint(num << 3) + put_varint(int(v))
        return bytes(out)

    def seal(self, secret=None):
        """Writes the header back into the area: its SHA-256 always, its HMAC when secret is given."""
        h = self.header()
        assert 12 + len(h) + 64 <= AREA, "header too large"
        area = bytearray(AREA)
        area[:8] = MAGIC
        struct.pack_into("<I", area, 8, len(h))
        area[12:12 + len(h)] = h
        area[12 + len(h):12 + len(h) + 32] = hashlib.sha256(h).digest()
        mac = hmac.new(key_of(secret), h, hashlib.sha256).digest() if secret else self.mac
        area[12 + len(h) + 32:12 + len(h) + 64] = mac
        self.raw[:AREA] = area


def main(argv):
    if len(argv) < 3 or argv[1] not in ("show", "set"):
        sys.exit(__doc__)
    path = argv[2]
    with open(path, "rb") as f:
        s = Snap(f.read())
    if argv[1] == "show":
        for num in sorted(s.fields):
            v = s.fields[num]
            print("%s = %s" % (FIELDS.get(num, (str(num),))[0], v.hex() if isinstance(v, bytes) else v))
        return
    secret, edits = None, argv[3:]
    if "--secret" in edits:
        k = edits.index("--secret")
        secret = edits[k + 1]
        edits = edits[:k] + edits[k + 2:]
    for e in edits:
        name, value = e.split("=", 1)
        num = NUMBER[name]
        kind = FIELDS[num][1]
        s.fields[num] = value if kind == "str" else bytes.fromhex(value) if kind == "bytes" else int(value, 0)
    s.seal(secret)
    with open(path, "wb") as f:
        f.write(s.raw)


if __name__ == "__main__":
    main(sys.argv)
