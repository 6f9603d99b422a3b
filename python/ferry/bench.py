"""Hand-over benchmark: ferry against what a Python server would use otherwise.

    python -m ferry.bench [--sizes 4KiB,1MiB,16MiB,64MiB] [--consumers 1,4]
                          [--producer-device 0] [--consumer-device 1] [--iterations 50]
                          [--methods ferry,torch_mp,cpu_pickle] [--plot FILE] [--json FILE]

For every method, item size and consumer count it measures the round trip of one tensor:
the producer holds a CUDA tensor, hands it to N consumer processes, and each consumer ends up
with its own copy on its GPU (synchronised) and says so; the round trip ends when the last
consumer has. Methods:

  ferry       pool.publish on the producer's stream, the 256-byte descriptor through the
              pipe, ferry.receive(copy=False) on the consumer's stream and a private clone
              (torch's allocator), then the view is dropped (which acknowledges)
  torch_mp    a torch.multiprocessing queue per consumer carrying the CUDA tensor (CUDA IPC
              under the hood), then a private clone on the consumer's GPU
  cpu_pickle  tensor.cpu(), pickled through the pipe, rebuilt on the consumer's GPU
  channel     no tensor: the pipe round trip alone, the floor every method above pays

All methods use the same spawned processes and the same pipes (raw bytes) for items and for
the "done" replies. Warm-up items and one item after the timed ones are verified in every
consumer (a checksum computed on the GPU against the producer's). `--cpu` runs ferry against
pickle with NumPy arrays over a host pool, for machines without a GPU.
"""

import argparse
import json
import struct
import multiprocessing as mp
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


def _consume_gpu(method, rank, device, payload, stream):
    import torch
    import ferry
    with torch.cuda.stream(stream):
        if method == "ferry":
            view = ferry.receive(ferry.Descriptor.from_bytes(payload), rank=rank, device=device,
                                 copy=False, stream=stream.cuda_stream)
            shared = torch.from_dlpack(view)
            got = shared.clone()
            del shared, view  # the lease is acknowledged on the stream, after the clone
        elif method == "torch_mp":
            got = payload.to(f"cuda:{device}", copy=True)
        else:
            got = torch.from_numpy(pickle.loads(payload)).to(f"cuda:{device}")
        stream.synchronize()
    return got


def _consumer(method, rank, device, conn, queue, cpu):
    """Receives items until an empty message; replies b"" (done) or an error text."""
    try:
        if not cpu:
            import torch
            torch.cuda.set_device(device)
            stream = torch.cuda.Stream(device=device)
        conn.send_bytes(b"")
        while True:
            if method == "torch_mp":
                item = queue.get()
                if item is None:
                    break
                payload, expected = item
            else:
                raw = conn.recv_bytes()
                if not raw:
                    break
                (expected,), payload = HEADER.unpack_from(raw), raw[HEADER.size:]
            if method == "channel":
                conn.send_bytes(b"")
                continue
            if cpu:
                got = _consume_cpu(method, rank, payload)
                ok = expected == NO_CHECK or _checksum_numpy(got) == expected
            else:
                got = _consume_gpu(method, rank, device, payload, stream)
                ok = expected == NO_CHECK or _checksum_torch(got) == expected
            del got
            conn.send_bytes(b"" if ok else b"checksum mismatch")
    except Exception as e:  # reported to the producer, which fails the run
        conn.send_bytes(f"{type(e).__name__}: {e}".encode() or b"error")


# ---- producer -----------------------------------------------------------------------------

