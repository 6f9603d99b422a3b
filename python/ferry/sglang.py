"""ferry as SGLang's multimodal feature transport.

SGLang's tokenizer workers move image and video features to the scheduler ranks through a
CUDA IPC pool (``MmItemMemoryPool``) and pickled proxies (``CudaIpcTensorTransportProxy``);
the scheduler calls ``reconstruct_on_target_device`` on each. This module gives both classes
ferry's body, so that SGLang's own code runs unchanged on one ferry pool:

- :class:`FerryMmItemMemoryPool` has ``MmItemMemoryPool``'s constructor and calls
  (``wrap_tensor``, ``cancel_proxy``, ``shutdown``, ``active_lease_count``) over a
  :class:`ferry.Pool`: a full pool gives None (SGLang then falls back to its CPU path) with
  one warning per pool, a dead scheduler rank's leases are acknowledged for it, nothing is
  polled.
- :class:`FerryTensorTransportProxy` subclasses SGLang's proxy class (where SGLang is
  installed), so that every ``isinstance`` check in SGLang takes it: it carries the lease's
  descriptor and, for a pool made with ``listen=``, the pool's remote address.
  ``reconstruct_on_target_device`` copies the tensor onto the scheduler's GPU and
  acknowledges in stream order (a mapped pool) or reads it by UCX gets (a scheduler on
  another host: SGLang's encoder/language-model disaggregation); ``acknowledge_consumption``
  and ``release_without_reconstruction`` release without reading, for one rank or for the
  whole consumer group, and release the whole lease when several tensors share it
  (:meth:`FerryMmItemMemoryPool.wrap_tensors`).

Turning it on: ``FERRY_SGLANG=1`` in the environment of ``python -m sglang.launch_server``.
ferry's package registers an SGLang plugin (entry point group ``sglang.srt.plugins``), which
SGLang loads in each of its processes; with ``FERRY_SGLANG=1`` the plugin puts these classes
in place of SGLang's, else it does nothing. ``FERRY_SGLANG_LISTEN=HOST:PORT`` makes the pools
serve scheduler ranks on other hosts too. In a process of one's own, :func:`install` does the
same.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Optional

import torch

import ferry
from ferry import _placement
from ferry._placement import current_stream, node_id

logger = logging.getLogger("ferry.sglang")

try:  # SGLang 0.5.2x; older releases kept the classes in sglang.srt.utils
    from sglang.srt.multimodal.transport import cuda_ipc as _sglang_transport
except ImportError:  # pragma: no cover - depends on the installed SGLang
    try:
        from sglang.srt.utils import cuda_ipc_transport_utils as _sglang_transport
    except ImportError:
        _sglang_transport = None

_ProxyBase: type = (getattr(_sglang_transport, "CudaIpcTensorTransportProxy", object)
                    if _sglang_transport is not None else object)
try:  # SGLang's rule for a scheduler's consumer rank (its TP rank modulo the count)
    from sglang.srt.multimodal.transport.memory_pool import resolve_consumer_rank as _resolve
except ImportError:  # pragma: no cover - depends on the installed SGLang
    _resolve = None

#: Environment variables: the switch, and an address to serve other hosts from.
ENV_ENABLE = "FERRY_SGLANG"
ENV_LISTEN = "FERRY_SGLANG_LISTEN"
ENV_BACKEND = "FERRY_SGLANG_BACKEND"

_TARGET_POOL = "sglang.srt.multimodal.transport.cuda_ipc.MmItemMemoryPool"
_TARGET_PROXY = "sglang.srt.multimodal.transport.cuda_ipc.CudaIpcTensorTransportProxy"


def _consumer_rank(total: int, consumer_rank: Optional[int]) -> int:
    """The rank a scheduler acknowledges as: the one given, else SGLang's own rule (its TP
    rank modulo the consumer count), else 0 for a single consumer."""
    if consumer_rank is None and total > 1:
        if _resolve is None:
            raise RuntimeError(f"ferry: give consumer_rank= (the pool has {total} consumers)")
        return int(_resolve(total, None, "ferry"))
    rank = 0 if consumer_rank is None else int(consumer_rank)
    if not 0 <= rank < total:
        raise RuntimeError(f"ferry consumer rank {rank} is outside [0, {total})")
    return rank


class FerryTensorTransportProxy(_ProxyBase):  # type: ignore[misc, valid-type]
    """One tensor in a ferry pool, as SGLang's scheduler sees a CUDA IPC proxy.

    Its whole state is ``proxy_state["ferry"]`` (plain values: SGLang's msgpack path carries
    ``proxy_state`` and nothing else), so it pickles small and travels by either of SGLang's
    encodings."""

    def __init__(self, descriptor: ferry.Descriptor, shape, dtype: torch.dtype,
                 remote_address: Optional[str] = None, node: Optional[str] = None):
        # SGLang's constructor takes the pool's tensors: nothing of it applies here.
        self._set({"descriptor": bytes(descriptor), "shape": tuple(int(n) for n in shape),
                   "dtype": str(dtype).replace("torch.", ""), "remote": remote_address,
                   "node": node or node_id()})
        self._descriptor = descriptor

    def _set(self, state: dict) -> None:
        """The proxy from its state (proxy_state["ferry"]), nothing read or acknowledged."""
        self.proxy_state = {"ferry": state, "tensor_data": None}
        self.sync_data_meta = None
        self.reconstruct_tensor = None
        self._consumer_acknowledged = False
        self._descriptor: Optional[ferry.Descriptor] = None

    def __getstate__(self) -> dict:
        return {"proxy_state": self.proxy_state}

    def __setstate__(self, state: dict) -> None:
        self._set(state["proxy_state"]["ferry"])

    def __reduce__(self):
        # Pickled as a flat tuple (about half the time of the state dict's round trip).
        st = self.proxy_state["ferry"]
        return (_proxy_from_wire, (type(self), st["descriptor"], st["shape"], st["dtype"],
                                   st["remote"], st["node"]))

    # ---- what SGLang reads of a proxy ----------------------------------------------------

    @property
    def _state(self) -> dict:
        return self.proxy_state["ferry"]

    @property
    def descriptor(self) -> ferry.Descriptor:
        d = getattr(self, "_descriptor", None)
        if d is None:
            d = self._descriptor = ferry.Descriptor(self._state["descriptor"])
        return d

    @property
    def total_consumer_count(self) -> int:
        return self.descriptor.consumer_count

    @property
    def generation(self) -> int:
        return self.descriptor.generation

    @property
    def remote(self) -> bool:
        """Whether this process reads the pool over UCX (another host) rather than mapped."""
        return self.proxy_state["ferry"]["node"] != node_id()

    # ---- consuming -----------------------------------------------------------------------

    def _ranks(self, consumer_count: int, consumer_rank: Optional[int]) -> tuple[int, range]:
        """(the rank that reads, the ranks acknowledged): one rank, or the whole group."""
        total = self.total_consumer_count
        if consumer_count == total:  # this rank reads (or not) and releases the group's
            return _consumer_rank(total, consumer_rank), range(total)
        if consumer_count != 1:
            raise ValueError("ferry acknowledgements support one consumer or the complete "
                             f"consumer group, got {consumer_count}/{total}")
        rank = _consumer_rank(total, consumer_rank)
        return rank, range(rank, rank + 1)

    def _where(self, rank: int, device: Optional[int]) -> dict:
        """The keywords of _placement.receive and ack for this proxy's pool."""
        st = self.proxy_state["ferry"]
        return {"node": st["node"], "remote": st["remote"], "rank": rank, "device": device}

    def reconstruct_on_target_device(self, rebuild_device_idx, consumer_count: int = 1,
                                     consumer_rank: Optional[int] = None):
        """The tensor on GPU ``rebuild_device_idx`` (a copy, from torch's allocator on the
        current stream), acknowledged for this rank, or for every rank when
        ``consumer_count`` is the whole group. The same tensor again on a second call."""
        if isinstance(rebuild_device_idx, torch.device):
            rebuild_device_idx = rebuild_device_idx.index or 0
        d = self.descriptor
        host = d.device < 0
        target = torch.device("cpu") if host else torch.device("cuda", int(rebuild_device_idx))
        if isinstance(self.reconstruct_tensor, torch.Tensor) and \
                self.reconstruct_tensor.device == target:
            return self.reconstruct_tensor
        if self._consumer_acknowledged:
            raise RuntimeError("ferry: this proxy's lease was released without reading it")
        rank, ranks = self._ranks(consumer_count, consumer_rank)
        shape, dtype = self._state["shape"], getattr(torch, self._state["dtype"])
        out = torch.empty(shape, dtype=dtype, device=target)
        device = None if host else int(rebuild_device_idx)
        stream = None if host else current_stream(device)
        others = [r for r in (range(ranks.start, rank), range(rank + 1, ranks.stop)) if len(r)]
        where = self._where(rank, device)
        try:
            for r in others:  # the group's: its lease is held by this rank's until read
                _placement.ack(d, ranks=r, **where)
            _placement.receive(d, out=out, stream=stream, **where)
        except ferry.Error:
            # Not read (Timeout, ProducerGone, ...): this rank's part is released all the same,
            # so that the lease is not held by a proxy SGLang will drop.
            self._consumer_acknowledged = True
            try:
                _placement.ack(d, **where)
            except ferry.Error:
                pass  # acknowledged already, or the producer is gone
            raise
        self._consumer_acknowledged = True
        self.reconstruct_tensor = out
        return out

    def _release(self, consumer_count: int, consumer_rank: Optional[int], lease: bool) -> None:
        if self._consumer_acknowledged:
            return
        rank, ranks = self._ranks(consumer_count, consumer_rank)
        device = None
        if self.descriptor.device >= 0 and torch.cuda.is_available():
            device = torch.cuda.current_device()
        try:
            _placement.ack(self.descriptor, ranks=ranks, lease=lease,
                           **self._where(rank, device))
        except ferry.Stale:
            if not lease:
                raise
            # Released already, through another proxy of the same lease.
        self._consumer_acknowledged = True

    def acknowledge_consumption(self, consumer_count: int = 1,
                                consumer_rank: Optional[int] = None) -> None:
        """Releases this proxy's tensor without reading it (an embedding-cache hit), for this
        rank or for the whole group; other tensors of a shared lease stay readable."""
        self._release(consumer_count, consumer_rank, lease=False)

    def release_without_reconstruction(self, consumer_count: int = 1) -> None:
        """Releases a proxy whose request was abandoned: the whole lease it is part of (every
        tensor of the request goes), once; the request's other proxies then find it released
        and return."""
        self._release(consumer_count, None, lease=True)

    def borrow_on_target_device(self, rebuild_device_idx: int) -> None:
        """No borrowed views: SGLang then reconstructs (a copy, acknowledged in order)."""
        return None

    def release_borrowed_on_current_stream(self, consumer_count: int = 1,
                                           consumer_rank: Optional[int] = None) -> None:
        return None

    def __repr__(self) -> str:
        d = self.descriptor
        return (f"FerryTensorTransportProxy(slot={d.slot}, generation={d.generation}, "
                f"shape={self._state['shape']}, dtype={self._state['dtype']}, "
                f"remote={self._state['remote'] is not None})")


