"""Lease life cycle across processes: multi-tensor leases, acknowledgements by rank, range and
all, cancel and stale descriptors, a full pool under each policy, and views that outlive the
objects they came from."""

import gc
import time

import numpy as np
import pytest

import ferry
from conftest import in_flight, wait_until

# A pool whose data region holds exactly one 4 KiB tensor (8 rows of 2 words: 256 bytes of
# control table).
ONE_SLICE = 256 + 4096


def block(value=0):
    return np.full(1024, value, np.float32)  # 4096 bytes


def test_multi_tensor_publish_is_one_lease(worker):
    with ferry.Pool(1 << 20, 1) as pool:
        xs = [np.arange(10, dtype=np.int64), np.ones((3, 3), np.float32), np.array(True)]
        ds = pool.publish_many(xs)
        assert len(ds) == 3 and all(d.multi for d in ds)
        assert len({(d.slot, d.generation) for d in ds}) == 1
        assert in_flight(pool) == 1 and pool.stats()["publishes"] == 1
        got = worker.call("receive_many", ds, 0)
        for x, y in zip(xs, got):
            assert x.dtype == y.dtype and np.array_equal(x, y)
        wait_until(lambda: in_flight(pool) == 0)
        assert pool.stats()["reclaimed"] == 1
        assert pool.consumer_info(0)["outstanding"] == 0
        with pytest.raises(ferry.Stale):  # acknowledged once, for the whole lease
            worker.call("receive_array", ds[1], 0)


def test_multi_tensor_views(worker):
    with ferry.Pool(1 << 20, 1) as pool:
        ds = pool.publish_many([np.arange(4), np.arange(5.0)])
        got = worker.call("receive_many", ds, 0, copy=False)
        assert np.array_equal(got[0], np.arange(4)) and np.array_equal(got[1], np.arange(5.0))
        wait_until(lambda: in_flight(pool) == 0)  # the last view freed acknowledges


def test_receive_many_needs_one_lease():
    with ferry.Pool(1 << 20, 1, drain_timeout=0) as pool:
        a, b = pool.publish(np.arange(3)), pool.publish(np.arange(3))
        with pytest.raises(ValueError, match="one lease"):
            ferry.receive_many([a, b], rank=0)


def test_acks_by_rank_range_and_all(workers_pair):
    consumer, other = workers_pair
    with ferry.Pool(1 << 20, 4) as pool:
        d = pool.publish(np.arange(8))
        assert consumer.call("receive_array", d, 0)[0].tolist() == list(range(8))
        assert [pool.consumer_info(r)["outstanding"] for r in range(4)] == [0, 1, 1, 1]
        consumer.call("ack", d, rank=1)  # a consumer process acknowledges for another rank
        assert [pool.consumer_info(r)["outstanding"] for r in range(4)] == [0, 0, 1, 1]
        other.call("ack", d, ranks=range(2, 4))
        assert [pool.consumer_info(r)["outstanding"] for r in range(4)] == [0, 0, 0, 0]
        wait_until(lambda: in_flight(pool) == 0)
        assert pool.stats()["reclaimed"] == 1

        e = pool.publish(np.arange(8))
        assert in_flight(pool) == 1
        other.call("ack", e)  # every rank
        wait_until(lambda: in_flight(pool) == 0)
        assert pool.stats()["reclaimed"] == 2
        with pytest.raises(ferry.Stale):
            consumer.call("receive_array", e, 0)
        with pytest.raises(ferry.Stale):
            consumer.call("ack", e, rank=3)


def test_ack_arguments():
    with ferry.Pool(1 << 20, 4) as pool:
        d = pool.publish(np.arange(8))
        with pytest.raises(ValueError, match="not both"):
            ferry.ack(d, rank=1, ranks=range(0, 1))
        with pytest.raises(ValueError, match="step 1"):
            ferry.ack(d, ranks=range(0, 4, 2))
        with pytest.raises(TypeError, match="range"):
            ferry.ack(d, ranks=(0, 2))
        with pytest.raises(ValueError) as info:
            ferry.ack(d, ranks=range(3, 9))
        assert str(info.value) == "rank range [3, 9) is outside [0, 4)"
        ferry.ack(d, ranks=range(0, 4))
        wait_until(lambda: in_flight(pool) == 0)


