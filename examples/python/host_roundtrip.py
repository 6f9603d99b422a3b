"""A producer hands numpy arrays to two consumer processes through a ferry host pool.

    pip install ferry-tensors numpy     # or: pip install ./python from the repository
    python examples/python/host_roundtrip.py

The producer publishes each array into the pool and sends the 256-byte descriptor through a
multiprocessing queue per consumer; each consumer receives (a copy, acknowledged at once),
checks the array and reports its sum. The producer's pool recycles a slice as soon as both
consumers have acknowledged it.
"""

import multiprocessing as mp

import numpy as np

import ferry

CONSUMERS = 2
ITEMS = 8


def consumer(rank, queue, results):
    total = 0.0
    while True:
        d = queue.get()
        if d is None:
            break
        a = np.from_dlpack(ferry.receive(d, rank=rank))  # waits for the slice, copies, acks
        assert a.shape == d.shape and str(a.dtype) == d.dtype
        total += float(a.sum())
    results.put((rank, total))


def main():
    ctx = mp.get_context("spawn")  # consumers are separate processes: spawn, not fork
    queues = [ctx.Queue() for _ in range(CONSUMERS)]
    results = ctx.Queue()
    procs = [ctx.Process(target=consumer, args=(r, queues[r], results))
             for r in range(CONSUMERS)]
    for p in procs:
        p.start()
    expected = 0.0
    with ferry.Pool("64MiB", CONSUMERS, backend="host", on_full="wait") as pool:
        print(pool)
        for i in range(ITEMS):
            x = np.full((256, 1024), i, dtype=np.float32)  # 1 MiB
            expected += float(x.sum())
            d = pool.publish(x)  # copies x into a leased slice of the pool
            for q in queues:
                q.put(d)  # descriptors pickle to 256 bytes
        for q in queues:
            q.put(None)
        got = dict(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(60)
        print(f"published {ITEMS} arrays, stats: publishes={pool.stats()['publishes']}")
    for rank in range(CONSUMERS):
        assert got[rank] == expected, (rank, got[rank], expected)
        print(f"consumer {rank}: sum {got[rank]:.0f} (expected {expected:.0f}) ok")
    print("host round trip ok")


if __name__ == "__main__":
    main()
