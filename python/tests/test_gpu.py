"""ferry on real GPUs, with torch CUDA tensors: cuda_ipc and cuda_vmm pools, consumers in
spawned processes on the producer's GPU or another one, views used by torch kernels before
they acknowledge, and streams other than the default. Skipped without torch and a CUDA
device (scripts/gpu-check's machine runs it)."""

import numpy as np
import pytest

import ferry
from conftest import in_flight, wait_until

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

BACKENDS = ["cuda_ipc", "cuda_vmm"]
DTYPES = ["float32", "float16", "bfloat16", "int64", "int8", "uint8", "bool", "complex64"]
SHAPES = [(), (5,), (3, 4), (0, 3), (2,) * 8]


def cuda_sample(shape, dtype, device="cuda:0", scale=1):
    t = torch.arange(int(np.prod(shape, dtype=np.int64)), device=device).reshape(shape) * scale
    if dtype == "bool":
        return t % 3 == 0
    return (t % 100).to(getattr(torch, dtype))


@pytest.fixture(params=BACKENDS)
def pool(request):
    with ferry.Pool(64 << 20, 1, backend=request.param, device=0) as p:
        assert p.backend == request.param and p.device == 0
        yield p


def check(got, expected, device="cuda:0"):
    assert got["device"] == device
    assert got["dtype"] == str(expected.dtype) and got["shape"] == tuple(expected.shape)
    assert torch.equal(got["value"], expected.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_same_gpu(pool, worker, dtype):
    x = cuda_sample((4, 6), dtype)
    d = pool.publish(x)  # stream None: the legacy default stream, torch's default
    assert (d.backend, d.device, d.dtype, d.shape) == (pool.backend, 0, dtype, (4, 6))
    got = worker.call("torch_receive", d, 0)
    check(got, x)
    assert not got["readonly"]
    wait_until(lambda: in_flight(pool) == 0)  # the ack was enqueued after the copy
    check(worker.call("torch_receive", pool.publish(x), 0, into=True), x)
    wait_until(lambda: in_flight(pool) == 0)


def test_receive_into_checks_out(pool, worker):
    x = cuda_sample((4, 6), "float32")
    d = pool.publish(x)
    name, message = worker.call("torch_receive_into_error", d, 0, (4, 6), "float16")
    assert name == "ValueError" and "24 elements of float16" in message
    name, message = worker.call("torch_receive_into_error", d, 0, (5,), "float32")
    assert name == "ValueError" and "5 elements of float32" in message
    check(worker.call("torch_receive", d, 0, into=True), x)  # the failures changed nothing
    wait_until(lambda: in_flight(pool) == 0)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_shapes(pool, worker, shape):
    x = cuda_sample(shape, "float32")
    check(worker.call("torch_receive", pool.publish(x), 0), x)


def test_host_source_into_gpu_pool(pool, worker):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = worker.call("torch_receive", pool.publish(x), 0)
    check(got, torch.from_numpy(x))


def test_host_pool_refuses_cuda_tensors():
    with ferry.Pool(1 << 20, 1, backend="host") as host:
        with pytest.raises(ValueError, match="a host pool needs CPU data"):
            host.publish(torch.ones(4, device="cuda:0"))


def test_view_used_by_kernels_then_acknowledged(pool, worker):
    x = cuda_sample((256, 256), "float32")
    d = pool.publish(x)
    got = worker.call("torch_receive", d, 0, copy=False)
    check(got, x)
    assert got["readonly"]
    assert torch.equal(got["doubled"], (x * 2).cpu())  # a torch kernel read the view
    wait_until(lambda: in_flight(pool) == 0)  # freed by torch: acknowledged on its stream


MODES = {"copy": {"copy": True}, "view": {"copy": False}, "into": {"into": True}}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("recv_side, use_side", [(True, True), (True, False), (False, True)],
                         ids=["side-side", "side-default", "default-side"])  # fmt: skip
def test_streams(pool, worker, mode, recv_side, use_side):
    producer_stream = torch.cuda.Stream()
    with torch.cuda.stream(producer_stream):
        x = cuda_sample((1024, 64), "float32", scale=3)  # computed on the producer's stream
        d = pool.publish(x, stream=producer_stream)  # copied after it, no host sync
    got = worker.call("torch_receive", d, 0, recv_side=recv_side, use_side=use_side,
                      **MODES[mode])
    producer_stream.synchronize()
    check(got, x)
    assert torch.equal(got["doubled"], (x * 2).cpu())
    wait_until(lambda: in_flight(pool) == 0)


def test_stream_handles(pool, worker):
    s = torch.cuda.Stream()
    x = cuda_sample((8,), "int64")
    torch.cuda.synchronize()
    for stream in (s, s.cuda_stream, 0, None):  # a torch stream, its int handle, legacy
        check(worker.call("torch_receive", pool.publish(x, stream=stream), 0), x)


def test_multi_tensor(pool, worker):
    xs = [cuda_sample((3, 3), "float32"), cuda_sample((7,), "int64"), cuda_sample((), "bool")]
    for copy in (True, False):
        ds = pool.publish_many(xs)
        assert in_flight(pool) == 1
        got = worker.call("torch_receive_many", ds, 0, copy=copy)
        for x, y in zip(xs, got):
            assert torch.equal(x.cpu(), y)
        wait_until(lambda: in_flight(pool) == 0)


def test_reservation_written_by_torch(pool, worker):
    res = pool.reserve((16, 16), torch.bfloat16)
    assert res.__dlpack_device__() == (2, 0)
    target = torch.from_dlpack(res)
    assert target.device == torch.device("cuda:0") and target.dtype == torch.bfloat16
    expected = cuda_sample((16, 16), "bfloat16")
    target.copy_(expected)  # on the current (default) stream
    res.commit(stream=torch.cuda.current_stream())  # ready after the copy, stream-ordered
    del target
    check(worker.call("torch_receive", res.descriptor, 0), expected)


def test_source_kept_alive_until_copied(pool, worker):
    # The temporaries die at once; publish keeps them until its stream has run the copies.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        ds = [pool.publish(torch.full((1 << 16,), i, device="cuda:0"), stream=s)
              for i in range(8)]  # fmt: skip
        junk = [torch.empty(1 << 16, device="cuda:0").fill_(-1) for _ in range(8)]
    for i, d in enumerate(ds):
        got = worker.call("torch_receive", d, 0)
        assert torch.equal(got["value"], torch.full((1 << 16,), i))
    del junk


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("mode", MODES)
def test_consumer_on_another_gpu(pool, worker, mode):
    x = cuda_sample((64, 64), "float32")
    d = pool.publish(x)
    got = worker.call("torch_receive", d, 0, device=1, **MODES[mode])
    check(got, x, device="cuda:1")
    assert torch.equal(got["doubled"], (x * 2).cpu())
    wait_until(lambda: in_flight(pool) == 0)


def test_producer_on_another_gpu(worker):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    for backend in BACKENDS:
        with ferry.Pool(16 << 20, 1, backend=backend, device=1) as pool:
            x = cuda_sample((32,), "float32", device="cuda:1")
            d = pool.publish(x, stream=torch.cuda.current_stream(1))
            assert d.device == 1
            check(worker.call("torch_receive", d, 0), x, device="cuda:1")  # default: d.device
            check(worker.call("torch_receive", pool.publish(x), 0, device=0), x, "cuda:0")
