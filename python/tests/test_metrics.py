"""Metrics: Pool.metrics() (the library's Prometheus text) and ferry.prometheus.FerryCollector
(prometheus_client, installed here if missing; its tests skip when it cannot be)."""

import importlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import ferry

# At most four leases in flight: the fifth publish finds the pool full.
LEASES = 4

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')


def unescape(value):
    return re.sub(r'\\([\\"n])', lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_labels(text):
    labels, pos = {}, 0
    while pos < len(text):
        m = LABEL.match(text, pos)
        assert m, f"labels do not parse at {pos}: {text!r}"
        labels[m.group(1)] = unescape(m.group(2))
        pos = m.end()
    return labels


def parse(text):
    """{(name, ((label, value), ...)): value}, {name: type}, {name: help} of Prometheus text;
    every line must parse. Labels are sorted by name (prometheus_client sorts them)."""
    samples, types, helps = {}, {}, {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            helps[name] = help_text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert kind in ("counter", "gauge") or not name.startswith("ferry_"), line
            types[name] = kind
        elif line.startswith("#"):
            continue
        else:
            m = SAMPLE.match(line)
            assert m, f"metrics line does not parse: {line!r}"
            labels = tuple(sorted(parse_labels(m.group(2) or "").items()))
            samples[(m.group(1), labels)] = float(m.group(3))
    return samples, types, helps


def block():
    return np.zeros(1024, np.float32)  # 4096 bytes


def full_pool(consumers=2):
    """A pool published into until PoolFull, once more with a wait, and once too large."""
    pool = ferry.Pool(1 << 20, consumers, max_inflight=LEASES, drain_timeout=0)
    ds = []
    with pytest.raises(ferry.PoolFull):
        for _ in range(10):
            ds.append(pool.publish(block()))
    with pytest.raises(ferry.PoolFull):
        pool.publish(block(), timeout=0.02)
    with pytest.raises(ferry.TooLarge):
        pool.publish(np.zeros(1 << 20, np.uint8))
    return pool, ds


POOL_METRICS = {
    "ferry_publishes_total": ("counter", "publishes"),
    "ferry_pool_full_events_total": ("counter", "pool_full_events"),
    "ferry_pool_full_waits_total": ("counter", "pool_full_waits"),
    "ferry_pool_full_timeouts_total": ("counter", "pool_full_timeouts"),
    "ferry_too_large_total": ("counter", "too_large"),
    "ferry_reclaimed_total": ("counter", "reclaimed"),
    "ferry_cancelled_total": ("counter", "cancelled"),
    "ferry_acked_for_dead_total": ("counter", "acked_for_dead"),
    "ferry_broker_refused_total": ("counter", "broker_refused"),
    "ferry_capacity_bytes": ("gauge", "capacity"),
    "ferry_usable_bytes": ("gauge", "usable_bytes"),
    "ferry_bytes_in_use": ("gauge", "bytes_in_use"),
    "ferry_largest_free_bytes": ("gauge", "largest_free"),
    "ferry_leases_in_flight": ("gauge", "leases_in_flight"),
    "ferry_high_water_bytes": ("gauge", "high_water_bytes"),
    "ferry_high_water_leases": ("gauge", "high_water_leases"),
    "ferry_consumers_attached": ("gauge", "consumers_attached"),
    "ferry_consumers_alive": ("gauge", "consumers_alive"),
    "ferry_remote_connected": ("gauge", "remote_connected"),
    "ferry_remote_admitted_total": ("counter", "remote_admitted"),
    "ferry_remote_emulated": ("gauge", "remote_emulated"),
    "ferry_remote_forwarded_total": ("counter", "remote_forwarded"),
    "ferry_remote_bad_messages_total": ("counter", "remote_bad_messages"),
}
REFUSED = "ferry_remote_refused_total"
REASONS = ("malformed", "secret", "rank", "silent", "flood", "error")
RANK_METRICS = {
    "ferry_rank_attached": lambda i: float(i["attached"]),
    "ferry_rank_alive": lambda i: float(i["alive"]),
    "ferry_rank_pid": lambda i: float(i["pid"]),
    "ferry_rank_outstanding_leases": lambda i: float(i["outstanding"]),
}
AGE = "ferry_rank_oldest_lease_age_seconds"


def key_of(labels):
    return tuple(sorted(labels))


def check(samples, types, pool, extra=()):
    """Every sample of one pool, against its stats() and consumer_info()."""
    stats = pool.stats()
    base = (("pool", pool.describe().pool_id.hex()), ("backend", "host"), *extra)
    consumers = pool.describe().consumer_count
    for name, (kind, key) in POOL_METRICS.items():
        assert types[name] == kind
        assert samples[(name, key_of(base))] == stats[key], name
    for r in range(consumers):
        info, labels = pool.consumer_info(r), key_of(base + (("rank", str(r)),))
        for name, value in RANK_METRICS.items():
            assert types[name] == "gauge"
            assert samples[(name, labels)] == value(info), (name, r)
        assert types[AGE] == "gauge"
        assert 0 <= samples[(AGE, labels)] < 60
    assert types[REFUSED] == "counter"
    for reason in REASONS:
        labels = key_of(base + (("reason", reason),))
        assert samples[(REFUSED, labels)] == stats["remote_refused_" + reason], reason
    assert len(samples) == (len(POOL_METRICS) + len(REASONS) +
                            consumers * (len(RANK_METRICS) + 1))


def test_text_matches_stats_and_consumer_info():
    pool, ds = full_pool()
    with pool:
        stats = pool.stats()
        assert stats["pool_full_waits"] >= 1 and stats["pool_full_timeouts"] >= 1
        assert stats["too_large"] == 1 and stats["publishes"] == len(ds) == LEASES
        ferry.ack(ds[0], ranks=range(0, 2))
        pool.reclaim()
        samples, types, helps = parse(pool.metrics())
        assert set(helps) == set(types) == (set(POOL_METRICS) | set(RANK_METRICS) |
                                            {AGE, REFUSED})
        check(samples, types, pool)
        base = (("pool", pool.describe().pool_id.hex()), ("backend", "host"))
        assert samples[("ferry_reclaimed_total", key_of(base))] == 1
        assert samples[("ferry_rank_outstanding_leases", key_of(base + (("rank", "1"),)))] == (
            LEASES - 1)


def test_labels_are_escaped():
    with ferry.Pool(1 << 20, 1, drain_timeout=0) as pool:
        assert pool.metrics({}) == pool.metrics() == pool.metrics(None)
        pool.publish(block())
        labels = {"worker": 3, "job": 'a "b" {c}\\\nd', "zone": "été"}
        samples, types, _ = parse(pool.metrics(labels))
        check(samples, types, pool, tuple((k, str(v)) for k, v in labels.items()))


@pytest.mark.parametrize("labels, error", [
    ({"1x": "a"}, ValueError), ({"a-b": "a"}, ValueError), ({"": "a"}, ValueError),
    ({"__x": "a"}, ValueError), ({"pool": "x"}, ValueError), ({"rank": "x"}, ValueError),
    ({"a": "x\0y"}, ValueError), ({"a": "tab\there"}, ValueError), ({1: "a"}, TypeError),
    ("worker=3", TypeError), ([("a", "b")], TypeError),
])  # fmt: skip
def test_bad_labels_refused(labels, error):
    with ferry.Pool(1 << 20, 1, drain_timeout=0) as pool:
        with pytest.raises(error):
            pool.metrics(labels)
        assert pool.metrics().startswith("# HELP ferry_")


def test_closed_pool():
    pool = ferry.Pool(1 << 20, 1, drain_timeout=0)
    pool.close()
    with pytest.raises(ferry.Closing):
        pool.metrics()


# ---- the collector ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus_client():
    try:
        return importlib.import_module("prometheus_client")
    except ImportError:
        pass
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--retries", "1",
                        "--timeout", "15", "prometheus-client"],
                       check=True, capture_output=True, timeout=180,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})  # fmt: skip
        importlib.invalidate_caches()
        return importlib.import_module("prometheus_client")
    except (subprocess.SubprocessError, OSError, ImportError) as e:
        pytest.skip(f"prometheus_client is not installed and could not be: {e}")


