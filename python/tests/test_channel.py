"""Channels: pools that carry their descriptors themselves. Consumers in spawned processes
connect by the pool's address (ferry.connect) and receive what Pool.send queues for their rank:
connected before and after the first send, some ranks or all, packed sends, several pools
through selectors, asyncio, a full ring under each on_full policy, drain, a with block that
ends before the consumer read, a producer killed, a consumer killed and restarted, bad input.
Every item's bytes are checked."""

import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

import channel_workers
import ferry

CTX = multiprocessing.get_context("spawn")


class Child:
    """A spawned channel_workers.<fn>(conn, *args) process."""

    def __init__(self, fn, *args):
        self.conn, child = CTX.Pipe()
        self.process = CTX.Process(target=getattr(channel_workers, fn), args=(child, *args),
                                   daemon=True)
        self.process.start()
        child.close()

    def ready(self, timeout=30):
        kind, value = self._get(timeout)
        assert kind == "ready", value
        return value

    def _get(self, timeout):
        if not self.conn.poll(timeout):
            raise TimeoutError("the helper process did not answer")
        return self.conn.recv()

    def result(self, timeout=30):
        answer = self._get(timeout)
        if answer[0] == "error":
            raise AssertionError(f"helper: {answer[1]}: {answer[2]}")
        return answer[1]

    def kill(self):
        self.process.kill()
        self.process.join(10)

    def stop(self):
        if self.process.is_alive():
            self.kill()


@pytest.fixture
def children():
    made = []

    def start(fn, *args):
        c = Child(fn, *args)
        made.append(c)
        return c

    yield start
    for c in made:
        c.stop()


def item(seed, n=64, dtype=np.int32):
    return (np.arange(n, dtype=np.int64) * 7919 + seed).astype(dtype)


def plain(a):
    return (a.dtype.str, a.tolist())


def test_connect_before_and_after_the_first_send(children):
    with ferry.Pool("1MiB", 2) as pool:
        assert pool.address.startswith("ferry:") and len(pool.address) == 38
        early = children("recv_n", pool.address, 0, 3)
        early.ready()
        sent = [item(i) for i in range(3)]
        descs = [pool.send(x) for x in sent]
        assert all(isinstance(d, ferry.Descriptor) for d in descs)
        late = children("recv_n", pool.address, 1, 3)  # its items wait in its ring
        late.ready()
        assert early.result() == [plain(x) for x in sent]
        assert late.result() == [plain(x) for x in sent]
        pool.drain(5)
        assert pool.stats()["leases_in_flight"] == 0


def test_ranks_int_list_range(children):
    with ferry.Pool("1MiB", 4) as pool:
        c = children("recv_ranks", pool.address, [0, 1, 2, 3])
        c.ready()
        a, b, d = item(1), item(2, 10, np.float32), item(3, 5, np.uint8)
        pool.send(a, ranks=1)
        pool.send(b, ranks=[0, 2])
        pool.send(d, ranks=range(2, 4))
        pool.send(item(4), ranks=(3,))
        c.conn.send("go")
        got = c.result()
        assert got == {0: [plain(b)], 1: [plain(a)], 2: [plain(b), plain(d)],
                       3: [plain(d), plain(item(4))]}
        pool.drain(5)  # ranks not chosen were acknowledged for at once


def test_packed_send_returns_a_list(children):
    with ferry.Pool("1MiB", 1) as pool:
        c = children("recv_n", pool.address, 0, 2)
        c.ready()
        parts = [item(1, 3, np.int8), item(2, 7, np.float64), item(3, 1, np.int16)]
        descs = pool.send(parts)
        assert isinstance(descs, list) and len(descs) == 3
        assert len({(d.slot, d.generation) for d in descs}) == 1  # one lease
        assert isinstance(pool.send(tuple(parts[:2])), list)
        assert c.result() == [[plain(p) for p in parts], [plain(p) for p in parts[:2]]]


