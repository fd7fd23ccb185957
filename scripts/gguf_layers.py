#!/usr/bin/env python3
"""Writes a copy of a GGUF model that keeps only its first N transformer
layers (blk.0 .. blk.N-1, the embeddings, the final norm and the output head),
with <arch>.block_count set to N. For measuring what a decode step costs apart
from its layers: `kvcache bench model` on 1 layer and on all of them gives the
per-layer cost and the fixed part of every token (embedding, output head,
sampling, pool jobs).

    python3 scripts/gguf_layers.py IN.gguf N OUT.gguf

Standard library only. The GGUF layout (v2/v3): magic, version, tensor count,
metadata count, metadata (key, type, value), tensor infos (name, dims, type,
offset), padding to the alignment, tensor data."""
import struct
import sys

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


class Reader:
    def __init__(self, data):
        self.d, self.o = data, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.d, self.o)
        self.o += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        if self.o + n > len(self.d):
            raise ValueError("string past the end of the file")
        s = self.d[self.o:self.o + n]
        self.o += n
        return s

    def value(self, t):
        """the value's raw bytes (copied as they are)"""
        start = self.o
        if t in SCALAR:
            self.take(SCALAR[t])
        elif t == STRING:
            self.string()
        elif t == ARRAY:
            et, n = self.take("I"), self.take("Q")
            for _ in range(n):
                self.value(et)
        else:
            raise ValueError(f"unknown metadata type {t}")
        return self.d[start:self.o]


def main(argv):
    if len(argv) != 4:
        sys.exit("usage: gguf_layers.py IN.gguf N OUT.gguf")
    src, keep, dst = argv[1], int(argv[2]), argv[3]
    data = open(src, "rb").read()
    r = Reader(data)
    if r.take("I") != 0x46554747:
        sys.exit(f"{src}: not a GGUF file")
    version = r.take("I")
    if version not in (2, 3):
        sys.exit(f"{src}: GGUF version {version}; this script reads 2 and 3")
    n_tensors, n_kv = r.take("Q"), r.take("Q")
    kvs, arch, align = [], None, 32
    for _ in range(n_kv):
        key = r.string()
        t = r.take("I")
        raw = r.value(t)
        kvs.append((key, t, raw))
        if key == b"general.architecture":
            arch = raw[8:]
        if key == b"general.alignment":
            align = struct.unpack("<I", raw)[0]
    if arch is None:
        sys.exit(f"{src}: no general.architecture")
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        tensors.append((name, dims, r.take("I"), r.take("Q")))
    data0 = (r.o + align - 1) // align * align
    offsets = sorted(t[3] for t in tensors) + [len(data) - data0]

    def size_of(off):   # a tensor's bytes: up to the next tensor's start (padding included)
        return offsets[offsets.index(off) + 1] - off

    def kept(name):
        if not name.startswith(b"blk."):
            return True
        return int(name.split(b".")[1]) < keep

    block_key = arch + b".block_count"
    out_kv = []
    for key, t, raw in kvs:
        if key == block_key:
            raw = struct.pack("<I", keep) if t == 4 else struct.pack("<" + SCALAR[t], keep)
        out_kv.append(struct.pack("<Q", len(key)) + key + struct.pack("<I", t) + raw)
    out_t, blobs, at = [], [], 0
    for name, dims, ty, off in tensors:
        if not kept(name):
            continue
        n = size_of(off)
        out_t.append(struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ty, at))
        blobs.append(data[data0 + off:data0 + off + n])
        at += n
    head = struct.pack("<IIQQ", 0x46554747, version, len(out_t), len(out_kv)) + b"".join(out_kv) + b"".join(out_t)
    head += b"\0" * ((-len(head)) % align)
    with open(dst, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)
    print(f"{dst}: {keep} of the layers, {len(out_t)} of {n_tensors} tensors, {len(head) + at} bytes")


if __name__ == "__main__":
    main(sys.argv)