class Run:
    def __init__(self, args, method, consumers, cpu):
        ctx = mp.get_context("spawn")
        if method == "torch_mp" and not cpu:
            import torch.multiprocessing as tmp
            ctx = tmp.get_context("spawn")
        self.method = method
        self.pipes, self.queues, self.procs = [], [], []
        for r in range(consumers):
            parent, child = ctx.Pipe()
            q = ctx.Queue() if method == "torch_mp" else None
            dev = args.consumer_device
            p = ctx.Process(target=_consumer, args=(method, r, dev, child, q, cpu), daemon=True)
            p.start()
            self.pipes.append(parent)
            self.queues.append(q)
            self.procs.append(p)
        for c in self.pipes:
            self._expect(c)

    def _expect(self, conn, timeout=120):
        if not conn.poll(timeout):
            raise RuntimeError(f"a consumer did not answer within {timeout} s")
        err = conn.recv_bytes()
        if err:
            raise RuntimeError(f"consumer: {err.decode()}")

    def send(self, payload, expected):
        if self.method == "torch_mp":
            for q in self.queues:
                q.put((payload, expected))
            return
        raw = HEADER.pack(expected) + payload
        for c in self.pipes:
            c.send_bytes(raw)

    def wait(self):
        for c in self.pipes:
            self._expect(c)

    def close(self):
        for i, c in enumerate(self.pipes):
            try:
                if self.method == "torch_mp":
                    self.queues[i].put(None)
                else:
                    c.send_bytes(b"")
            except Exception:
                pass
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def _publish(method, pool, tensor, cpu, stream):
    if method == "ferry":
        d = pool.publish(tensor, stream=stream)
        if d is None:
            raise RuntimeError("pool full")
        return bytes(d)
    if method == "torch_mp":
        return tensor
    if method == "channel":
        return b""
    if cpu:
        return pickle.dumps(tensor, protocol=pickle.HIGHEST_PROTOCOL)
    return pickle.dumps(tensor.cpu().numpy(), protocol=pickle.HIGHEST_PROTOCOL)


def measure(args, method, size, consumers, cpu):
    """Mean, p50, p99 round trip in microseconds over args.iterations (after warm-up)."""
    import ferry
    run = Run(args, method, consumers, cpu)
    pool = None
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
        if method == "ferry":
            pool = ferry.Pool(max(64 << 20, 8 * size), consumers, backend=backend,
                              device=args.producer_device, on_full="wait")
        times = []
        # Warm-up items and one item after the timed ones are verified (a checksum in every
        # consumer); the timed ones are not, so that checking costs no method any time.
        for i in range(args.warmup + args.iterations + 1):
            timed = args.warmup <= i < args.warmup + args.iterations
            t0 = time.perf_counter()
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
            pool.close()


def plot(results, path):
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ferry.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4KiB,1MiB,16MiB,64MiB")
    ap.add_argument("--consumers", default="1,4")
    ap.add_argument("--methods", default="channel,ferry,torch_mp,cpu_pickle")
    ap.add_argument("--backend", default="cuda_ipc")
    ap.add_argument("--producer-device", type=int, default=0)
    ap.add_argument("--consumer-device", type=int, default=0)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="NumPy over a host pool (no GPU)")
    ap.add_argument("--plot", default=None, help="write a PNG plot here")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    counts = [int(c) for c in args.consumers.split(",")]
    methods = args.methods.split(",")
    if args.cpu:
        methods = [m for m in methods if m != "torch_mp"]
    results = []
    print(f"{'method':11s} {'size':>7s} {'consumers':>9s} {'mean us':>11s} {'p50 us':>11s} "
          f"{'p99 us':>11s}", flush=True)
    for n in counts:
        for size in sizes:
            for method in methods:
                r = measure(args, method, size, n, args.cpu)
                r.update(method=method, size=size, consumers=n)
                results.append(r)
                print(f"{method:11s} {human(size):>7s} {n:9d} {r['mean_us']:11.1f} "
                      f"{r['p50_us']:11.1f} {r['p99_us']:11.1f}", flush=True)
    print("\nspeed-up of ferry (mean round trip):")
    for n in counts:
        for size in sizes:
            base = {r["method"]: r["mean_us"] for r in results
                    if r["size"] == size and r["consumers"] == n}
            if "ferry" in base:
                parts = [f"{m} {base[m] / base['ferry']:.1f}x" for m in base
                     if m not in ("ferry", "channel")]
            if "channel" in base:
                parts.append(f"(channel alone {base['channel']:.0f} us of ferry's "
                             f"{base['ferry']:.0f} us)")
                print(f"  {human(size):>7s} x{n}: " + ", ".join(parts))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"consumer_device": args.consumer_device, "results": results}, f, indent=1)
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
