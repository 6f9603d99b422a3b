"""GPU code paths of the package against ferry's fake CUDA driver (tests/fake_cuda in the
repository), which keeps "device" memory in host memory. Runs only in worker processes whose
FERRY_CUDA_DRIVER names the fake: the test process never loads a CUDA driver.

Without torch or cupy, DLPack tensors are made and read here with ctypes (test code only):
CudaLike presents a numpy array as CUDA memory, read_dlpack consumes any DLPack object the
way a framework would and returns what it saw.
"""

import ctypes
import gc
import os
import threading
import weakref

import numpy as np

import ferry


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]  # fmt: skip


_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
USED = {b"dltensor_versioned": b"used_dltensor_versioned", b"dltensor": b"used_dltensor"}


def managed_of(capsule):
    """(managed struct, capsule name) of an unconsumed capsule."""
    for name, cls in ((b"dltensor_versioned", DLManagedTensorVersioned),
                      (b"dltensor", DLManagedTensor)):  # fmt: skip
        if _api.PyCapsule_IsValid(capsule, name):
            return cls.from_address(_api.PyCapsule_GetPointer(capsule, name)), name
    raise TypeError("not a DLPack capsule")


def describe(managed):
    t = managed.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    nbytes = int(np.prod(shape, dtype=np.int64)) * t.dtype.bits * t.dtype.lanes // 8
    data = ctypes.string_at(t.data + t.byte_offset, nbytes) if nbytes else b""
    return {
        "device": (t.device.device_type, t.device.device_id),
        "dtype": (t.dtype.code, t.dtype.bits, t.dtype.lanes),
        "shape": shape,
        "strides": strides,
        "readonly": bool(getattr(managed, "flags", 0) & 1),
        "versioned": isinstance(managed, DLManagedTensorVersioned),
        "data": data,
    }


def read_dlpack(obj, **kwargs):
    """Consumes obj's tensor as a framework would: rename the capsule, read, call the deleter."""
    capsule = obj.__dlpack__(**kwargs)
    managed, name = managed_of(capsule)
    info = describe(managed)
    _api.PyCapsule_SetName(capsule, USED[name])
    if managed.deleter:
        DELETER(managed.deleter)(ctypes.addressof(managed))
    return info


def write_dlpack(obj, data):
    """Writes data into obj's (writable) tensor through a capsule it hands out."""
    capsule = obj.__dlpack__(max_version=(1, 0))
    managed, _ = managed_of(capsule)
    assert not managed.flags & 1
    ctypes.memmove(managed.dl_tensor.data, data, len(data))
    return (managed.dl_tensor.device.device_type, managed.dl_tensor.device.device_id)


class CudaLike:
    """A numpy array presented as CUDA memory of device 0 (the fake's memory is host memory);
    remembers the streams its producer protocol was asked for."""

    def __init__(self, array, device=0):
        self.array = np.array(array, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
        self.device = device
        self.streams = []

    def __dlpack_device__(self):
        return (2, self.device)

    def __dlpack__(self, stream=None, max_version=None):
        self.streams.append(stream)
        capsule = self.array.__dlpack__(max_version=max_version)
        managed, _ = managed_of(capsule)
        managed.dl_tensor.device.device_type = 2
        managed.dl_tensor.device.device_id = self.device
        return capsule


# ---- the fake driver itself (the library ferry loaded: FERRY_CUDA_DRIVER) -----------------

_DRIVER = []


def driver():
    """The fake driver (the same library ferry dlopened), with its control functions."""
    if not _DRIVER:
        lib = ctypes.CDLL(os.environ["FERRY_CUDA_DRIVER"])
        lib.ferry_fake_cuda_calls.restype = ctypes.c_ulong
        lib.ferry_fake_cuda_calls.argtypes = [ctypes.c_char_p]
        lib.ferry_fake_cuda_pool_bytes.restype = ctypes.c_ulonglong
        lib.ferry_fake_cuda_live_allocations.restype = ctypes.c_int
        _DRIVER.append(lib)
    return _DRIVER[0]


def calls(*names):
    """The fake driver's count of this process's calls of each entry point."""
    return {n: driver().ferry_fake_cuda_calls(n.encode()) for n in names}


def entry(name, *argtypes):
    """A driver entry point, as ferry resolves them (cuGetProcAddress_v2)."""
    fn = ctypes.c_void_p()
    status = ctypes.c_int()
    rc = driver().cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), 13000, 1,
                                      ctypes.byref(status))
    assert rc == 0 and fn.value, name
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(fn.value)