def _proxy_from_wire(cls, descriptor: bytes, shape: tuple, dtype: str,
                     remote: Optional[str], node: str) -> FerryTensorTransportProxy:
    proxy = cls.__new__(cls)
    proxy._set({"descriptor": descriptor, "shape": shape, "dtype": dtype, "remote": remote,
                "node": node})
    return proxy


class FerryMmItemMemoryPool:
    """SGLang's ``MmItemMemoryPool`` over one ferry pool.

    ``memory_size`` bytes on GPU ``base_gpu_id`` (a host pool for ``base_gpu_id < 0``), read
    by ``consumer_count`` scheduler ranks, at most ``max_inflight_slices`` tensors in flight.
    ``recycle_interval`` is checked and otherwise unused: ferry recycles a slice when its
    last acknowledgement lands, no thread polls. ``listen="HOST:PORT"`` (default:
    ``$FERRY_SGLANG_LISTEN``) serves ranks on other hosts too; ``backend`` (default:
    ``$FERRY_SGLANG_BACKEND``, else ferry's choice for the GPU)."""

    def __init__(self, memory_size: int, recycle_interval: float, base_gpu_id: int,
                 consumer_count: int, max_inflight_slices: int = 4096, *,
                 listen: Optional[str] = None, backend: Optional[str] = None):
        if recycle_interval <= 0:
            raise ValueError("recycle_interval must be positive")
        listen = listen if listen is not None else (os.environ.get(ENV_LISTEN) or None)
        backend = backend or os.environ.get(ENV_BACKEND) or "auto"
        self.device_id = base_gpu_id
        self.consumer_count = consumer_count
        self._pool = ferry.Pool(memory_size, consumers=consumer_count, backend=backend,
                                device=base_gpu_id if base_gpu_id >= 0 else -1,
                                max_inflight=max_inflight_slices, on_full="none",
                                listen=listen)
        self._node = node_id()
        self._remote = self._pool.remote_address
        self._pool_id = self._pool.describe().pool_id
        self._cancelled: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self._pool_full_warned = False
        self._memory_size = memory_size
        logger.info("ferry pool for SGLang's multimodal features: %s, %d MiB, %d consumers%s",
                    self._pool.backend, memory_size >> 20, consumer_count,
                    f", serving other hosts at {listen}" if listen else "")

    @property
    def pool(self) -> ferry.Pool:
        """The ferry pool (stats, metrics, consumer_info)."""
        return self._pool

    @property
    def active_lease_count(self) -> int:
        return int(self._pool.stats()["leases_in_flight"])

    def shutdown(self) -> None:
        self._pool.close()

    def _stream(self, tensor: torch.Tensor):
        return current_stream(tensor.device.index) if tensor.is_cuda else None

    def _proxy(self, d: ferry.Descriptor, tensor: torch.Tensor) -> FerryTensorTransportProxy:
        return FerryTensorTransportProxy(d, tensor.shape, tensor.dtype, self._remote, self._node)

    def wrap_tensor(self, tensor: torch.Tensor, *, use_pool_handle_cache: bool = True
                    ) -> Optional[FerryTensorTransportProxy]:
        """Copies tensor into the pool (on the current stream: no host synchronisation) and
        returns its proxy; None when the pool is full (SGLang then sends it by value).
        ``use_pool_handle_cache`` is accepted for SGLang: ferry always caches its mappings."""
        tensor = tensor.contiguous()
        d = self._pool.publish(tensor, stream=self._stream(tensor))
        if d is None:
            self._warn_pool_full_once(tensor.numel() * tensor.element_size())
            return None
        return self._proxy(d, tensor)

    def wrap_tensors(self, tensors: list) -> Optional[list]:
        """Several tensors of one request in one lease (one copy call, one acknowledgement):
        a proxy each, and any one of them releases the whole lease when the request is
        abandoned. None when the pool is full."""
        tensors = [t.contiguous() for t in tensors]
        ds = self._pool.publish_many(tensors, stream=self._stream(tensors[0]))
        if ds is None:
            self._warn_pool_full_once(sum(t.numel() * t.element_size() for t in tensors))
            return None
        return [self._proxy(d, t) for d, t in zip(ds, tensors)]

    def cancel_proxy(self, proxy: FerryTensorTransportProxy) -> None:
        """Returns the slice of a proxy whose request was never dispatched (every proxy of a
        shared lease may be given: the lease is cancelled once)."""
        if not isinstance(proxy, FerryTensorTransportProxy) or \
                proxy.descriptor.pool_id != self._pool_id:
            raise RuntimeError("ferry proxy does not belong to this pool")
        d = proxy.descriptor
        key = (d.slot, d.generation)
        with self._lock:
            if key in self._cancelled:
                return
            self._pool.cancel(d)
            self._cancelled.add(key)
            if len(self._cancelled) > 4 * self._pool.describe().max_inflight:
                self._cancelled.clear()  # only a rollback's own proxies ever repeat

    def _warn_pool_full_once(self, nbytes: int) -> None:
        if self._pool_full_warned:
            return
        self._pool_full_warned = True
        logger.warning(
            "ferry pool has no room for a %.2f MiB tensor (pool size: %.2f MiB); falling "
            "back to non-IPC transport. Consider increasing SGLANG_MM_FEATURE_CACHE_MB.",
            nbytes / (1 << 20), self._memory_size / (1 << 20))


