"""Prometheus metrics of ferry pools, through ``prometheus_client``.

::

    from prometheus_client import REGISTRY, start_http_server
    from ferry.prometheus import FerryCollector

    REGISTRY.register(FerryCollector(pool, labels={"worker": "3"}))
    start_http_server(9100)

``prometheus_client`` is not a dependency of ferry: this module imports it when a collector is
made or scraped, and raises ``ImportError`` saying what to install when it is missing
(``import ferry`` and ``import ferry.prometheus`` work without it). Without it,
``Pool.metrics()`` gives the same metrics as Prometheus text.

The metrics are those of ``Pool.metrics()`` (docs/metrics.md): counters and gauges of the
pool's ``stats()``, and per rank (label ``rank``) the gauges of ``consumer_info(rank)``. Every
sample carries ``pool`` (the pool's id, 32 hex digits), ``backend`` and the collector's
labels.
"""

from . import _ferry

# (name, key in Pool.stats(), help): the names and help of src/pool/metrics.c.
_COUNTERS = (
    ("ferry_publishes", "publishes", "Leases created (publish, publish_many, reserve)."),
    ("ferry_pool_full_events", "pool_full_events",
     "Publishes that found the pool full even after reclaiming."),
    ("ferry_pool_full_waits", "pool_full_waits",
     "Publishes that found the pool full and waited for space."),
    ("ferry_pool_full_timeouts", "pool_full_timeouts",
     "Publishes that waited for space and gave up with POOL_FULL."),
    ("ferry_too_large", "too_large",
     "Publishes refused at once because they can never fit (the fallback path)."),
    ("ferry_reclaimed", "reclaimed", "Leases freed after every rank acknowledged them."),
    ("ferry_cancelled", "cancelled", "Leases cancelled by the producer."),
    ("ferry_acked_for_dead", "acked_for_dead",
     "Acknowledgements written on behalf of consumers whose process died."),
    ("ferry_broker_refused", "broker_refused",
     "Broker connections refused (another uid, a bad message)."),
    ("ferry_remote_admitted", "remote_admitted", "Remote consumers admitted so far."),
    ("ferry_remote_forwarded", "remote_forwarded",
     "Descriptors sent to consumers on other hosts."),
    ("ferry_remote_bad_messages", "remote_bad_messages",
     "Active messages from remote consumers dropped as malformed, forged or stale."),
)  # fmt: skip

# The remote refusals: one family, a sample per reason (stats key remote_refused_<reason>).
_REFUSED = ("ferry_remote_refused",
            "Remote connections refused, by reason (malformed, secret, rank, silent, flood, "
            "error).")
_REFUSED_REASONS = ("malformed", "secret", "rank", "silent", "flood", "error")

_GAUGES = (
    ("ferry_capacity_bytes", "capacity", "Bytes of pool memory: control table and data."),
    ("ferry_usable_bytes", "usable_bytes", "Bytes of the pool available for data."),
    ("ferry_bytes_in_use", "bytes_in_use", "Bytes held by live leases."),
    ("ferry_largest_free_bytes", "largest_free", "Bytes of the largest free extent."),
    ("ferry_leases_in_flight", "leases_in_flight",
     "Leases reserved or published, not reclaimed."),
    ("ferry_high_water_bytes", "high_water_bytes", "Most bytes in use at once so far."),
    ("ferry_high_water_leases", "high_water_leases", "Most leases in flight at once so far."),
    ("ferry_consumers_attached", "consumers_attached", "Ranks that attached at least once."),
    ("ferry_consumers_alive", "consumers_alive", "Attached ranks whose process is alive."),
    ("ferry_remote_connected", "remote_connected", "Ranks held by consumers on other hosts now."),
    ("ferry_remote_emulated", "remote_emulated",
     "Remote consumers connected now whose reads are emulated over active messages (tcp)."),
)  # fmt: skip

# (name, value of a consumer_info(rank) dict, help)
_RANK_GAUGES = (
    ("ferry_rank_attached", lambda i: int(i["attached"]), "1 if the rank attached at least once."),
    ("ferry_rank_alive", lambda i: int(i["alive"]), "1 if the rank's last process is alive."),
    ("ferry_rank_pid", lambda i: i["pid"],
     "The rank's last process (the producer's pid namespace), 0 if none."),
    ("ferry_rank_outstanding_leases", lambda i: i["outstanding"],
     "Published leases the rank has not acknowledged."),
    ("ferry_rank_oldest_lease_age_seconds", lambda i: i["oldest_age_ns"] / 1e9,
     "Age of the rank's oldest unacknowledged lease, 0 if none."),
)  # fmt: skip