def test_cancel(worker):
    with ferry.Pool(1 << 20, 1) as pool:
        d = pool.publish(np.arange(4))
        pool.cancel(d)
        assert in_flight(pool) == 0 and pool.stats()["cancelled"] == 1
        with pytest.raises(ferry.Stale) as info:
            worker.call("receive_array", d, 0)
        assert "cancelled by the producer" in str(info.value)
        assert info.value.status == "STALE"
        with pytest.raises(ferry.Error) as again:
            pool.cancel(d)
        assert str(again.value) == (
            f"Cannot release inactive host pool lease (slot={d.slot}, generation={d.generation})"
        )
        assert again.value.status == "INACTIVE_LEASE"


def test_stale_after_ack(worker):
    with ferry.Pool(1 << 20, 1) as pool:
        d = pool.publish(np.arange(4))
        worker.call("receive_array", d, 0)
        with pytest.raises(ferry.Stale) as info:
            worker.call("receive_array", d, 0)
        assert "already acknowledged for rank 0" in str(info.value)


def test_stale_after_slot_reuse(worker):
    with ferry.Pool(1 << 20, 1, max_inflight=1) as pool:
        old = pool.publish(np.arange(4))
        worker.call("receive_array", old, 0)
        wait_until(lambda: in_flight(pool) == 0)
        new = pool.publish(np.arange(4) * 2)
        assert (new.slot, new.generation) == (old.slot, old.generation + 1)
        with pytest.raises(ferry.Stale) as info:
            worker.call("receive_array", old, 0)
        assert str(info.value) == (
            f"stale descriptor: slot {old.slot} now holds generation {new.generation}, "
            f"descriptor has {old.generation}"
        )
        assert np.array_equal(worker.call("receive_array", new, 0)[0], np.arange(4) * 2)


def test_pool_full_raises():
    with ferry.Pool(ONE_SLICE, 1, max_inflight=8, drain_timeout=0) as pool:
        pool.publish(block())
        with pytest.raises(ferry.PoolFull) as info:
            pool.publish(block())
        assert info.value.status == "POOL_FULL"
        assert str(info.value).startswith("host pool is full: 4096 bytes requested")
        assert "slowest consumer: rank 0" in str(info.value)
        assert pool.stats()["pool_full_events"] >= 1
        start = time.monotonic()
        with pytest.raises(ferry.PoolFull):  # a per-call timeout waits first, then raises
            pool.publish(block(), timeout=0.2)
        assert time.monotonic() - start >= 0.15


def test_pool_full_none():
    with ferry.Pool(ONE_SLICE, 1, max_inflight=8, on_full="none", drain_timeout=0) as pool:
        assert pool.publish(block()) is not None
        assert pool.publish(block()) is None
        assert pool.publish_many([np.zeros(4), np.zeros(4)]) is None
        assert pool.reserve((1024,), "float32") is None
        assert pool.publish(block(), timeout=0.05) is None
        assert pool.on_full == "none"


def test_pool_full_wait_until_a_consumer_acks(worker):
    with ferry.Pool(ONE_SLICE, 1, max_inflight=8, on_full="wait") as pool:
        first = pool.publish(block(1))
        worker.submit("delayed", 0.3, "receive_array", first, 0)
        start = time.monotonic()
        second = pool.publish(block(2))  # waits (GIL released) for the consumer's ack
        waited = time.monotonic() - start
        assert np.array_equal(worker.result()[0], block(1))
        assert second is not None and 0.2 <= waited < 5
        assert np.array_equal(worker.call("receive_array", second, 0)[0], block(2))


def test_pool_full_wait_times_out():
    with ferry.Pool(ONE_SLICE, 1, max_inflight=8, on_full="wait", timeout=0.3,
                    drain_timeout=0) as pool:
        pool.publish(block())
        start = time.monotonic()
        with pytest.raises(ferry.PoolFull):
            pool.publish(block())
        assert 0.25 <= time.monotonic() - start < 3
        start = time.monotonic()
        with pytest.raises(ferry.PoolFull):
            pool.reserve((1024,), "float32", timeout=0.1)  # the call's timeout wins
        assert time.monotonic() - start < 0.25


