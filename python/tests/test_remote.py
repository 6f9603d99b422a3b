"""Consumers on other hosts from Python: Pool(listen=...), remote_address, connect to it.

Real processes over UCX's tcp transport: on loopback, and the README's two-host example in two
network namespaces joined by a veth pair where the test can make them (as root), on loopback
otherwise. Skipped where UCX cannot be loaded."""

import gc
import multiprocessing as mp
import pathlib
import re
import time

import numpy as np
import pytest

import ferry
from hosts import Hosts, have_ucx

README = pathlib.Path(__file__).resolve().parent.parent.parent / "README.md"


pytestmark = pytest.mark.skipif(not have_ucx(), reason="UCX (libucp.so.0) is not installed")


@pytest.fixture(autouse=True)
def _tcp_on_loopback(monkeypatch):
    monkeypatch.setenv("UCX_TLS", "tcp")
    monkeypatch.setenv("UCX_NET_DEVICES", "lo")


def _receiver(address, rank, n, queue):
    try:
        rx = ferry.connect(address, rank=rank)
        got = []
        for t in rx:
            got.append(float(np.from_dlpack(t).sum()))
        queue.put(("ok", got))
    except BaseException as e:  # reported to the test, which fails with it
        queue.put(("error", repr(e)))


def test_local_and_remote_receivers():
    ctx = mp.get_context("spawn")  # UCX does not survive fork
    queue = ctx.Queue()
    with ferry.Pool("16MiB", consumers=2, listen="127.0.0.1:0", drain_timeout=30) as pool:
        assert pool.remote_address.startswith("ferry+ucx://127.0.0.1:")
        workers = [ctx.Process(target=_receiver, args=(pool.address, 0, 5, queue)),
                   ctx.Process(target=_receiver, args=(pool.remote_address, 1, 5, queue))]
        for w in workers:
            w.start()
        for i in range(5):
            pool.send(np.full(1000, i, np.float32))
        deadline = time.monotonic() + 30
        while pool.stats()["remote_admitted"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = pool.stats()
    results = [queue.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(30)
    assert all(r[0] == "ok" for r in results), results
    assert [r[1] for r in results] == [[1000.0 * i for i in range(5)]] * 2
    assert stats["remote_admitted"] == 1


def test_remote_receiver_in_this_process():
    with ferry.Pool("16MiB", consumers=1, listen="127.0.0.1:0") as pool:
        with ferry.connect(pool.remote_address, rank=0) as rx:
            pool.send(np.arange(256, dtype=np.int64))
            got = rx.recv(timeout=10)
            assert (np.from_dlpack(got) == np.arange(256)).all()
            pool.send(np.arange(4, dtype=np.int64))
            out = np.zeros(4, np.int64)
            assert rx.recv(timeout=10, out=out) is out
            assert (out == np.arange(4)).all()
            pool.send(np.arange(4, dtype=np.int64))
            with pytest.raises(ferry.Error, match="another host"):
                rx.recv(timeout=10, copy=False)  # a view needs the pool mapped here


def test_same_host_receiver_maps_the_pool(monkeypatch):
    """By default a receiver of a pool on its own host, connected by the remote address, opens
    the pool through its broker: a view works (it needs the pool mapped here), and the pool's
    server admits nobody."""
    monkeypatch.delenv("FERRY_REMOTE_LOCAL")
    with ferry.Pool("16MiB", consumers=1, listen="127.0.0.1:0") as pool:
        with ferry.connect(pool.remote_address, rank=0) as rx:
            pool.send(np.arange(256, dtype=np.int64))
            got = rx.recv(timeout=10, copy=False)
            assert (np.from_dlpack(got) == np.arange(256)).all()
            del got
            pool.send(np.arange(4, dtype=np.int64))
            out = np.zeros(4, np.int64)
            assert rx.recv(timeout=10, out=out) is out
            assert (out == np.arange(4)).all()
        assert pool.stats()["remote_admitted"] == 0
        # Closing the receiver gave the rank back: this process connects as rank 0 again.
        with ferry.connect(pool.remote_address, rank=0) as rx:
            pool.send(np.arange(8, dtype=np.int64))
            out = np.zeros(8, np.int64)
            assert rx.recv(timeout=10, out=out) is out
            assert (out == np.arange(8)).all()
        assert pool.stats()["remote_admitted"] == 0


def test_same_host_reconnect_while_a_view_lives(monkeypatch):
    """A receiver closed while a view of it lives keeps its consumer (the view needs the
    mapping): a new receiver of the same rank in the process connects all the same, and the
    rank is given back once both are gone."""
    monkeypatch.delenv("FERRY_REMOTE_LOCAL")
    with ferry.Pool("16MiB", consumers=1, listen="127.0.0.1:0") as pool:
        rx = ferry.connect(pool.remote_address, rank=0)
        pool.send(np.arange(256, dtype=np.int64))
        got = rx.recv(timeout=10, copy=False)
        rx.close()
        with ferry.connect(pool.remote_address, rank=0) as again:
            pool.send(np.arange(8, dtype=np.int64))
            out = np.zeros(8, np.int64)
            assert again.recv(timeout=10, out=out) is out
            assert (out == np.arange(8)).all()
        assert (np.from_dlpack(got) == np.arange(256)).all()
        del got
        gc.collect()
        assert pool.stats()["remote_admitted"] == 0
        deadline = time.monotonic() + 5
        while pool.stats()["leases_in_flight"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.stats()["leases_in_flight"] == 0  # the view's lease, settled for it


def test_descriptors_read_through_a_receiver():
    """A descriptor that came by the caller's own channel (SGLang's proxies, vLLM's index) is
    read and acknowledged through a receiver connected to the pool's remote address."""
    with ferry.Pool("16MiB", consumers=2, listen="127.0.0.1:0") as pool:
        with ferry.connect(pool.remote_address, rank=1) as rx:
            d = pool.publish(np.arange(1000, dtype=np.float32))
            got = rx.receive(d, timeout=10)
            assert (np.from_dlpack(got) == np.arange(1000)).all()
            with pytest.raises(ferry.Stale):
                rx.receive(d, timeout=10)  # read once per rank
            rx.ack(d, ranks=range(0, 1))  # rank 0's, by its group leader
            d2 = pool.publish(np.arange(6, dtype=np.int64))
            out = np.zeros(6, np.int64)
            assert rx.receive(d2, out=out, timeout=10) is out
            assert (out == np.arange(6)).all()
            d3 = pool.publish(np.ones(3, np.float32))
            rx.ack(d3, ranks=range(0, 2))  # never read: released for both ranks
            rx.ack(d2, ranks=range(0, 1))
            pool.drain(timeout=10)
            assert pool.stats()["leases_in_flight"] == 0
            with pytest.raises(TypeError, match="range"):
                rx.ack(d3, ranks=[0, 1])
            with pytest.raises(TypeError, match="descriptor"):
                rx.receive()
        with pytest.raises(ValueError, match="closed"):
            rx.receive(d3)


def test_wrong_secret_and_no_listen():
    with ferry.Pool("1MiB", consumers=1, listen="127.0.0.1:0") as pool:
        wrong = re.sub(r"[0-9a-f]$", lambda m: "0" if m.group() != "0" else "1",
                       pool.remote_address)
        with pytest.raises(ferry.Error) as info:
            ferry.connect(wrong, rank=0)
        assert info.value.status == "PERMISSION"
        assert pool.stats()["remote_refused"] == 1
    with ferry.Pool("1MiB", consumers=1) as pool:
        assert pool.remote_address is None
    with pytest.raises(ValueError, match="HOST:PORT"):
        ferry.Pool("1MiB", consumers=1, listen="nowhere")


def _example(tag):
    text = README.read_text()
    m = re.search(rf"^```python {tag}[ \t]*\n(.*?)^```[ \t]*$", text, re.S | re.M)
    assert m, f"README.md has no ```python {tag} block"
    return m.group(1)


def test_readme_two_hosts(tmp_path):
    producer, consumer = tmp_path / "producer.py", tmp_path / "consumer.py"
    producer.write_text(_example("producer"))
    consumer.write_text(_example("consumer"))
    hosts = Hosts()
    try:
        prod = hosts.run(0, [str(producer), f"{hosts.ip[0]}:0"])
        address = prod.stdout.readline().strip()
        assert address.startswith(f"ferry+ucx://{hosts.ip[0]}:"), (address, prod.stderr.read())
        cons = hosts.run(1, [str(consumer), address])
        out, err = cons.communicate(timeout=120)
        assert cons.returncode == 0, err
        assert "received 8 tensors from the other host" in out
        assert prod.wait(timeout=120) == 0, prod.stderr.read()
    finally:
        hosts.down()
