"""Hand-over benchmark: every Python path of ferry against the floor and the baselines.

    python -m ferry.bench [--sizes 4KiB,1MiB,16MiB,64MiB] [--consumers 1,4]
                          [--producer-device 0] [--consumer-device 1] [--iterations 50]
                          [--methods floor,ferry_channel,...] [--channel pipe|spin]
                          [--row-budget 3] [--listen HOST:PORT] [--plot FILE]
                          [--json FILE] [--cpu]

The producer holds a CUDA tensor and hands it to N consumer processes; each consumer ends up
with its own copy of it on its GPU, synchronised, and says so through the bench's channel.
Every round trip ends when the last consumer's reply has come back through that channel (the
same end for every method; ferry_channel_drain, which ends at pool.drain(), excepted). The
consumer processes are spawned once per consumer count and run every method and size in
turn, so all rows come from the same processes in one run. Methods:

  floor        the channel's message, then the consumer's own copy of the same bytes on its
               GPU (a tensor of its own copied into another, on its stream), synchronised,
               then the reply: what any hand-over costs at least
  channel      the message and the reply alone, no tensor
  ferry_channel  pool.send(t) on the producer's stream; rx.recv(out=preallocated) on the
               consumer's stream (copy, then acknowledgement); send/recv(out=)
  ferry_channel_drain  the same, but the producer learns that every consumer has its copy
               from pool.drain() (the acknowledgements the consumers' streams write) instead
               of a reply
  ferry_recv   pool.send(t); rx.recv(torch=True): a tensor from torch's caching allocator on
               the consumer's stream; send/recv
  ferry_recv_dlpack  pool.send(t); torch.from_dlpack(rx.recv()): memory from ferry's
               stream-ordered pool, freed on the consumer's stream
  ferry_view   pool.send(t); rx.recv(copy=False): the zero-copy view, torch.from_dlpack, a
               private clone, then the view is dropped (which acknowledges on the stream)
  ferry_out    pool.publish(t); the 256-byte descriptor through the channel;
               ferry.receive(Descriptor.from_bytes(...), out=preallocated); publish/receive(out=)
  ferry        pool.publish(t); the descriptor through the channel;
               ferry.receive(d, torch=True); publish/receive
  ferry_remote the consumers as remote ones: a pool with a listen address (--listen), each
               consumer connected to pool.remote_address (UCX: the descriptor as an active
               message, the bytes fetched by a get into out=, the acknowledgement as an active
               message); send/recv(out=) as ferry_channel. Skipped, with UCX's reason, where
               UCX cannot be loaded. Its floor over bare UCX is `ferry bench --mode remote`'s
  torch_mp     a torch.multiprocessing queue per consumer carrying the CUDA tensor (CUDA IPC
               under the hood), then a private clone on the consumer's GPU
  torch_ipc    torch.multiprocessing's CUDA IPC pickling of the tensor (what its queues
               send), through the bench's channel
  cpu_pickle   tensor.cpu(), pickled through the channel, rebuilt on the consumer's GPU

Channels (--channel): "pipe", a multiprocessing Pipe per consumer (the processes sleep in
read() between messages); "spin", a shared-memory mailbox per consumer and direction that the
reader polls without sleeping, as vLLM's shared-memory message queue and SGLang's
non-blocking ZMQ polling loops do (messages over 64 KiB still go through the pipe). Warm-up
items and one item after the timed ones are verified in every consumer (a checksum computed
on the GPU against the producer's); timed items are not. A row stops early, after at least 5
timed items, once it has run --row-budget seconds (cpu_pickle at 64 MiB takes ~0.5 s an item).
--cpu runs the same methods with NumPy arrays over a host pool (torch's rows left out), for
machines without a GPU. The table gives each row's mean, p50 and p99 and its p50 against the
floor's (x floor).
"""

import argparse
import json
import multiprocessing as mp
import os
import pickle
import statistics
import struct
import sys
import time
from multiprocessing import shared_memory

UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
         "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3}

METHODS = ("floor", "channel", "ferry_channel", "ferry_channel_drain", "ferry_recv",
           "ferry_recv_dlpack", "ferry_view", "ferry_out", "ferry", "ferry_remote", "torch_mp",
           "torch_ipc", "cpu_pickle")
