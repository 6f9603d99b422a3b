"""ferry as a vLLM encoder-cache connector (``ECConnectorBase``), loaded out of tree.

An encoder instance (``ec_role="ec_producer"``) publishes each encoder output into one ferry
pool; a language-model instance (``ec_role="ec_consumer"``), on this host or another, reads
it onto its GPUs, every tensor-parallel rank its own copy, and acknowledges; the pool
recycles the slice then. Turn it on in both instances with::

    --ec-transfer-config '{"ec_connector": "FerryECConnector",
                           "ec_connector_module_path": "ferry.vllm",
                           "ec_role": "ec_producer",
                           "ec_ip": "10.0.0.5", "ec_port": 14579,
                           "ec_buffer_size": 1e9,
                           "ec_connector_extra_config": {"consumers": 2,
                                                         "listen": "10.0.0.5:0"}}'

(``"ec_role": "ec_consumer"`` and the same ``ec_ip``/``ec_port`` on the consumer.)

- ``ec_buffer_size``: the pool's bytes; ``ec_buffer_device``: ``"cuda"`` (the producer
  worker's GPU) or ``"cpu"`` (a host pool).
- ``ec_ip``/``ec_port``: where the producer's index answers (the TCP address consumers ask
  which features it holds; it hands out the pool's descriptors and its remote address, which
  carries the pool's secret: bind it to a network only your instances reach).
- ``ec_connector_extra_config``: ``consumers`` (the consumer instance's tensor-parallel
  size, default 1), ``listen`` (``HOST:PORT`` to serve consumers on other hosts over UCX;
  without it, consumers must share the producer's host), ``backend`` (``"auto"``,
  ``"cuda_ipc"``, ``"cuda_vmm"``, ``"host"``), ``timeout`` (seconds for index requests,
  default 5).

Each feature is handed over once: the consumer's scheduler claims it (``update_state_after_alloc``),
its workers read it (``start_load_caches``), and the slice is recycled. A pool full of
features nobody claimed drops the oldest unclaimed ones to make room (a claimed one is never
dropped); a feature that still does not fit is not offered (the consumer encodes it itself,
or fails as vLLM decides), with one warning per pool.
"""

from __future__ import annotations

import collections
import json
import logging
import socket
import socketserver
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch

import ferry
from ferry import _placement
from ferry._placement import current_stream, node_id

from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.request import Request

logger = logging.getLogger("ferry.vllm")

_LINE_MAX = 64 * 1024  # an index request or answer; a longer line is refused


# ---- the producer's index: mm_hash -> lease -----------------------------------------------

class _Index:
    """The features a producer holds, by mm_hash, oldest first; claimed ones are gone from
    it (their slices are the consumers' to release)."""

    def __init__(self, pool: ferry.Pool, node: str):
        self.pool = pool
        self.node = node
        self.lock = threading.Lock()
        self.unclaimed: collections.OrderedDict[str, ferry.Descriptor] = collections.OrderedDict()
        self.full_warned = False

    def put(self, mm_hash: str, tensor: torch.Tensor, stream) -> bool:
        """Publishes tensor under mm_hash, dropping the oldest unclaimed features while the
        pool is full. False if it does not fit even then."""
        with self.lock:
            if mm_hash in self.unclaimed:
                return True
            while True:
                try:
                    self.unclaimed[mm_hash] = self.pool.publish(tensor, stream=stream)
                    return True
                except ferry.TooLarge:  # never fits: nothing is dropped for it
                    break
                except ferry.PoolFull:
                    if not self.unclaimed:
                        break
                    _, oldest = self.unclaimed.popitem(last=False)
                    self.pool.cancel(oldest)
        if not self.full_warned:
            self.full_warned = True
            logger.warning("ferry: the encoder-cache pool has no room for %s (%.2f MiB); "
                           "not offered (raise ec_buffer_size)", mm_hash,
                           tensor.numel() * tensor.element_size() / (1 << 20))
        return False

    def unclaim(self, mm_hash: str, descriptor_hex: str) -> None:
        """A claim whose answer did not get out: the feature is offered again, oldest first."""
        with self.lock:
            if mm_hash not in self.unclaimed:
                self.unclaimed[mm_hash] = ferry.Descriptor(bytes.fromhex(descriptor_hex))
                self.unclaimed.move_to_end(mm_hash, last=False)

    def answer(self, request: Any) -> dict:
        if not isinstance(request, dict) or not isinstance(request.get("key"), str):
            return {"ok": False, "error": "a request is {\"op\": ..., \"key\": mm_hash}"}
        op, key = request.get("op"), request["key"]
        with self.lock:
            if op == "has":
                return {"ok": True, "has": key in self.unclaimed}
            if op == "claim":
                d = self.unclaimed.pop(key, None)
                if d is None:
                    return {"ok": True, "descriptor": None}
                return {"ok": True, "descriptor": bytes(d).hex(), "node": self.node,
                        "remote": self.pool.remote_address}
        return {"ok": False, "error": f"unknown op {op!r}"}