def use_device(device=0):
    """Makes device's primary context current on this thread, as a framework would (ferry
    may not have initialised the driver yet)."""
    assert entry("cuInit", ctypes.c_uint)(0) == 0
    ctx = ctypes.c_void_p()
    assert entry("cuDevicePrimaryCtxRetain", ctypes.c_void_p, ctypes.c_int)(
        ctypes.byref(ctx), device) == 0
    assert entry("cuCtxSetCurrent", ctypes.c_void_p)(ctx) == 0


def new_stream(device=0):
    """A non-blocking stream of the fake on device, as an int handle."""
    use_device(device)
    s = ctypes.c_void_p()
    assert entry("cuStreamCreate", ctypes.c_void_p, ctypes.c_uint)(ctypes.byref(s), 1) == 0
    return s.value


def sync_stream(handle, device=0):
    use_device(device)
    rc = entry("cuStreamSynchronize", ctypes.c_void_p)(handle)
    assert rc == 0, f"cuStreamSynchronize: {rc}"


# ---- operations for the worker processes (workers.serve adds them to its OPS) -------------

POOLS = {}
HELD = {}


def fake_make_pool(backend, size, consumers, **kwargs):
    pool = ferry.Pool(size, consumers, backend=backend, **kwargs)
    POOLS["pool"] = pool
    return pool.backend, pool.device


def fake_publish(arrays, cuda=False, many=False, **kwargs):
    """Publishes numpy arrays (as CudaLike with cuda): (descriptors, streams seen)."""
    pool = POOLS["pool"]
    sources = [CudaLike(a) if cuda else a for a in arrays]
    if many:
        ds = pool.publish_many(sources, **kwargs)
    else:
        ds = [pool.publish(s, **kwargs) for s in sources]
    streams = [s.streams if cuda else None for s in sources]
    del sources  # the pool keeps what it still copies
    gc.collect()
    return ds, streams


def fake_publish_streams(array, **kwargs):
    source = CudaLike(array)
    return POOLS["pool"].publish(source, **kwargs), source.streams


def fake_reserve(shape, dtype, data, **kwargs):
    res = POOLS["pool"].reserve(shape, dtype)
    device = write_dlpack(res, data)
    res.commit(**kwargs)
    return res.descriptor, device, res.__dlpack_device__()


def fake_send(arrays, cuda=False, **kwargs):
    """Pool.send of numpy arrays (as CudaLike with cuda); a list sends them packed. Returns
    the pool's address and the descriptors."""
    pool = POOLS["pool"]
    sources = [CudaLike(a) if cuda else a for a in arrays]
    ds = pool.send(sources if len(sources) > 1 else sources[0], **kwargs)
    del sources
    gc.collect()
    return pool.address, ds


def fake_channel_recv(address, rank, device=0, copy=True, out=False, **kwargs):
    """ferry.connect + recv: each tensor's bytes (a list for a packed lease)."""
    with ferry.connect(address, rank, device=device) as rx:
        if out:
            got = rx.recv(timeout=5, out=CudaLike(np.zeros(out[0], out[1]), device=device),
                          **kwargs)
            rx_items = [got]
        else:
            got = rx.recv(timeout=5, copy=copy, **kwargs)
            rx_items = got if isinstance(got, list) else [got]
        infos = []
        for r in rx_items:
            if isinstance(r, CudaLike):
                infos.append({"data": r.array.tobytes(), "shape": r.array.shape})
                continue
            r.synchronize()
            info = read_dlpack(r, max_version=(1, 0))
            infos.append({"data": info["data"], "shape": info["shape"],
                          "device": info["device"]})
        del got, rx_items
        gc.collect()
        return infos


def fake_stats():
    return POOLS["pool"].stats()


def fake_close():
    POOLS.pop("pool").close()


def fake_receive(d, rank, export=None, **kwargs):
    r = ferry.receive(d, rank=rank, **kwargs)
    r.synchronize()  # this "framework" reads on the host
    info = read_dlpack(r, **(export if export is not None else {"max_version": (1, 0)}))
    info["received_device"] = r.device
    return info


def fake_receive_many(ds, rank, **kwargs):
    rs = ferry.receive_many(ds, rank=rank, **kwargs)
    for r in rs:
        r.synchronize()
    return [read_dlpack(r, max_version=(1, 0)) for r in rs]


