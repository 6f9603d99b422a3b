"""The package's GPU code paths (stream-ordered publish and receive, device copies, views
acknowledged on a stream, DLPack export of CUDA memory) against ferry's fake CUDA driver, in
worker processes: runs wherever the repository's build has made the fake
(build/tests/libferry_fakecuda.so, or FERRY_FAKE_CUDA=path). test_gpu.py is the real thing."""

import os
import pathlib

import numpy as np
import pytest

import ferry
from conftest import Worker, wait_until
from fakecuda import CudaLike

REPO = pathlib.Path(__file__).resolve().parents[2]
FAKE = os.environ.get("FERRY_FAKE_CUDA") or str(REPO / "build" / "tests" / "libferry_fakecuda.so")
pytestmark = pytest.mark.skipif(not os.path.exists(FAKE), reason="fake CUDA driver not built")

DL_CUDA = 2


@pytest.fixture(scope="module")
def fake_pair():
    env = {"FERRY_CUDA_DRIVER": FAKE, "FERRY_FAKE_CUDA_DEVICES": "2"}
    pair = [Worker(env), Worker(env)]
    yield pair
    for w in pair:
        w.stop()


@pytest.fixture(params=["cuda_ipc", "cuda_vmm"])
def gpu(fake_pair, request):
    producer, consumer = fake_pair
    assert producer.call("fake_make_pool", request.param, 8 << 20, 1) == (request.param, 0)
    yield producer, consumer
    producer.call("fake_close")


def drained(producer):
    return producer.call("fake_stats")["leases_in_flight"] == 0


def expect(info, array, device=(DL_CUDA, 0), readonly=False):
    assert info["device"] == device and info["readonly"] == readonly
    assert info["shape"] == array.shape and info["data"] == array.tobytes()
    strides = tuple(s // array.itemsize for s in array.strides) if array.size else info["strides"]
    assert info["strides"] == strides


ARRAYS = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array(7, np.int8),
          np.zeros((0, 2), np.complex128), np.arange(10) % 2 == 0]  # fmt: skip


def test_copies(gpu):
    producer, consumer = gpu
    ds, _ = producer.call("fake_publish", ARRAYS)
    for d, a in zip(ds, ARRAYS):
        assert d.device == 0 and d.shape == a.shape
        info = consumer.call("fake_receive", d, 0)
        expect(info, a)
        assert info["versioned"] and info["received_device"] == (DL_CUDA, 0)
    wait_until(lambda: drained(producer))


def test_cuda_sources_and_streams(gpu):
    producer, consumer = gpu
    a = np.arange(6, dtype=np.float64)
    for stream in (None, 0, 1):
        d, seen = producer.call("fake_publish_streams", a, stream=stream)
        assert seen == [1]  # the legacy default stream, as the DLPack protocol spells it
        expect(consumer.call("fake_receive", d, 0, stream=stream), a)
    wait_until(lambda: drained(producer))


def test_view_acknowledges_when_freed(gpu):
    producer, consumer = gpu
    (d,), _ = producer.call("fake_publish", [np.arange(5, dtype=np.int32)], cuda=True)
    info = consumer.call("fake_hold", "v", d, 0)
    expect(info, np.arange(5, dtype=np.int32), readonly=True)
    assert producer.call("fake_stats")["leases_in_flight"] == 1
    consumer.call("fake_drop", "v")  # the capsule dies: the view is freed, the ack enqueued
    wait_until(lambda: drained(producer))


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "view"])
@pytest.mark.parametrize("export", [{}, {"stream": -1}, {"max_version": (1, 0), "stream": 1},
                                    {"max_version": (1, 0), "stream": None}])  # fmt: skip
def test_export_arguments(gpu, copy, export):
    producer, consumer = gpu
    a = np.arange(4, dtype=np.uint16)
    (d,), _ = producer.call("fake_publish", [a])
    info = consumer.call("fake_receive", d, 0, copy=copy, export=export)
    expect(info, a, readonly=not copy and "max_version" in export)
    assert info["versioned"] == ("max_version" in export)
    wait_until(lambda: drained(producer))


