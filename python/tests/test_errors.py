"""Errors: classes, statuses and the library's exact messages; a producer that dies."""

import time

import numpy as np
import pytest

import ferry
import workers
from conftest import CTX, Worker


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"size": 0, "consumers": 1}, "memory_size must be positive"),
        ({"size": 1 << 20, "consumers": 0}, "consumer_count must be positive"),
        ({"size": 1 << 20, "consumers": 1, "max_inflight": 0},
         "max_inflight_slices must be positive"),
        ({"size": 1 << 20, "consumers": 1, "reclaim_interval_us": 0},
         "recycle_interval must be positive"),
        ({"size": 1000, "consumers": 1},
         "host pool is too small after control metadata: pool=1000, control=32768"),
        ({"size": 300, "consumers": 1, "backend": "host", "max_inflight": 16},
         "host pool is too small after control metadata: pool=300, control=256"),
        ({"size": 1 << 20, "consumers": 1, "backend": "bogus"},
         'unknown backend "bogus" (expected auto, host, cuda_ipc or cuda_vmm)'),
        ({"size": 1 << 20, "consumers": 1, "on_full": "block"},
         'unknown on_full policy "block" (expected raise, none, wait)'),
        ({"size": 1 << 20, "consumers": 1, "control": "gpu"},
         'unknown control placement "gpu" (expected host, device)'),
        ({"size": 1 << 20, "consumers": 1, "control": "device"},
         "control words can live on the device only in a GPU pool"),
        ({"size": 1 << 20, "consumers": 1, "timeout": -1},
         "timeout must be a non-negative number of seconds, got -1"),
    ],
)  # fmt: skip
def test_invalid_pool_arguments(kwargs, message):
    kwargs = dict(kwargs)
    with pytest.raises(ValueError) as info:
        ferry.Pool(kwargs.pop("size"), kwargs.pop("consumers"), **kwargs)
    assert str(info.value) == message


def test_library_value_errors_carry_status():
    with pytest.raises(ValueError) as info:
        ferry.Pool(0, 1)
    assert info.value.status == "INVALID_ARGUMENT"
    with pytest.raises(ValueError) as info:
        ferry.Descriptor.from_bytes(b"\x00" * 256)
    assert info.value.status == "MALFORMED"


def test_split_budget():
    assert ferry.split_budget(10, 3) == 3
    assert ferry.split_budget(8 << 30, 8) == 1 << 30
    with pytest.raises(ValueError, match="^total_pool_size must be positive$"):
        ferry.split_budget(0, 3)
    with pytest.raises(ValueError, match="^tokenizer_worker_num must be positive$"):
        ferry.split_budget(10, 0)


def test_exception_hierarchy():
    assert issubclass(ferry.Error, RuntimeError)
    for cls in (ferry.PoolFull, ferry.Stale, ferry.ProducerGone, ferry.Timeout,
                ferry.PoolFailed, ferry.Closing, ferry.RankInUse, ferry.Forked,
                ferry.TooLarge):  # fmt: skip
        assert issubclass(cls, ferry.Error)
        assert cls.__name__ in ferry.__all__ and cls.__module__ == "ferry"
    assert issubclass(ferry.Timeout, TimeoutError)
    assert issubclass(ferry.TooLarge, ferry.PoolFull)
    assert not issubclass(ferry.Error, ValueError)


def test_rank_in_use(workers_pair):
    first, second = workers_pair
    with ferry.Pool(1 << 20, 2) as pool:
        d = pool.publish(np.arange(3))
        first.call("receive_array", d, 0)
        with pytest.raises(ferry.RankInUse) as info:  # rank 0 is the first worker's
            second.call("receive_array", d, 0)
        assert info.value.status == "RANK_IN_USE" and str(first.pid) in str(info.value)
        assert second.call("receive_array", d, 1)[0].tolist() == [0, 1, 2]


def test_timeout():
    with ferry.Pool(1 << 20, 1) as pool:
        res = pool.reserve((4,), "float32")  # never committed
        start = time.monotonic()
        with pytest.raises(ferry.Timeout) as info:
            ferry.receive(res.descriptor, rank=0, timeout=0.1)
        assert 0.09 <= time.monotonic() - start < 2
        assert isinstance(info.value, TimeoutError) and info.value.status == "TIMEOUT"
        assert str(info.value) == (
            f"lease (slot={res.descriptor.slot}, generation={res.descriptor.generation}) "
            "not ready after 100.000 ms"
        )
        res.commit()
        assert np.from_dlpack(ferry.receive(res.descriptor, rank=0)).shape == (4,)
        with pytest.raises(ferry.Error) as again:
            res.commit()
        assert again.value.status == "INACTIVE_LEASE"