def fake_hold(key, d, rank, **kwargs):
    """Exports a view to a capsule that nobody consumes (kept in HELD): its destructor frees
    the view, as a framework's deleter would."""
    r = ferry.receive(d, rank=rank, copy=False, **kwargs)
    r.synchronize()
    capsule = r.__dlpack__(max_version=(1, 0))
    HELD[key] = capsule
    return describe(managed_of(capsule)[0])


def fake_receive_into(key, d, rank, device=0, **kwargs):
    """receive(out=) into a CudaLike of device, kept in HELD[key] (read it with fake_read_out
    once the lease is acknowledged: the acknowledgement follows the copy on the stream)."""
    out = CudaLike(np.zeros(d.shape, d.dtype), device=device)
    assert ferry.receive(d, rank=rank, out=out, **kwargs) is out
    HELD[key] = out
    return out.streams


def fake_read_out(key):
    out = HELD.pop(key)
    return out.array.tobytes(), out.array.shape


def fake_torch_publish(arrays, current_stream=0, **kwargs):
    """Publishes fake torch tensors (tests/faketorch.py, installed into this process first)
    with torch's current stream set to current_stream; kwargs go to the tensors. Returns the
    descriptors and the stream argument of each __dlpack__ call per tensor (none: the fast
    path took it)."""
    import faketorch

    faketorch.install()
    faketorch.CURRENT_STREAM[0] = current_stream
    tensors = [faketorch.make(a, **kwargs) for a in arrays]
    ds = [POOLS["pool"].publish(t) for t in tensors]
    return ds, [t.dlpack_streams for t in tensors]


def fake_torch_publish_elsewhere(array, current_device):
    """Publishes a fake torch tensor of device 0 through DLPack (on the legacy stream while
    torch's current stream is another: no fast path) while torch's current device is
    current_device: torch's current device at the export, and after the publish."""
    import faketorch

    faketorch.install()
    faketorch.CURRENT_STREAM[0] = 5
    faketorch.CURRENT_DEVICE[0] = current_device
    t = faketorch.make(array)
    try:
        POOLS["pool"].publish(t)
    finally:
        faketorch.CURRENT_STREAM[0] = 0
    return t.export_devices, faketorch.CURRENT_DEVICE[0]


def fake_torch_receive_into(d, rank):
    """receive(out=) into a fake torch tensor; its bytes once the lease is acknowledged, and
    the stream argument of each __dlpack__ call."""
    import faketorch

    faketorch.install()
    out = faketorch.make(np.zeros(d.shape, d.dtype))
    assert ferry.receive(d, rank=rank, out=out) is out
    HELD["torch_out"] = out
    return out.dlpack_streams


def fake_torch_read_out():
    return HELD.pop("torch_out").array.tobytes()


def fake_drop(key):
    del HELD[key]
    gc.collect()


def fake_receive_error(d, rank, **kwargs):
    try:
        ferry.receive(d, rank=rank, **kwargs)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, str(e)
    return None, ""