def test_copy_used_on_another_stream(gpu):
    # The consumer names a stream other than the receive's: that stream waits for the
    # receive's copy on the GPU (cuStreamWaitEvent), not the host, and the memory is freed in
    # that stream's order once the consumer lets go.
    producer, consumer = gpu
    a = np.arange(8, dtype=np.int64)
    (d,), _ = producer.call("fake_publish", [a])
    data, made, frees = consumer.call("fake_receive_on_stream", d, 0)
    assert data == a.tobytes()
    assert made["cuStreamWaitEvent"] == 1
    assert made["cuEventSynchronize"] == made["cuStreamSynchronize"] == 0
    assert frees == 1


@pytest.mark.parametrize("export", [True, False], ids=["exported", "dropped"])
def test_copies_come_from_a_stream_ordered_pool(gpu, export):
    # A copy's memory comes from the stream-ordered pool and goes back to it in stream order:
    # no cuMemAlloc / cuMemFree (which waits for the device) per item, and the pool holds as
    # much after the last of twelve items as after the second.
    producer, consumer = gpu
    arrays = [np.full(3000, i, np.int32) for i in range(12)]
    ds, _ = producer.call("fake_publish", arrays)
    got, made, second, last = consumer.call("fake_receive_counts", ds, 0, export=export)
    if export:
        assert got == [a.tobytes() for a in arrays]
    assert made["cuMemAlloc"] == made["cuMemFree"] == 0
    assert made["cuMemAllocFromPoolAsync"] == made["cuMemFreeAsync"] == 12
    assert made["cuEventSynchronize"] == 12  # synchronize(): the copy, not a whole stream
    assert second == last > 0
    wait_until(lambda: drained(producer))
    before, after = consumer.call("fake_release_memory")
    assert before > 0 and after == 0


@pytest.mark.parametrize("current, recv_stream, waits",
                         [(None, None, 0), ("new", None, 0), ("new", "new", 2)],
                         ids=["legacy", "torch-stream", "other-stream"])
def test_torch_receive_uses_torchs_allocator(gpu, current, recv_stream, waits):
    # torch=True: the tensor comes from torch.empty (torch's allocator, on torch's current
    # stream) and is read into as out= is: ferry allocates nothing. On a stream= other than
    # torch's current one, that stream first waits for torch's (the memory's last users) and
    # torch's then waits for the copy.
    producer, consumer = gpu
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (d,), _ = producer.call("fake_publish", [a])
    types, data, devices, empties, made, current_stream, device = consumer.call(
        "fake_torch_receive", d, 0, current=current, recv_stream=recv_stream)
    assert types == ["Tensor"] and data == [a.tobytes()] and devices == [0]
    assert empties == [((2, 3, 4), "float32", 0, current_stream)]
    assert made["cuMemAllocFromPoolAsync"] == made["cuMemAlloc"] == 0
    assert made["cuStreamWaitEvent"] == waits
    wait_until(lambda: drained(producer))


def test_torch_receive_from_a_host_pool(fake_pair):
    # torch=True on a host pool: a CPU tensor from torch.empty, copied into on the CPU.
    producer, consumer = fake_pair
    producer.call("fake_make_pool", "host", 4 << 20, 1)
    try:
        a = np.arange(10, dtype=np.int32)
        (d,), _ = producer.call("fake_publish", [a])
        types, data, devices, empties, made, _, _ = consumer.call("fake_torch_receive", d, 0,
                                                                  host=True)
        assert types == ["Tensor"] and data == [a.tobytes()] and devices == [None]
        assert empties == [((10,), "int32", None, 0)] and made["cuMemAllocFromPoolAsync"] == 0
        wait_until(lambda: drained(producer))
    finally:
        producer.call("fake_close")


def test_torch_receive_many_and_views(gpu):
    producer, consumer = gpu
    arrays = [np.arange(6, dtype=np.int64), np.ones((2, 2), np.uint8)]
    ds, _ = producer.call("fake_publish", arrays, many=True)
    types, data, _, empties, made, _, _ = consumer.call("fake_torch_receive_many", ds, 0)
    assert types == ["Tensor", "Tensor"] and data == [a.tobytes() for a in arrays]
    assert [e[:2] for e in empties] == [((6,), "int64"), ((2, 2), "uint8")]
    (d,), _ = producer.call("fake_publish", [arrays[0]])
    types, data, _, empties, _, _, _ = consumer.call("fake_torch_receive", d, 0, copy=False)
    assert types == ["Tensor"] and data == [arrays[0].tobytes()] and empties == []
    wait_until(lambda: drained(producer))


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "view"])
def test_multi_tensor(gpu, copy):
    producer, consumer = gpu
    ds, seen = producer.call("fake_publish", ARRAYS, cuda=True, many=True)
    assert seen == [[1]] * len(ARRAYS)
    assert producer.call("fake_stats")["leases_in_flight"] == 1
    infos = consumer.call("fake_receive_many", ds, 0, copy=copy)
    for info, a in zip(infos, ARRAYS):
        expect(info, a, readonly=not copy)
    wait_until(lambda: drained(producer))


