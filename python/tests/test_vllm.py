"""ferry.vllm against vLLM's own code (the pinned wheel: python/tests/engines.txt).

vLLM's connector factory loads FerryECConnector out of tree (ec_connector_module_path); a
producer worker saves encoder outputs, the consumer's scheduler finds and claims them
through the producer's index, its workers (real processes, one per tensor-parallel rank)
read them into their encoder caches byte for byte, and the pool recycles every slice. A full
pool drops the oldest unclaimed feature, never a claimed one; a consumer on another "host"
reads over UCX; the index refuses malformed requests. Host pools here, GPU pools too where
torch sees a GPU. Skipped, with the reason, where vLLM cannot be imported."""

import json
import multiprocessing as mp
import socket
import textwrap
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.distributed.ec_transfer.ec_connector.base",
                    reason="vLLM is not installed here: python/run-tests runs this file in "
                           "its engines environment (python/tests/engines.txt)")

from ferry import vllm as fv  # noqa: E402
from hosts import Hosts, have_ucx  # noqa: E402
from vllm.config import ECTransferConfig  # noqa: E402
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole  # noqa: E402
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory  # noqa: E402

CTX = mp.get_context("spawn")
GPU = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if GPU else [])


def make(role, ec_role, port, device="cpu", size=8 << 20, **extra):
    """A connector as vLLM makes one: its factory, from an ECTransferConfig. The engine's
    VllmConfig is reduced to what connectors read of it (a full one needs a model)."""
    cfg = ECTransferConfig(ec_connector="FerryECConnector", ec_connector_module_path="ferry.vllm",
                           ec_role=ec_role, ec_ip="127.0.0.1", ec_port=port,
                           ec_buffer_size=size, ec_buffer_device=device,
                           ec_connector_extra_config=extra)
    return ECConnectorFactory.create_connector(types.SimpleNamespace(ec_transfer_config=cfg),
                                               role)


def request(*hashes):
    """What the scheduler hands update_state_after_alloc: a request's features by hash."""
    return types.SimpleNamespace(mm_features=[types.SimpleNamespace(identifier=h)
                                              for h in hashes])


def feature(i, tokens=17, device="cpu"):
    t = (torch.arange(tokens * 128, dtype=torch.float32).reshape(tokens, 128) / 7 + i)
    return t.to(torch.bfloat16).to(device)