def enabled() -> bool:
    """Whether ``FERRY_SGLANG`` asks for ferry."""
    return os.environ.get(ENV_ENABLE, "").strip().lower() in ("1", "true", "yes", "on")


def _register() -> None:
    """Registers the two classes with SGLang's hook registry (class replacement, which it
    propagates to every module that imported SGLang's)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    HookRegistry.register(_TARGET_POOL, FerryMmItemMemoryPool, HookType.REPLACE)
    HookRegistry.register(_TARGET_PROXY, FerryTensorTransportProxy, HookType.REPLACE)


def install() -> None:
    """Puts ferry's classes in place of SGLang's CUDA IPC pool and proxy in this process,
    through SGLang's hook registry (what the plugin does under ``FERRY_SGLANG=1``)."""
    if _sglang_transport is None:
        raise RuntimeError("ferry.sglang.install: SGLang is not installed")
    from sglang.srt.plugins.hook_registry import HookRegistry
    _register()
    HookRegistry.apply_hooks()


def plugin() -> None:
    """SGLang's general plugin (entry point ``ferry`` in ``sglang.srt.plugins``): with
    ``FERRY_SGLANG=1``, registers the two classes with SGLang's hook registry, which puts
    them in place in each SGLang process; without it, nothing."""
    if not enabled():
        return
    _register()
    logger.info("ferry carries SGLang's multimodal features (%s=1)", ENV_ENABLE)
