"""Tensors published by this process and received by a spawned consumer process: every dtype
and shape ferry supports, copies and views, and what publish refuses."""

import numpy as np
import pytest

import ferry
from conftest import in_flight, wait_until

NUMPY_DTYPES = [
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
    "bool", "complex64", "complex128",
]  # fmt: skip

SHAPES = [(), (3,), (2, 3), (2, 1, 3), (1, 2, 3, 2), (2,) * 5, (2, 1) * 3, (1, 2) * 3 + (3,),
          (2,) * 8]  # fmt: skip
EMPTY_SHAPES = [(0,), (3, 0), (2, 0, 4), (0,) * 8, (1, 2, 3, 0, 1)]


def sample(shape, dtype):
    n = int(np.prod(shape, dtype=np.int64))
    values = np.arange(n).reshape(shape)
    if dtype == "bool":
        values = values % 3 == 0
    elif dtype.startswith("complex"):
        values = values + 1j * (values + 0.5)
    else:
        values = values % 100
    return np.asarray(values, dtype=dtype)  # 0-d arithmetic gives numpy scalars: make arrays


@pytest.fixture
def pool():
    with ferry.Pool(1 << 20, 1, backend="host", drain_timeout=0) as p:
        yield p


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_every_dtype(pool, worker, dtype):
    x = sample((4, 5), dtype)
    d = pool.publish(x)
    assert (d.dtype, d.shape, d.length) == (dtype, (4, 5), x.nbytes)
    got, writeable = worker.call("receive_array", d, 0)
    assert got.dtype == x.dtype and got.shape == x.shape
    assert np.array_equal(got, x)
    assert writeable  # a copy belongs to the consumer


@pytest.mark.parametrize("shape", SHAPES + EMPTY_SHAPES, ids=str)
def test_every_shape(pool, worker, shape):
    x = sample(shape, "float32")
    d = pool.publish(x)
    assert d.shape == shape and d.length == x.nbytes
    got, _ = worker.call("receive_array", d, 0)
    assert got.shape == shape
    assert np.array_equal(got, x)


def test_all_dtypes_and_shapes_in_one_go(pool, worker):
    xs = [sample(shape, dtype) for dtype in NUMPY_DTYPES for shape in ((), (3, 1, 2), (0, 2))]
    ds = [pool.publish(x) for x in xs]
    got = worker.call("receive_arrays", ds, 0)
    for x, y in zip(xs, got):
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)


def test_bfloat16_through_a_reservation(pool, worker):
    # numpy has no bfloat16: the producer writes raw bytes into a bfloat16 reservation and the
    # consumer checks the raw bytes it received.
    res = pool.reserve((2, 3), "bfloat16")
    assert (res.dtype, res.shape, res.nbytes) == ("bfloat16", (2, 3), 12)
    payload = np.array([1.0, -2.0, 0.5, 3.0, 0.0, 1024.0], np.float32)
    bf16 = (payload.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # exact for these
    memoryview(res)[:] = bf16
    res.commit()
    got = worker.call("receive_raw", res.descriptor, 0)
    assert got == {"dtype": "bfloat16", "shape": (2, 3), "nbytes": 12, "data": bf16}


def test_reservation_through_dlpack(pool, worker):
    res = pool.reserve([3, 4], np.int32)  # a numpy dtype works too
    assert res.dtype == "int32"
    arr = np.from_dlpack(res)
    assert arr.flags.writeable and arr.shape == (3, 4)
    arr[...] = np.arange(12, dtype=np.int32).reshape(3, 4)
    del arr
    res.commit()
    got, _ = worker.call("receive_array", res.descriptor, 0)
    assert np.array_equal(got, np.arange(12).reshape(3, 4))


def test_reserve_dtype_names(pool):
    for name in ["float32", "bfloat16", "complex128", "bool", "uint64", "float32x4"]:
        res = pool.reserve((1,), name)
        assert res.dtype == name and res.descriptor.dtype == name
        res.cancel()
    with pytest.raises(ValueError, match="unknown dtype"):
        pool.reserve((1,), "float")


def test_view_round_trip(pool, worker):
    x = sample((8, 8), "float64")
    d = pool.publish(x)
    got, writeable = worker.call("receive_array", d, 0, copy=False)
    assert np.array_equal(got, x)
    assert not writeable  # views are the producer's memory: read-only


@pytest.mark.parametrize("dtype", ["uint8", "float32", "complex128", "bool"])
def test_receive_into_out(pool, worker, dtype):
    x = sample((6, 7), dtype)
    d = pool.publish(x)
    got = worker.call("receive_into", d, 0)  # out= a numpy array of the same shape
    assert got.dtype == x.dtype and np.array_equal(got, x)
    wait_until(lambda: in_flight(pool) == 0)  # host pools: acknowledged by receive
    flat = worker.call("receive_into", pool.publish(x), 0, shape=(42,))  # any shape
    assert np.array_equal(flat, x.reshape(-1))
    wait_until(lambda: in_flight(pool) == 0)
    with pytest.raises(ferry.Stale):  # read and acknowledged already: nothing is copied
        worker.call("receive_into", d, 0)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [({"dtype": "float64"}, ValueError, "out= holds 12 elements of float64; the tensor "
                                        "received has 12 of float32"),
     ({"shape": (13,)}, ValueError, "out= holds 13 elements of float32"),
     ({"copy": False}, ValueError, "cannot be combined with copy=False")],
    ids=["dtype", "count", "view"])  # fmt: skip