# Methods whose items travel in the pool's rings (the bench's channel carries only replies).
RING = ("ferry_channel", "ferry_channel_drain", "ferry_recv", "ferry_recv_dlpack", "ferry_view",
        "ferry_remote")
# Methods that publish and send the descriptor through the bench's channel.
PUBLISH = ("ferry_out", "ferry")


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
# Messages from the producer: a row's plan (pickled), an item, a checksum for an item that
# came through the rings, the end.
PLAN, ITEM, CHECK, QUIT = b"P", b"I", b"C", b"Q"


class Consumer:
    """One consumer process's side of a row: what it receives and how."""

    def __init__(self, rank, device, chan, queue, cpu, plan):
        import ferry
        self.ferry = ferry
        self.rank, self.chan, self.queue, self.cpu = rank, chan, queue, cpu
        self.method, self.size = plan["method"], plan["size"]
        self.rx = None
        if cpu:
            import numpy as np
            self.np = np
            self.out = np.empty(self.size, np.uint8)
            self.src = np.ones(self.size, np.uint8)
        else:
            import torch
            self.torch = torch
            self.device = device
            torch.cuda.set_device(device)
            self.stream = plan["stream"]
            self.target = torch.device("cuda", device)
            self.out = torch.empty(self.size, dtype=torch.uint8, device=self.target)
            self.src = torch.ones(self.size, dtype=torch.uint8, device=self.target)
        if self.method in RING:
            self.rx = ferry.connect(plan["address"], rank, device=None if cpu else device)

    def close(self):
        if self.rx is not None:
            self.rx.close()

    def checksum(self, t):
        return _checksum_numpy(t) if self.cpu else _checksum_torch(t)

    def take(self, raw):
        """One item (raw: the channel's message after ITEM and the header, or None for items
        in the rings or the queue): the consumer's own copy, synchronised."""
        m = self.method
        if self.cpu:
            return self._take_cpu(m, raw)
        torch = self.torch
        s = self.stream
        with torch.cuda.stream(s):
            h = s.cuda_stream
            if m == "floor":
                self.out.copy_(self.src)
                got = self.out
            elif m in ("ferry_channel", "ferry_channel_drain", "ferry_remote"):
                got = self.rx.recv(out=self.out, stream=h)
            elif m == "ferry_recv":
                got = self.rx.recv(torch=True, stream=h)
            elif m == "ferry_recv_dlpack":
                got = torch.from_dlpack(self.rx.recv(stream=h))
            elif m == "ferry_view":
                view = self.rx.recv(copy=False, stream=h)
                shared = torch.from_dlpack(view)
                got = shared.clone()
                del shared, view  # acknowledged on the stream, after the clone
            elif m == "ferry_out":
                d = self.ferry.Descriptor.from_bytes(raw)
                got = self.ferry.receive(d, rank=self.rank, out=self.out, stream=h)
            elif m == "ferry":
                got = self.ferry.receive(self.ferry.Descriptor.from_bytes(raw), rank=self.rank,
                                         device=self.device, stream=h, torch=True)
            elif m == "torch_mp":
                got = raw.to(self.target, copy=True)
            elif m == "torch_ipc":
                got = pickle.loads(raw).to(self.target, copy=True)
            else:
                got = torch.from_numpy(pickle.loads(raw)).to(self.target)
            s.synchronize()
        return got

    def _take_cpu(self, m, raw):
        np, ferry = self.np, self.ferry
        if m == "floor":
            np.copyto(self.out, self.src)
            return self.out
        if m in ("ferry_channel", "ferry_channel_drain", "ferry_remote"):
            return self.rx.recv(out=self.out)
        if m in ("ferry_recv", "ferry_recv_dlpack"):
            return np.from_dlpack(self.rx.recv())
        if m == "ferry_view":
            view = self.rx.recv(copy=False)
            got = np.from_dlpack(view).copy()
            del view
            return got
        if m == "ferry_out":
            return ferry.receive(ferry.Descriptor.from_bytes(raw), rank=self.rank, out=self.out)
        if m == "ferry":
            return np.from_dlpack(ferry.receive(ferry.Descriptor.from_bytes(raw),
                                                rank=self.rank))
        return pickle.loads(raw)

    def run(self, items, verified):
        """The row's items. Replies b"" (or an error text, which fails the run) after each,
        but for ferry_channel_drain, whose producer waits for the acknowledgements: after
        the verified ones only."""
        for i in range(items):
            expected, raw = NO_CHECK, None
            if self.method == "torch_mp":
                raw, expected = self.queue.get()
            elif self.method not in RING:
                msg = self.chan.recv()
                (expected,), raw = HEADER.unpack_from(msg, 1), msg[1 + HEADER.size:]
            if self.method == "channel":
                self.chan.send(b"")
                continue
            got = self.take(raw)
            if self.method in RING and i in verified:  # the checksum follows, untimed
                (expected,) = HEADER.unpack_from(self.chan.recv(), 1)
            ok = expected == NO_CHECK or self.checksum(got) == expected
            del got
            if self.method != "ferry_channel_drain" or i in verified:
                self.chan.send(b"" if ok else b"checksum mismatch")