def test_packed_recv_into_out_and_views():
    with ferry.Pool("1MiB", 1) as pool, ferry.connect(pool.address, 0) as rx:
        parts = [item(1, 4), item(2, 6, np.float32)]
        pool.send(parts)
        with pytest.raises(ValueError, match="out= takes a list of 2"):
            rx.recv(timeout=1, out=np.empty(4, np.int32))
        # A wrong second tensor (size, dtype, read-only) is refused before the first part is
        # read or acknowledged: the whole lease comes again.
        first = np.full(4, -1, np.int32)
        read_only = np.empty((2, 3), np.float32)
        read_only.flags.writeable = False
        for second in (np.empty(5, np.float32), np.empty(6, np.int32), read_only):
            with pytest.raises((ValueError, TypeError, BufferError)):
                rx.recv(timeout=1, out=[first, second])
            assert first.tolist() == [-1] * 4  # nothing read into it
            assert pool.consumer_info(0)["outstanding"] == 1
        outs = [np.empty(4, np.int32), np.empty((2, 3), np.float32)]
        got = rx.recv(timeout=1, out=outs)  # the refused lease came again
        assert got[0] is outs[0] and got[1] is outs[1]
        assert outs[0].tolist() == parts[0].tolist()
        assert outs[1].reshape(-1).tolist() == parts[1].tolist()
        pool.send(item(5))
        v = rx.recv(timeout=1, copy=False)
        arr = np.from_dlpack(v)
        assert not arr.flags.writeable and arr.tolist() == item(5).tolist()
        pool.reclaim()
        assert pool.stats()["leases_in_flight"] == 1
        del v, arr  # the view acknowledges when freed
        pool.drain(2)


def test_packed_send_of_many_parts():
    # More parts than recv's first descriptor buffer holds: the lease stays queued while the
    # buffer grows to the count the library reports, then arrives whole and in order.
    with ferry.Pool("1MiB", 1, channel_depth=64) as pool, ferry.connect(pool.address, 0) as rx:
        parts = [item(i, 1 + i % 5) for i in range(21)]
        pool.send(parts)
        got = rx.recv(timeout=1)
        assert [np.from_dlpack(g).tolist() for g in got] == [p.tolist() for p in parts]
        pool.drain(2)


def test_several_pools_through_selectors(children):
    with ferry.Pool("1MiB", 1) as p0, ferry.Pool("1MiB", 1) as p1:
        c = children("select_pools", [p0.address, p1.address], 0, 6)
        c.ready()
        for i in range(3):
            p0.send(item(i))
            time.sleep(0.02)
            p1.send(item(10 + i))
        got = c.result()
        assert got == sorted([(0, plain(item(i))) for i in range(3)] +
                             [(1, plain(item(10 + i))) for i in range(3)])


def test_asyncio_arecv(children):
    pool = ferry.Pool("1MiB", 1)
    c = children("async_recv", pool.address, 0, 2)
    c.ready()
    time.sleep(0.2)  # the receiver waits on its fd
    pool.send(item(1))
    time.sleep(0.1)
    pool.send(item(2))
    for i in range(3, 6):
        pool.send(item(i))
    pool.close(drain=5)
    first, rest = c.result()
    assert first == [plain(item(1)), plain(item(2))]
    assert rest == [plain(item(i)) for i in range(3, 6)]


