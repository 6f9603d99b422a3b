"""ferry.sglang against SGLang's own code (the pinned wheel: python/tests/engines.txt).

The proxies are SGLang's proxy class to every isinstance check, travel pickled (SGLang's
ZMQ path) and by SGLang's own msgpack encoder, and are read by real consumer processes, one
per rank; SGLang's plugin loader puts the classes in place; SGLang's tokenizer-side wrap
falls back to its CPU path on a full pool; a consumer on another "host" (a network
namespace) reads over UCX. Host pools here, GPU pools too where torch sees a GPU (the GPU
machine: scripts/gpu-check). Skipped, with the reason, where SGLang cannot be imported."""

import logging
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.multimodal.transport.cuda_ipc",
                    reason="SGLang is not installed here: python/run-tests runs this file in "
                           "its engines environment (python/tests/engines.txt)")

import ferry  # noqa: E402
from ferry import sglang as fs  # noqa: E402
from hosts import Hosts, have_ucx  # noqa: E402
from sglang.srt.multimodal.transport import cuda_ipc as sg  # noqa: E402

CTX = mp.get_context("spawn")
DEVICES = [-1] + ([0] if torch.cuda.is_available() else [])


def sample(i, shape=(64, 96), dtype=torch.bfloat16, device=-1):
    n = 1
    for s in shape:
        n *= s
    t = (torch.arange(n, dtype=torch.float32).reshape(shape) * 0.25 + i) % 251
    return t.to(dtype).to("cpu" if device < 0 else f"cuda:{device}")


def _consumer(rank, device, proxies, results, hold):
    """A scheduler rank: reconstructs each proxy it is handed, reports a digest."""
    try:
        got = []
        while True:
            p = proxies.get(timeout=60)
            if p is None:
                break
            if hold.is_set() and got:  # a stuck rank: read one (attached), then no more
                if len(got) == 1:
                    results.put((rank, "held", list(got)))
                    got.append(None)
                continue
            t = p.reconstruct_on_target_device(max(device, 0), consumer_rank=rank)
            if device >= 0:
                torch.cuda.current_stream(device).synchronize()
            got.append((tuple(t.shape), str(t.dtype), t.float().cpu().sum().item(),
                        t.cpu().view(torch.uint8).flatten()[:64].tolist()))
        results.put((rank, "ok", got))
    except BaseException as e:  # reported to the test, which fails with it
        results.put((rank, "error", repr(e)))


def _digest(t):
    return (tuple(t.shape), str(t.dtype), t.float().cpu().sum().item(),
            t.cpu().view(torch.uint8).flatten()[:64].tolist())


@pytest.mark.parametrize("device", DEVICES)
def test_proxy_is_sglangs_and_travels(device):
    pool = fs.FerryMmItemMemoryPool(4 << 20, 0.05, device, 1)
    try:
        x = sample(3, device=device)
        p = pool.wrap_tensor(x, use_pool_handle_cache=True)
        assert isinstance(p, sg.CudaIpcTensorTransportProxy)
        assert p.total_consumer_count == 1 and pool.active_lease_count == 1
        wire = pickle.dumps(p)
        assert len(wire) < 1024  # a descriptor, not the tensor
        q = pickle.loads(wire)
        t = q.reconstruct_on_target_device(max(device, 0))
        assert torch.equal(t.cpu(), x.cpu()) and t.dtype == x.dtype
        assert q.reconstruct_on_target_device(max(device, 0)) is t  # once, as SGLang's
        deadline = time.monotonic() + 5
        while pool.active_lease_count and time.monotonic() < deadline:
            pool.pool.reclaim()
        assert pool.active_lease_count == 0
    finally:
        pool.shutdown()


def test_sglang_msgpack_encoding():
    """SGLang's msgpack IPC (SGLANG_USE_PICKLE_IPC unset) carries proxy_state only and
    rebuilds the class its module names: with the plugin's replacement in place, ours."""
    msgpack_utils = pytest.importorskip("sglang.srt.utils.msgpack_utils")
    pool = fs.FerryMmItemMemoryPool(1 << 20, 0.05, -1, 1)
    saved = msgpack_utils.CudaIpcTensorTransportProxy
    try:
        msgpack_utils.CudaIpcTensorTransportProxy = fs.FerryTensorTransportProxy
        x = sample(5, (7, 9), torch.float16)
        p = pool.wrap_tensor(x)
        q = msgpack_utils._decode_cuda_ipc_tensor_proxy(
            msgpack_utils._encode_cuda_ipc_tensor_proxy(p))
        assert type(q) is fs.FerryTensorTransportProxy
        assert torch.equal(q.reconstruct_on_target_device(0), x)
    finally:
        msgpack_utils.CudaIpcTensorTransportProxy = saved
        pool.shutdown()


