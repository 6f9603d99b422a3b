#!/usr/bin/env python3
"""Writes the seed corpus of the remote wire format's fuzz target (tests/corpus/remote/).

Each file is one byte that tests/fuzz_remote.c reads as an active-message payload length (in
units of 8 bytes), then the message. The encoder here is independent of the C one
(docs/wire-format.md, "Remote consumers", is the contract): tests/test_remote_wire.c checks
that every valid-* file decodes and every invalid-* file is refused.

Usage: scripts/gen-remote-corpus.py [OUTDIR]     (default: tests/corpus/remote)
"""

import os
import struct
import sys

MAGIC = 0x55595246  # "FRYU"
VERSION = 7
INLINE_MAX = 16384  # the most bytes a DESC carries inline
READ_MAX = 1 << 20  # the most bytes a READ asks for
ACKS_MAX = 64  # the most leases an ACKS names


def pad8(b):
    return b + bytes(-len(b) % 8)


def header(kind, size, version=VERSION, reserved=0):
    return struct.pack("<IHHII", MAGIC, version, kind, size, reserved)


def hello(rank=1, worker=bytes(range(1, 80)), host=b"encoder-0", secret=bytes(range(16)),
          pool=bytes(range(0xA0, 0xB0)), reserved=0, size=None):
    body = secret + pool + struct.pack("<IIII", rank, 4242, len(worker), reserved)
    body += host.ljust(64, b"\0") + pad8(worker)
    n = 16 + len(body) if size is None else size
    return header(1, n) + body


def pool_descriptor():
    # A valid pool-only descriptor is not needed by the decoder: 256 opaque bytes.
    return bytes(range(256))


def welcome(worker=bytes(range(3, 90)), rkeys=(bytes(10), b""), flags=0, depth=64,
            timeout=5000, sizes=(1 << 20, 0), size=None):
    fixed = struct.pack("<IIQIIII", 7 | (1 << 16), 4242, 0x1122334455667788, timeout, depth,
                        flags, 0)
    fixed += struct.pack("<QQQQ", 0x7F0000000000, 0, sizes[0], sizes[1])
    fixed += struct.pack("<QQQQ", 256, 512, 4096, 8192)
    fixed += struct.pack("<IIII", len(worker), len(rkeys[0]), len(rkeys[1]), 0)
    fixed += pool_descriptor()
    body = fixed + pad8(worker) + pad8(rkeys[0]) + pad8(rkeys[1])
    n = 16 + len(body) if size is None else size
    return header(2, n) + body


def refuse(status=15, rank=3, holder=0):
    return header(3, 32) + struct.pack("<IIII", status, rank, holder, 0)


def am(kind, flags=0, body=bytes(16)):
    return struct.pack("<HHIQ", kind, flags, 9 | (1 << 16), 0xAABBCCDDEEFF0011) + body