@pytest.mark.parametrize("policy", ["raise", "none", "wait"])
def test_full_ring(children, policy):
    with ferry.Pool("1MiB", 2, channel_depth=2, on_full=policy, timeout=0.2,
                    drain_timeout=0.1) as pool, ferry.connect(pool.address, 0) as rx:
        assert pool.channel_depth == 2
        stuck = children("hold", pool.address, 1)  # rank 1 never receives
        stuck.ready()
        for i in range(2):
            pool.send(item(i))
            assert rx.recv(timeout=1, out=np.empty(64, np.int32)).tolist() == item(i).tolist()
        start = time.monotonic()
        if policy == "none":
            assert pool.send(item(2)) is None
        else:
            with pytest.raises(ferry.PoolFull, match=r"ring of rank 1 is full.*rank 1 is behind"):
                pool.send(item(2))
        waited = time.monotonic() - start
        assert waited >= 0.15 if policy == "wait" else waited < 0.15
        if policy == "none":
            assert pool.send(item(2), timeout=0.05) is None
        else:
            with pytest.raises(ferry.PoolFull):  # timeout= overrides the pool's wait
                pool.send(item(2), timeout=0.05)
        assert pool.send(item(3), ranks=0) is not None  # rank 0's ring has room
        assert np.from_dlpack(rx.recv(timeout=1)).tolist() == item(3).tolist()
        assert pool.stats()["leases_in_flight"] >= 2  # nothing leased by the refused sends
        stuck.kill()  # the exit drains: the dead rank is acknowledged for


def test_full_ring_wait_until_the_consumer_reads(children):
    with ferry.Pool("1MiB", 1, channel_depth=2, on_full="wait", timeout=10) as pool:
        c = children("recv_n", pool.address, 0, 5, 0.5)
        c.ready()
        start = time.monotonic()
        for i in range(5):
            assert pool.send(item(i)) is not None
        assert time.monotonic() - start >= 0.3  # waited for room in the ring
        assert c.result() == [plain(item(i)) for i in range(5)]


def test_send_too_large_and_bad_ranks():
    for policy, expect in (("raise", ferry.TooLarge), ("none", None), ("wait", ferry.TooLarge)):
        with ferry.Pool("1MiB", 2, on_full=policy) as pool:
            big = np.zeros(2 << 20, np.uint8)
            if expect is None:
                assert pool.send(big) is None
            else:
                start = time.monotonic()
                with pytest.raises(expect, match="never fit"):
                    pool.send(big)
                assert time.monotonic() - start < 1
            with pytest.raises(ValueError):
                pool.send(item(0), ranks=5)
            with pytest.raises(ValueError):
                pool.send(item(0), ranks=range(1, 3))
            with pytest.raises(ValueError):
                pool.send(item(0), ranks=range(0, 2, 2))
            with pytest.raises(TypeError):
                pool.send(item(0), ranks="0")
            with pytest.raises(TypeError):
                pool.send(item(0), ranks=[0, True])
            with pytest.raises(ValueError):
                pool.send([])
            assert pool.stats()["leases_in_flight"] == 0


def test_drain_with_a_slow_consumer(children):
    with ferry.Pool("1MiB", 1) as pool:
        c = children("recv_n", pool.address, 0, 4, 0.0, 0.1)
        c.ready()
        for i in range(4):
            pool.send(item(i))
        start = time.monotonic()
        pool.drain(5)
        assert time.monotonic() - start >= 0.2
        assert pool.stats()["leases_in_flight"] == 0
        assert c.result() == [plain(item(i)) for i in range(4)]


def test_drain_timeout_and_a_dead_consumer(children):
    with ferry.Pool("1MiB", 2) as pool:
        stuck = children("hold", pool.address, 1)
        stuck.ready()
        ok = children("recv_n", pool.address, 0, 2)
        ok.ready()
        pool.send(item(0))
        pool.send(item(1))
        assert ok.result() == [plain(item(0)), plain(item(1))]
        with pytest.raises(ferry.Timeout, match=r"did not drain within 200\.000 ms.*rank 1"):
            pool.drain(0.2)
        stuck.kill()  # its leases are acknowledged on its behalf
        start = time.monotonic()
        pool.drain(5)
        assert time.monotonic() - start < 2