def test_view_outlives_received_and_consumer_cache(worker):
    with ferry.Pool(1 << 20, 1) as pool:
        x = np.arange(100, dtype=np.float64)
        d = pool.publish(x)
        values, writeable, write_error = worker.call("hold_view", "v", d, 0)
        assert np.array_equal(values, x)
        assert not writeable and "read-only" in write_error
        pool.reclaim()
        assert in_flight(pool) == 1 and pool.consumer_info(0)["outstanding"] == 1
        assert np.array_equal(worker.call("read_held", "v"), x)
        worker.call("drop_held", "v")  # numpy frees the view: ferry acknowledges
        wait_until(lambda: in_flight(pool) == 0)
        assert pool.consumer_info(0)["outstanding"] == 0


def test_view_outlives_the_pool_object():
    pool = ferry.Pool(1 << 20, 1)
    x = np.arange(64, dtype=np.int32)
    view = ferry.receive(pool.publish(x), rank=0, copy=False)
    arr = np.from_dlpack(view)
    del view
    ferry.release_consumers()
    assert in_flight(pool) == 1
    pool.close()
    del pool
    gc.collect()
    assert np.array_equal(arr, x)  # this process's mapping lives as long as the view
    del arr
    gc.collect()


def test_unexported_view_acknowledges_when_freed():
    with ferry.Pool(1 << 20, 1) as pool:
        view = ferry.receive(pool.publish(np.arange(3)), rank=0, copy=False)
        assert view.readonly and in_flight(pool) == 1
        del view
        wait_until(lambda: in_flight(pool) == 0)


def test_stats_and_consumer_info_fields(worker):
    with ferry.Pool(1 << 20, 2, drain_timeout=0) as pool:
        assert set(pool.stats()) == {
            "capacity", "usable_bytes", "bytes_in_use", "largest_free", "leases_in_flight",
            "high_water_bytes", "high_water_leases", "publishes", "pool_full_events",
            "reclaimed", "cancelled", "acked_for_dead", "broker_refused",
            "consumers_attached", "consumers_alive", "too_large", "pool_full_waits",
            "pool_full_timeouts", "remote_connected", "remote_admitted", "remote_refused",
            "remote_emulated", "remote_forwarded", "remote_bad_messages",
            "remote_refused_malformed", "remote_refused_secret", "remote_refused_rank",
            "remote_refused_silent", "remote_refused_flood", "remote_refused_error",
        }  # fmt: skip
        d = pool.publish(np.arange(4))
        worker.call("receive_array", d, 1)
        info = pool.consumer_info(1)
        assert info == {"attached": True, "alive": True, "pid": worker.pid, "outstanding": 0,
                        "oldest_age_ns": 0, "partly_acknowledged": 0}  # fmt: skip
        assert pool.consumer_info(0)["attached"] is False
        assert pool.consumer_info(0)["outstanding"] == 1
        stats = pool.stats()
        assert stats["capacity"] == 1 << 20 and stats["publishes"] == 1
        assert stats["consumers_attached"] == 1 and stats["consumers_alive"] == 1
        with pytest.raises(ValueError):
            pool.consumer_info(2)


# ---- a tensor larger than the pool ------------------------------------------------------

TOO_LARGE = np.zeros(2048, np.float32)  # 8 KiB: ONE_SLICE holds 4 KiB of data


@pytest.mark.parametrize("call", ["publish", "publish_many", "reserve"])
def test_too_large_under_none_is_none(call):
    with ferry.Pool(ONE_SLICE, 1, max_inflight=8, on_full="none") as pool:
        assert too_large_call(pool, call) is None
        assert pool.stats()["too_large"] == 1 and in_flight(pool) == 0