def _consumer(rank, device, conn, queue, cpu, channel, name):
    """Runs the rows the producer plans until QUIT; reports errors through the channel."""
    chan = _channel(channel, conn, name, 1)
    stream = None
    try:
        if not cpu:
            import torch
            import torch.multiprocessing  # noqa: F401 - registers the CUDA rebuilders
            torch.cuda.set_device(device)
            stream = torch.cuda.Stream(device=device)
        chan.send(b"")
        while True:
            msg = chan.recv()
            if msg[:1] == QUIT:
                break
            plan = pickle.loads(msg[1:])
            plan["stream"] = stream
            c = None
            try:
                c = Consumer(rank, device, chan, queue, cpu, plan)
                chan.send(b"")  # ready
                c.run(plan["items"], plan["verified"])
            finally:
                if c is not None:
                    c.close()
    except Exception as e:  # reported to the producer, which fails the run
        chan.send(f"{type(e).__name__}: {e}".encode() or b"error")
    finally:
        if channel == "spin":
            chan.close()


# ---- producer -----------------------------------------------------------------------------

class Consumers:
    """The consumer processes of one consumer count, with a channel (and a torch.multiprocessing
    queue) each."""

    def __init__(self, args, count, cpu):
        ctx = mp.get_context("spawn")
        if not cpu:
            import torch.multiprocessing as tmp
            ctx = tmp.get_context("spawn")
        self.chans, self.queues, self.procs, self.shms = [], [], [], []
        for r in range(count):
            parent, child = ctx.Pipe()
            q = ctx.Queue() if not cpu else None
            shm = SpinChannel.create() if args.channel == "spin" else None
            name = shm.name if shm else None
            p = ctx.Process(target=_consumer, daemon=True,
                            args=(r, args.consumer_device, child, q, cpu, args.channel, name))
            p.start()
            self.chans.append(_channel(args.channel, parent, name, 0))
            self.queues.append(q)
            self.procs.append(p)
            self.shms.append(shm)
        for c in self.chans:
            self.expect(c, 300)

    @staticmethod
    def expect(chan, timeout=120):
        err = chan.recv(timeout)
        if err:
            raise RuntimeError(f"consumer: {err.decode()}")

    def wait(self):
        for c in self.chans:
            self.expect(c)

    def plan(self, plan):
        raw = PLAN + pickle.dumps(plan)
        for c in self.chans:
            c.send(raw)
        self.wait()

    def send(self, method, payload, expected):
        """An item through the channel or the queues (payload: the channel's bytes after the
        header, or the torch_mp tensor)."""
        if method == "torch_mp":
            for q in self.queues:
                q.put((payload, expected))
            return
        raw = ITEM + HEADER.pack(expected) + payload
        for c in self.chans:
            c.send(raw)

    def check(self, expected):
        raw = CHECK + HEADER.pack(expected)
        for c in self.chans:
            c.send(raw)

    def close(self):
        for c in self.chans:
            try:
                c.send(QUIT)
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