class _IndexHandler(socketserver.StreamRequestHandler):
    def setup(self) -> None:
        super().setup()
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle(self) -> None:
        index: _Index = self.server.index  # type: ignore[attr-defined]
        while True:
            line = self.rfile.readline(_LINE_MAX + 1)
            if not line:
                return
            if len(line) > _LINE_MAX or not line.endswith(b"\n"):
                self.wfile.write(b'{"ok": false, "error": "request too long"}\n')
                return
            try:
                request = json.loads(line)
            except (ValueError, RecursionError):  # too deeply nested is not JSON either
                answer = {"ok": False, "error": "not JSON"}
            else:
                answer = index.answer(request)
            try:
                self.wfile.write(json.dumps(answer).encode() + b"\n")
            except OSError:
                # The asker is gone: a feature it claimed goes back, else no one would read
                # it (a reply lost after it was sent cannot be told from one read).
                if answer.get("descriptor"):
                    index.unclaim(request["key"], answer["descriptor"])
                return


class _IndexServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _IndexClient:
    """A consumer scheduler's connection to the producer's index (one request at a time,
    reconnected after any failure)."""

    def __init__(self, host: str, port: int, timeout: float):
        self.address = (host, port)
        self.timeout = timeout
        self.lock = threading.Lock()
        self.sock: Optional[socket.socket] = None
        self.rfile = None

    def _close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = self.rfile = None

    def ask(self, op: str, key: str) -> dict:
        with self.lock:
            try:
                if self.sock is None:
                    self.sock = socket.create_connection(self.address, timeout=self.timeout)
                    self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.rfile = self.sock.makefile("rb")
                self.sock.sendall(json.dumps({"op": op, "key": key}).encode() + b"\n")
                line = self.rfile.readline(_LINE_MAX + 1)
                if not line.endswith(b"\n"):
                    raise ConnectionError("the index closed the connection")
                answer = json.loads(line)
                if not isinstance(answer, dict) or answer.get("ok") is not True:
                    raise ConnectionError(f"the index refused {op}: {answer!r}")
                return answer
            except (OSError, ValueError):
                self._close()
                raise


# ---- the connector --------------------------------------------------------------------------

@dataclass
class FerryLoad:
    """One feature a consumer's workers read: its mm_hash and where it is."""
    mm_hash: str
    descriptor: bytes
    node: str
    remote: Optional[str]


@dataclass
class FerryECConnectorMetadata(ECConnectorMetadata):
    loads: list[FerryLoad] = field(default_factory=list)


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return int(get_tensor_model_parallel_rank())
    except Exception:  # no parallel state (a single worker, tests): rank 0
        return 0


