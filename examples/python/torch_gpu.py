"""A torch CUDA tensor handed to another process through a ferry GPU pool.

    pip install ferry-tensors torch
    python examples/python/torch_gpu.py

The producer publishes a CUDA tensor on its current stream (the copy into the pool is
enqueued there, with no host synchronisation) and sends the descriptor through a pipe; the
consumer, in another process, allocates its own tensor with torch and lets ferry copy into it
on its stream (ferry.receive(out=...)), then checks it. Where torch or a GPU is missing it
prints "skipped: needs torch and a GPU" and exits 0.
"""

import multiprocessing as mp
import sys


def gpu_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def consumer(conn, device):
    import torch

    import ferry

    torch.cuda.set_device(device)
    d = conn.recv()
    out = torch.empty(d.shape, dtype=getattr(torch, d.dtype), device=f"cuda:{device}")
    stream = torch.cuda.current_stream(device)
    ferry.receive(d, rank=0, out=out, stream=stream)  # copy + acknowledgement, on the stream
    stream.synchronize()
    conn.send(float(out.sum().item()))


def main():
    if not gpu_available():
        print("skipped: needs torch and a GPU")
        return 0
    import torch

    import ferry

    device = 0
    consumer_device = 1 if torch.cuda.device_count() > 1 else 0
    torch.cuda.set_device(device)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=consumer, args=(child, consumer_device))
    proc.start()
    with ferry.Pool("256MiB", 1, backend="cuda_ipc", device=device) as pool:
        print(pool)
        x = torch.arange(1 << 20, dtype=torch.float32, device=f"cuda:{device}")
        d = pool.publish(x, stream=torch.cuda.current_stream(device))
        conn.send(d)
        got = conn.recv()
        proc.join(60)
    expected = float(x.sum().item())
    print(f"consumer on cuda:{consumer_device}: sum {got:.0f} (expected {expected:.0f})")
    if got != expected:
        print("mismatch", file=sys.stderr)
        return 1
    print("torch GPU hand-over ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
