"""Hand-over benchmark: ferry against what a Python server would use otherwise.

    python -m ferry.bench [--sizes 4KiB,1MiB,16MiB,64MiB] [--consumers 1,4]
                          [--producer-device 0] [--consumer-device 1] [--iterations 50]
                          [--methods channel,ferry,ferry_channel,torch_mp,torch_ipc,cpu_pickle]
                          [--channel pipe|spin] [--plot FILE] [--json FILE]

For every method, item size and consumer count it measures the round trip of one tensor:
the producer holds a CUDA tensor, hands it to N consumer processes, and each consumer ends up
with its own copy on its GPU (synchronised) and says so; the round trip ends when the last
consumer has. Methods:

  ferry       pool.publish on the producer's stream, the 256-byte descriptor through the
              channel, then in the consumer torch.empty (torch's allocator) and
              ferry.receive(out=...) on the consumer's stream (copy, then acknowledgement)
  ferry_view  the same with ferry.receive(copy=False): a zero-copy view, torch.from_dlpack,
              a private clone, then the view is dropped (which acknowledges)
  ferry_channel  no channel of the bench's for the items: pool.send(tensor) on the producer's
              stream queues the descriptor in every rank's ring inside the pool, and each
              consumer (ferry.connect(pool.address, rank=i, device=...)) takes it with
              rx.recv(out=preallocated) on its stream (copy, then acknowledgement); the
              producer learns that every consumer has its copy from pool.drain() (the
              acknowledgements the consumers' streams write), not from a reply
  torch_mp    a torch.multiprocessing queue per consumer carrying the CUDA tensor (CUDA IPC
              under the hood), then a private clone on the consumer's GPU
  torch_ipc   torch.multiprocessing's CUDA IPC pickling of the tensor (what its queues
              send), through the bench's channel instead of a queue
  cpu_pickle  tensor.cpu(), pickled through the channel, rebuilt on the consumer's GPU
  channel     no tensor: the channel's round trip alone, the floor every method above pays

Channels (--channel): "pipe", a multiprocessing Pipe per consumer (the processes sleep in
read() between messages); "spin", a shared-memory mailbox per consumer and direction that the
reader polls without sleeping, as vLLM's shared-memory message queue and SGLang's
non-blocking ZMQ polling loops do (messages over 64 KiB still go through the pipe). Every
method uses the same spawned processes and the same channel for items and for the "done"
replies, except torch_mp, whose items go through its queue. Warm-up items and one item after
the timed ones are verified in every consumer (a checksum computed on the GPU against the
producer's). `--cpu` runs ferry against pickle with NumPy arrays over a host pool, for
machines without a GPU.
"""

import argparse
import json
import struct
import multiprocessing as mp
from multiprocessing import shared_memory
import os
import pickle
import statistics
import sys
import time

UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
         "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3}


def parse_size(text):
    t = text.strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    if unit not in UNITS or not num:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    return int(float(num) * UNITS[unit])