def test_receive_into_refusals_change_nothing(pool, worker, kwargs, error, message):
    x = sample((3, 4), "float32")
    d = pool.publish(x)
    with pytest.raises(error, match=message):
        worker.call("receive_into", d, 0, **kwargs)
    assert in_flight(pool) == 1  # not acknowledged: the lease can still be received
    assert np.array_equal(worker.call("receive_into", d, 0), x)
    wait_until(lambda: in_flight(pool) == 0)


def test_receive_into_refuses_read_only_and_strided(pool, worker):
    d = pool.publish(sample((4, 4), "int32"))
    for kind, match in (("readonly", "read-only"), ("strided", "C-contiguous")):
        with pytest.raises((ValueError, BufferError), match=match):
            worker.call("receive_into_special", d, 0, kind)
    assert in_flight(pool) == 1
    worker.call("receive_into", d, 0)
    wait_until(lambda: in_flight(pool) == 0)


@pytest.mark.parametrize(
    "make",
    [lambda a: a[:, ::2], lambda a: a.T, lambda a: a[::-1], lambda a: a[:, 1:3]],
    ids=["step", "transpose", "reversed", "column-slice"],
)
def test_non_contiguous_refused(pool, make):
    x = make(np.arange(24, dtype=np.float32).reshape(4, 6))
    assert not x.flags.c_contiguous
    with pytest.raises(ValueError, match="C-contiguous"):
        pool.publish(x)
    assert pool.stats()["publishes"] == 0


def test_contiguous_with_odd_strides_accepted(pool, worker):
    # Size-1 dimensions may carry any stride: still C-contiguous.
    x = np.arange(6, dtype=np.int16).reshape(6, 1)[:, ::1]
    got, _ = worker.call("receive_array", pool.publish(x), 0)
    assert np.array_equal(got, x)


def test_objects_without_dlpack_refused(pool):
    with pytest.raises(TypeError, match="__dlpack__"):
        pool.publish([1, 2, 3])
    with pytest.raises(ValueError, match="at least one"):
        pool.publish_many([])


def test_too_many_dimensions_refused(pool):
    with pytest.raises(ValueError, match="at most 8"):
        pool.publish(np.zeros((1,) * 9))


def test_received_object(pool):
    x = sample((2, 3), "int64")
    d = pool.publish(x)
    r = ferry.receive(d, rank=0)
    assert (r.shape, r.dtype, r.nbytes, r.readonly) == ((2, 3), "int64", 48, False)
    assert r.descriptor is d and r.__dlpack_device__() == (1, 0)
    assert bytes(r) == x.tobytes()  # host results support the buffer protocol
    arr = np.from_dlpack(r)
    assert r.exported and np.array_equal(arr, x)
    with pytest.raises(BufferError):
        np.from_dlpack(r)  # exported once
    with pytest.raises(BufferError):
        memoryview(r)


def test_large_host_copies_reuse_their_memory():
    # Host copies of 1 MiB and more reuse buffers kept when the last copy was freed (malloc
    # maps fresh memory for large sizes, whose page faults cost more than the copy), a few and
    # 256 MiB at most; release_memory() frees them.
    ferry.release_memory()
    assert ferry._ferry._host_buffers_kept() == 0
    x = np.arange(3 << 18, dtype=np.int32)  # 3 MiB
    with ferry.Pool(32 << 20, 1, drain_timeout=0) as pool, ferry.connect(pool.address, 0) as rx:
        sent = pool.send(x)
        r = rx.recv()
        assert r.descriptor == sent  # made when asked for
        a = np.from_dlpack(r)
        first = a.__array_interface__["data"][0]
        assert np.array_equal(a, x)
        del a, r
        assert ferry._ferry._host_buffers_kept() >= x.nbytes
        pool.send(x[: len(x) * 2 // 3])  # two thirds: served by the kept buffer
        b = np.from_dlpack(rx.recv())
        assert b.__array_interface__["data"][0] == first
        assert ferry._ferry._host_buffers_kept() == 0 and np.array_equal(b, x[: len(b)])
        pool.send(np.zeros(1 << 10, np.int32))  # small copies come from malloc
        c = np.from_dlpack(rx.recv())
        del b, c
        kept = ferry._ferry._host_buffers_kept()
        assert kept >= x.nbytes
        ferry.release_memory()
        assert ferry._ferry._host_buffers_kept() == 0


def test_received_legacy_capsule(pool):
    d = pool.publish(sample((5,), "uint16"))
    capsule = ferry.receive(d, rank=0).__dlpack__()  # no max_version: legacy "dltensor"
    assert "dltensor" in repr(capsule) and "versioned" not in repr(capsule)
    del capsule  # an unconsumed capsule frees its tensor


def test_received_buffer_blocks_dlpack(pool):
    r = ferry.receive(pool.publish(sample((5,), "uint8")), rank=0, copy=False)
    m = memoryview(r)
    assert m.readonly and m.tobytes() == bytes(range(5))
    with pytest.raises(BufferError):
        r.__dlpack__()
    m.release()
    assert np.array_equal(np.from_dlpack(r), np.arange(5))


def test_descriptor_properties(pool):
    x = sample((3, 7), "float16")
    d = pool.publish(x)
    pool_only = pool.describe()
    assert d.backend == "host" and d.device == -1
    assert d.slot >= 0 and d.generation >= 1 and d.length == x.nbytes
    assert d.shape == (3, 7) and d.dtype == "float16" and d.consumer_count == 1
    assert isinstance(d.pool_id, bytes) and len(d.pool_id) == 16
    assert d.pool_id == pool_only.pool_id and pool_only.pool_only and not d.pool_only
    assert d.max_inflight == 4096 and d.pool_size == 1 << 20 and not d.multi