def _payload(method, pool, tensor, cpu, stream):
    """What the producer does for one item before the message goes: the channel's bytes (or
    the tensor for torch_mp)."""
    if method in PUBLISH:
        d = pool.publish(tensor, stream=stream)
        if d is None:
            raise RuntimeError("pool full")
        return bytes(d)
    if method in RING:
        if pool.send(tensor, stream=stream) is None:
            raise RuntimeError("pool full")
        return None
    if method == "torch_mp":
        return tensor
    if method == "torch_ipc":
        import torch.multiprocessing  # noqa: F401 - registers torch's reductions with it
        from multiprocessing.reduction import ForkingPickler
        return bytes(ForkingPickler.dumps(tensor))
    if method in ("channel", "floor"):
        return b""
    if cpu:
        return pickle.dumps(tensor, protocol=pickle.HIGHEST_PROTOCOL)
    return pickle.dumps(tensor.cpu().numpy(), protocol=pickle.HIGHEST_PROTOCOL)


def _sources(args, size, cpu):
    """Two source tensors of size bytes and their checksums, and the producer's stream."""
    if cpu:
        import numpy as np
        rng = np.random.default_rng(size)
        tensors = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(2)]
        return tensors, [_checksum_numpy(t) for t in tensors], None
    import torch
    torch.cuda.set_device(args.producer_device)
    g = torch.Generator(device=f"cuda:{args.producer_device}").manual_seed(size)
    tensors = [torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g,
                             device=f"cuda:{args.producer_device}") for _ in range(2)]
    return tensors, [_checksum_torch(t) for t in tensors], torch.cuda.current_stream().cuda_stream


def _items(consumers, method, pool, tensors, sums, cpu, stream, count, verified):
    """Runs count items (the consumers planned for them): the round trips of those not
    verified, in microseconds."""
    times = []
    for i in range(count):
        timed = i not in verified
        # (The floor's consumers copy bytes of their own: nothing of the producer's to check.)
        expected = NO_CHECK if timed or method in ("floor", "channel") else sums[i % 2]
        t0 = time.perf_counter()
        payload = _payload(method, pool, tensors[i % 2], cpu, stream)
        if method == "ferry_channel_drain":
            pool.drain(timeout=120)
            if not timed:  # untimed: the consumers check the item and say so
                consumers.check(expected)
                consumers.wait()
        elif method in RING:
            if not timed:
                consumers.check(expected)
            consumers.wait()
        else:
            consumers.send(method, payload, expected)
            consumers.wait()
        if timed:
            times.append((time.perf_counter() - t0) * 1e6)
    return times