def _worker(port, rank, metas, results):
    """A consumer worker of rank `rank`: loads each metadata it is handed."""
    try:
        import ferry.vllm
        from unittest import mock
        conn = make(ECConnectorRole.WORKER, "ec_consumer", port)
        got = {}
        with mock.patch.object(ferry.vllm, "_tp_rank", return_value=rank):
            while True:
                meta = metas.get(timeout=60)
                if meta is None:
                    break
                conn.bind_connector_metadata(meta)
                cache = {}
                conn.start_load_caches(cache)
                failed = conn.wait_for_load()
                conn.clear_connector_metadata()
                for k, t in cache.items():
                    got[k] = t.float().cpu().sum().item()
                got.update({k: "failed" for k in failed})
        results.put((rank, "ok", got))
    except BaseException as e:  # reported to the test, which fails with it
        results.put((rank, "error", repr(e)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def producer():
    made = []

    def start(device="cpu", size=8 << 20, consumers=2, **extra):
        port = free_port()
        conn = make(ECConnectorRole.WORKER, "ec_producer", port, device, size,
                    consumers=consumers, **extra)
        made.append(conn)
        return conn, port

    yield start
    for conn in made:
        conn.shutdown()


def test_factory_loads_it_out_of_tree():
    cfg = ECTransferConfig(ec_connector="FerryECConnector", ec_connector_module_path="ferry.vllm",
                           ec_role="ec_consumer")
    assert ECConnectorFactory.get_connector_class(cfg) is fv.FerryECConnector
    conn = make(ECConnectorRole.SCHEDULER, "ec_consumer", free_port())
    assert conn.is_consumer and not conn.is_producer
    assert conn.role is ECConnectorRole.SCHEDULER


@pytest.mark.parametrize("device", DEVICES)
def test_two_ranks_load_every_feature(producer, device):
    prod, port = producer(device)
    sched = make(ECConnectorRole.SCHEDULER, "ec_consumer", port)
    tensors = {f"h{i}": feature(i, 9 + i, device) for i in range(6)}
    for h, t in tensors.items():
        prod.save_caches(tensors, h)
    assert prod.pool.stats()["leases_in_flight"] == 6
    assert not sched.has_cache_item("nobody")
    assert all(sched.has_cache_item(h) for h in tensors)
    metas = [CTX.Queue() for _ in range(2)]
    results = CTX.Queue()
    procs = [CTX.Process(target=_worker, args=(port, r, metas[r], results)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        for step in (["h0", "h1"], ["h2", "h3", "h4", "h5"]):
            sched.update_state_after_alloc(request(*step), 0)
            for i in range(1, len(step)):
                sched.update_state_after_alloc(request(*step), i)
            meta = sched.build_connector_meta(None)
            assert [load.mm_hash for load in meta.loads] == step
            assert sched.build_connector_meta(None).loads == []  # built once
            for q in metas:
                q.put(meta)
        for q in metas:
            q.put(None)
        reports = sorted(results.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
    expected = {h: t.float().cpu().sum().item() for h, t in tensors.items()}
    assert reports == [(0, "ok", expected), (1, "ok", expected)]
    prod.pool.drain(timeout=10)  # both ranks acknowledged every slice
    assert prod.pool.stats()["leases_in_flight"] == 0
    assert not sched.has_cache_item("h0")  # handed over once


def test_full_pool_drops_oldest_unclaimed(producer, caplog):
    prod, port = producer(size=256 << 10, consumers=1)  # room for 5 features of 42.5 KiB
    sched = make(ECConnectorRole.SCHEDULER, "ec_consumer", port)
    cache = {f"h{i}": feature(i, 170) for i in range(40)}
    prod.save_caches(cache, "h0")
    sched.update_state_after_alloc(request("h0"), 0)  # claimed: never dropped
    for i in range(1, 40):
        prod.save_caches(cache, f"h{i}")
    assert not sched.has_cache_item("h1")  # the oldest unclaimed went first
    assert sched.has_cache_item("h39")
    late = request("h1")
    late.request_id = "r-late"  # offered earlier, dropped since: vLLM is told to fail it
    sched.update_state_after_alloc(late, 0)
    assert sched.take_unavailable_requests() == {"r-late"}
    assert sched.take_unavailable_requests() == set()
    meta = sched.build_connector_meta(None)
    conn = make(ECConnectorRole.WORKER, "ec_consumer", port)
    conn.bind_connector_metadata(meta)
    loaded = {}
    conn.start_load_caches(loaded)
    assert conn.wait_for_load() == set()
    assert torch.equal(loaded["h0"].cpu(), cache["h0"])  # intact after 39 saves
    big = {"big": torch.zeros(1 << 20, dtype=torch.uint8)}
    with caplog.at_level("WARNING", logger="ferry.vllm"):
        prod.save_caches(big, "big")
        prod.save_caches(big, "big")
    assert sum("no room" in r.message for r in caplog.records) == 1
    assert not sched.has_cache_item("big")


def test_cache_hit_only_acknowledges(producer):
    prod, port = producer(consumers=1)
    sched = make(ECConnectorRole.SCHEDULER, "ec_consumer", port)
    prod.save_caches({"h": feature(1)}, "h")
    sched.update_state_after_alloc(request("h"), 0)
    conn = make(ECConnectorRole.WORKER, "ec_consumer", port)
    conn.bind_connector_metadata(sched.build_connector_meta(None))
    mine = feature(99)
    cache = {"h": mine}
    conn.start_load_caches(cache)
    assert cache["h"] is mine and conn.wait_for_load() == set()
    prod.pool.drain(timeout=10)


def test_index_refuses_malformed_requests(producer):
    prod, port = producer()
    prod.save_caches({"h": feature(1)}, "h")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        f = s.makefile("rwb")
        for line in (b"not json\n", b"[1, 2]\n", b'{"op": "steal", "key": "h"}\n',
                     b'{"op": "has"}\n'):
            f.write(line)
            f.flush()
            assert json.loads(f.readline())["ok"] is False
        f.write(b'{"op": "has", "key": "h"}\n')
        f.flush()
        assert json.loads(f.readline()) == {"ok": True, "has": True}
        f.write(b"[" * 60000 + b"\n")  # nested past Python's recursion limit
        f.flush()
        assert json.loads(f.readline()) == {"ok": False, "error": "not JSON"}
        f.write(b"x" * (fv._LINE_MAX + 10) + b"\n")
        f.flush()
        assert json.loads(f.readline())["error"] == "request too long"
        assert f.readline() == b""  # and the connection is closed
    sched = make(ECConnectorRole.SCHEDULER, "ec_consumer", port)
    assert sched.has_cache_item("h")  # the index still serves


def test_claim_whose_answer_cannot_be_sent_goes_back(producer):
    """A consumer that asked for a feature and went before the answer: the feature is offered
    again (else its slice would be held for a reader that never comes)."""
    prod, port = producer(consumers=1)
    prod.save_caches({"h": feature(1)}, "h")
    index = prod._index
    ours, theirs = socket.socketpair()
    theirs.sendall(b'{"op": "claim", "key": "h"}\n')
    theirs.close()  # gone before the answer: the index's write fails (EPIPE)
    server = types.SimpleNamespace(index=index)
    fv._IndexHandler(ours, ("test", 0), server)  # serves the one connection to its end
    ours.close()
    sched = make(ECConnectorRole.SCHEDULER, "ec_consumer", port)
    assert sched.has_cache_item("h")
    sched.update_state_after_alloc(request("h"), 0)
    conn = make(ECConnectorRole.WORKER, "ec_consumer", port)
    conn.bind_connector_metadata(sched.build_connector_meta(None))
    cache = {}
    conn.start_load_caches(cache)
    assert torch.equal(cache["h"].cpu(), feature(1))
    prod.pool.drain(timeout=10)


def test_index_gone():
    sched = make(ECConnectorRole.SCHEDULER, "ec_consumer", free_port(), timeout=1)
    assert sched.has_cache_item("h") is False  # a warning, not an exception
    sched.update_state_after_alloc(request("h"), 0)
    assert sched.build_connector_meta(None).loads == []


_PRODUCER = textwrap.dedent("""
    import sys, types, torch
    from ferry.vllm import FerryECConnector
    from vllm.config import ECTransferConfig
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    ip = sys.argv[1]
    cfg = ECTransferConfig(ec_connector="FerryECConnector", ec_connector_module_path="ferry.vllm",
                           ec_role="ec_producer", ec_ip=ip, ec_port=0, ec_buffer_size=8 << 20,
                           ec_buffer_device="cpu",
                           ec_connector_extra_config={"listen": ip + ":0"})
    conn = FerryECConnector(types.SimpleNamespace(ec_transfer_config=cfg), ECConnectorRole.WORKER)
    cache = {f"h{i}": torch.full((33, 64), i, dtype=torch.float16) for i in range(4)}
    for h in cache:
        conn.save_caches(cache, h)
    print(conn.index_address[1], flush=True)
    sys.stdin.readline()
    conn.pool.drain(timeout=10)
    print(conn.pool.stats()["leases_in_flight"], flush=True)
    conn.shutdown()
""")

_CONSUMER = textwrap.dedent("""
    import sys, types, torch
    from ferry.vllm import FerryECConnector
    from vllm.config import ECTransferConfig
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    cfg = ECTransferConfig(ec_connector="FerryECConnector", ec_connector_module_path="ferry.vllm",
                           ec_role="ec_consumer", ec_ip=sys.argv[1], ec_port=int(sys.argv[2]))
    env = types.SimpleNamespace(ec_transfer_config=cfg)
    sched = FerryECConnector(env, ECConnectorRole.SCHEDULER)
    worker = FerryECConnector(env, ECConnectorRole.WORKER)
    req = types.SimpleNamespace(mm_features=[types.SimpleNamespace(identifier=f"h{i}")
                                             for i in range(4)])
    for i in range(4):
        assert sched.has_cache_item(f"h{i}")
        sched.update_state_after_alloc(req, i)
    meta = sched.build_connector_meta(None)
    assert all(load.remote for load in meta.loads)
    worker.bind_connector_metadata(meta)
    cache = {}
    worker.start_load_caches(cache)
    assert worker.wait_for_load() == set()
    for i in range(4):
        assert torch.equal(cache[f"h{i}"].cpu(), torch.full((33, 64), i, dtype=torch.float16))
    print("loaded", len(cache), flush=True)
    worker.shutdown()
""")


@pytest.mark.skipif(not have_ucx(), reason="UCX (libucp.so.0) is not installed")
def test_consumer_on_another_host():
    hosts = Hosts()
    if not hosts.netns:
        pytest.skip("needs two network namespaces (root and ip): one namespace is one host")
    try:
        def consumer(port):
            assert port.isdigit(), port
            return ["-c", _CONSUMER, hosts.ip[0], port], None
        out = hosts.hand_over(["-c", _PRODUCER, hosts.ip[0]], consumer)
        assert out.strip() == "loaded 4"
    finally:
        hosts.down()


def test_wrong_role_calls_do_nothing(producer):
    prod, port = producer()
    assert prod.has_cache_item("h") is False  # a producer has no index client
    consumer = make(ECConnectorRole.WORKER, "ec_consumer", port)
    consumer.save_caches({"h": feature(0)}, "h")  # a consumer saves nothing
    assert consumer.pool is None
