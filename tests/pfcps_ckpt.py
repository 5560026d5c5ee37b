"""pfcps backbone checkpoints (worker/model/model.h layout), read from Python for the tests, written from the
layout's description, not from the C code: header (magic "PFCPSBB1", u32 version, D, tensors, extras,
network name 32 bytes, 8 bytes payload size, u64 FNV-1a checksum of everything after byte 72 at offset 64),
tensor table (u16 name length, name, u8 dtype, u8 ndim, u32 shape[ndim], u64 payload offset), extras
(version 2: 32-byte name + f64 each), then the float32 payload. Standard library only."""
import struct

MAGIC = b"PFCPSBB1"
TABLE_AT = 72


class Checkpoint:
    def __init__(self, raw):
        self.raw = bytearray(raw)
        assert self.raw[:8] == MAGIC, "not a pfcps backbone checkpoint"
        self.version, self.dim, ntens, nextra = struct.unpack_from("<4I", self.raw, 8)
        self.network = bytes(self.raw[24:56]).rstrip(b"\0").decode()
        pos, self.tensors = TABLE_AT, []  # (name, shape, payload offset)
        for _ in range(ntens):
            (nl,) = struct.unpack_from("<H", self.raw, pos)
            name = self.raw[pos + 2:pos + 2 + nl].decode()
            pos += 2 + nl
            nd = self.raw[pos + 1]
            shape = struct.unpack_from("<%dI" % nd, self.raw, pos + 2)
            pos += 2 + 4 * nd
            (off,) = struct.unpack_from("<Q", self.raw, pos)
            pos += 8
            self.tensors.append((name, shape, off))
        self.extras = {}
        for _ in range(nextra if self.version >= 2 else 0):
            name = bytes(self.raw[pos:pos + 32]).rstrip(b"\0").decode()
            (self.extras[name],) = struct.unpack_from("<d", self.raw, pos + 32)
            pos += 40
        self.payload = pos

    @staticmethod
    def count(shape):
        n = 1
        for s in shape:
            n *= s
        return n

    def values(self, name):
        """The tensor's float32 values as a flat tuple."""
        for n, shape, off in self.tensors:
            if n == name:
                return struct.unpack_from("<%df" % self.count(shape), self.raw, self.payload + off)
        raise KeyError(name)

    def fill(self, name, value):
        """Sets every element of tensor `name` to value (float32); call reseal() after the changes."""
        for n, shape, off in self.tensors:
            if n == name:
                k = self.count(shape)
                struct.pack_into("<%df" % k, self.raw, self.payload + off, *([value] * k))
                return
        raise KeyError(name)

    def reseal(self):
        """Recomputes the checksum (FNV-1a 64 over the bytes after the header) after edits."""
        h = 0xcbf29ce484222325
        for b in self.raw[TABLE_AT:]:
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
        struct.pack_into("<Q", self.raw, 64, h)


def read(path):
    with open(path, "rb") as f:
        return Checkpoint(f.read())