class FerryECConnector(ECConnectorBase):
    """vLLM's encoder-cache connector over a ferry pool (module docstring)."""

    def __init__(self, vllm_config: "VllmConfig", role: ECConnectorRole):
        super().__init__(vllm_config=vllm_config, role=role)
        cfg = vllm_config.ec_transfer_config
        extra = cfg.ec_connector_extra_config or {}
        self._index_address = (cfg.ec_ip, int(cfg.ec_port))
        self._size = int(cfg.ec_buffer_size)
        self._host_pool = (cfg.ec_buffer_device or "cuda") == "cpu"
        self._consumers = int(extra.get("consumers", 1))
        self._listen = extra.get("listen")
        self._backend = extra.get("backend", "auto")
        self._timeout = float(extra.get("timeout", 5.0))
        if self._consumers <= 0:
            raise ValueError("consumer_count must be positive")
        # producer worker
        self._pool: Optional[ferry.Pool] = None
        self._index: Optional[_Index] = None
        self._server: Optional[_IndexServer] = None
        # consumer scheduler
        self._client: Optional[_IndexClient] = None
        self._pending: dict[str, FerryLoad] = {}
        self._unavailable: set[str] = set()
        # consumer worker
        self._failed: set[str] = set()

    # ---- producer worker -----------------------------------------------------------------

    def _open_pool(self, tensor: torch.Tensor) -> _Index:
        device = -1 if self._host_pool or not tensor.is_cuda else tensor.device.index or 0
        pool = ferry.Pool(self._size, consumers=self._consumers, backend=self._backend,
                          device=device, on_full="raise", listen=self._listen)
        index = _Index(pool, node_id())
        try:
            server = _IndexServer(self._index_address, _IndexHandler)
        except OSError:
            pool.close()  # no index, no pool: the next save tries again
            raise
        server.index = index  # type: ignore[attr-defined]
        self._pool, self._index, self._server = pool, index, server
        threading.Thread(target=self._server.serve_forever, name="ferry-ec-index",
                         daemon=True).start()
        logger.info("ferry encoder-cache pool: %s, %d MiB, %d consumers, index at %s:%d%s",
                    self._pool.backend, self._size >> 20, self._consumers,
                    *self._server.server_address[:2],
                    f", serving other hosts at {self._listen}" if self._listen else "")
        return self._index

    @property
    def index_address(self) -> Optional[tuple[str, int]]:
        """Where the producer's index answers (its port when ec_port was 0)."""
        return self._server.server_address[:2] if self._server else None

    @property
    def pool(self) -> Optional[ferry.Pool]:
        return self._pool

    def save_caches(self, encoder_cache: dict[str, torch.Tensor], mm_hash: str,
                    **kwargs) -> None:
        """Publishes the encoder output of mm_hash (tensor-parallel rank 0 of the producer
        does; the others hold the same tensor)."""
        if not self.is_producer or _tp_rank() != 0:
            return
        tensor = encoder_cache[mm_hash].detach().contiguous()
        index = self._index or self._open_pool(tensor)
        stream = None
        if tensor.is_cuda and not self._host_pool:
            stream = current_stream(tensor.device.index)
        elif tensor.is_cuda:
            tensor = tensor.cpu()
        index.put(mm_hash, tensor, stream)

    def maybe_update_remote_cache_state(self, encoder_cache: dict[str, torch.Tensor]) -> None:
        return None

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._pool is not None:
            self._pool.close()

    # ---- consumer scheduler --------------------------------------------------------------

    def _index_client(self) -> _IndexClient:
        if self._client is None:
            self._client = _IndexClient(*self._index_address, self._timeout)
        return self._client

    def has_cache_item(self, identifier: str, request: "Request | None" = None) -> bool:
        if not self.is_consumer:
            return False
        if identifier in self._pending:
            return True
        try:
            return bool(self._index_client().ask("has", identifier).get("has"))
        except (OSError, ValueError) as e:
            logger.warning("ferry: the encoder-cache index at %s:%d did not answer (%s)",
                           *self._index_address, e)
            return False

    def update_state_after_alloc(self, request: "Request", index: int) -> None:
        """Claims the feature for this request's load: the producer keeps it until every
        rank of this instance read it."""
        if not self.is_consumer:
            return
        mm_hash = request.mm_features[index].identifier
        if mm_hash in self._pending:
            return
        request_id = getattr(request, "request_id", None)
        try:
            answer = self._index_client().ask("claim", mm_hash)
        except (OSError, ValueError) as e:
            logger.warning("ferry: could not claim %s from the encoder-cache index (%s)",
                           mm_hash, e)
            answer = {"descriptor": None}
        if answer.get("descriptor") is None:
            # Offered by has_cache_item and gone since (dropped for room, or the index
            # stopped answering): vLLM fails the request (take_unavailable_requests).
            if request_id is not None:
                self._unavailable.add(request_id)
            return
        try:
            load = FerryLoad(mm_hash, bytes.fromhex(answer["descriptor"]), str(answer["node"]),
                             answer.get("remote"))
            ferry.Descriptor(load.descriptor)  # checked before any worker relies on it
        except (KeyError, TypeError, ValueError) as e:
            logger.warning("ferry: the index answered %s with no valid descriptor (%s)",
                           mm_hash, e)
            return
        self._pending[mm_hash] = load

    def take_unavailable_requests(self) -> set[str]:
        """Requests whose claimed-for feature the producer no longer had (vLLM fails them;
        re-issued, they are encoded again)."""
        taken, self._unavailable = self._unavailable, set()
        return taken

    def build_connector_meta(self, scheduler_output: Any,
                             encoder_cache_manager: Any = None) -> ECConnectorMetadata:
        meta = FerryECConnectorMetadata(loads=list(self._pending.values()))
        self._pending.clear()
        return meta

    # ---- consumer worker -----------------------------------------------------------------

    def start_load_caches(self, encoder_cache: dict[str, torch.Tensor], **kwargs) -> None:
        """Reads each feature the scheduler claimed into encoder_cache (one already there is
        only acknowledged), as this worker's tensor-parallel rank, on the current stream."""
        meta = self._get_connector_metadata()
        self._failed = set()  # this step's (vLLM 0.34 never calls wait_for_load)
        if not isinstance(meta, FerryECConnectorMetadata):
            return
        rank = _tp_rank()
        gpu = torch.cuda.is_available()
        device = torch.cuda.current_device() if gpu else -1
        stream = current_stream(device) if gpu else None
        for load in meta.loads:
            d = ferry.Descriptor(load.descriptor)
            on_gpu = d.device >= 0
            where = {"node": load.node, "remote": load.remote, "rank": rank,
                     "device": device if on_gpu else None}
            hit = load.mm_hash in encoder_cache  # computed here meanwhile: released unread
            try:
                if hit:
                    _placement.ack(d, lease=True, **where)
                else:
                    t = _placement.receive(d, torch=True, stream=stream if on_gpu else None,
                                           **where)
                    # A host pool's copy is host memory: the encoder cache is the GPU's.
                    encoder_cache[load.mm_hash] = t.to(f"cuda:{device}") \
                        if gpu and t.device.type == "cpu" else t
            except (ferry.Error, RuntimeError, ValueError) as e:
                logger.warning("ferry: could not load the encoder output %s: %s",
                               load.mm_hash, e)
                self._failed.add(load.mm_hash)
                try:  # this rank's acknowledgement all the same: no slice is held for a rank
                    _placement.ack(d, lease=True, **where)  # that will never read it
                except (ferry.Error, RuntimeError, ValueError):
                    pass  # the producer is gone, or its pool serves no other host

    def wait_for_load(self) -> set[str]:
        """The features whose load failed (the reads completed in start_load_caches, in
        stream order on the GPU)."""
        failed, self._failed = self._failed, set()
        return failed