def test_reservation(gpu):
    producer, consumer = gpu
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    d, device, dlpack_device = producer.call("fake_reserve", (4, 4), "float32", a.tobytes())
    assert device == dlpack_device == (DL_CUDA, 0)
    expect(consumer.call("fake_receive", d, 0), a)


def test_consumer_on_another_device(gpu):
    producer, consumer = gpu
    a = np.arange(3, dtype=np.float32)
    for copy in (True, False):
        (d,), _ = producer.call("fake_publish", [a])
        expect(consumer.call("fake_receive", d, 0, device=1, copy=copy), a, device=(DL_CUDA, 1),
               readonly=not copy)  # fmt: skip
    wait_until(lambda: drained(producer))


def test_stale_and_bad_device(gpu):
    producer, consumer = gpu
    (d,), _ = producer.call("fake_publish", [np.arange(3)])
    consumer.call("fake_receive", d, 0)
    assert consumer.call("fake_receive_error", d, 0)[0] == "Stale"
    (d,), _ = producer.call("fake_publish", [np.arange(3)])
    name, message = consumer.call("fake_receive_error", d, 0, device=7)
    assert name == "ValueError" and "device 7" in message


@pytest.mark.parametrize("device", [0, 1])
def test_receive_into_out(gpu, device):
    # out= on device 0 or 1 (the consumer's device follows it); the acknowledgement is
    # enqueued after the copy, so a drained pool means the copy ran.
    producer, consumer = gpu
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    for stream in (None, 1):
        (d,), _ = producer.call("fake_publish", [a], cuda=True)
        seen = consumer.call("fake_receive_into", "out", d, 0, device=device, stream=stream)
        assert seen == [1]  # the legacy default stream, handed to out's __dlpack__
        wait_until(lambda: drained(producer))
        assert consumer.call("fake_read_out", "out") == (a.tobytes(), (4, 6))


def test_receive_into_refusal_changes_nothing(gpu):
    producer, consumer = gpu
    (d,), _ = producer.call("fake_publish", [np.arange(6, dtype=np.int16)])
    name, message = consumer.call("fake_receive_error", d, 0, out=np.zeros(5, np.int16))
    assert name == "ValueError" and "out= holds 5 elements of int16" in message
    assert not drained(producer)
    consumer.call("fake_receive_into", "out", d, 0)
    wait_until(lambda: drained(producer))
    assert consumer.call("fake_read_out", "out")[0] == np.arange(6, dtype=np.int16).tobytes()


# A dtype per backend: ferry learns a dtype once per process (the workers serve both).
FRESH_DTYPE = {"cuda_ipc": (np.float32, np.uint16), "cuda_vmm": (np.float16, np.int64)}


def test_torch_fast_path(gpu, request):
    # The first tensor of a dtype goes through DLPack (stream -1: it is on torch's current
    # stream already) and teaches ferry the dtype; the next ones skip DLPack. Tensors DLPack
    # would export differently, or on a stream that is not torch's current one, keep to it.
    producer, consumer = gpu
    dtype = FRESH_DTYPE[request.node.callspec.params["gpu"]][0]
    a, b = np.arange(6, dtype=dtype), np.arange(6, 12, dtype=dtype)
    ds, streams = producer.call("fake_torch_publish", [a, b, a])
    assert streams == [[-1], [], []]
    for d, x in zip(ds, [a, b, a]):
        assert d.dtype == np.dtype(dtype).name and d.shape == (6,)
        expect(consumer.call("fake_receive", d, 0), x)
    ds, streams = producer.call("fake_torch_publish", [b], current_stream=0x1234)
    assert streams == [[1]]  # torch is asked to order its stream before ferry's
    expect(consumer.call("fake_receive", ds[0], 0), b)
    for flag in ("requires_grad", "conj"):
        ds, streams = producer.call("fake_torch_publish", [a], **{flag: True})
        assert streams == [[-1]]
        expect(consumer.call("fake_receive", ds[0], 0), a)
    ds, streams = producer.call("fake_torch_publish", [a], contiguous=False)
    assert streams == [[-1]]  # DLPack's strides decide (here C-contiguous after all)
    wait_until(lambda: consumer.call("fake_receive", ds[0], 0) is not None)
    wait_until(lambda: drained(producer))


