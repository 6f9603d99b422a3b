"""Every dtype DLPack 1.1 can name: its name, its DLPack code, and round trips (ml_dtypes
arrays for float8, torch's float8 where torch is installed)."""

import sys

import numpy as np
import pytest

import ferry

# (name, DLPack code, bits, lanes): DLPack 1.1's DLDataTypeCode
DTYPES = [
    ("int8", 0, 8, 1), ("int64", 0, 64, 1), ("uint16", 1, 16, 1), ("float16", 2, 16, 1),
    ("float64", 2, 64, 1), ("float32x4", 2, 32, 4), ("opaque64", 3, 64, 1),
    ("bfloat16", 4, 16, 1), ("complex64", 5, 64, 1), ("complex128", 5, 128, 1),
    ("bool", 6, 8, 1),
    ("float8_e3m4", 7, 8, 1), ("float8_e4m3", 8, 8, 1), ("float8_e4m3b11fnuz", 9, 8, 1),
    ("float8_e4m3fn", 10, 8, 1), ("float8_e4m3fnuz", 11, 8, 1), ("float8_e5m2", 12, 8, 1),
    ("float8_e5m2fnuz", 13, 8, 1), ("float8_e8m0fnu", 14, 8, 1),
    ("float6_e2m3fnx4", 15, 6, 4), ("float6_e3m2fnx4", 16, 6, 4), ("float4_e2m1fnx2", 17, 4, 2),
]  # fmt: skip

FLOAT8 = ["float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
          "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"]


def reserve_or_skip(pool, shape, name, code):
    """The library refused DLPack 1.1 codes above 6 (src/wire/tensor.c) until it learnt them:
    skip with the reason rather than fail while it does."""
    try:
        return pool.reserve(shape, name)
    except ValueError as e:
        if code > 6 and f"dtype code {code} is unknown" in str(e):
            pytest.skip(f"libferry refuses DLPack code {code}: {e}")
        raise


@pytest.fixture
def pool():
    with ferry.Pool("4MiB", 1) as p:
        yield p


@pytest.mark.parametrize("name, code, bits, lanes", DTYPES)
def test_every_dlpack_dtype_by_name(pool, name, code, bits, lanes):
    r = reserve_or_skip(pool, (3, 4), name, code)
    d = r.descriptor
    assert d.dtype == name and r.dtype == name
    assert d.length == 12 * bits * lanes // 8
    r.commit()
    got = ferry.receive(d, rank=0)
    assert got.dtype == name
    # the DLPack capsule carries the code
    import ctypes
    capsule = got.__dlpack__(max_version=(1, 0))
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    managed = get(capsule, b"dltensor_versioned")
    # DLManagedTensorVersioned: version(8) ctx(8) deleter(8) flags(8), then the DLTensor:
    # data(8) device(8) ndim(4) dtype(code u8, bits u8, lanes u16)
    raw = ctypes.string_at(managed + 32 + 20, 4)
    assert (raw[0], raw[1], int.from_bytes(raw[2:], "little")) == (code, bits, lanes)


def test_torch_spelling_of_packed_float4(pool):
    r = reserve_or_skip(pool, 2, "float4_e2m1fn_x2", 17)
    assert r.dtype == "float4_e2m1fnx2"


@pytest.mark.parametrize("name", ["float8_e9m9", "boolx", "code300_8", "int", "x2"])
def test_unknown_dtype_names(pool, name):
    with pytest.raises(ValueError):
        pool.reserve(4, name)


def test_code_names_for_codes_without_one(pool):
    with pytest.raises(ValueError, match="dtype code 99"):
        pool.reserve(4, "code99_8")


@pytest.mark.parametrize("name", FLOAT8 + ["bfloat16"])
def test_ml_dtypes_round_trip(pool, name):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if not hasattr(ml_dtypes, name):
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {name}")
    dtype = np.dtype(getattr(ml_dtypes, name))
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6).astype(dtype)
    code = dict((n, c) for n, c, _, _ in DTYPES)[name]
    reserve_or_skip(pool, 1, name, code).cancel()
    d = pool.publish(x)
    assert d.dtype == name and d.shape == (4, 6)
    got = ferry.receive(d, rank=0)
    y = np.frombuffer(got, dtype=dtype).reshape(got.shape)
    assert y.tobytes() == x.tobytes()
    with pytest.raises(ValueError, match="not C-contiguous"):
        pool.publish(x.T)
    r = pool.reserve(x.shape, dtype)  # an ml_dtypes dtype names itself
    assert r.dtype == name
    r.cancel()


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                  "float8_e5m2fnuz", "float8_e8m0fnu"])
def test_torch_float8_round_trip(pool, name):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, name):
        pytest.skip(f"torch {torch.__version__} has no {name}")
    dtype = getattr(torch, name)
    code = dict((n, c) for n, c, _, _ in DTYPES)[name]
    reserve_or_skip(pool, 1, name, code).cancel()
    x = torch.linspace(0.5, 4, 32).to(dtype)
    try:
        x.__dlpack__()
    except (BufferError, RuntimeError, TypeError) as e:
        pytest.skip(f"torch {torch.__version__} exports no {name} through DLPack: {e}")
    d = pool.publish(x)
    assert d.dtype == name
    y = torch.from_dlpack(ferry.receive(d, rank=0))
    assert y.dtype == dtype and torch.equal(y.view(torch.uint8), x.view(torch.uint8))
    r = pool.reserve(4, dtype)
    assert r.dtype == name
    r.cancel()
    assert "torch" in sys.modules
