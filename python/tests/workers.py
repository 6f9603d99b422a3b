"""Helper processes for the tests, started with the "spawn" context.

A consumer worker serves requests from the test process over a Pipe: each request names one
of the operations below (run in the worker, with ferry and numpy) and its arguments; the
answer is the operation's result, or the exception's class name, message and ferry status.
"""

import gc
import json
import os
import sys
import threading
import time

import numpy as np

import ferry

HELD = {}  # views kept alive across requests, by key


def receive_into(d, rank, shape=None, dtype=None, **kwargs):
    """ferry.receive(out=) into a new numpy array (shape and dtype: the descriptor's unless
    given); returns the array, or raises what receive raised."""
    out = np.empty(d.shape if shape is None else shape, dtype=d.dtype if dtype is None else dtype)
    got = ferry.receive(d, rank=rank, out=out, **kwargs)
    assert got is out
    return out


def receive_into_special(d, rank, kind):
    """receive(out=) into a read-only array ("readonly") or a strided view ("strided")."""
    if kind == "readonly":
        out = np.empty(d.shape, d.dtype)
        out.flags.writeable = False
    else:
        out = np.empty((d.shape[0], 2 * d.shape[1]), d.dtype)[:, ::2]
    return ferry.receive(d, rank=rank, out=out)


def receive_array(d, rank, **kwargs):
    """numpy.from_dlpack of a received tensor, and whether numpy may write it."""
    arr = np.from_dlpack(ferry.receive(d, rank=rank, **kwargs))
    return np.array(arr), arr.flags.writeable


def receive_arrays(ds, rank, **kwargs):
    return [np.array(np.from_dlpack(ferry.receive(d, rank=rank, **kwargs))) for d in ds]


def receive_many(ds, rank, **kwargs):
    return [np.array(np.from_dlpack(r)) for r in ferry.receive_many(ds, rank=rank, **kwargs)]


def receive_raw(d, rank, **kwargs):
    """A received tensor's metadata and bytes (dtypes numpy lacks, such as bfloat16)."""
    r = ferry.receive(d, rank=rank, **kwargs)
    return {"dtype": r.dtype, "shape": r.shape, "nbytes": r.nbytes, "data": bytes(r)}


def receive_timed(d, rank, **kwargs):
    """How a receive ends, and after how long: (exception name or None, message, seconds)."""
    start = time.monotonic()
    try:
        ferry.receive(d, rank=rank, **kwargs)
        return None, "", time.monotonic() - start
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, str(e), time.monotonic() - start


def ack(d, **kwargs):
    ferry.ack(d, **kwargs)


def delayed(seconds, op, *args, **kwargs):
    time.sleep(seconds)
    return OPS[op](*args, **kwargs)


def hold_view(key, d, rank):
    """Receives a view, keeps only numpy's array of it, drops every other reference (the
    Received and the consumer cache) and reports what numpy sees."""
    view = ferry.receive(d, rank=rank, copy=False)
    arr = np.from_dlpack(view)
    del view
    ferry.release_consumers()
    gc.collect()
    HELD[key] = arr
    try:
        arr[...] = 0
        write_error = None
    except ValueError as e:
        write_error = str(e)
    return np.array(arr), arr.flags.writeable, write_error


def read_held(key):
    return np.array(HELD[key])


def drop_held(key):
    del HELD[key]
    gc.collect()


# ---- GPU operations (torch), for test_gpu.py ----------------------------------------------


def _torch_stream(torch, device, side):
    return torch.cuda.Stream(device) if side else torch.cuda.current_stream(device)


def torch_receive(d, rank, device=None, copy=True, recv_side=False, use_side=False, into=False):
    """Receives into a torch CUDA tensor and runs kernels on it before letting it go.

    The receive is enqueued on a side stream (recv_side) or the current one; torch consumes
    the result on a side stream (use_side) or the current one. With into, the receive copies
    into a tensor torch allocated (out=; device= left to ferry to take from it). Returns what
    torch saw."""
    import torch

    dev = torch.device("cuda", d.device if device is None else device)
    with torch.cuda.device(dev):
        recv_stream = _torch_stream(torch, dev, recv_side)
        use_stream = recv_stream if recv_side == use_side else _torch_stream(torch, dev, use_side)
        if into:
            with torch.cuda.stream(recv_stream):
                out = torch.empty(d.shape, dtype=getattr(torch, d.dtype), device=dev)
            r = ferry.receive(d, rank=rank, out=out, stream=recv_stream)
            assert r is out
            readonly = False
            use_stream.wait_stream(recv_stream)  # out= is the caller's: it orders its streams
        else:
            r = ferry.receive(d, rank=rank, device=dev.index, copy=copy, stream=recv_stream)
            readonly = r.readonly
        with torch.cuda.stream(use_stream):
            t = r if into else torch.from_dlpack(r)  # passes use_stream to __dlpack__
            doubled = t.logical_not() if t.dtype == torch.bool else t * 2  # a kernel on the view
            value = t.clone()
        del t, r  # a view acknowledges here, after the kernels (stream-ordered)
        use_stream.synchronize()
        return {
            "device": str(value.device),
            "dtype": str(value.dtype),
            "shape": tuple(value.shape),
            "readonly": readonly,
            "value": value.cpu(),
            "doubled": doubled.cpu(),
        }


