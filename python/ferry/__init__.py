"""ferry: hand tensors between processes through one bounded, pre-allocated pool.

A producer owns a :class:`Pool`. It publishes tensors (any object with ``__dlpack__``:
numpy arrays, torch and cupy tensors) into leased slices of the pool and sends the small
:class:`Descriptor` that publish returns (picklable; 256 bytes) to its consumers over any
channel. Each consumer process calls :func:`receive` with its rank: it waits for the slice,
copies it (or views it in place with ``copy=False``) and acknowledges it. The producer
recycles a slice once every rank has acknowledged it.

Channels: or let ferry carry the descriptors too. Every pool has an :attr:`Pool.address` (a
short string); a consumer process connects to it with :func:`connect` (a :class:`Receiver`
for one rank), the producer calls :meth:`Pool.send` (one tensor or a list, to every rank or
to some), and the receiver gets each tensor from :meth:`Receiver.recv`, by iterating over it
until the producer closes the pool, or with ``await rx.arecv()`` in asyncio (its
:meth:`Receiver.fileno` works with select and selectors too)::

    pool = ferry.Pool("1GiB", consumers=8)        # producer
    pool.send(features)                           # to every rank (or ranks=)
    rx = ferry.connect(pool.address, rank=3)      # consumer, any process on this machine
    t = np.from_dlpack(rx.recv())

:meth:`Pool.drain` waits until every lease sent was acknowledged, and a ``with`` block of a
pool drains before it closes.

Backends: ``"host"`` (shared memory), ``"cuda_ipc"`` and ``"cuda_vmm"`` (GPU memory; copies
are enqueued on CUDA streams without host synchronisation). The CUDA driver is loaded at run
time: the package works without a GPU.

Errors: invalid arguments raise ``ValueError``; everything else derives from :class:`Error`
(:class:`PoolFull` and its :class:`TooLarge`, :class:`Stale`, :class:`ProducerGone`,
:class:`Timeout`, :class:`PoolFailed`, :class:`Closing`, :class:`RankInUse`,
:class:`Forked`). Messages are the library's; ``.status`` is the ferry status name.
"""

import asyncio as _asyncio
import contextlib as _contextlib
import logging as _logging
import re as _re
import sys as _sys
from typing import Any as _Any

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
    doctor,
    receive,
    receive_many,
    release_consumers,
    release_memory,
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
    "Receiver",
    "Reservation",
    "Stale",
    "Timeout",
    "TooLarge",
    "__version__",
    "ack",
    "connect",
    "doctor",
    "logger",
    "parse_size",
    "receive",
    "receive_many",
    "release_consumers",
    "release_memory",
    "split_budget",
    "version",
]

