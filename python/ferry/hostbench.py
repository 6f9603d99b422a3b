"""Host benchmark: ferry over a host pool against pickle through a pipe, with numpy only.

    python -m ferry bench --host [--sizes 4KiB,256KiB,4MiB,32MiB] [--iterations 200]
                                 [--json FILE]

One spawned consumer process and a multiprocessing Pipe. For each item size it measures the
round trip of one numpy array, from the producer's call until the consumer's reply is back:

  pipe    an empty message and its reply: the floor every method pays
  pickle  the array pickled through the pipe, unpickled in the consumer
  ferry   pool.publish (a copy into the pool), the 256-byte descriptor through the pipe,
          ferry.receive (a copy out, acknowledged) in the consumer

The consumer checks the first byte and the last of every array against the producer's.
"""

import argparse as _argparse
import json as _json
import multiprocessing as _mp
import pickle as _pickle
import statistics as _statistics
import sys as _sys
import time as _time


def _consumer(conn):
    import numpy as np

    import ferry

    while True:
        message = conn.recv_bytes()
        kind, body = message[:1], message[1:]
        if kind == b"q":
            return
        if kind == b"p":
            a = _pickle.loads(body)
        elif kind == b"f":
            a = np.from_dlpack(ferry.receive(ferry.Descriptor(body), rank=0))
        else:
            conn.send_bytes(b"")
            continue
        conn.send_bytes(bytes([a[0], a[-1]]) if a.size else b"")


def _round_trips(send, conn, items, iterations, warmup):
    times = []
    for i in range(warmup + iterations):
        a = items[i % len(items)]
        t0 = _time.perf_counter()
        send(a)
        reply = conn.recv_bytes()
        if i >= warmup:
            times.append((_time.perf_counter() - t0) * 1e6)
        if reply and reply != bytes([a[0], a[-1]]):
            raise RuntimeError("the consumer received other bytes than the producer sent")
    times.sort()
    return {"mean_us": _statistics.fmean(times), "p50_us": times[len(times) // 2],
            "p99_us": times[min(len(times) - 1, int(len(times) * 0.99))]}


def measure(conn, size, iterations, warmup=10):
    """{method: {mean_us, p50_us, p99_us}} for one item size."""
    import numpy as np

    import ferry

    rng = np.random.default_rng(size)
    items = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(2)]
    results = {"pipe": _round_trips(lambda a: conn.send_bytes(b"e"), conn, items, iterations,
                                    warmup)}
    results["pickle"] = _round_trips(
        lambda a: conn.send_bytes(b"p" + _pickle.dumps(a, protocol=_pickle.HIGHEST_PROTOCOL)),
        conn, items, iterations, warmup)
    with ferry.Pool(max(16 << 20, 4 * size), 1, backend="host", on_full="wait") as pool:
        results["ferry"] = _round_trips(lambda a: conn.send_bytes(b"f" + bytes(pool.publish(a))),
                                        conn, items, iterations, warmup)
    return results


def parser():
    ap = _argparse.ArgumentParser(prog="ferry bench --host",
                                  description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4KiB,256KiB,4MiB,32MiB",
                    help="item sizes, comma-separated (default 4KiB,256KiB,4MiB,32MiB)")
    ap.add_argument("--iterations", type=int, default=200,
                    help="timed round trips per size and method (fewer for large items, so "
                         "that each takes at most about 2 GiB; default 200)")
    ap.add_argument("--json", default=None, help="write the results here")
    return ap


def main(argv=None):
    from . import _size_text, parse_size

    args = parser().parse_args(argv)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
        import numpy  # noqa: F401
    except ValueError as e:
        parser().error(str(e))
    except ImportError:
        print("ferry bench --host needs numpy (pip install numpy)", file=_sys.stderr)
        return 2
    ctx = _mp.get_context("spawn")
    conn, child = ctx.Pipe()
    process = ctx.Process(target=_consumer, args=(child,), daemon=True)
    process.start()
    child.close()
    rows = []
    try:
        print("ferry host bench: one numpy array to one consumer process and back, round trip "
              "(us)")
        print(f"{'size':>8s} {'pipe':>9s} {'pickle':>9s} {'ferry':>9s} {'pickle/ferry':>13s}",
              flush=True)
        for size in sizes:
            n = max(10, min(args.iterations, (2 << 30) // max(size, 1)))
            r = measure(conn, size, n)
            rows.append({"size": size, "iterations": n, **r})
            print(f"{str(_size_text(size)):>8s} {r['pipe']['mean_us']:9.1f} "
                  f"{r['pickle']['mean_us']:9.1f} {r['ferry']['mean_us']:9.1f} "
                  f"{r['pickle']['mean_us'] / r['ferry']['mean_us']:12.1f}x", flush=True)
        conn.send_bytes(b"q")
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
    if args.json:
        with open(args.json, "w") as f:
            _json.dump({"results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    _sys.exit(main())