def measure(args, consumers, method, size, cpu):
    """Mean, p50, p99 round trip in microseconds over the timed items. The warm-up items
    (verified) come first, as a plan of their own: how long they took decides how many timed
    items fit in the row's budget (at least 5, at most --iterations)."""
    import ferry
    tensors, sums, stream = _sources(args, size, cpu)
    pool = None
    if method in RING or method in PUBLISH:
        remote = {"listen": args.listen} if method == "ferry_remote" else {}
        try:
            pool = ferry.Pool(max(64 << 20, 8 * size), len(consumers.chans),
                              backend="host" if cpu else args.backend,
                              device=-1 if cpu else args.producer_device, on_full="wait",
                              drain_timeout=0, **remote)
        except ferry.Error as e:
            if remote and "need UCX" in str(e):
                return {"skipped": str(e)}
            raise
    address = None
    if pool is not None:
        address = pool.remote_address if method == "ferry_remote" else pool.address

    def row(count, verified):
        consumers.plan({"method": method, "size": size, "items": count, "verified": verified,
                        "address": address})
        return _items(consumers, method, pool, tensors, sums, cpu, stream, count, verified)

    try:
        start = time.perf_counter()
        row(args.warmup, set(range(args.warmup)))
        each = (time.perf_counter() - start) / max(1, args.warmup)
        n = max(5, min(args.iterations, int(args.row_budget / max(each, 1e-6))))
        times = sorted(row(n + 1, {n}))
        return {"mean_us": statistics.fmean(times), "p50_us": times[len(times) // 2],
                "p99_us": times[min(len(times) - 1, int(len(times) * 0.99))],
                "items": len(times)}
    finally:
        if pool is not None:
            pool.close(drain=False)


def plot(results, path, channel, floor="floor"):
    """Round trip p50 per method against size, one panel per consumer count; the floor dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    counts = sorted({r["consumers"] for r in results})
    fig, axes = plt.subplots(1, len(counts), figsize=(6 * len(counts), 4.6), sharey=True,
                             squeeze=False)
    for ax, n in zip(axes[0], counts):
        for method in [m for m in METHODS if any(r["method"] == m for r in results)]:
            rows = sorted((r for r in results if r["consumers"] == n and r["method"] == method),
                          key=lambda r: r["size"])
            style = {"linestyle": "--", "color": "black"} if method == floor else {}
            ax.plot([r["size"] for r in rows], [r["p50_us"] for r in rows], marker="o",
                    label=method, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("item size (bytes)")
        ax.set_title(f"{n} consumer{'s' if n > 1 else ''}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("round trip to the last reply, p50 (us)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"one tensor to N consumers, every path against the floor ({channel} channel)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parser():
    ap = argparse.ArgumentParser(prog="python -m ferry.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4KiB,1MiB,16MiB,64MiB")
    ap.add_argument("--consumers", default="1,4")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help="comma-separated, from: " + ", ".join(METHODS))
    ap.add_argument("--channel", choices=("pipe", "spin"), default="pipe",
                    help="how items and replies travel (see above)")
    ap.add_argument("--backend", default="cuda_ipc")
    ap.add_argument("--listen", default="127.0.0.1:0",
                    help="ferry_remote's listen address (HOST:PORT; port 0: any free one)")
    ap.add_argument("--producer-device", type=int, default=0)
    ap.add_argument("--consumer-device", type=int, default=0)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--row-budget", type=float, default=3.0,
                    help="seconds a row may take; slower rows time fewer items (at least 5)")
    ap.add_argument("--cpu", action="store_true", help="NumPy over a host pool (no GPU)")
    ap.add_argument("--plot", default=None, help="write a PNG plot here")
    ap.add_argument("--json", default=None, help="write the results here")
    return ap


def _mps():
    """Whether an MPS control daemon serves this machine's GPUs (ferry doctor's answer)."""
    try:
        import ferry
        return bool(json.loads(ferry.doctor(json=True))["mps"]["active"])
    except Exception:
        return None


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
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        print(f"python -m ferry.bench: unknown method(s) {', '.join(unknown)}; known: "
              f"{', '.join(METHODS)}", file=sys.stderr)
        return 2
    if args.cpu:
        methods = [m for m in methods if not m.startswith("torch")]
    mps = None if args.cpu else _mps()
    print(f"# {'cpu (numpy, host pool)' if args.cpu else args.backend}, channel {args.channel}, "
          f"producer GPU {args.producer_device}, consumer GPU {args.consumer_device}, "
          f"MPS {'n/a' if mps is None else 'on' if mps else 'off'}", flush=True)
    print(f"{'method':20s} {'size':>7s} {'consumers':>9s} {'mean us':>10s} {'p50 us':>10s} "
          f"{'p99 us':>10s} {'x floor':>8s}", flush=True)
    results, skipped = [], {}
    for n in counts:
        consumers = Consumers(args, n, args.cpu)
        try:
            for size in sizes:
                floor = None
                for method in methods:
                    r = measure(args, consumers, method, size, args.cpu)
                    if "skipped" in r:
                        if method not in skipped:
                            print(f"{method:20s} skipped: {r['skipped']}", flush=True)
                        skipped[method] = r["skipped"]
                        continue
                    r.update(method=method, size=size, consumers=n)
                    if method == "floor":
                        floor = r["p50_us"]
                    r["x_floor"] = r["p50_us"] / floor if floor else None
                    results.append(r)
                    ratio = f"{r['x_floor']:8.2f}" if r["x_floor"] else f"{'':8s}"
                    print(f"{method:20s} {human(size):>7s} {n:9d} {r['mean_us']:10.1f} "
                          f"{r['p50_us']:10.1f} {r['p99_us']:10.1f} {ratio}", flush=True)
        finally:
            consumers.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": args.cpu, "backend": "host" if args.cpu else args.backend,
                       "producer_device": args.producer_device,
                       "consumer_device": args.consumer_device, "channel": args.channel,
                       "mps": mps, "results": results, "skipped": skipped}, f, indent=1)
    if args.plot:
        plot(results, args.plot, args.channel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