def test_collector_yields_the_text_metrics(prometheus_client):
    from ferry.prometheus import FerryCollector

    registry = prometheus_client.CollectorRegistry()
    pool, ds = full_pool(consumers=3)
    other = ferry.Pool(1 << 20, 1, drain_timeout=0)
    with pool, other:
        ferry.ack(ds[1], ranks=range(0, 3))
        pool.reclaim()
        registry.register(FerryCollector([pool, other], labels={"worker": 7}))
        text = prometheus_client.generate_latest(registry).decode()
        for counter in ("publishes", "pool_full_events", "pool_full_waits",
                        "pool_full_timeouts", "too_large", "reclaimed"):  # fmt: skip
            assert f"# TYPE ferry_{counter}_total counter" in text
            assert f"\nferry_{counter}_total{{" in text
        samples, types, helps = parse(text)
        check({k: v for k, v in samples.items() if dict(k[1])["pool"] ==
               pool.describe().pool_id.hex()}, types, pool, (("worker", "7"),))  # fmt: skip
        other_id = other.describe().pool_id.hex()
        assert samples[("ferry_publishes_total", key_of((("pool", other_id),
                        ("backend", "host"), ("worker", "7"))))] == 0  # fmt: skip
        # The same metrics, types and help as the library's text.
        lib_samples, lib_types, lib_helps = parse(pool.metrics({"worker": 7}))
        assert lib_types == types and lib_helps == helps
        assert set(lib_samples) <= set(samples)
        for key, value in lib_samples.items():
            if key[0] != AGE:
                assert samples[key] == value, key
        other.close()  # a closed pool is left out of the next scrape
        samples, _, _ = parse(prometheus_client.generate_latest(registry).decode())
        assert {dict(k[1])["pool"] for k in samples} == {pool.describe().pool_id.hex()}


