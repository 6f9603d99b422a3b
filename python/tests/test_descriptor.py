"""ferry.Descriptor: immutable, hashable, picklable through its 256-byte wire form."""

import pickle

import numpy as np
import pytest

import ferry


@pytest.fixture(scope="module")
def descriptors():
    with ferry.Pool(1 << 20, 2, drain_timeout=0) as pool:
        yield pool.publish(np.zeros((2, 5), np.complex64)), pool.publish(np.arange(7))


def test_bytes_round_trip(descriptors):
    d, _ = descriptors
    wire = bytes(d)
    assert len(wire) == ferry._ferry.DESCRIPTOR_SIZE == 256
    for back in (ferry.Descriptor.from_bytes(wire), ferry.Descriptor(wire),
                 ferry.Descriptor.from_bytes(bytearray(wire)),
                 ferry.Descriptor.from_bytes(memoryview(wire))):  # fmt: skip
        assert back == d and hash(back) == hash(d) and bytes(back) == wire
        assert (back.shape, back.dtype, back.slot, back.generation) == (
            (2, 5), "complex64", d.slot, d.generation)


def test_pickle_round_trip(descriptors):
    d, other = descriptors
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(d, protocol=protocol))
        assert back == d and back is not d and back != other
    assert len({d, other, pickle.loads(pickle.dumps(d))}) == 2


def test_immutable(descriptors):
    d, _ = descriptors
    with pytest.raises(AttributeError):
        d.slot = 3
    with pytest.raises(AttributeError):
        d.anything = 1


def test_repr(descriptors):
    d, _ = descriptors
    assert repr(d) == (
        f"Descriptor(backend='host', slot={d.slot}, generation={d.generation}, shape=(2, 5), "
        f"dtype='complex64', offset={d.offset}, length=80)"
    )


def test_comparisons(descriptors):
    d, other = descriptors
    assert d != other and not (d == other)
    assert d != bytes(d)  # a Descriptor equals Descriptors only
    with pytest.raises(TypeError):
        d < other  # noqa: B015


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "descriptor length: got 0 bytes, expected 256"),
        (b"abc", "descriptor length: got 3 bytes, expected 256"),
        (b"\x00" * 256,
         'descriptor magic mismatch: got 00 00 00 00, expected 46 52 59 44 ("FRYD")'),
        (b"x" * 257, "descriptor length: got 257 bytes, expected 256"),
    ],
)  # fmt: skip
def test_garbage_refused(data, message):
    with pytest.raises(ValueError) as info:
        ferry.Descriptor.from_bytes(data)
    assert str(info.value) == message and info.value.status == "MALFORMED"


def test_corrupted_checksum_refused(descriptors):
    d, _ = descriptors
    wire = bytearray(bytes(d))
    wire[100] ^= 0x01
    with pytest.raises(ValueError, match="^descriptor checksum mismatch: stored 0x"):
        ferry.Descriptor.from_bytes(bytes(wire))


def test_not_bytes_refused():
    with pytest.raises(TypeError):
        ferry.Descriptor.from_bytes(12)