def test_with_block_ends_before_the_consumer_reads(children):
    c = None
    with ferry.Pool("1MiB", 1) as pool:
        c = children("recv_n", pool.address, 0, 2, 0.5)  # reads half a second from now
        c.ready()
        pool.send(item(1))
        pool.send([item(2), item(3, 3, np.float64)])
        start = time.monotonic()
    assert time.monotonic() - start >= 0.3  # the exit drained first
    assert pool.closed
    assert c.result() == [plain(item(1)), [plain(item(2)), plain(item(3, 3, np.float64))]]


def test_close_drain_argument(children):
    pool = ferry.Pool("1MiB", 1, drain_timeout=0.2)
    assert pool.drain_timeout == pytest.approx(0.2)
    stuck = children("hold", pool.address, 0)
    stuck.ready()
    pool.send(item(0))
    start = time.monotonic()
    pool.close()  # waits drain_timeout, logs, closes anyway
    assert 0.15 <= time.monotonic() - start < 2
    assert pool.closed
    pool2 = ferry.Pool("1MiB", 1, drain_timeout=5)
    pool2.send(item(0))
    start = time.monotonic()
    pool2.close(drain=False)
    assert time.monotonic() - start < 1


def test_iteration_ends_at_close(children):
    with ferry.Pool("1MiB", 1) as pool:
        c = children("iterate", pool.address, 0)
        c.ready()
        for i in range(5):
            pool.send(item(i))
    assert c.result() == [plain(item(i)) for i in range(5)]


def test_producer_killed_while_a_receiver_waits(children):
    producer = children("producer", 1)
    address = producer.ready()
    rx = ferry.connect(address, 0)
    killed = []

    def kill():
        time.sleep(0.3)
        killed.append(time.monotonic())
        os.kill(producer.process.pid, signal.SIGKILL)

    t = threading.Thread(target=kill)
    t.start()
    with pytest.raises(ferry.ProducerGone):
        rx.recv()  # forever, but the producer dies
    gone = time.monotonic()
    t.join()
    assert gone - killed[0] < 1.0
    with pytest.raises(ferry.ProducerGone):
        rx.recv(timeout=0.1)
    assert list(rx) == []
    rx.close()


def test_consumer_killed_then_restarted_on_its_rank(children):
    with ferry.Pool("1MiB", 1) as pool:
        first = children("hold", pool.address, 0)
        first.ready()
        for i in range(3):
            pool.send(item(i))  # queued for the first process, which never reads
        first.kill()
        again = children("recv_n", pool.address, 0, 2)
        again.ready()
        pool.send(item(10))
        pool.send(item(11))
        assert again.result() == [plain(item(10)), plain(item(11))]
        pool.drain(5)


def test_only_the_printed_address(children):
    """An address is refused unless it is exactly what Pool.address prints: junk after a NUL
    (which the library would never see) or hex digits in upper case, and the rank stays free."""
    with ferry.Pool("1MiB", 1) as pool:
        upper = "ferry:" + pool.address[6:].upper()
        for bad in (pool.address + "\x00junk", pool.address + "\x00", upper):
            if bad == pool.address:
                continue  # no letter among the digits (1 in 3 million)
            with pytest.raises(ValueError, match="is not a ferry address") as info:
                ferry.connect(bad, 0)
            assert info.value.status == "INVALID_ARGUMENT"
        other = children("recv_n", pool.address, 0, 1)  # rank 0 was not claimed here
        other.ready()
        pool.send(item(5))
        assert other.result() == [plain(item(5))]


