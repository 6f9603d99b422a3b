"""Helper processes for the tests, started with the "spawn" context.

A consumer worker serves requests from the test process over a Pipe: each request names one
of the operations below (run in the worker, with ferry and numpy) and its arguments; the
answer is the operation's result, or the exception's class name, message and ferry status.
"""

import gc
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
    import os

    return os.getpid()


OPS = {
    name: fn
    for name, fn in globals().items()
    if callable(fn) and not name.startswith("_") and name not in ("serve", "produce_and_hang")
}


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
