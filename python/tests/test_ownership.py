"""Who owns what: reservations and the exports of their memory across commit, cancel and the
pool's close, reservations collected or used as context managers, sequences that change while
a call runs, and reference cycles through pools and reservations."""

import gc
import threading
import time
import weakref

import numpy as np
import pytest

import ferry
from conftest import in_flight, isolated, wait_until


@pytest.mark.parametrize("kind", ["buffer", "dlpack"])
def test_export_outlives_the_pool(kind):
    # Written after the pool was closed and dropped: without the export keeping the memory
    # mapped, this kills the interpreter (SIGSEGV).
    rc, seen, stderr = isolated("export_outlives_close", kind)
    assert rc == 0, stderr
    refused = "the reservation's slice cannot be exported: its pool is closed"
    assert seen == {
        "closed": True,
        "export": ["BufferError", refused],
        "dlpack": ["BufferError", refused],
        "publish": ["Closing", "host pool is closing"],
        "commit": ["Closing", "host pool is closing"],
        "sum": 7 * 1024,
    }


def test_close_finishes_when_the_last_export_goes(worker):
    pool = ferry.Pool(1 << 20, 1)
    never = pool.reserve((4,), "float32")  # never committed: the consumer waits on it
    r = pool.reserve((4,), "float32")
    arr = np.from_dlpack(r)
    worker.submit("receive_timed", never.descriptor, 0, timeout=30)
    time.sleep(0.3)
    pool.close()
    assert pool.closed
    with pytest.raises(ferry.Closing, match="^host pool is closing$"):
        pool.stats()
    with pytest.raises(ferry.Closing):
        pool.reserve((4,), "float32")
    assert not worker.conn.poll(0.3)  # the pool is still up for the consumer
    del arr  # the last export: the library's close runs now
    name, message, seconds = worker.result()
    assert name == "ProducerGone" and "is gone or closed the pool" in message
    with pytest.raises(ferry.Closing, match="^host pool is closing$"):
        pool.stats()  # the library's answer now
    del r, never


def test_close_ends_a_wait_for_space_while_exports_live():
    pool = ferry.Pool(256 + 4096, 1, max_inflight=8, on_full="wait", timeout=10)
    r = pool.reserve((1024,), "float32")  # the whole pool
    arr = np.from_dlpack(r)
    outcome = []

    def publish():
        start = time.monotonic()
        try:
            pool.publish(np.ones(1024, np.float32))
        except ferry.Error as e:
            outcome.append((type(e), str(e), time.monotonic() - start))

    thread = threading.Thread(target=publish)
    thread.start()
    time.sleep(0.2)
    pool.close()  # the library's close waits for arr: the waiting publish must end anyway
    thread.join(5)
    assert outcome and outcome[0][:2] == (ferry.Closing, "host pool is closing")
    assert outcome[0][2] < 2
    del arr, r


def test_no_export_after_commit_or_cancel():
    with ferry.Pool(1 << 20, 1) as pool:
        r = pool.reserve((4,), "int32")
        m = memoryview(r)  # an export from before the commit stays usable
        m[:] = np.arange(4, dtype=np.int32).tobytes()
        r.commit()
        assert r.state == "committed"
        for export in (memoryview, np.from_dlpack):
            with pytest.raises(BufferError, match="it was committed, and the consumers may"):
                export(r)
        m.release()
        c = pool.reserve((4,), "int32")
        c.cancel()
        assert c.state == "cancelled"
        with pytest.raises(BufferError, match="it was cancelled, and the slice may hold"):
            memoryview(c)
        assert np.array_equal(np.from_dlpack(ferry.receive(r.descriptor, rank=0)), np.arange(4))


def test_collected_reservation_is_cancelled(worker):
    with ferry.Pool(1 << 20, 1, drain_timeout=0) as pool:
        r = pool.reserve((4,), "float32")
        d = r.descriptor
        del r
        assert in_flight(pool) == 0 and pool.stats()["cancelled"] == 1
        with pytest.raises(ferry.Stale, match="cancelled by the producer"):
            worker.call("receive_array", d, 0)
        pool.reserve((4,), "float32").commit()  # committed, then collected: not cancelled
        assert in_flight(pool) == 1 and pool.stats()["cancelled"] == 1


def test_collected_reservation_waits_for_its_exports():
    # The slice stays the writer's while a DLPack export of it lives: it is cancelled only
    # when that goes, so that no other lease gets the memory meanwhile.
    with ferry.Pool(1 << 20, 1) as pool:
        r = pool.reserve((4,), "float32")
        arr = np.from_dlpack(r)
        del r
        gc.collect()
        assert in_flight(pool) == 1 and pool.stats()["cancelled"] == 0
        arr[:] = 1
        del arr
        assert in_flight(pool) == 0 and pool.stats()["cancelled"] == 1


def test_reservation_as_context_manager(worker):
    with ferry.Pool(1 << 20, 1) as pool:
        with pool.reserve((3,), "int64") as r:  # a normal exit commits
            np.from_dlpack(r)[:] = [1, 2, 3]
        assert r.state == "committed"
        assert worker.call("receive_array", r.descriptor, 0)[0].tolist() == [1, 2, 3]
        with pytest.raises(KeyError):
            with pool.reserve((3,), "int64") as failed:  # an exception cancels
                raise KeyError("no data")
        assert failed.state == "cancelled"
        with pytest.raises(ferry.Stale, match="cancelled by the producer"):
            worker.call("receive_array", failed.descriptor, 0)
        with pytest.raises(KeyError):
            with pool.reserve((3,), "int64") as sent:  # committed already: left as it is
                sent.commit()
                raise KeyError("after the commit")
        assert sent.state == "committed"
        assert worker.call("receive_array", sent.descriptor, 0)[0].shape == (3,)
        with pool.reserve((3,), "int64") as dropped:
            dropped.cancel()  # cancelled already: nothing more on exit
        assert pool.stats()["cancelled"] == 2
        wait_until(lambda: in_flight(pool) == 0)


def test_sequences_changed_while_a_call_runs():
    # Under the debug allocator, reading the items of a list that was emptied meanwhile
    # crashes the interpreter.
    rc, seen, stderr = isolated("lists_changed_meanwhile", env={"PYTHONMALLOC": "debug"})
    assert rc == 0, stderr
    (slot_a, a), (slot_b, b) = seen["received"]
    assert slot_a == slot_b and a == b == [0.0, 1.0, 2.0, 3.0]
    assert seen["published"] == [[3], [2], [4]]


def test_cycles_through_pools_and_reservations_are_collected():
    class Owner(ferry.Pool):
        pass

    pool = Owner(1 << 20, 1)
    pool.reservation = pool.reserve((4,), "float32")  # pool -> reservation -> pool
    assert gc.is_tracked(pool.reservation)
    d = pool.publish(np.arange(3))
    received = ferry.receive(d, rank=0)
    assert gc.is_tracked(received)
    ref = weakref.ref(pool)
    del pool
    gc.collect()
    assert ref() is None