def test_bad_input():
    with pytest.raises(ValueError, match="'nope' is not a ferry address") as info:
        ferry.connect("nope", 0)
    assert info.value.status == "INVALID_ARGUMENT"
    with pytest.raises(ferry.ProducerGone) as gone:
        ferry.connect("ferry:" + "0" * 32, 0)
    # the address and the cause, once each
    assert str(gone.value).count("no pool serves") == 1
    assert "pool broker is not reachable" in str(gone.value)
    with pytest.raises(ValueError, match="power of two"):
        ferry.Pool("1MiB", 1, channel_depth=3)
    with pytest.raises(ValueError):
        ferry.Pool("1MiB", 1, drain_timeout=-1)
    with ferry.Pool("1MiB", 2) as pool:
        with pytest.raises(ValueError, match="rank 2 is not a rank of the pool"):
            ferry.connect(pool.address, 2)
        with pytest.raises(ValueError):
            ferry.connect(pool.address, -1)
        with pytest.raises(TypeError):
            ferry.connect(b"ferry:", 0)
        rx = ferry.connect(pool.address, 1)
        assert repr(rx) == (f"ferry.Receiver(address={pool.address!r}, rank=1, device=-1, "
                            f"closed=False)")
        assert (rx.rank, rx.address, rx.device) == (1, pool.address, -1)
        assert isinstance(rx.fileno(), int)
        with pytest.raises(ferry.Timeout, match="no lease came for rank 1 within 100.000 ms"):
            rx.recv(timeout=0.1)
        pool.send(item(0), ranks=1)
        with pytest.raises(ValueError, match="out= holds"):
            rx.recv(out=np.empty(3, np.int32))
        assert rx.recv(timeout=1, out=np.empty(64, np.int32)).tolist() == item(0).tolist()
        rx.close()
        rx.close()
        assert rx.closed
        with pytest.raises(ValueError, match="closed"):
            rx.recv()
        with pytest.raises(ValueError, match="closed"):
            rx.fileno()
        pool.send(item(1))
        pool.close(drain=False)  # nobody reads it
    with pytest.raises(ferry.Closing):
        pool.send(item(2))
    assert pool.address.startswith("ferry:")  # still known after close


def test_stale_leases_are_skipped():
    with ferry.Pool("1MiB", 2) as pool, ferry.connect(pool.address, 0) as rx:
        d = pool.send(item(0))
        ferry.ack(d, ranks=range(0, 1))  # acknowledged on rank 0's behalf: nothing to read
        pool.send(item(1))
        assert np.from_dlpack(rx.recv(timeout=1)).tolist() == item(1).tolist()
        ferry.ack(d, rank=1)
        ferry.ack(pool.send(item(2), ranks=0), rank=0)
        with pytest.raises(ferry.Timeout):  # the last two were acknowledged for rank 0
            rx.recv(timeout=0.1)
        pool.close(drain=False)  # rank 1 never reads item 1


def test_recv_torch_needs_torch():
    torch = pytest.importorskip("torch")
    with ferry.Pool("1MiB", 1) as pool, ferry.connect(pool.address, 0, torch=True) as rx:
        pool.send(item(3))
        t = rx.recv(timeout=1)
        assert isinstance(t, torch.Tensor) and t.tolist() == item(3).tolist()


INTERRUPTIBLE = """
import signal, sys, numpy as np, ferry
# Python handles Ctrl-C only where SIGINT was not ignored when it started (a test run
# started in the background of a shell inherits it ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)
pool = ferry.Pool("1MiB", 2)
rx = ferry.connect(pool.address, 1)
pool.send(np.arange(4), ranks=0)  # rank 0 never reads: drains wait forever
print("blocking", flush=True)
try:
    if sys.argv[1] == "drain":
        pool.drain(float("inf"))
    elif sys.argv[1] == "close":
        pool.close(drain=float("inf"))
    else:
        rx.recv()
except KeyboardInterrupt:
    print("interrupted", pool.closed, flush=True)
"""


@pytest.mark.parametrize("call", ["drain", "close", "recv"])
def test_waits_end_with_ctrl_c(call):
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-c", INTERRUPTIBLE, call], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "blocking"
        time.sleep(0.5)
        start = time.monotonic()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline().split()
        assert time.monotonic() - start < 2
        assert line == ["interrupted", "True" if call == "close" else "False"], p.stderr.read()
        assert p.wait(10) == 0
    finally:
        if p.poll() is None:
            p.kill()
