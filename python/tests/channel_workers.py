"""Helper processes of test_channel.py, started with the "spawn" context. Each connects to a pool
by its address (ferry.connect), says "ready" on its Pipe, does its part and sends back
("ok", value) or ("error", class name, message)."""

import asyncio
import os
import selectors
import time

import numpy as np

import ferry


def _report(conn, fn):
    try:
        conn.send(("ok", fn()))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        conn.send(("error", type(e).__name__, str(e)))


def recv_n(conn, address, rank, n, delay=0.0, each=0.0, timeout=5.0):
    """Connects, reports ready, sleeps delay, then receives n items (sleeping each between
    them); returns them as lists of (dtype, values) (a packed item: a list of those)."""
    rx = ferry.connect(address, rank)
    conn.send(("ready", os.getpid()))

    def run():
        time.sleep(delay)
        got = []
        for _ in range(n):
            item = rx.recv(timeout=timeout)
            got.append(_plain(item))
            time.sleep(each)
        return got

    _report(conn, run)


def _plain(item):
    if isinstance(item, list):
        return [_plain(x) for x in item]
    a = np.from_dlpack(item)
    return (a.dtype.str, a.tolist())


def recv_ranks(conn, address, ranks, timeout=0.5):
    """One process, several ranks: every item each rank gets until a recv times out."""
    rxs = {r: ferry.connect(address, r) for r in ranks}
    conn.send(("ready", os.getpid()))
    conn.recv()  # the test sent everything

    def run():
        got = {}
        for r, rx in rxs.items():
            got[r] = []
            while True:
                try:
                    got[r].append(_plain(rx.recv(timeout=timeout)))
                except ferry.Timeout:
                    break
        return got

    _report(conn, run)


def iterate(conn, address, rank):
    """Iterates over the receiver until the producer closes the pool."""
    rx = ferry.connect(address, rank)
    conn.send(("ready", os.getpid()))
    _report(conn, lambda: [_plain(t) for t in rx])


def select_pools(conn, addresses, rank, n):
    """Connects to several pools and waits on their fds with selectors until n items came."""
    rxs = [ferry.connect(a, rank) for a in addresses]
    conn.send(("ready", os.getpid()))

    def run():
        sel = selectors.DefaultSelector()
        for i, rx in enumerate(rxs):
            sel.register(rx, selectors.EVENT_READ, i)  # fileno() is enough for selectors
        got = []

        def take(i):  # until Timeout, which arms the fd again
            while True:
                try:
                    got.append((i, _plain(rxs[i].recv(timeout=0))))
                except (ferry.Timeout, ferry.ProducerGone):  # closed once all was read
                    return

        for i in range(len(rxs)):  # what came before the fds were registered
            take(i)
        deadline = time.monotonic() + 10
        while len(got) < n and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=1):
                take(key.data)
        return sorted(got)

    _report(conn, run)


def async_recv(conn, address, rank, n):
    """arecv n items (each under a 5 s guard), then async for until the producer closes."""
    rx = ferry.connect(address, rank)
    conn.send(("ready", os.getpid()))

    async def main():
        first = [_plain(await asyncio.wait_for(rx.arecv(), 5)) for _ in range(n)]
        rest = []

        async def drain():
            async for t in rx:
                rest.append(_plain(t))

        await asyncio.wait_for(drain(), 10)
        return first, rest

    _report(conn, lambda: asyncio.run(main()))


def hold(conn, address, rank):
    """Connects, reports ready and sleeps until killed (a rank that does not receive)."""
    ferry.connect(address, rank)
    conn.send(("ready", os.getpid()))
    time.sleep(3600)


def producer(conn, n_consumers):
    """Makes a pool, sends its address and sleeps until killed."""
    pool = ferry.Pool("1MiB", n_consumers)
    conn.send(("ready", pool.address))
    time.sleep(3600)