def fake_race_exports(ds, rank, exporters=2, synchronizers=2):
    """For each descriptor: receives a GPU copy on the legacy stream, then threads export it at
    once for another stream (each export waits for the copy's event, the GIL released) while
    others synchronize it. How many exports got the tensor each time: one, or its memory would
    be released twice."""
    wins = []
    for d in ds:
        r = ferry.receive(d, rank=rank)
        barrier = threading.Barrier(exporters + synchronizers)
        got = []

        def export():
            barrier.wait()
            try:
                got.append(read_dlpack(r, stream=2, max_version=(1, 0))["data"])
            except BufferError:
                pass

        def synchronize():
            barrier.wait()
            for _ in range(20):
                r.synchronize()

        threads = [threading.Thread(target=export) for _ in range(exporters)]
        threads += [threading.Thread(target=synchronize) for _ in range(synchronizers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        del r
        gc.collect()
        wins.append(len(got))
    return wins


ALLOC_CALLS = ("cuMemAlloc", "cuMemFree", "cuMemAllocFromPoolAsync", "cuMemFreeAsync",
               "cuStreamSynchronize", "cuEventSynchronize", "cuStreamWaitEvent")


def fake_receive_counts(ds, rank, export=True, **kwargs):
    """Receives copies of ds one after the other, reads each (exported to this "framework",
    or only synchronised), frees it: the bytes, the driver calls the whole run made, and the
    bytes the memory pools held after the second and after the last item."""
    before = calls(*ALLOC_CALLS)
    got, held = [], []
    for d in ds:
        r = ferry.receive(d, rank=rank, **kwargs)
        r.synchronize()
        got.append(read_dlpack(r, max_version=(1, 0))["data"] if export else bytes(0))
        del r
        held.append(driver().ferry_fake_cuda_pool_bytes())
    after = calls(*ALLOC_CALLS)
    return got, {k: after[k] - before[k] for k in ALLOC_CALLS}, held[1], held[-1]


def fake_release_memory(device=0):
    """ferry.release_memory: the bytes the pools held before and after (once the frees queued
    on the legacy stream ran)."""
    sync_stream(0)
    before = driver().ferry_fake_cuda_pool_bytes()
    ferry.release_memory(device)
    return before, driver().ferry_fake_cuda_pool_bytes()


def fake_receive_on_stream(d, rank):
    """A copy received on the legacy stream, exported for another stream of the fake: the bytes
    as read there, and the driver calls the export made."""
    s = new_stream()
    r = ferry.receive(d, rank=rank)
    before = calls(*ALLOC_CALLS)
    capsule = r.__dlpack__(stream=s, max_version=(1, 0))
    after = calls(*ALLOC_CALLS)
    sync_stream(s)
    managed, name = managed_of(capsule)
    info = describe(managed)
    _api.PyCapsule_SetName(capsule, USED[name])
    DELETER(managed.deleter)(ctypes.addressof(managed))  # freed on s
    del capsule, r
    frees = calls("cuMemFreeAsync")["cuMemFreeAsync"] - after["cuMemFreeAsync"]
    sync_stream(s)
    return info["data"], {k: after[k] - before[k] for k in ALLOC_CALLS}, frees


def fake_torch_receive(d, rank, current=None, recv_stream=None, host=False, many=False,
                       **kwargs):
    """ferry.receive(torch=True) (receive_many with many) with torch's current stream set to a
    stream of the fake (current="new") or the legacy one, and stream= a new one
    (recv_stream="new") or None: what torch.empty made, the tensors' types and bytes, and the
    stream waits the receive enqueued."""
    import faketorch

    faketorch.install()
    faketorch.EMPTIES.clear()
    device = None if host else 0
    faketorch.CURRENT_STREAM[0] = new_stream() if current == "new" else 0
    stream = new_stream() if recv_stream == "new" else None
    before = calls(*ALLOC_CALLS)
    call = ferry.receive_many if many else ferry.receive
    t = call(d, rank=rank, torch=True, stream=stream, **kwargs)
    after = calls(*ALLOC_CALLS)
    if not host:
        sync_stream(faketorch.CURRENT_STREAM[0])
    tensors = t if isinstance(t, list) else [t]
    return ([type(x).__name__ for x in tensors], [x.array.tobytes() for x in tensors],
            [x.device_index for x in tensors], list(faketorch.EMPTIES),
            {k: after[k] - before[k] for k in ALLOC_CALLS},
            faketorch.CURRENT_STREAM[0], device)


def fake_torch_receive_many(ds, rank, **kwargs):
    return fake_torch_receive(ds, rank, many=True, **kwargs)


def fake_torch_recv(address, rank, **kwargs):
    """connect(torch=True) + recv: the tensors' types and bytes, and what torch.empty made."""
    import faketorch

    faketorch.install()
    faketorch.EMPTIES.clear()
    faketorch.CURRENT_STREAM[0] = 0
    with ferry.connect(address, rank, device=0, torch=True) as rx:
        got = rx.recv(timeout=5, **kwargs)
        tensors = got if isinstance(got, list) else [got]
        sync_stream(0)
        return ([type(x).__name__ for x in tensors], [x.array.tobytes() for x in tensors],
                len(faketorch.EMPTIES))


def fake_pool_cycle(backend):
    """A GPU pool in a reference cycle through a source it still holds (a torch tensor of the
    fast path, kept until its copy ran): whether the collector freed it."""
    import faketorch

    faketorch.install()
    faketorch.CURRENT_STREAM[0] = 0
    pool = ferry.Pool(8 << 20, 1, backend=backend)
    pool.publish(faketorch.make(np.arange(4, dtype=np.int32)))  # teaches ferry the dtype
    source = faketorch.make(np.arange(4, dtype=np.int32))
    pool.publish(source)  # the fast path: the pool holds source itself until the copy ran
    source.pool = pool
    ref = weakref.ref(pool)
    del pool, source
    gc.collect()
    return ref() is None


OPS = {name: fn for name, fn in globals().items() if name.startswith("fake_")}