def test_receive_arguments():
    with ferry.Pool(1 << 20, 1) as pool:
        d = pool.publish(np.arange(3))
        with pytest.raises(ValueError) as info:
            ferry.receive(d, rank=5)
        assert str(info.value) == "rank 5 is out of range (consumers=1)"
        with pytest.raises(ValueError, match="rank must be a non-negative int"):
            ferry.receive(d, rank=-1)
        with pytest.raises(TypeError, match="rank="):
            ferry.receive(d)
        with pytest.raises(ValueError, match="timeout"):
            ferry.receive(d, rank=0, timeout=float("nan"))
        with pytest.raises(ValueError) as info:
            ferry.receive(pool.describe(), rank=0)
        assert str(info.value) == "a pool-only descriptor names no lease: it can only open the pool"
        with pytest.raises(TypeError, match="Descriptor"):
            ferry.receive(12, rank=0)
        got = ferry.receive(bytes(d), rank=0)  # the wire form works too
        assert np.array_equal(np.from_dlpack(got), np.arange(3))


def test_receive_keywords():
    # receive, receive_many and recv parse their keywords themselves (no dict per call): the
    # same refusals as Python's own parsing, nothing read or acknowledged.
    with ferry.Pool(1 << 20, 1) as pool:
        d = pool.publish(np.arange(3))
        cases = [
            (lambda: ferry.receive(), "receive() missing its required argument 'descriptor'"),
            (lambda: ferry.receive(d, 0), "receive() takes at most 1 positional argument (2 "
                                          "given)"),
            (lambda: ferry.receive(d, rank=0, bogus=1), "receive() got an unexpected keyword "
                                                        "argument 'bogus'"),
            (lambda: ferry.receive(descriptor=d, rank=0, **{"descriptor": d}), None),
            (lambda: ferry.receive_many([d], rank=0, out=np.empty(3)),
             "receive_many() got an unexpected keyword argument 'out'"),
            (lambda: ferry.receive_many(rank=0), "receive_many() missing its required "
                                                 "argument 'descriptors'"),
        ]
        for call, message in cases:
            with pytest.raises(TypeError) as info:
                call()
            if message:
                assert str(info.value) == message
        with pytest.raises(TypeError, match="got multiple values for keyword argument 'rank'"):
            ferry.receive(d, **{"rank": 0}, **{"ra" + "nk": 0})
        out = np.empty(3, np.int64)
        key = "".join(["o", "u", "t"])  # a keyword name that is not the interned one
        assert ferry.receive(descriptor=d, rank=0, **{key: out}) is out
        assert out.tolist() == [0, 1, 2]
        pool.drain(timeout=5)  # read and acknowledged once, the refusals took nothing
        with ferry.connect(pool.address, 0) as rx:
            pool.send(np.arange(2))
            with pytest.raises(TypeError, match="recv\\(\\) got an unexpected keyword"):
                rx.recv(timeout=1, nope=True)
            with pytest.raises(TypeError, match="at most 5 positional"):
                rx.recv(1, True, None, None, None, 6)
            assert np.from_dlpack(rx.recv(1)).tolist() == [0, 1]


def test_closing():
    pool = ferry.Pool(1 << 20, 1)
    d = pool.publish(np.arange(3))
    pool.close()
    pool.close()  # idempotent
    assert pool.closed
    with pytest.raises(ferry.Closing) as info:
        pool.publish(np.arange(3))
    assert str(info.value) == "host pool is closing" and info.value.status == "CLOSING"
    with pytest.raises(ferry.Closing):
        pool.cancel(d)
    with pytest.raises(ferry.Closing):
        pool.describe()


def test_healthy_pool_has_no_error():
    with ferry.Pool(1 << 20, 1) as pool:
        assert pool.error() is None


def test_producer_gone_while_waiting(worker):
    queue = CTX.Queue()
    producer = CTX.Process(target=workers.produce_and_hang, args=(queue, 1 << 20), daemon=True)
    producer.start()
    try:
        d = ferry.Descriptor.from_bytes(queue.get(timeout=60))
        worker.submit("receive_timed", d, 0, timeout=30)  # waits on a lease never committed
        time.sleep(0.3)
        producer.kill()
        name, message, seconds = worker.result()
        assert name == "ProducerGone"
        assert message.startswith("producer of the pool (pid ")
        assert "is gone or closed the pool" in message and "will never be ready" in message
        assert seconds < 5  # noticed within ferry's liveness checks, far before the timeout
        start = time.monotonic()
        with pytest.raises(ferry.ProducerGone) as info:  # a fresh consumer: broker unreachable
            ferry.receive(d, rank=0, timeout=30)
        assert time.monotonic() - start < 10
        assert info.value.status == "PRODUCER_GONE"
    finally:
        producer.kill()
        producer.join(10)


def test_gpu_pool_without_a_driver():
    w = Worker({"FERRY_CUDA_DRIVER": "/nonexistent/libcuda.so.1"})
    try:
        for backend, name in (("cuda_ipc", "CUDA IPC"), ("cuda_vmm", "CUDA VMM")):
            cls, message, status = w.call("pool_error", backend)
            assert (cls, status) == ("Error", "NOT_SUPPORTED")
            assert message.startswith(f"{name} pool needs the CUDA driver: no CUDA driver: "
                                      "/nonexistent/libcuda.so.1")
    finally:
        w.stop()


def test_pool_repr():
    pool = ferry.Pool(1 << 20, 1)
    assert repr(pool) == ("ferry.Pool(backend='host', size='1MiB', consumers=1, device=-1, "
                          "on_full='raise', closed=False)")
    pool.close()
    assert repr(pool).endswith(", closed=True)")