def test_torch_export_on_the_tensors_device(gpu):
    # torch exports a CUDA tensor only while its device is torch's current one: a publish
    # through DLPack makes it so for the export, then puts torch's current device back.
    producer, _ = gpu
    exported, after = producer.call("fake_torch_publish_elsewhere",
                                    np.arange(5, dtype=np.int16), 1)
    assert exported == [0] and after == 1
    exported, after = producer.call("fake_torch_publish_elsewhere",
                                    np.arange(5, dtype=np.int16), 0)
    assert exported == [0] and after == 0


def test_torch_fast_path_into_out(gpu, request):
    producer, consumer = gpu
    a = np.arange(10, dtype=FRESH_DTYPE[request.node.callspec.params["gpu"]][1])
    for expected_streams in ([-1], []):  # DLPack once, then the fast path
        (d,), _ = producer.call("fake_publish", [a])
        assert consumer.call("fake_torch_receive_into", d, 0) == expected_streams
        wait_until(lambda: drained(producer))
        assert consumer.call("fake_torch_read_out") == a.tobytes()


def test_host_pool_refuses_cuda_memory():
    with ferry.Pool(1 << 20, 1, backend="host") as pool:
        with pytest.raises(ValueError, match="a host pool needs CPU data"):
            pool.publish(CudaLike(np.ones(3)))


def test_concurrent_exports_take_the_tensor_once(gpu):
    # Exports wait for the copy's event without the GIL: two threads must not both get the
    # tensor (its memory would be freed twice), nor synchronize() read it once freed.
    producer, consumer = gpu
    a = np.arange(64, dtype=np.float32)
    ds = [producer.call("fake_publish", [a])[0][0] for _ in range(20)]
    assert consumer.call("fake_race_exports", ds, 0) == [1] * 20
    wait_until(lambda: drained(producer))


def test_pool_in_a_cycle_through_a_held_source(gpu, request):
    producer, _ = gpu
    assert producer.call("fake_pool_cycle", request.node.callspec.params["gpu"])


def test_auto_backend_follows_the_data(fake_pair):
    """backend="auto": a pool for a GPU is a CUDA IPC pool where the machine supports it; a
    pool that names no device (or host memory) is a host pool."""
    producer, _ = fake_pair
    assert producer.call("fake_make_pool", "auto", 8 << 20, 1, device=1) == ("cuda_ipc", 1)
    producer.call("fake_close")
    assert producer.call("fake_make_pool", "auto", 8 << 20, 1) == ("host", -1)
    producer.call("fake_close")
    assert producer.call("fake_make_pool", "auto", 8 << 20, 1, device=-1) == ("host", -1)
    producer.call("fake_close")
    # A GPU backend that names no device is on GPU 0.
    assert producer.call("fake_make_pool", "cuda_ipc", 8 << 20, 1) == ("cuda_ipc", 0)
    producer.call("fake_close")


@pytest.mark.parametrize("cuda", [False, True], ids=["host_source", "cuda_source"])
def test_channel_send_and_recv(gpu, cuda):
    producer, consumer = gpu
    a, b = np.arange(6, dtype=np.float32), np.arange(5, dtype=np.int16)
    address, d = producer.call("fake_send", [a], cuda=cuda)
    assert d.device == 0
    (info,) = consumer.call("fake_channel_recv", address, 0)
    assert info["data"] == a.tobytes() and info["device"] == (DL_CUDA, 0)
    producer.call("fake_send", [a, b], cuda=cuda)
    infos = consumer.call("fake_channel_recv", address, 0, copy=False)
    assert [i["data"] for i in infos] == [a.tobytes(), b.tobytes()]
    producer.call("fake_send", [b], cuda=cuda)
    (info,) = consumer.call("fake_channel_recv", address, 0, out=((5,), "int16"))
    assert info["data"] == b.tobytes()
    wait_until(lambda: drained(producer))
