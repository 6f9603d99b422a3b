#!/usr/bin/env python3
"""Writes the seed corpus of the descriptor fuzz target (tests/corpus/descriptor/).

The encoder here is independent of the C one (docs/wire-format.md is the contract), so the
corpus also cross-checks the C decoder: every file named valid-* must decode, every file
named invalid-* must be rejected.

Usage: scripts/gen-descriptor-corpus.py [OUTDIR]     (default: tests/corpus/descriptor)
       scripts/gen-descriptor-corpus.py --dump       (hex dump of the worked example)
"""

import os
import struct
import sys

SIZE = 256
CRC_OFFSET = 252

# Field layout, little-endian: magic, version, size, backend, flags, consumer_count,
# max_inflight, slot, generation, offset, length, pool_size, pool_id, broker, producer_pid,
# device, handle, dtype code/bits/lanes, ndim, 3 reserved bytes, shape[8], 28 reserved bytes.
BODY = struct.Struct("<4sHHBBHIIIQQQ16s16sIi64sBBHB3x8q28x")
assert BODY.size == CRC_OFFSET


def _crc_table():
    table = []
    for byte in range(256):
        c = byte
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def descriptor(**kw):
    """Fields of a valid host descriptor (the worked example), overridden by kw."""
    d = dict(magic=b"FRYD", version=1, size=SIZE, backend=1, flags=0x02, consumer_count=2,
             max_inflight=64, slot=5, generation=3, offset=4096, length=96,
             pool_size=1 << 20, pool_id=bytes(range(0xA0, 0xB0)),
             broker=bytes(range(0xB0, 0xC0)), producer_pid=4242, device=-1,
             handle=bytes(64), code=2, bits=32, lanes=1, shape=[2, 3, 4])
    d.update(kw)
    return d


def encode(d, reserved=None):
    """256 bytes of d; reserved = (offset, value) sets one reserved byte before the CRC."""
    shape = list(d["shape"]) + [0] * (8 - len(d["shape"]))
    ndim = d.get("ndim", len(d["shape"]))
    body = bytearray(BODY.pack(
        d["magic"], d["version"], d["size"], d["backend"], d["flags"], d["consumer_count"],
        d["max_inflight"], d["slot"], d["generation"], d["offset"], d["length"],
        d["pool_size"], d["pool_id"], d["broker"], d["producer_pid"], d["device"],
        d["handle"], d["code"], d["bits"], d["lanes"], ndim, *shape))
    if reserved is not None:
        body[reserved[0]] = reserved[1]
    return bytes(body) + struct.pack("<I", crc32c(body))


def gpu(backend, **kw):
    base = dict(backend=backend, flags=0x01, device=1, broker=bytes(16),
                handle=bytes((7 * i + 1) & 0xFF for i in range(64)))
    base.update(kw)
    return descriptor(**base)


def flip_crc(data):
    return data[:CRC_OFFSET] + bytes([data[CRC_OFFSET] ^ 0x01]) + data[CRC_OFFSET + 1:]


def corpus():
    example = encode(descriptor())
    return {
        "valid-host-example.bin": example,
        "valid-host-single.bin": encode(descriptor(flags=0)),
        "valid-host-bytes.bin": encode(descriptor(code=1, bits=8, shape=[1000], length=1000,
                                                  offset=12345)),
        "valid-cuda-ipc.bin": encode(gpu(2, code=4, bits=16, shape=[8, 128], length=2048)),
        "valid-cuda-vmm.bin": encode(gpu(3, flags=0x03, device=0, code=2, bits=64,
                                         shape=[3, 5], length=120, offset=1 << 30,
                                         pool_size=1 << 32)),
        "valid-scalar.bin": encode(descriptor(flags=0, shape=[], length=4)),
        "valid-ndim8.bin": encode(descriptor(code=0, bits=8, shape=[1, 2, 1, 3, 1, 2, 1, 2],
                                             length=24, offset=7)),
        "valid-empty.bin": encode(descriptor(shape=[4, 0, 9], length=0, offset=1 << 20)),
        "valid-bool.bin": encode(descriptor(code=6, bits=8, shape=[17], length=17, offset=3)),
        "valid-complex-lanes.bin": encode(descriptor(code=5, bits=64, lanes=2, shape=[10],
                                                     length=160, offset=4096 + 16)),
        "valid-max-generation.bin": encode(descriptor(generation=0x7FFFFFFF, slot=63,
                                                      consumer_count=0xFFFF)),
        "invalid-empty.bin": b"",
        "invalid-truncated.bin": example[:100],
        "invalid-too-long.bin": example + b"\x00",
        "invalid-bad-checksum.bin": flip_crc(example),
        "invalid-bad-magic.bin": encode(descriptor(magic=b"FRYE")),
        "invalid-version-2.bin": encode(descriptor(version=2)),
        "invalid-reserved-157.bin": encode(descriptor(), reserved=(157, 0x01)),
        "invalid-reserved-240.bin": encode(descriptor(), reserved=(240, 0x80)),
        "invalid-unknown-flag.bin": encode(descriptor(flags=0x06)),
        "invalid-backend-auto.bin": encode(descriptor(backend=0)),
        "invalid-generation-0.bin": encode(descriptor(generation=0)),
        "invalid-length.bin": encode(descriptor(length=95)),
        "invalid-ndim9.bin": encode(descriptor(ndim=9)),
    }


def hex_dump(data):
    lines = []
    for off in range(0, len(data), 16):
        row = data[off:off + 16]
        lines.append("%04x: %s  %s" % (off, " ".join("%02x" % b for b in row[:8]),
                                        " ".join("%02x" % b for b in row[8:])))
    return "\n".join(lines)


def main(argv):
    if argv[1:] == ["--dump"]:
        print(hex_dump(encode(descriptor())))
        return 0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outdir = argv[1] if len(argv) > 1 else os.path.join(root, "tests", "corpus", "descriptor")
    os.makedirs(outdir, exist_ok=True)
    for name, data in sorted(corpus().items()):
        with open(os.path.join(outdir, name), "wb") as f:
            f.write(data)
    print("wrote %d files to %s" % (len(corpus()), outdir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