def test_collector_on_the_default_registry(prometheus_client):
    from ferry.prometheus import FerryCollector

    with ferry.Pool(1 << 20, 1, drain_timeout=0) as pool:
        pool.publish(block())
        collector = FerryCollector(pool)
        prometheus_client.REGISTRY.register(collector)
        try:
            samples, types, _ = parse(prometheus_client.generate_latest().decode())
            hex_id = pool.describe().pool_id.hex()
            assert types["ferry_publishes_total"] == "counter"
            assert samples[("ferry_publishes_total", key_of((("pool", hex_id),
                            ("backend", "host"))))] == 1  # fmt: skip
        finally:
            prometheus_client.REGISTRY.unregister(collector)


def test_collector_refuses_bad_labels(prometheus_client):
    from ferry.prometheus import FerryCollector

    with ferry.Pool(1 << 20, 1, drain_timeout=0) as pool:
        for labels in ({"pool": "x"}, {"9": "x"}, {"__a": "x"}):
            with pytest.raises(ValueError):
                FerryCollector(pool, labels)
        with pytest.raises(TypeError):
            FerryCollector(pool, "worker=3")
        with pytest.raises(TypeError):
            FerryCollector(3)


def test_import_without_prometheus_client():
    """import ferry (and ferry.prometheus) never needs prometheus_client; the collector says
    what to install."""
    code = """if True:
        import sys
        sys.modules["prometheus_client"] = None  # import prometheus_client fails from here
        import ferry, ferry.prometheus
        with ferry.Pool(1 << 20, 1, drain_timeout=0) as pool:
            assert pool.metrics().startswith("# HELP ferry_")
            try:
                ferry.prometheus.FerryCollector(pool)
            except ImportError as e:
                assert "pip install prometheus-client" in str(e), e
            else:
                raise AssertionError("no ImportError")
        print("ok")
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    # Installed or not, importing ferry does not import it.
    code = "import sys, ferry, ferry.prometheus; print('prometheus_client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