@pytest.mark.parametrize("call", ["publish", "publish_many", "reserve"])
@pytest.mark.parametrize("policy", ["raise", "wait"])
def test_too_large_raises_at_once(call, policy):
    with ferry.Pool(ONE_SLICE, 1, max_inflight=8, on_full=policy, timeout=5,
                    drain_timeout=0) as pool:
        start = time.monotonic()
        with pytest.raises(ferry.TooLarge) as info:
            too_large_call(pool, call)
        assert time.monotonic() - start < 1  # "wait" does not wait for what can never fit
        assert isinstance(info.value, ferry.PoolFull) and info.value.status == "POOL_FULL"
        assert "can never fit" in str(info.value)
        pool.publish(block())  # the pool is as it was
        with pytest.raises(ferry.PoolFull) as full:
            pool.publish(block(), timeout=0)
        assert not isinstance(full.value, ferry.TooLarge)
        assert pool.stats()["too_large"] == 1


def too_large_call(pool, call):
    if call == "publish":
        return pool.publish(TOO_LARGE)
    if call == "publish_many":
        return pool.publish_many([np.zeros(512, np.float32), np.zeros(512, np.float32),
                                  np.zeros(3, np.uint8)])  # fmt: skip  4099 bytes packed
    return pool.reserve(TOO_LARGE.shape, "float32")


# ---- acknowledging for other ranks ----------------------------------------------------


def test_ack_on_behalf_claims_no_rank(worker):
    # The worker has a consumer of rank 0 cached (for pool a); acknowledging pool b's lease
    # for ranks 1 and 2, and for all, must not attach it to b as rank 0, or as any rank.
    with ferry.Pool(1 << 20, 1) as a, ferry.Pool(1 << 20, 3) as b:
        d = b.publish(np.arange(4))
        worker.call("ack_on_behalf", a.publish(np.arange(2)), d, rank=1)
        worker.call("ack", d, ranks=range(2, 3))
        assert [b.consumer_info(r)["outstanding"] for r in range(3)] == [1, 0, 0]
        e = b.publish(np.arange(4))
        worker.call("ack", e)
        assert [b.consumer_info(r)["attached"] for r in range(3)] == [False] * 3
        assert b.stats()["consumers_attached"] == 0
        assert b.consumer_info(0)["outstanding"] == 1  # d: rank 0 still has it to read
        assert worker.call("receive_array", d, 0)[0].tolist() == [0, 1, 2, 3]
        assert b.consumer_info(0)["pid"] == worker.pid  # reading claims the rank
        wait_until(lambda: in_flight(b) == 0)


# ---- the parts of a packed lease ----------------------------------------------------------


def test_parts_are_acknowledged_one_by_one(workers_pair):
    first, second = workers_pair
    with ferry.Pool(1 << 20, 2) as pool:
        ds = pool.publish_many([np.arange(3), np.arange(4.0), np.ones(2, np.int8)])
        assert first.call("receive_parts", ds, 0, [0, 2])[1].tolist() == [1, 1]
        pool.reclaim()
        assert in_flight(pool) == 1 and pool.consumer_info(0)["outstanding"] == 1
        assert first.call("receive_parts", ds, 0, [1])[0].tolist() == [0.0, 1.0, 2.0, 3.0]
        assert pool.consumer_info(0)["outstanding"] == 0  # every part read: the lease is done
        with pytest.raises(ferry.Stale):
            first.call("receive_parts", ds, 0, [2])
        got = second.call("receive_many", ds, 1)  # receive_many acknowledges every part
        assert [g.tolist() for g in got] == [[0, 1, 2], [0.0, 1.0, 2.0, 3.0], [1, 1]]
        wait_until(lambda: in_flight(pool) == 0)


def test_receive_of_an_acknowledged_part_is_stale(worker):
    """A part this rank acknowledged is Stale to receive again, as a whole lease is, while
    its other parts are still to be read (a consumer deduplicating by Stale reads it once)."""
    with ferry.Pool(1 << 20, 1) as pool:
        ds = pool.publish_many([np.arange(3), np.arange(4.0)])
        assert worker.call("receive_parts", ds, 0, [0])[0].tolist() == [0, 1, 2]
        with pytest.raises(ferry.Stale, match="part 0 of lease"):
            worker.call("receive_parts", ds, 0, [0])
        with pytest.raises(ferry.Stale):
            worker.call("receive_parts", ds, 0, [0], copy=False)
        with pytest.raises(ferry.Stale):
            worker.call("ack", ds[0], rank=0)
        assert pool.consumer_info(0)["outstanding"] == 1
        assert worker.call("receive_parts", ds, 0, [1])[0].tolist() == [0.0, 1.0, 2.0, 3.0]
        wait_until(lambda: in_flight(pool) == 0)