def _run_ranks(pool, tensors, n, device, hold_rank=None):
    """n consumer processes read every proxy of tensors; returns their reports by rank."""
    queues = [CTX.Queue() for _ in range(n)]
    results = CTX.Queue()
    holds = [CTX.Event() for _ in range(n)]
    if hold_rank is not None:
        holds[hold_rank].set()
    procs = [CTX.Process(target=_consumer, args=(r, device, queues[r], results, holds[r]))
             for r in range(n)]
    for p in procs:
        p.start()
    try:
        for t in tensors:
            proxy = pool.wrap_tensor(t)
            assert proxy is not None
            for q in queues:
                q.put(proxy)
        if hold_rank is not None:
            return procs, queues, results, holds  # the events live as long as the ranks
        for q in queues:
            q.put(None)
        reports = dict((r, (status, got)) for r, status, got in
                       (results.get(timeout=120) for _ in range(n)))
    finally:
        if hold_rank is None:
            for p in procs:
                p.join(30)
    return reports


@pytest.mark.parametrize("device", DEVICES)
def test_four_consumers_every_tensor(device):
    tensors = [sample(i, (i + 1, 257), torch.bfloat16 if i % 2 else torch.float32, device)
               for i in range(12)]
    pool = fs.FerryMmItemMemoryPool(8 << 20, 0.05, device, 4)
    try:
        reports = _run_ranks(pool, tensors, 4, device)
        expected = [_digest(t) for t in tensors]
        for rank in range(4):
            status, got = reports[rank]
            assert status == "ok", (rank, got)
            assert got == expected, rank
        pool.pool.drain(timeout=10)  # every lease acknowledged by every rank
        assert pool.active_lease_count == 0
    finally:
        pool.shutdown()


def test_killed_consumer_is_reclaimed():
    pool = fs.FerryMmItemMemoryPool(8 << 20, 0.05, -1, 4)
    try:
        procs, queues, results, _holds = _run_ranks(pool, [sample(i) for i in range(6)], 4,
                                                    -1, hold_rank=3)
        for q in queues[:3]:
            q.put(None)
        reports = [results.get(timeout=120) for _ in range(4)]
        assert sorted(status for _, status, _ in reports) == ["held", "ok", "ok", "ok"]
        deadline = time.monotonic() + 10
        while pool.active_lease_count > 5 and time.monotonic() < deadline:
            time.sleep(0.01)  # ranks 0-2's last acknowledgements land
        assert pool.active_lease_count == 5  # rank 3 read the first and holds the rest
        os.kill(procs[3].pid, signal.SIGKILL)
        for p in procs:
            p.join(30)
        pool.pool.drain(timeout=10)  # acknowledged for the dead rank
        assert pool.active_lease_count == 0
        assert pool.pool.consumer_info(3)["alive"] is False
    finally:
        pool.shutdown()


def test_group_acknowledgement_and_release():
    """One rank releases for the whole group (SGLang's attention-DP leader), by reading or
    not; a lease several tensors share is released through any one proxy."""
    pool = fs.FerryMmItemMemoryPool(4 << 20, 0.05, -1, 4)
    try:
        x = sample(1)
        p = pickle.loads(pickle.dumps(pool.wrap_tensor(x)))
        t = p.reconstruct_on_target_device(0, consumer_count=4, consumer_rank=2)
        assert torch.equal(t, x)
        q = pickle.loads(pickle.dumps(pool.wrap_tensor(x)))
        q.acknowledge_consumption(consumer_count=4, consumer_rank=2)
        q.acknowledge_consumption(consumer_count=4, consumer_rank=2)  # once
        with pytest.raises(RuntimeError, match="without reading"):
            q.reconstruct_on_target_device(0, consumer_rank=2)
        pool.pool.drain(timeout=10)
        assert pool.active_lease_count == 0
        shared = pool.wrap_tensors([sample(2), sample(3, (5,), torch.int64)])
        assert len(shared) == 2 and pool.active_lease_count == 1
        for proxy in shared:  # each tensor released by the group's leader
            pickle.loads(pickle.dumps(proxy)).acknowledge_consumption(4, consumer_rank=0)
        pool.pool.drain(timeout=10)
        assert pool.active_lease_count == 0
        with pytest.raises(ValueError, match="one consumer or the complete"):
            pool.wrap_tensor(x).acknowledge_consumption(consumer_count=2, consumer_rank=0)
        with pytest.raises(RuntimeError, match="outside"):
            pool.wrap_tensor(x).reconstruct_on_target_device(0, consumer_rank=4)
    finally:
        pool.shutdown(); ferry.release_consumers()  # noqa: E702