def files():
    ack = struct.pack("<IIII", 5, 3, 0, 2)
    yield "valid-hello", 0, hello()
    yield "valid-welcome", 0, welcome()
    yield "valid-welcome-gpu", 0, welcome(rkeys=(bytes(10), bytes(40)), flags=3,
                                          sizes=(1 << 20, 1 << 30))
    yield "valid-refuse", 0, refuse()
    yield "valid-am-desc", 256, am(1, body=struct.pack("<QQ", 4096, 96))
    # inline: one descriptor (256 bytes) and the extent's 1024 bytes
    yield "valid-am-desc-inline", 1280, am(1, flags=1, body=struct.pack("<QQ", 4096, 1024))
    yield "valid-am-ack", 0, am(2, body=ack)
    yield "valid-am-ack-partial", 0, am(2, flags=1, body=ack)
    yield "valid-am-taken", 0, am(3, body=struct.pack("<I12x", 17))
    yield "valid-am-info", 32, am(4, flags=1)
    yield "valid-am-info-hold", 32, am(4, flags=2)
    yield "invalid-am-info-flags", 32, am(4, flags=4)
    yield "invalid-empty", 0, b""
    yield "invalid-hello-magic", 0, b"X" + hello()[1:]
    yield "invalid-hello-version", 0, header(1, 208, version=VERSION - 1) + hello()[16:]
    yield "invalid-hello-reserved", 0, hello(reserved=1)
    yield "invalid-hello-size", 0, hello(size=4000)
    yield "invalid-hello-truncated", 0, hello()[:100]
    yield "invalid-hello-no-worker", 0, hello(worker=b"")
    yield "invalid-hello-host", 0, hello(host=b"bad host")
    yield "invalid-welcome-flags", 0, welcome(flags=4)
    yield "invalid-welcome-depth", 0, welcome(depth=3)
    yield "invalid-welcome-region", 0, welcome(flags=1)
    yield "invalid-welcome-truncated", 0, welcome()[:-8]
    yield "invalid-refuse-ok", 0, refuse(status=0)
    yield "invalid-am-desc-partial", 16, am(1, body=struct.pack("<QQ", 0, 96))
    yield "valid-am-desc-held", 256, am(1, flags=2, body=struct.pack("<QQ", 4096, 96))
    yield "valid-am-desc-inline-held", 1280, am(1, flags=3, body=struct.pack("<QQ", 4096, 1024))
    yield "invalid-am-desc-flags", 256, am(1, flags=4, body=struct.pack("<QQ", 4096, 96))
    # inline bytes fewer than the extent's length, two descriptors with them, none, too many
    yield "invalid-am-desc-inline-short", 1280, am(1, flags=1, body=struct.pack("<QQ", 0, 1040))
    yield "invalid-am-desc-inline-parts", 1536, am(1, flags=1, body=struct.pack("<QQ", 0, 1024))
    yield "invalid-am-desc-inline-empty", 256, am(1, flags=1, body=struct.pack("<QQ", 0, 0))
    yield "invalid-am-desc-inline-over", 2040, am(1, flags=1,
                                                 body=struct.pack("<QQ", 0, INLINE_MAX + 16))
    yield "invalid-am-ack-payload", 256, am(2, body=ack)
    yield "invalid-am-ack-flags", 0, am(2, flags=2, body=ack)
    yield "invalid-am-taken-reserved", 0, am(3, body=struct.pack("<I4xQ", 1, 1))
    read = struct.pack("<IIII", 5, 3, 11, 4096)
    yield "valid-am-read", 8, am(5, body=read)
    yield "valid-am-read-look", 8, am(5, body=struct.pack("<IIII", 5, 3, 12, 0))
    yield "valid-am-data", 2040, am(6, body=struct.pack("<IIQ", 11, 0, 0))
    yield "valid-am-data-extent", 16, am(6, flags=1, body=struct.pack("<IIQ", 12, 0, 0))
    yield "valid-am-data-stale", 0, am(6, body=struct.pack("<IIQ", 11, 1, 4))
    yield "valid-am-data-busy", 0, am(6, body=struct.pack("<IIQ", 11, 4, 0))
    yield "valid-am-data-failed", 0, am(6, body=struct.pack("<IIQ", 11, 5, 0))
    yield "invalid-am-data-failed-payload", 8, am(6, body=struct.pack("<IIQ", 11, 5, 0))
    yield "invalid-am-read-payload", 16, am(5, body=read)
    yield "invalid-am-read-over", 8, am(5, body=struct.pack("<IIII", 5, 3, 11, READ_MAX + 1))
    yield "invalid-am-data-outside-bare", 0, am(6, body=struct.pack("<IIQ", 11, 3, 0))
    yield "invalid-am-data-value", 0, am(6, body=struct.pack("<IIQ", 11, 2, 7))
    yield "invalid-am-data-status", 0, am(6, body=struct.pack("<IIQ", 11, 6, 0))
    hold = struct.pack("<II8x", 5, 3)
    yield "valid-am-revoke", 0, am(7, body=hold)
    yield "valid-am-released", 0, am(8, body=hold)
    yield "invalid-am-revoke-reserved", 0, am(7, body=struct.pack("<IIQ", 5, 3, 1))
    yield "invalid-am-released-payload", 8, am(8, body=hold)
    yield "invalid-am-released-flags", 0, am(8, flags=1, body=hold)
    acks = struct.pack("<I12x", 3)
    yield "valid-am-acks", 24, am(9, body=acks)
    yield "valid-am-acks-max", 512, am(9, body=struct.pack("<I12x", ACKS_MAX))
    yield "invalid-am-acks-none", 0, am(9, body=bytes(16))
    yield "invalid-am-acks-over", 520, am(9, body=struct.pack("<I12x", ACKS_MAX + 1))
    yield "invalid-am-acks-short", 16, am(9, body=acks)
    yield "invalid-am-acks-flags", 24, am(9, flags=1, body=acks)
    yield "invalid-am-acks-reserved", 24, am(9, body=struct.pack("<IIQ", 3, 1, 0))
    yield "invalid-am-type", 0, am(10)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "tests", "corpus", "remote")
    os.makedirs(out, exist_ok=True)
    for name, payload, msg in files():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            assert payload % 8 == 0 and payload // 8 < 256, name
            f.write(bytes([payload // 8]) + msg)


if __name__ == "__main__":
    main()