def human(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


# ---- channels ------------------------------------------------------------------------------

class PipeChannel:
    """One end of a multiprocessing Pipe (raw bytes)."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, data):
        self.conn.send_bytes(data)

    def recv(self, timeout=None):
        if timeout is not None and not self.conn.poll(timeout):
            raise TimeoutError(f"no message within {timeout} s")
        return self.conn.recv_bytes()


class SpinChannel:
    """One end of a pair of shared-memory mailboxes (one per direction) over a Pipe: a message
    up to INLINE bytes is written after its length and published by bumping a sequence
    number, which the reader polls (releasing the GIL between looks); longer ones are
    announced there and sent through the pipe.
    Request/reply use only (each side sends once, then waits for the other), on x86 (stores
    are seen in program order)."""

    INLINE = 64 << 10
    WORD = struct.Struct("<Q")  # at 0 the sequence number, at 8 the length (BIG: in the pipe)
    BIG = (1 << 64) - 1
    BOX = 64 + INLINE

    def __init__(self, conn, name, side):
        self.conn = conn
        self.shm = shared_memory.SharedMemory(name=name)
        self.buf = self.shm.buf
        self.out = side * self.BOX
        self.inp = (1 - side) * self.BOX
        self.sent = self.seen = 0

    @classmethod
    def create(cls):
        shm = shared_memory.SharedMemory(create=True, size=2 * cls.BOX)
        shm.buf[:] = bytes(2 * cls.BOX)
        return shm

    def send(self, data):
        n = len(data)
        if n <= self.INLINE:
            self.buf[self.out + 64:self.out + 64 + n] = data
        self.sent += 1
        # The length, then the sequence number: one aligned 8-byte store each, in this order.
        self.WORD.pack_into(self.buf, self.out + 8, n if n <= self.INLINE else self.BIG)
        self.WORD.pack_into(self.buf, self.out, self.sent)
        if n > self.INLINE:
            self.conn.send_bytes(data)

    def recv(self, timeout=None):
        head, buf, at = self.WORD, self.buf, self.inp
        want = self.seen + 1
        deadline = None if timeout is None else time.monotonic() + timeout
        spins = 0
        while head.unpack_from(buf, at)[0] != want:
            # sched_yield lets the process's other threads have the GIL (torch.multiprocessing
            # queues write from a feeder thread) without giving up the CPU for long.
            os.sched_yield()
            spins += 1
            if deadline is not None and spins % 4096 == 0 and time.monotonic() > deadline:
                raise TimeoutError(f"no message within {timeout} s")
        self.seen = want
        n = head.unpack_from(buf, at + 8)[0]
        if n == self.BIG:
            return self.conn.recv_bytes()
        return bytes(buf[at + 64:at + 64 + n])

    def close(self):
        self.buf = None
        self.shm.close()


def _channel(kind, conn, name, side):
    return SpinChannel(conn, name, side) if kind == "spin" else PipeChannel(conn)


# ---- consumer processes -------------------------------------------------------------------

def _checksum_torch(t):
    import torch
    # A cheap, order-sensitive reduction computed on the GPU.
    v = t.view(torch.uint8).to(torch.int64)
    w = torch.arange(1, v.numel() + 1, device=v.device, dtype=torch.int64) % 251
    return int((v * w).sum().item())


def _checksum_numpy(a):
    import numpy as np
    v = a.view(np.uint8).astype(np.int64)
    w = (np.arange(1, v.size + 1, dtype=np.int64) % 251)
    return int((v * w).sum())


NO_CHECK = -1
HEADER = struct.Struct("<q")  # the expected checksum (NO_CHECK: do not verify)


def _consume_cpu(method, rank, payload):
    import numpy as np
    import ferry
    if method == "ferry":
        return np.from_dlpack(ferry.receive(ferry.Descriptor.from_bytes(payload), rank=rank,
                                            copy=True))
    return pickle.loads(payload)


def _consume_gpu(method, rank, device, payload, stream, target):
    import torch
    import ferry
    with torch.cuda.stream(stream):
        if method == "ferry":
            d = ferry.Descriptor.from_bytes(payload)
            got = torch.empty(d.shape, dtype=getattr(torch, d.dtype), device=target)
            ferry.receive(d, rank=rank, out=got, stream=stream.cuda_stream)
        elif method == "ferry_view":
            view = ferry.receive(ferry.Descriptor.from_bytes(payload), rank=rank, device=device,
                                 copy=False, stream=stream.cuda_stream)
            shared = torch.from_dlpack(view)
            got = shared.clone()
            del shared, view  # the lease is acknowledged on the stream, after the clone
        elif method == "torch_mp":
            got = payload.to(target, copy=True)
        elif method == "torch_ipc":
            got = pickle.loads(payload).to(target, copy=True)
        else:
            got = torch.from_numpy(pickle.loads(payload)).to(target)
        stream.synchronize()
    return got


def _consume_channel(rank, device, chan, cpu, plan):
    """ferry_channel: plan["items"] items from the pool's ring into one preallocated tensor;
    for the verified ones the expected checksum follows through the channel (untimed)."""
    import ferry
    rx = ferry.connect(plan["address"], rank, device=None if cpu else device)
    if cpu:
        import numpy as np
        out = np.empty(plan["size"], np.uint8)
    else:
        import torch
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device=device)
        out = torch.empty(plan["size"], dtype=torch.uint8, device=torch.device("cuda", device))
    chan.send(b"")
    for i in range(plan["items"]):
        if cpu:
            rx.recv(out=out)
        else:  # the copy and the acknowledgement are enqueued on the stream
            with torch.cuda.stream(stream):
                rx.recv(out=out, stream=stream.cuda_stream)
        if i in plan["verified"]:  # untimed: the producer waits for this reply
            if not cpu:
                stream.synchronize()
            (expected,) = HEADER.unpack(chan.recv())
            ok = expected == (_checksum_numpy(out) if cpu else _checksum_torch(out))
            chan.send(b"" if ok else b"checksum mismatch")
    rx.close()


def _consumer(method, rank, device, conn, queue, cpu, channel, name, plan=None):
    """Receives items until an empty message; replies b"" (done) or an error text."""
    chan = _channel(channel, conn, name, 1)
    try:
        if method == "ferry_channel":
            _consume_channel(rank, device, chan, cpu, plan)
            return
        if not cpu:
            import torch
            if method == "torch_ipc":
                import torch.multiprocessing  # noqa: F401 - registers the CUDA rebuilders
            torch.cuda.set_device(device)
            stream = torch.cuda.Stream(device=device)
            target = torch.device("cuda", device)
        chan.send(b"")
        while True:
            if method == "torch_mp":
                item = queue.get()
                if item is None:
                    break
                payload, expected = item
            else:
                raw = chan.recv()
                if not raw:
                    break
                (expected,), payload = HEADER.unpack_from(raw), raw[HEADER.size:]
            if method == "channel":
                chan.send(b"")
                continue
            if cpu:
                got = _consume_cpu(method, rank, payload)
                ok = expected == NO_CHECK or _checksum_numpy(got) == expected
            else:
                got = _consume_gpu(method, rank, device, payload, stream, target)
                ok = expected == NO_CHECK or _checksum_torch(got) == expected
            del got
            chan.send(b"" if ok else b"checksum mismatch")
    except Exception as e:  # reported to the producer, which fails the run
        chan.send(f"{type(e).__name__}: {e}".encode() or b"error")
    finally:
        if channel == "spin":
            chan.close()


# ---- producer -----------------------------------------------------------------------------

class Run:
    def __init__(self, args, method, consumers, cpu, plan=None):
        ctx = mp.get_context("spawn")
        if method == "torch_mp" and not cpu:
            import torch.multiprocessing as tmp
            ctx = tmp.get_context("spawn")
        self.method = method
        self.chans, self.queues, self.procs, self.shms = [], [], [], []
        for r in range(consumers):
            parent, child = ctx.Pipe()
            q = ctx.Queue() if method == "torch_mp" else None
            shm = SpinChannel.create() if args.channel == "spin" else None
            name = shm.name if shm else None
            dev = args.consumer_device
            p = ctx.Process(target=_consumer, daemon=True,
                            args=(method, r, dev, child, q, cpu, args.channel, name, plan))
            p.start()
            self.chans.append(_channel(args.channel, parent, name, 0))
            self.queues.append(q)
            self.procs.append(p)
            self.shms.append(shm)
        for c in self.chans:
            self._expect(c)

    def _expect(self, chan, timeout=120):
        err = chan.recv(timeout)
        if err:
            raise RuntimeError(f"consumer: {err.decode()}")

    def send(self, payload, expected):
        if self.method == "ferry_channel":  # the item went through the pool's rings
            if expected != NO_CHECK:
                for c in self.chans:
                    c.send(HEADER.pack(expected))
            return
        if self.method == "torch_mp":
            for q in self.queues:
                q.put((payload, expected))
            return
        raw = HEADER.pack(expected) + payload
        for c in self.chans:
            c.send(raw)

    def wait(self):
        for c in self.chans:
            self._expect(c)

    def close(self):
        for i, c in enumerate(self.chans):
            try:
                if self.method == "torch_mp":
                    self.queues[i].put(None)
                else:
                    c.send(b"")
            except Exception:
                pass
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        for c, shm in zip(self.chans, self.shms):
            if shm is not None:
                c.close()
                shm.close()
                shm.unlink()


def _publish(method, pool, tensor, cpu, stream):
    if method in ("ferry", "ferry_view"):
        d = pool.publish(tensor, stream=stream)
        if d is None:
            raise RuntimeError("pool full")
        return bytes(d)
    if method == "ferry_channel":
        if pool.send(tensor, stream=stream) is None:
            raise RuntimeError("pool full")
        return b""
    if method == "torch_mp":
        return tensor
    if method == "torch_ipc":
        import torch.multiprocessing  # noqa: F401 - registers torch's reductions with it
        from multiprocessing.reduction import ForkingPickler
        return bytes(ForkingPickler.dumps(tensor))
    if method == "channel":
        return b""
    if cpu:
        return pickle.dumps(tensor, protocol=pickle.HIGHEST_PROTOCOL)
    return pickle.dumps(tensor.cpu().numpy(), protocol=pickle.HIGHEST_PROTOCOL)


def measure(args, method, size, consumers, cpu):
    """Mean, p50, p99 round trip in microseconds over args.iterations (after warm-up)."""
    import ferry
    pool = plan = None
    items = args.warmup + args.iterations + 1
    if method == "ferry_channel":  # the consumers connect to the pool: it comes first
        if not cpu:
            import torch
            torch.cuda.set_device(args.producer_device)
        pool = ferry.Pool(max(64 << 20, 8 * size), consumers, backend="host" if cpu else
                          args.backend, device=-1 if cpu else args.producer_device,
                          on_full="wait")
        plan = {"address": pool.address, "size": size, "items": items,
                "verified": set(range(args.warmup)) | {items - 1}}
    try:
        run = Run(args, method, consumers, cpu, plan)
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    try:
        if cpu:
            import numpy as np
            rng = np.random.default_rng(size)
            tensors = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(2)]
            sums = [_checksum_numpy(t) for t in tensors]
            stream = None
            backend = "host"
        else:
            import torch
            torch.cuda.set_device(args.producer_device)
            g = torch.Generator(device=f"cuda:{args.producer_device}").manual_seed(size)
            tensors = [torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g,
                                     device=f"cuda:{args.producer_device}") for _ in range(2)]
            sums = [_checksum_torch(t) for t in tensors]
            stream = torch.cuda.current_stream().cuda_stream
            backend = args.backend
        if method in ("ferry", "ferry_view"):
            pool = ferry.Pool(max(64 << 20, 8 * size), consumers, backend=backend,
                              device=args.producer_device, on_full="wait")
        times = []
        # Warm-up items and one item after the timed ones are verified (a checksum in every
        # consumer); the timed ones are not, so that checking costs no method any time.
        for i in range(items):
            timed = args.warmup <= i < args.warmup + args.iterations
            t0 = time.perf_counter()
            if method == "ferry_channel":
                # No channel of the bench's: the producer learns that every consumer has its
                # copy when the lease is acknowledged by all (their streams write the acks).
                _publish(method, pool, tensors[i % 2], cpu, stream)
                pool.drain(timeout=120)
                if timed:
                    times.append((time.perf_counter() - t0) * 1e6)
                else:
                    run.send(b"", sums[i % 2])
                    run.wait()
                continue
            run.send(_publish(method, pool, tensors[i % 2], cpu, stream),
                     NO_CHECK if timed or method == "channel" else sums[i % 2])
            run.wait()
            if timed:
                times.append((time.perf_counter() - t0) * 1e6)
        times.sort()
        return {"mean_us": statistics.fmean(times), "p50_us": times[len(times) // 2],
                "p99_us": times[min(len(times) - 1, int(len(times) * 0.99))]}
    finally:
        run.close()
        if pool is not None:
            pool.close(drain=False)


def plot(results, path, channel):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, n in zip(axes, sorted({r["consumers"] for r in results})):
        for method in sorted({r["method"] for r in results}):
            rows = sorted((r for r in results if r["consumers"] == n and r["method"] == method),
                          key=lambda r: r["size"])
            ax.plot([r["size"] for r in rows], [r["mean_us"] for r in rows], marker="o",
                    label=method)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("item size (bytes)")
        ax.set_title(f"{n} consumer{'s' if n > 1 else ''}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("round trip, mean (us)")
    axes[0].legend()
    fig.suptitle(f"one CUDA tensor to N consumers, {channel} channel")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parser():
    ap = argparse.ArgumentParser(prog="python -m ferry.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4KiB,1MiB,16MiB,64MiB")
    ap.add_argument("--consumers", default="1,4")
    ap.add_argument("--methods",
                    default="channel,ferry,ferry_channel,torch_mp,torch_ipc,cpu_pickle")
    ap.add_argument("--channel", choices=("pipe", "spin"), default="pipe",
                    help="how items and replies travel (see above)")
    ap.add_argument("--backend", default="cuda_ipc")
    ap.add_argument("--producer-device", type=int, default=0)
    ap.add_argument("--consumer-device", type=int, default=0)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="NumPy over a host pool (no GPU)")
    ap.add_argument("--plot", default=None, help="write a PNG plot here")
    ap.add_argument("--json", default=None, help="write the results here")
    return ap


def _speedups(results, counts, sizes, ours, channel):
    """How many times slower each other method is than ours, by size and consumer count."""
    lines = []
    for n in counts:
        for size in sizes:
            base = {r["method"]: r["mean_us"] for r in results
                    if r["size"] == size and r["consumers"] == n}
            if ours not in base or len(base) < 2:
                continue
            parts = [f"{m} {base[m] / base[ours]:.1f}x" for m in base
                     if m not in (ours, "channel")]
            if ours == "ferry" and "channel" in base:
                parts.append(f"(channel alone {base['channel']:.0f} us of ferry's "
                             f"{base['ferry']:.0f} us)")
            lines.append(f"  {human(size):>7s} x{n}: " + ", ".join(parts))
    if lines:
        how = "its rings" if ours == "ferry_channel" else f"the {channel} channel"
        print(f"\nspeed-up of {ours} (mean round trip; {ours} through {how}):")
        print("\n".join(lines))


def main(argv=None):
    args = parser().parse_args(argv)
    if not args.cpu:
        from .cli import gpu_missing
        missing = gpu_missing()
        if missing:
            print(f"python -m ferry.bench: this benchmark hands CUDA tensors between GPU "
                  f"processes and needs torch with CUDA and a GPU ({missing}). Without them: "
                  f"python -m ferry bench --host (ferry against pickle through a pipe, over a "
                  f"host pool with numpy), or --cpu here.", file=sys.stderr)
            return 2
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    counts = [int(c) for c in args.consumers.split(",")]
    methods = args.methods.split(",")
    if args.cpu:
        methods = [m for m in methods if not m.startswith("torch")]
    results = []
    print(f"{'method':13s} {'size':>7s} {'consumers':>9s} {'mean us':>11s} {'p50 us':>11s} "
          f"{'p99 us':>11s}", flush=True)
    for n in counts:
        for size in sizes:
            for method in methods:
                r = measure(args, method, size, n, args.cpu)
                r.update(method=method, size=size, consumers=n)
                results.append(r)
                print(f"{method:13s} {human(size):>7s} {n:9d} {r['mean_us']:11.1f} "
                      f"{r['p50_us']:11.1f} {r['p99_us']:11.1f}", flush=True)
    for ours in ("ferry_channel", "ferry"):
        _speedups(results, counts, sizes, ours, args.channel)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"consumer_device": args.consumer_device, "channel": args.channel,
                       "results": results}, f, indent=1)
    if args.plot:
        plot(results, args.plot, args.channel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