def test_shared_lease_cache_hit_and_abandon():
    """Tensors of one request in one lease: a cache hit on one leaves the other readable; an
    abandoned request releases the whole lease through its first proxy, and its other
    proxies then return quietly (SGLang releases each)."""
    pool = fs.FerryMmItemMemoryPool(4 << 20, 0.05, -1, 1)
    try:
        a, b = sample(4), sample(5, (3, 7), torch.float16)
        hit, wanted = (pickle.loads(pickle.dumps(p)) for p in pool.wrap_tensors([a, b]))
        hit.acknowledge_consumption()
        assert torch.equal(wanted.reconstruct_on_target_device(0), b)
        pool.pool.drain(timeout=10)
        assert pool.active_lease_count == 0
        abandoned = [pickle.loads(pickle.dumps(p)) for p in pool.wrap_tensors([a, b, a])]
        for proxy in abandoned:
            proxy.release_without_reconstruction()
        pool.pool.drain(timeout=10)
        assert pool.active_lease_count == 0
    finally:
        pool.shutdown()


def test_failed_read_releases_its_rank():
    """A read that fails (the producer closed its pool) still releases this rank's part, and
    SGLang's later release of the abandoned proxy returns quietly."""
    pool = fs.FerryMmItemMemoryPool(4 << 20, 0.05, -1, 2)
    proxy = pickle.loads(pickle.dumps(pool.wrap_tensor(sample(6))))
    pool.shutdown()
    with pytest.raises(ferry.Error):
        proxy.reconstruct_on_target_device(0, consumer_count=2, consumer_rank=1)
    proxy.release_without_reconstruction(2)  # released already: no second acknowledgement
    ferry.release_consumers()


def test_cancel_proxy():
    pool = fs.FerryMmItemMemoryPool(1 << 20, 0.05, -1, 2)
    other = fs.FerryMmItemMemoryPool(1 << 20, 0.05, -1, 2)
    try:
        p = pool.wrap_tensor(sample(0))
        with pytest.raises(RuntimeError, match="does not belong to this pool"):
            other.cancel_proxy(p)
        pool.cancel_proxy(p)
        assert pool.active_lease_count == 0
        shared = pool.wrap_tensors([sample(1), sample(2)])
        for proxy in shared:  # SGLang's rollback cancels each: the lease once
            pool.cancel_proxy(proxy)
        assert pool.active_lease_count == 0
        with pytest.raises(ValueError, match="recycle_interval must be positive"):
            fs.FerryMmItemMemoryPool(1 << 20, 0, -1, 2)
    finally:
        pool.shutdown()
        other.shutdown()


def _sglang_wrap():
    """SGLang's tokenizer-side wrap (BaseMultimodalProcessor._wrap_tensor_for_cuda_ipc), or
    None where its module cannot be imported (it pulls in SGLang's whole frontend)."""
    try:
        from sglang.srt.multimodal.processors.base_processor import BaseMultimodalProcessor
    except Exception:
        return None
    return BaseMultimodalProcessor._wrap_tensor_for_cuda_ipc