def torch_receive_many(ds, rank, device=None, copy=True):
    import torch

    dev = torch.device("cuda", ds[0].device if device is None else device)
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev)
        rs = ferry.receive_many(ds, rank=rank, device=dev.index, copy=copy, stream=stream)
        values = [torch.from_dlpack(r).clone() for r in rs]
        del rs
        stream.synchronize()
        return [v.cpu() for v in values]


def torch_receive_into_error(d, rank, shape, dtype):
    """How receive(out=) refuses a torch tensor of shape and dtype: (class name, message)."""
    import torch

    out = torch.empty(shape, dtype=getattr(torch, dtype), device=torch.device("cuda", d.device))
    try:
        ferry.receive(d, rank=rank, out=out)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, str(e)
    return None, ""


def pool_error(backend):
    """How creating a pool of backend fails here: (class name, message, status)."""
    try:
        ferry.Pool(1 << 20, 1, backend=backend).close()
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, str(e), getattr(e, "status", None)
    return None, "", None


def pid():
    return os.getpid()


def ack_on_behalf(cached, d, **kwargs):
    """Receives cached (so that this process has a consumer of its rank), then acknowledges d
    for other ranks with ferry.ack."""
    ferry.receive(cached, rank=0)
    ferry.ack(d, **kwargs)


def receive_parts(ds, rank, indices, **kwargs):
    """Receives the parts ds[i] for i in indices one by one: their values."""
    return [np.array(np.from_dlpack(ferry.receive(ds[i], rank=rank, **kwargs))) for i in indices]


def hold_many(key, ds, rank):
    """receive_many views, kept as numpy arrays in HELD[key] (drop_part frees one)."""
    HELD[key] = [np.from_dlpack(r) for r in ferry.receive_many(ds, rank=rank, copy=False)]
    gc.collect()
    return [np.array(a) for a in HELD[key]]


def drop_part(key, index):
    HELD[key][index] = None
    gc.collect()


def _outcome(fn):
    try:
        return ["ok", fn()]
    except Exception as e:  # noqa: BLE001 - reported to the test
        return [type(e).__name__, getattr(e, "status", None), str(e)]