def test_whole_lease_through_one_part(workers_pair):
    """A leader acknowledging a packed lease through one part acknowledges that part only: the
    lease stays, counted as partly acknowledged and named when the pool is full; lease=True
    releases it whole through any part, for a range, one rank or every rank."""
    leader, other = workers_pair
    with ferry.Pool(1 << 20, 4, max_inflight=1, drain_timeout=0) as pool:
        ds = pool.publish_many([np.arange(3), np.arange(4.0), np.ones(2, np.int8)])
        leader.call("ack", ds[0], ranks=range(0, 4))  # that part only
        pool.reclaim()
        assert in_flight(pool) == 1
        assert [pool.consumer_info(r)["partly_acknowledged"] for r in range(4)] == [1] * 4
        with pytest.raises(ferry.PoolFull, match="1 partly acknowledged"):
            pool.publish(np.arange(3))
        leader.call("ack", ds[1], ranks=range(0, 2), lease=True)
        assert [pool.consumer_info(r)["outstanding"] for r in range(4)] == [0, 0, 1, 1]
        other.call("ack", ds[2], rank=2, lease=True)  # through a part it never acknowledged
        assert pool.consumer_info(2)["outstanding"] == 0
        leader.call("ack", ds[0], lease=True)  # every rank: rank 3 was the last
        wait_until(lambda: in_flight(pool) == 0)
        assert pool.consumer_info(3)["partly_acknowledged"] == 0
        with pytest.raises(ferry.Stale):
            leader.call("ack", ds[1], lease=True)
        d = pool.publish(np.arange(3))  # a lease of one tensor: the same as without lease
        leader.call("ack", d, lease=True)
        wait_until(lambda: in_flight(pool) == 0)


def test_part_views_acknowledge_when_freed(worker):
    with ferry.Pool(1 << 20, 1) as pool:
        ds = pool.publish_many([np.arange(3), np.arange(5)])
        worker.call("hold_many", "parts", ds, 0)
        worker.call("drop_part", "parts", 0)
        pool.reclaim()
        assert pool.consumer_info(0)["outstanding"] == 1  # the other view still reads it
        worker.call("drop_part", "parts", 1)
        wait_until(lambda: in_flight(pool) == 0)
        worker.call("drop_held", "parts")


# ---- descriptors checked before anything is allocated -----------------------------------


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def forged(d, length, pool_size):
    """d's wire form as a 1-D uint8 tensor of length bytes in a pool of pool_size bytes, with
    a valid checksum (docs/wire-format.md)."""
    wire = bytearray(bytes(d))
    wire[32:40] = length.to_bytes(8, "little")
    wire[40:48] = pool_size.to_bytes(8, "little")
    wire[152:157] = bytes([1, 8, 1, 0, 1])  # uint8, 8 bits, 1 lane, ndim 1
    wire[160:224] = length.to_bytes(8, "little") + bytes(56)
    wire[252:256] = crc32c(bytes(wire[:252])).to_bytes(4, "little")
    return ferry.Descriptor.from_bytes(bytes(wire))


def test_descriptor_checked_before_allocation(worker):
    with ferry.Pool(1 << 20, 1) as pool:
        d = pool.publish(np.arange(4, dtype=np.uint8))
        huge = forged(d, 1 << 50, 1 << 51)  # a petabyte: receive must not try to allocate it
        messages = []
        for opened in (False, True):  # the pool opened with the forged descriptor, or before
            if opened:
                assert worker.call("receive_array", d, 0)[0].tolist() == [0, 1, 2, 3]
            for kwargs in ({}, {"copy": False}):
                with pytest.raises(ValueError) as info:
                    worker.call("receive_array", huge, 0, **kwargs)
                assert info.value.status == "MISMATCH"
                messages.append(str(info.value))
        assert messages[0] == "pool header does not match the descriptor: pool size differs"
        assert messages[-1].startswith("descriptor disagrees with the pool")