@pytest.mark.parametrize("device", DEVICES)
def test_pool_full_falls_back_as_sglang_does(device, caplog):
    """A full pool gives None with one warning; SGLang's own wrap then sends the tensor by
    value (on the CPU), which it does for CUDA tensors only (a host tensor it never wraps)."""
    pool = fs.FerryMmItemMemoryPool(1 << 20, 0.05, device, 1)
    sglang_wrap = _sglang_wrap() if device >= 0 else None

    class Processor:  # the two attributes SGLang's method reads of its processor
        cudaipc_mmfeature_pool = pool
        use_ipc_pool_handle_cache = True

    def wrap(t):
        return sglang_wrap(Processor(), t) if sglang_wrap else pool.wrap_tensor(t)

    try:
        big = sample(0, (1024, 1024), torch.float32, device)  # 4 MiB: never fits
        with caplog.at_level(logging.WARNING, logger="ferry.sglang"):
            for _ in range(3):
                out = wrap(big)
                if sglang_wrap:
                    assert isinstance(out, torch.Tensor) and out.device.type == "cpu"
                    assert torch.equal(out, big.cpu())
                else:
                    assert out is None
        assert sum("falling back" in r.message for r in caplog.records) == 1
        assert isinstance(wrap(sample(1, device=device)), fs.FerryTensorTransportProxy)
    finally:
        pool.shutdown()


_CHECK_PLUGIN = textwrap.dedent("""
    import sys
    if sys.argv[1] == "install":
        import ferry.sglang
        ferry.sglang.install()
    else:
        from sglang.srt.plugins import load_plugins
        load_plugins()
    from sglang.srt.multimodal.transport import cuda_ipc
    from sglang.srt.utils import cuda_ipc_transport_utils as compat
    print(cuda_ipc.MmItemMemoryPool.__module__, compat.MmItemMemoryPool.__module__,
          cuda_ipc.CudaIpcTensorTransportProxy.__module__)
""")


@pytest.mark.parametrize("flag, how", [("1", "plugin"), ("", "plugin"), ("", "install")])
def test_plugin_turns_it_on(flag, how):
    """SGLang's own plugin loader finds ferry's entry point; FERRY_SGLANG=1 decides; install()
    does it in a process of one's own."""
    env = dict(os.environ, FERRY_SGLANG=flag)
    env.pop("SGLANG_PLUGINS", None)
    done = subprocess.run([sys.executable, "-c", _CHECK_PLUGIN, how], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    modules = done.stdout.split()
    if flag or how == "install":
        assert modules == ["ferry.sglang"] * 3
    else:
        assert "ferry.sglang" not in modules


_PRODUCER = textwrap.dedent("""
    import pickle, sys, torch
    from ferry import sglang as fs
    pool = fs.FerryMmItemMemoryPool(8 << 20, 0.05, -1, 1)
    xs = [(torch.arange(4096, dtype=torch.float32) * 0.5 + i).to(torch.bfloat16)
          for i in range(5)]
    sys.stdout.write(pickle.dumps([pool.wrap_tensor(x) for x in xs]).hex() + "\\n")
    sys.stdout.flush()
    sys.stdin.readline()  # the consumer's word that it is done
    pool.pool.drain(timeout=10)
    print(pool.active_lease_count, flush=True)
    pool.shutdown()
""")

_REMOTE_CONSUMER = textwrap.dedent("""
    import pickle, sys, torch
    proxies = pickle.loads(bytes.fromhex(sys.stdin.readline()))
    for i, p in enumerate(proxies):
        assert p.remote, "the proxy should read over UCX from here"
        t = p.reconstruct_on_target_device(0)
        x = (torch.arange(4096, dtype=torch.float32) * 0.5 + i).to(torch.bfloat16)
        assert torch.equal(t, x), i
    print("read", len(proxies), flush=True)
""")


@pytest.mark.skipif(not have_ucx(), reason="UCX (libucp.so.0) is not installed")
def test_scheduler_on_another_host():
    """SGLang's encoder/language-model split: the pool listens (FERRY_SGLANG_LISTEN), the
    proxy travels, the scheduler on the other host reads over UCX."""
    hosts = Hosts()
    if not hosts.netns:
        pytest.skip("needs two network namespaces (root and ip): one namespace is one host")
    try:
        out = hosts.hand_over(["-c", _PRODUCER], lambda wire: (["-c", _REMOTE_CONSUMER], wire),
                              producer_env={"FERRY_SGLANG_LISTEN": f"{hosts.ip[0]}:0"})
        assert out.strip() == "read 5"
    finally:
        hosts.down()
