"""Consumers on other hosts from Python: Pool(listen=...), remote_address, connect to it.

Real processes over UCX's tcp transport: on loopback, and the README's two-host example in two
network namespaces joined by a veth pair where the test can make them (as root), on loopback
otherwise. Skipped where UCX cannot be loaded."""

import ctypes
import multiprocessing as mp
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import ferry

README = pathlib.Path(__file__).resolve().parent.parent.parent / "README.md"


def _have_ucx():
    try:
        ctypes.CDLL(os.environ.get("FERRY_UCX_LIBRARY") or "libucp.so.0")
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _have_ucx(), reason="UCX (libucp.so.0) is not installed")


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


class _Hosts:
    """Two network namespaces joined by a veth pair (root), else loopback twice."""

    def __init__(self):
        pid = os.getpid()
        self.ns = [f"fypy-{pid}-a", f"fypy-{pid}-b"]
        self.dev = [f"fpa{pid % 100000}", f"fpb{pid % 100000}"]
        x = pid % 250 + 1
        self.ip = [f"10.232.{x}.1", f"10.232.{x}.2"]
        self.netns = os.geteuid() == 0 and shutil.which("ip") is not None
        if self.netns and not self._up():
            self.down()
            self.netns = False
        if not self.netns:
            self.ip = ["127.0.0.1", "127.0.0.1"]

    def _up(self):
        a, b = self.ns
        da, db = self.dev
        cmds = [f"ip netns add {a}", f"ip netns add {b}",
                f"ip link add {da} type veth peer name {db}",
                f"ip link set {da} netns {a}", f"ip link set {db} netns {b}",
                f"ip -n {a} addr add {self.ip[0]}/30 dev {da}",
                f"ip -n {b} addr add {self.ip[1]}/30 dev {db}",
                f"ip -n {a} link set {da} up", f"ip -n {b} link set {db} up",
                f"ip -n {a} link set lo up", f"ip -n {b} link set lo up"]
        return all(subprocess.run(c.split(), capture_output=True).returncode == 0 for c in cmds)

    def down(self):
        if not self.netns:
            return
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def run(self, side, args):
        env = dict(os.environ, UCX_TLS="tcp",
                   UCX_NET_DEVICES=self.dev[side] if self.netns else "lo")
        prefix = ["ip", "netns", "exec", self.ns[side]] if self.netns else []
        return subprocess.Popen(prefix + [sys.executable] + args, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_readme_two_hosts(tmp_path):
    producer, consumer = tmp_path / "producer.py", tmp_path / "consumer.py"
    producer.write_text(_example("producer"))
    consumer.write_text(_example("consumer"))
    hosts = _Hosts()
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