#: The library's log lines (warnings such as the once-per-pool "pool full", a consumer gone,
#: a pool failed) go to this logger; the extension installs the route at import
#: (``ferry_set_log``). Without a handler configured, Python prints warnings and errors on
#: stderr.
logger = _logging.getLogger("ferry")

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12}
_SIZE = _re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_size(size: "int | str") -> int:
    """Bytes of a size given as an int or a string: ``"256MiB"``, ``"1GiB"``, ``"512KiB"``,
    ``"1.5GB"``, ``"4096"`` (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; any case). Raises
    ``ValueError`` naming the value for any other string (signs, fractions of a byte, unknown
    units) and ``TypeError`` for other types; ints are returned as they are."""
    if isinstance(size, bool):
        raise TypeError(f"size must be an int or a string such as '256MiB', not {size!r}")
    if isinstance(size, int):
        return size  # the library says what is wrong with 0 or a negative one
    if not isinstance(size, str):
        raise TypeError(f"size must be an int or a string such as '256MiB', not "
                        f"{type(size).__name__}")
    m = _SIZE.fullmatch(size)
    unit = m and _UNITS.get(m.group(2).lower())
    if not m or unit is None:
        raise ValueError(f"invalid size {size!r} (a size such as 4096, '256MiB', '1GiB' or "
                         f"'1.5GB'; units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
    whole, _, frac = m.group(1).partition(".")
    scale = 10 ** len(frac)
    numerator = int(whole or "0") * scale + int(frac or "0")
    if numerator * unit % scale:
        raise ValueError(f"invalid size {size!r}: not a whole number of bytes")
    return numerator * unit // scale


def _size_text(n):
    """'256MiB' for a whole number of a binary unit, else the int."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return n


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


def _ml_dtypes_array(x):
    """Whether x is a numpy array of an ml_dtypes dtype (float8_*, bfloat16, ...), which
    numpy's __dlpack__ refuses: such arrays are published through a reservation."""
    numpy = _sys.modules.get("numpy")
    return (numpy is not None and isinstance(x, numpy.ndarray) and
            getattr(x.dtype.type, "__module__", "").startswith("ml_dtypes"))


class Pool(_ferry.Pool):
    """Pool(size, consumers, *, backend="auto", device=None, max_inflight=4096,
    reclaim_interval_us=1000, control="host", on_full="raise", timeout=None,
    vmm_handle="auto", channel_depth=64, drain_timeout=None, listen=None,
    remote_timeout=None)

    A producer's pool: ``size`` bytes (control table and data; an int or a string such as
    ``"256MiB"``, ``"1GiB"``, ``"1.5GB"``) read by ``consumers`` ranks.

    - ``backend``: ``"auto"``, ``"host"``, ``"cuda_ipc"`` or ``"cuda_vmm"``; ``device``: where
      the tensors are, a GPU ordinal or -1 for host memory (None: host memory for
      ``"auto"``, GPU 0 for a GPU backend). ``"auto"`` lets the library decide: a pool for a
      GPU is ``"cuda_ipc"`` where the machine supports it, else ``"host"`` with the reason
      logged; ``pool.backend`` says what it picked.
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
    - ``channel_depth``: descriptors each rank's ring holds for :meth:`send` (a power of
      two; a rank whose ring is full makes ``send`` follow ``on_full``, naming the rank
      behind). ``drain_timeout``: seconds :meth:`close` first waits for every published
      lease to be acknowledged (None: no wait, but 10 s at the end of a ``with`` block;
      0: never, not at the end of a ``with`` block either); see :meth:`drain`.
    - ``address``: the string consumers pass to :func:`connect` (valid after close too).
    - ``listen``: ``"HOST:PORT"`` (port 0: any free one) to serve consumers on other hosts
      too, over UCX (the site's, or pip's ``libucx-cu13``/``libucx-cu12``: ``pip install
      'ferry-tensors[ucx]'``); they connect to :attr:`remote_address`, which carries the
      pool's secret. ``remote_timeout``: seconds after which a silent remote consumer (its
      host or link gone) is released, and its receivers hear :class:`ProducerGone` when the
      producer falls silent (None: 5; at least 2).

    Closing: ``close(drain=None)`` drains first up to ``drain_timeout`` when one was given
    (``drain=True``: up to ``drain_timeout`` if one was given, else 10 s; ``drain=False``: not at all; or a
    number of seconds); a drain that runs out is logged on the ``"ferry"`` logger and the
    pool is closed anyway, and Ctrl-C closes at once. A ``with`` block that ends normally
    closes with ``drain=True``: the consumers read what was sent before the pool goes (a
    consumer that died is acknowledged for; one that is alive and does not read holds the
    exit up to ``drain_timeout``, else 10 s; ``drain_timeout=0`` makes the exit close at
    once, for pools whose leases nobody may read). A block that raised closes as ``close()``.
    The drain runs in Python's ``close`` in 50 ms slices (so that Ctrl-C works), not in the
    library's close (the config's ``drain_timeout_us`` is left 0).

    Invalid arguments raise ``ValueError`` with the library's message. A context manager:
    the pool closes on exit; ``close()`` is idempotent and the memory is freed when the
    object goes. While a buffer or DLPack tensor of one of its reservations is alive, a
    closed pool refuses every call (:class:`Closing`) and finishes its shutdown when the
    last of them is freed. In a forked child the pool refuses every call (:class:`Forked`);
    closing or collecting it there leaves the parent's pool alone.
    """

    def __init__(self, size: "int | str", consumers: int, **options: _Any) -> None:
        size = parse_size(size)
        if options.get("listen") is not None:
            _load_ucx()
        if options.get("device", 0) is None:
            del options["device"]  # where the backend puts a pool that names no device
        super().__init__(size, consumers, **options)
        self._size = size
        self._consumers = consumers

    @property
    def size(self) -> int:
        """The pool's size in bytes, as asked for (control table and data)."""
        return self._size

    @property
    def consumers(self) -> int:
        """The number of consumer ranks."""
        return self._consumers

    def __repr__(self) -> str:
        size = getattr(self, "_size", None)
        if size is None:  # __init__ did not run, or failed
            return "ferry.Pool(<not initialised>)"
        return (f"ferry.Pool(backend={self.backend!r}, size={_size_text(size)!r}, "
                f"consumers={self._consumers}, device={self.device}, "
                f"on_full={self.on_full!r}, closed={self.closed})")

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

    def _publish_bytes(self, x, timeout):
        """publish for numpy arrays of ml_dtypes dtypes (no DLPack export; the extension calls
        this when numpy refuses one): reserve, copy the bytes through the buffer protocol,
        commit. Host pools only."""
        if self.backend != "host":
            raise ValueError(f"a numpy array of dtype {x.dtype.name} can only be published "
                             f"into a host pool (numpy exports it to no device): use a "
                             f"torch tensor for {self.backend} pools")
        if not x.flags.c_contiguous:
            raise ValueError("the tensor is not C-contiguous")
        r = self.reserve(x.shape, x.dtype.name, timeout)
        if r is None:
            return None
        try:
            with memoryview(r) as view:
                view.cast("B")[:] = x.reshape(-1).view("uint8")
        except BaseException:
            r.cancel()
            raise
        r.commit()
        return r.descriptor


#: How often a waiting arecv looks at its ring without a wake-up of its fd (seconds).
_ARECV_RECHECK_S = 0.1


class Receiver(_ferry.Receiver):
    """Receiver(address, rank, device=None, *, torch=False): a consumer connected to the pool
    at ``address`` (:attr:`Pool.address`) as ``rank``; see :func:`connect`.

    - ``recv(timeout=None, copy=True, out=None, stream=None, torch=None)``: the next tensor
      sent to this rank, read as :func:`receive` reads one: a :class:`Received` copy
      (acknowledged at once), a read-only view with ``copy=False`` (acknowledged when
      freed), or ``out``; a list for a packed send (a list sent; ``out``: a list of
      tensors). ``timeout`` in seconds, None: forever (Ctrl-C ends it). Raises
      :class:`Timeout`, or :class:`ProducerGone` once the producer closed the pool or died.
      ``torch=True`` (default: the receiver's ``torch``) returns ``torch.from_dlpack`` of
      the result (torch tensors; ``out`` is returned as it is).
    - Iterating yields ``recv()`` results until the producer closes the pool;
      ``await rx.arecv(...)`` and ``async for`` do the same in asyncio, through
      :meth:`fileno` (one event-loop reader per receiver, shared by its waiting tasks).
    - ``fileno()`` for select/selectors: get it (or register the receiver) first, then
      ``recv(timeout=0)`` until :class:`Timeout` (which arms the fd), then wait for the fd;
      it may wake with nothing to receive. ``rank``, ``address``, ``device``, ``closed``;
      ``close()`` and the context manager disconnect.
    """

    def __init__(self, address: str, rank: int, device: "int | None" = None, *,
                 torch: bool = False) -> None:
        super().__init__(address, rank, device, torch=bool(torch))
        self._waiters = []

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return self.recv()
        except ProducerGone:
            raise StopIteration from None

    def _wake(self):
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def arecv(self, copy=True, out=None, stream=None, torch=None):
        """await arecv(copy=True, out=None, stream=None, torch=None): recv in asyncio. Tries
        ``recv(timeout=0)``; while nothing is there, waits for :meth:`fileno` to be
        readable (``loop.add_reader``) without blocking the loop. Raises
        :class:`ProducerGone` once the producer closed the pool or died."""
        loop = _asyncio.get_running_loop()
        fd = self.fileno()  # first: a recv that finds nothing arms the fd it has
        while True:
            try:
                return self.recv(0, copy, out, stream, torch)
            except Timeout:
                pass
            fut = loop.create_future()
            if not self._waiters:
                loop.add_reader(fd, self._wake)
            self._waiters.append(fut)
            # A safety net: the library may miss the fd's wake-up of a close that races the
            # recv arming it (the pool's close then goes unannounced); look again meanwhile.
            timer = loop.call_later(_ARECV_RECHECK_S, self._wake)
            try:
                await fut
            finally:
                timer.cancel()
                if fut in self._waiters:
                    self._waiters.remove(fut)
                if not self._waiters:
                    with _contextlib.suppress(Exception):
                        loop.remove_reader(fd)

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return await self.arecv()
        except ProducerGone:
            raise StopAsyncIteration from None

    def __repr__(self) -> str:
        if not self.address:
            return "ferry.Receiver(<not initialised>)"
        return (f"ferry.Receiver(address={self.address!r}, rank={self.rank}, "
                f"device={self.device}, closed={self.closed})")


def _load_ucx() -> None:
    """Loads pip's UCX (the ``libucx`` package of ``libucx-cu13``/``libucx-cu12``) when it is
    installed and FERRY_UCX_LIBRARY names none, so that the library finds it by its name;
    otherwise the library loads the system's ``libucp.so.0`` itself."""
    import os

    if os.environ.get("FERRY_UCX_LIBRARY"):
        return
    try:
        import libucx  # type: ignore[import-not-found]
    except ImportError:
        return
    libucx.load_library()


def connect(address: str, rank: int, device: "int | None" = None, *,
            torch: bool = False) -> Receiver:
    """connect(address, rank, device=None, *, torch=False) -> Receiver

    Connects to the pool at ``address`` (the producer's :attr:`Pool.address`, passed in a
    flag, an environment variable, a config or a pipe) as ``rank``: opens the pool and claims
    the rank for this process (:class:`RankInUse` if another live process holds it). Connect
    before or after the first send: what was sent to the rank waits in its ring.
    ``device``: the GPU the receiver's copies of a GPU pool's tensors go to (None: host
    pools only). ``torch=True``: ``recv`` returns torch tensors. Raises ``ValueError`` for a
    malformed address or a rank the pool does not have, :class:`ProducerGone` when nobody
    serves the address, :class:`Timeout` after 5 s.

    ``address`` may be a pool's :attr:`Pool.remote_address` (``"ferry+ucx://..."``), from
    any host: the receiver is admitted over TCP (:class:`Error` with status
    ``"PERMISSION"`` for a wrong secret) and reads over UCX; ``recv`` (copies, ``out=``), iteration, ``arecv`` and
    ``fileno`` work as for a local pool, zero-copy views (``copy=False``) do not (the pool
    is not mapped here). Start such receivers with the ``spawn`` start method: UCX does not
    survive ``fork``."""
    if isinstance(address, str) and address.startswith("ferry+ucx://"):
        _load_ucx()
    return Receiver(address, rank, device, torch=torch)
