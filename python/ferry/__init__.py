"""ferry: hand tensors between processes through one bounded, pre-allocated pool.

A producer owns a :class:`Pool`. It publishes tensors (any object with ``__dlpack__``:
numpy arrays, torch and cupy tensors) into leased slices of the pool and sends the small
:class:`Descriptor` that publish returns (picklable; 256 bytes) to its consumers over any
channel. Each consumer process calls :func:`receive` with its rank: it waits for the slice,
copies it (or views it in place with ``copy=False``) and acknowledges it. The producer
recycles a slice once every rank has acknowledged it.

Backends: ``"host"`` (shared memory), ``"cuda_ipc"`` and ``"cuda_vmm"`` (GPU memory; copies
are enqueued on CUDA streams without host synchronisation). The CUDA driver is loaded at run
time: the package works without a GPU.

Errors: invalid arguments raise ``ValueError``; everything else derives from :class:`Error`
(:class:`PoolFull` and its :class:`TooLarge`, :class:`Stale`, :class:`ProducerGone`,
:class:`Timeout`, :class:`PoolFailed`, :class:`Closing`, :class:`RankInUse`,
:class:`Forked`). Messages are the library's; ``.status`` is the ferry status name.
"""

import contextlib
import sys

from . import _ferry
from ._ferry import (
    Closing,
    Descriptor,
    Error,
    Forked,
    PoolFailed,
    PoolFull,
    ProducerGone,
    RankInUse,
    Received,
    Reservation,
    Stale,
    Timeout,
    TooLarge,
    ack,
    receive,
    receive_many,
    release_consumers,
    split_budget,
    version,
)

__version__ = _ferry.version()

__all__ = [
    "Closing",
    "Descriptor",
    "Error",
    "Forked",
    "Pool",
    "PoolFailed",
    "PoolFull",
    "ProducerGone",
    "RankInUse",
    "Received",
    "Reservation",
    "Stale",
    "Timeout",
    "TooLarge",
    "ack",
    "receive",
    "receive_many",
    "release_consumers",
    "split_budget",
    "version",
]


def _dtype_name(dtype):
    """ferry's name of a dtype given as a name, a numpy dtype or type, or a torch dtype."""
    if isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):  # torch.float32, torch.bfloat16, torch.bool
        return text[len("torch.") :]
    try:
        import numpy
    except ImportError:
        return text
    try:
        return numpy.dtype(dtype).name
    except TypeError:
        return text


_AS_IS = contextlib.nullcontext()


def _exporting(*tensors):
    """The context in which the tensors' producer agrees to export them: torch exports a CUDA
    tensor only while its device is torch's current device. (torch's C getters: this runs at
    every publish.)"""
    torch = sys.modules.get("torch")
    if torch is None:
        return _AS_IS
    current = None
    for x in tensors:
        if isinstance(x, torch.Tensor) and x.is_cuda:
            if current is None:
                current = torch.cuda.current_device()
            if x.get_device() != current:
                return torch.cuda.device(x.device)
    return _AS_IS


class Pool(_ferry.Pool):
    """Pool(size, consumers, *, backend="auto", device=0, max_inflight=4096,
    reclaim_interval_us=1000, control="host", on_full="raise", timeout=None,
    vmm_handle="auto")

    A producer's pool: ``size`` bytes (control table and data) read by ``consumers`` ranks.

    - ``backend``: ``"auto"`` (host unless a GPU backend is asked for), ``"host"``,
      ``"cuda_ipc"`` or ``"cuda_vmm"``; ``device`` is the GPU of a GPU pool.
    - ``max_inflight``: rows of the control table (leases in flight at most);
      ``reclaim_interval_us``: period of the background reclaimer.
    - ``control``: where a GPU pool keeps its control words, ``"host"`` (faster) or
      ``"device"``; ``vmm_handle``: ``"auto"``, ``"fabric"`` or ``"posix_fd"`` (CUDA VMM).
    - ``on_full``: what publish and reserve do when the pool has no room: ``"raise"``
      (:class:`PoolFull`), ``"none"`` (return None) or ``"wait"`` (wait up to ``timeout``
      seconds, default 10, then raise :class:`PoolFull`). A ``timeout`` given to a call
      overrides the pool's wait under every policy. A tensor larger than the pool can ever
      hold is never waited for: None under ``"none"``, else :class:`TooLarge` (a
      :class:`PoolFull`). Waits end with ``KeyboardInterrupt`` on Ctrl-C.

    Invalid arguments raise ``ValueError`` with the library's message. A context manager:
    the pool closes on exit; ``close()`` is idempotent and the memory is freed when the
    object goes. While a buffer or DLPack tensor of one of its reservations is alive, a
    closed pool refuses every call (:class:`Closing`) and finishes its shutdown when the
    last of them is freed. In a forked child the pool refuses every call (:class:`Forked`);
    closing or collecting it there leaves the parent's pool alone.
    """

    def __repr__(self):
        state = ", closed" if self.closed else ""
        return (f"ferry.Pool(backend={self.backend!r}, device={self.device}, "
                f"on_full={self.on_full!r}{state})")

    def publish(self, x, stream=None, timeout=None):
        with _exporting(x):
            return super().publish(x, stream, timeout)
    publish.__doc__ = _ferry.Pool.publish.__doc__

    def publish_many(self, tensors, stream=None, timeout=None):
        tensors = list(tensors)
        with _exporting(*tensors):
            return super().publish_many(tensors, stream, timeout)
    publish_many.__doc__ = _ferry.Pool.publish_many.__doc__

    def reserve(self, shape, dtype, timeout=None):
        """reserve(shape, dtype, timeout=None) -> Reservation | None

        Leases a writable slice for one C-contiguous tensor without publishing it: write it
        through the Reservation's ``__dlpack__`` (or ``memoryview`` on host pools), then call
        its ``commit()``; or ``with pool.reserve(...) as r:``, which commits when the block
        ends normally and cancels when it raises. ``dtype`` is a name ("float32",
        "bfloat16", ...), a numpy dtype or a torch dtype. The descriptor (``.descriptor``)
        may be sent before the commit: consumers wait for it. A reservation collected
        without a commit is cancelled.
        """
        return super().reserve(shape, _dtype_name(dtype), timeout)
