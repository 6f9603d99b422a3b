"""The library's log lines go to the "ferry" logger; the pool-full warning is not repeated to a
caller who got it as an exception."""

import logging

import numpy as np
import pytest

import ferry

ITEM = np.zeros(200 << 10, np.uint8)


def fill(pool):
    pool.publish(ITEM)  # the pool holds one item; its consumer never acknowledges it


def full_warnings(caplog):
    return [r for r in caplog.records
            if r.name == "ferry" and r.levelno == logging.WARNING and "POOL_FULL" in r.message]


def test_pool_full_warning_goes_to_logging(caplog, capfd):
    caplog.set_level(logging.INFO, logger="ferry")
    with ferry.Pool("384KiB", 1, on_full="none", drain_timeout=0) as pool:
        fill(pool)
        assert pool.publish(ITEM) is None
        assert pool.publish(ITEM) is None  # warned once per pool
    records = full_warnings(caplog)
    assert len(records) == 1, caplog.records
    assert "warned once" in records[0].message
    assert "ferry warning" not in capfd.readouterr().err  # not the library's stderr line


@pytest.mark.parametrize("policy, kwargs", [("wait", {"timeout": 0.05}), ("raise", {})])
def test_no_warning_when_the_caller_gets_pool_full(caplog, capfd, policy, kwargs):
    caplog.set_level(logging.INFO, logger="ferry")
    with ferry.Pool("384KiB", 1, on_full=policy, **kwargs, drain_timeout=0) as pool:
        fill(pool)
        with pytest.raises(ferry.PoolFull) as info:
            pool.publish(ITEM)
        assert "POOL_FULL" == info.value.status
        with pytest.raises(ferry.PoolFull):
            pool.reserve(ITEM.shape, "uint8")
    assert full_warnings(caplog) == []
    assert "pool full" not in capfd.readouterr().err.lower()


def test_reserve_under_none_warns(caplog):
    caplog.set_level(logging.INFO, logger="ferry")
    with ferry.Pool("384KiB", 1, on_full="none", drain_timeout=0) as pool:
        fill(pool)
        assert pool.reserve(ITEM.shape, "uint8") is None
    assert len(full_warnings(caplog)) == 1


def test_logger_is_the_packages():
    assert ferry.logger is logging.getLogger("ferry")
    ferry._ferry._log_flush()  # delivers what other threads queued; harmless when empty