_BASE_LABELS = ("pool", "backend")


def _client():
    """prometheus_client's metric families, imported on first use."""
    try:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    except ImportError as e:
        raise ImportError(
            "ferry.prometheus.FerryCollector needs prometheus_client, which ferry does not "
            "install: pip install prometheus-client (or use Pool.metrics() for the text)"
        ) from e
    return CounterMetricFamily, GaugeMetricFamily


def _check_labels(labels):
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise TypeError(f"labels must be a dict, not {type(labels).__name__}")
    for name in labels:
        if not isinstance(name, str):
            raise TypeError(f"label names must be str, not {type(name).__name__}")
        ok = (name and name[0].isascii() and (name[0].isalpha() or name[0] == "_")
              and all(c.isascii() and (c.isalnum() or c == "_") for c in name)
              and not name.startswith("__") and name not in ("pool", "backend", "rank"))  # fmt: skip
        if not ok:
            raise ValueError(
                f'metrics label name "{name}" is not allowed (expected [a-zA-Z_][a-zA-Z0-9_]*, '
                'not starting with "__", not pool, backend or rank)'
            )
    return {name: str(value) for name, value in labels.items()}


class FerryCollector:
    """FerryCollector(pools, labels=None)

    A ``prometheus_client`` collector of ferry pools: ``pools`` is one ``ferry.Pool`` or a
    collection of them (iterated at every scrape, so a list may change); ``labels`` is a dict
    of labels added to every sample. Closed pools are left out of a scrape. Register it with
    ``prometheus_client.REGISTRY.register(collector)`` (or any ``CollectorRegistry``).
    Raises ``ImportError`` when ``prometheus_client`` is not installed.
    """

    def __init__(self, pools, labels=None):
        _client()
        if not isinstance(pools, _ferry.Pool) and not hasattr(pools, "__iter__"):
            raise TypeError(f"pools must be a ferry.Pool or a collection of them, not "
                            f"{type(pools).__name__}")  # fmt: skip
        self._pools = pools
        self._labels = _check_labels(labels)
        self._label_names = _BASE_LABELS + tuple(self._labels)

    def _each_pool(self):
        if isinstance(self._pools, _ferry.Pool):
            return (self._pools,)
        return tuple(self._pools)

    def _families(self):
        counter, gauge = _client()
        names = list(self._label_names)
        pool_families = [(counter(n, h, labels=names), key) for n, key, h in _COUNTERS]
        pool_families += [(gauge(n, h, labels=names), key) for n, key, h in _GAUGES]
        rank_families = [(gauge(n, h, labels=names + ["rank"]), value)
                         for n, value, h in _RANK_GAUGES]  # fmt: skip
        refused = counter(_REFUSED[0], _REFUSED[1], labels=names + ["reason"])
        rank_families.append((refused, None))
        return pool_families, rank_families

    def describe(self):
        """The metric families without samples (registering does not scrape the pools)."""
        pool_families, rank_families = self._families()
        return [f for f, _ in pool_families] + [f for f, _ in rank_families]

    def collect(self):
        """The metric families of every open pool."""
        pool_families, rank_families = self._families()
        for pool in self._each_pool():
            try:
                self._add_pool(pool, pool_families, rank_families)
            except (_ferry.Closing, _ferry.Forked):
                continue  # closed meanwhile (or inherited by a fork): nothing to report
        for family, _ in pool_families + rank_families:
            yield family

    def _add_pool(self, pool, pool_families, rank_families):
        if pool.closed:
            return
        d = pool.describe()
        stats = pool.stats()
        infos = [pool.consumer_info(r) for r in range(d.consumer_count)]
        base = [d.pool_id.hex(), pool.backend, *self._labels.values()]
        for family, key in pool_families:
            family.add_metric(base, stats[key])
        for family, value in rank_families:
            if value is None:  # the remote refusals, by reason
                for reason in _REFUSED_REASONS:
                    family.add_metric(base + [reason], stats["remote_refused_" + reason])
                continue
            for rank, info in enumerate(infos):
                family.add_metric(base + [str(rank)], value(info))