def fork_and_receive(d_cached, d_claimed, d_fresh, rank):
    """Receives d_cached as rank here (a cached consumer, the rank claimed) and makes a pool of
    this process's own, then forks. The child receives d_fresh (another pool) and d_claimed (a
    lease of d_cached's pool, whose rank this process holds) as rank, publishes to the
    inherited pool, drops it and exits. Returns what the child saw, and whether the pool still
    works here afterwards."""
    ferry.receive(d_cached, rank=rank)
    own = ferry.Pool(1 << 20, 1)
    kept = own.publish(np.arange(5))
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # only os._exit leaves the child
        seen = {
            "fresh": _outcome(lambda: np.from_dlpack(ferry.receive(d_fresh, rank=rank)).tolist()),
            "claimed": _outcome(lambda: ferry.receive(d_claimed, rank=rank) and None),
            "publish": _outcome(lambda: own.publish(np.arange(3)) and None),
        }
        del own
        gc.collect()
        os.write(write, json.dumps(seen).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child_saw = json.loads(f.read())
    _, status = os.waitpid(child, 0)
    after = np.from_dlpack(ferry.receive(own.publish(np.arange(7)), rank=0)).tolist()
    first = np.from_dlpack(ferry.receive(kept, rank=0)).tolist()
    own.close()
    return {"child": child_saw, "status": status, "after": after, "first": first}


OPS = {
    name: fn
    for name, fn in globals().items()
    if callable(fn) and not name.startswith("_") and name not in ("serve", "produce_and_hang")
}


# ---- run alone in a fresh interpreter (conftest.isolated), for what may crash it ------------


def export_outlives_close(kind):
    """Exports a reservation (kind: "buffer" or "dlpack"), closes and drops the pool, then
    writes through the export: the pool's memory must still be mapped. What it saw."""
    pool = ferry.Pool(1 << 20, 1)
    r = pool.reserve((1024,), "uint8")
    export = memoryview(r) if kind == "buffer" else np.from_dlpack(r)
    pool.close()
    seen = {"closed": pool.closed}
    for name, call in (("export", lambda: memoryview(r)), ("dlpack", lambda: r.__dlpack__()),
                       ("publish", lambda: pool.publish(np.zeros(4))),
                       ("commit", r.commit)):  # fmt: skip
        try:
            call()
            seen[name] = None
        except Exception as e:  # noqa: BLE001 - reported to the test
            seen[name] = [type(e).__name__, str(e)]
    del r, pool
    gc.collect()
    np.frombuffer(export, np.uint8)[:] = 7  # after the close: still the pool's mapping
    seen["sum"] = int(np.frombuffer(export, np.uint8).sum())
    del export  # the last export: the close completes here
    gc.collect()
    return seen


def lists_changed_meanwhile():
    """receive_many and publish_many given lists that change while they run (another thread
    during a wait; a source's __dlpack__): they must use what they were given. Run under
    PYTHONMALLOC=debug, which poisons freed memory."""
    pool = ferry.Pool(1 << 20, 1)
    r = pool.reserve((4,), "float32")
    np.from_dlpack(r)[:] = np.arange(4)
    wire = bytes(r.descriptor)
    ds = [ferry.Descriptor.from_bytes(wire) for _ in range(2)]  # the list's own objects

    def change_then_commit():
        time.sleep(0.2)  # receive_many waits for the lease meanwhile
        ds.clear()
        junk = [ferry.Descriptor.from_bytes(wire) for _ in range(100)]  # reuses the memory
        del junk
        r.commit()

    thread = threading.Thread(target=change_then_commit)
    thread.start()
    got = ferry.receive_many(ds, rank=0, timeout=10)
    thread.join()
    seen = {"received": [[g.descriptor.slot, np.from_dlpack(g).tolist()] for g in got]}

    class Clears:  # a source whose __dlpack__ empties the list being published
        def __init__(self, target):
            self.target = target

        def __dlpack__(self, **kwargs):
            self.target.clear()
            return np.arange(3.0).__dlpack__(**kwargs)

    xs = [None, np.arange(2), np.arange(4)]
    xs[0] = Clears(xs)
    descs = ferry._ferry.Pool.publish_many(pool, xs)  # the list as given, no copy in between
    seen["published"] = [d.shape for d in descs]
    pool.close()
    return seen



def serve(conn, env=None):
    """The worker's loop: (op, args, kwargs) in, ("ok", result) or ("err", ...) out. env is
    set first (e.g. FERRY_CUDA_DRIVER: read when the driver is first needed)."""
    import os

    os.environ.update(env or {})
    if env and "FERRY_CUDA_DRIVER" in env:
        import fakecuda

        OPS.update(fakecuda.OPS)
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        op, args, kwargs = request
        try:
            conn.send(("ok", OPS[op](*args, **kwargs)))
        except Exception as e:  # noqa: BLE001 - sent back to the test
            conn.send(("err", type(e).__name__, str(e), getattr(e, "status", None)))


def produce_and_hang(queue, size):
    """A producer that reserves a lease, never commits it, sends its descriptor and waits to be
    killed."""
    pool = ferry.Pool(size, 1, backend="host")
    reservation = pool.reserve((4,), "float32")
    queue.put(bytes(reservation.descriptor))
    time.sleep(600)


def interruptible(op, wire=None):
    """A call that blocks (op: a receive of the lease wire names, never committed yet, waiting
    forever; or a publish or reserve waiting for space in a full pool of this process's own),
    for the test to interrupt with SIGINT. Talks over stdout/stdin: "blocking" before the
    call, "interrupted" once KeyboardInterrupt came out of it, then after the test's "go" the
    call again (the lease committed meanwhile; for a pool, the space freed) and its result."""
    forever = float("inf")
    if wire is not None:
        d = ferry.Descriptor.from_bytes(bytes.fromhex(wire))
        calls = {
            "receive": lambda t: np.from_dlpack(ferry.receive(d, rank=0, timeout=t)).tolist(),
            "receive_many": lambda t: [np.from_dlpack(r).tolist()
                                       for r in ferry.receive_many([d], rank=0, timeout=t)],
            "receive_out": lambda t: ferry.receive(d, rank=0, timeout=t,
                                                   out=np.zeros(d.shape, d.dtype)).tolist(),
        }  # fmt: skip
    else:
        pool = ferry.Pool(256 + 4096, 1, max_inflight=8, on_full="wait", timeout=forever)
        first = pool.publish(np.zeros(1024, np.float32))  # the pool is full from here
        block = np.ones(1024, np.float32)
        calls = {
            "publish": lambda t: pool.publish(block, timeout=t).shape,
            "publish_many": lambda t: [x.shape for x in pool.publish_many([block], timeout=t)],
            "reserve": lambda t: pool.reserve((1024,), "float32", timeout=t).shape,
        }
    print("blocking", flush=True)
    try:
        calls[op](forever)
        print("returned", flush=True)
        return
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    if wire is None:  # nothing leased by the interrupted call; the pool works on
        stats = pool.stats()
        print("stats", stats["leases_in_flight"], stats["publishes"], flush=True)
        pool.cancel(first)
    sys.stdin.readline()  # "go"
    print("again", calls[op](5.0), flush=True)
