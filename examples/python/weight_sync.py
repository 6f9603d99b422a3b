"""Weight sync on one GPU: a trainer streams a ~1B-parameter model into a rollout process.

    pip install ferry-tensors torch transformers
    python examples/python/weight_sync.py [--syncs 50] [--pool 384MiB] [--bucket 64MiB]

What colocated RL trainers do every step, and what NCCL cannot do between two processes on
one GPU. A trainer process holds a transformers Llama model with random weights (~1.1B
parameters in bf16, built from a config: no download); a rollout process holds the same
architecture with other weights. Every sync, the trainer changes its weights (a stand-in for
an optimizer step) and streams every parameter, in buckets of up to --bucket bytes, through
a ferry pool far smaller than the model (on_full="wait": a bucket waits for the rollout to
acknowledge earlier ones); the rollout receives each bucket straight into its own parameters
(rx.recv(out=[params]): no allocation, no copy of its own), enqueued on its stream.

In the same run, the same syncs through torch's CUDA IPC reductions
(torch.multiprocessing.reductions.reduce_tensor of every parameter, rebuilt in the rollout and
copied into its parameters: what RL frameworks do today) and through host memory (each bucket
copied to a pinned shared-memory buffer, then into the rollout's parameters). It prints
seconds per sync and GB/s (model bytes per second) for each, checks after the first and the
last sync of each that the rollout's parameters equal the trainer's (a checksum per
parameter, on the GPU), shows the GPU's memory in use after a first, untimed ferry sync and
after the last (flat: the pool is all ferry holds), and kills a rollout in the middle of a
sync: the pool acknowledges its leases for it, the trainer's sync completes and the pool
drains to nothing in use; a new rollout then takes the rank over and a full sync verifies.
Where torch, a GPU or transformers is missing it prints "skipped: ..." and exits 0. Same-GPU
numbers want MPS (scripts/gpu-check runs it under MPS).
"""

import argparse
import multiprocessing as mp
import sys
import time
from multiprocessing import shared_memory

DEVICE = 0
KILL_AFTER = 3  # buckets the rollout killed mid-sync receives first


def missing():
    try:
        import torch
    except ImportError:
        return "torch"
    if not torch.cuda.is_available():
        return "a GPU"
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "transformers"
    return None


def build_model(seed):
    """A Llama of ~1.1B parameters (TinyLlama's shape) with random weights, bf16, on the GPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                         num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                         max_position_embeddings=2048, tie_word_embeddings=False)
    torch.manual_seed(seed)
    try:  # made in bf16 on the GPU at once (an fp32 model is converted below otherwise)
        torch.set_default_dtype(torch.bfloat16)
    except (TypeError, RuntimeError):
        pass
    try:
        with torch.device(f"cuda:{DEVICE}"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    return model.to(torch.bfloat16).eval()


def weights_of(model):
    """The parameters as plain tensors (detached views: what DLPack exports and out= fills)."""
    return [p.detach() for p in model.parameters()]


def buckets_of(shapes, itemsize, limit):
    """Consecutive parameters grouped into buckets of at most limit bytes (a larger parameter
    alone): the same on both sides, from the shapes alone."""
    buckets, current, size = [], [], 0
    for i, shape in enumerate(shapes):
        n = itemsize
        for d in shape:
            n *= d
        if current and size + n > limit:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        buckets.append(current)
    return buckets


def checksums(weights):
    """A checksum per tensor (the sum of its bytes as int16), computed on the GPU."""
    import torch
    return torch.stack([w.view(torch.int16).sum(dtype=torch.int64) for w in weights]).tolist()


def used_gib():
    """GPU memory in use on the device, every process's (what nvidia-smi shows)."""
    import torch
    free, total = torch.cuda.mem_get_info(DEVICE)
    return (total - free) / (1 << 30)


def pin(buf):
    """Registers a shared-memory buffer with CUDA (pinned: DMA at full speed); False when the
    runtime refuses (the copies then go through pageable memory)."""
    import ctypes

    import torch
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    return int(torch.cuda.cudart().cudaHostRegister(addr, len(buf), 0)) == 0


# ---- trainer -----------------------------------------------------------------------------

def trainer(ctl, peer, shm_name, slot_bytes, pool_bytes, bucket_bytes):
    import torch
    import torch.multiprocessing  # noqa: F401 - its reductions (the CUDA IPC baseline)
    from torch.multiprocessing.reductions import reduce_tensor

    import ferry
    torch.cuda.set_device(DEVICE)
    model = build_model(seed=1)
    weights = weights_of(model)
    shapes = [tuple(w.shape) for w in weights]
    buckets = buckets_of(shapes, 2, bucket_bytes)
    stream = torch.cuda.current_stream(DEVICE)
    pool = ferry.Pool(pool_bytes, 1, device=DEVICE, on_full="wait", timeout=120,
                      drain_timeout=0)
    shm = shared_memory.SharedMemory(name=shm_name)
    host = torch.frombuffer(shm.buf, dtype=torch.uint8)
    pinned = pin(shm.buf)
    ctl.send((pool.address, shapes, sum(w.numel() * 2 for w in weights), pinned))

    def send_buckets():
        for b in buckets:
            pool.send([weights[i] for i in b], stream=stream)

    while True:
        cmd = ctl.recv()
        if cmd == "step":  # a stand-in for the optimizer: every weight changes
            torch._foreach_add_(weights, 1e-3)
            ctl.send(checksums(weights))
        elif cmd == "ferry":
            send_buckets()
            ctl.send("sent")
        elif cmd == "ferry_unattended":  # the rollout will die mid-sync: nobody replies
            send_buckets()
            pool.drain(timeout=60)  # every lease acknowledged, the dead rank's for it
            ctl.send(pool.stats())
        elif cmd == "torch":
            peer.send([reduce_tensor(w) for w in weights])
            peer.recv()  # the rollout copied everything: the handles may go
            ctl.send("sent")
        elif cmd == "host":
            stage(weights, buckets, host, peer, stream, slot_bytes)
            ctl.send("sent")
        elif cmd == "stats":
            ctl.send(pool.stats())
        elif cmd == "exit":
            break
    del host
    shm.close()
    pool.close(drain=False)


def stage(weights, buckets, host, peer, stream, slot_bytes):
    """Host staging: each bucket copied into one of two halves of the shared buffer, the
    rollout told, the half reused once the rollout said it copied it out."""
    import torch
    for k, b in enumerate(buckets):
        if k >= 2:
            peer.recv()  # the half used two buckets ago is free again
        base, off = (k % 2) * slot_bytes, 0
        for i in b:
            n = weights[i].numel() * 2
            host[base + off:base + off + n].view(torch.bfloat16).copy_(
                weights[i].reshape(-1), non_blocking=True)
            off += n
        stream.synchronize()
        peer.send(k)
    for _ in range(min(2, len(buckets))):
        peer.recv()


# ---- rollout -----------------------------------------------------------------------------

def rollout(ctl, peer, address, shapes, shm_name, slot_bytes, bucket_bytes, role):
    """role "model": a model of its own, receiving into its parameters; "scratch": tensors of
    the parameters' shapes only (the rollouts of the kill test); "die": a scratch rollout that
    says so after KILL_AFTER buckets of its first sync and waits to be killed."""
    import torch

    import ferry
    torch.cuda.set_device(DEVICE)
    if role == "model":
        targets = weights_of(build_model(seed=2))
    else:
        targets = [torch.empty(s, dtype=torch.bfloat16, device=f"cuda:{DEVICE}") for s in shapes]
    buckets = buckets_of(shapes, 2, bucket_bytes)
    stream = torch.cuda.Stream(DEVICE)
    rx = ferry.connect(address, 0, device=DEVICE)
    shm = shared_memory.SharedMemory(name=shm_name) if role == "model" else None
    host = torch.frombuffer(shm.buf, dtype=torch.uint8) if shm else None
    if shm is not None:
        pin(shm.buf)
    ctl.send("ready")
    while True:
        cmd = ctl.recv()
        if cmd == "exit":
            break
        if cmd == "sums":
            ctl.send(checksums(targets))
            continue
        if cmd == "memory":
            ctl.send(used_gib())
            continue
        with torch.cuda.stream(stream):
            if cmd == "ferry":
                for k, b in enumerate(buckets):
                    outs = [targets[i] for i in b]  # the parameters themselves
                    # (a bucket of one parameter is sent as one tensor, not a packed lease)
                    rx.recv(out=outs if len(outs) > 1 else outs[0], stream=stream)
                    if role == "die" and k + 1 == KILL_AFTER:
                        stream.synchronize()
                        ctl.send("dying")
                        time.sleep(3600)
            elif cmd == "torch":
                for (rebuild, args), t in zip(peer.recv(), targets):
                    t.copy_(rebuild(*args))
            elif cmd == "host":
                for b in buckets:
                    k = peer.recv()
                    base, off = (k % 2) * slot_bytes, 0
                    for i in b:
                        n = targets[i].numel() * 2
                        targets[i].view(-1).copy_(
                            host[base + off:base + off + n].view(torch.bfloat16), non_blocking=True)
                        off += n
                    stream.synchronize()
                    peer.send("free")
            stream.synchronize()
        if cmd == "torch":
            peer.send("done")
        ctl.send("done")
    rx.close()
    del host
    if shm is not None:
        shm.close()


# ---- the run -------------------------------------------------------------------------------

class Session:
    def __init__(self, args):
        import torch
        self.ctx = mp.get_context("spawn")
        self.args = args
        self.t_ctl, t_end = self.ctx.Pipe()
        self.peer_t, self.peer_r = self.ctx.Pipe()
        # Two halves, each as large as the largest bucket (a parameter may exceed --bucket).
        self.slot = 256 << 20
        self.shm = shared_memory.SharedMemory(create=True, size=2 * self.slot)
        self.trainer = self.ctx.Process(target=trainer, args=(
            t_end, self.peer_t, self.shm.name, self.slot, args.pool, args.bucket))
        self.trainer.start()
        self.address, self.shapes, self.nbytes, self.pinned = self.t_ctl.recv()
        largest = max(buckets_of(self.shapes, 2, args.bucket),
                      key=lambda b: sum(2 * torch.Size(self.shapes[i]).numel() for i in b))
        assert sum(2 * torch.Size(self.shapes[i]).numel() for i in largest) <= self.slot

    def start_rollout(self, role):
        ctl, end = self.ctx.Pipe()
        p = self.ctx.Process(target=rollout, args=(end, self.peer_r, self.address, self.shapes,
                                                   self.shm.name, self.slot, self.args.bucket,
                                                   role))
        p.start()
        assert ctl.recv() == "ready"
        return p, ctl

    def sync(self, method, r_ctl):
        """One sync by method: the trainer steps, then both sides run it; seconds."""
        sums = self.call("step")
        t0 = time.perf_counter()
        self.t_ctl.send(method)
        r_ctl.send(method)
        assert r_ctl.recv() == "done"
        elapsed = time.perf_counter() - t0
        assert self.t_ctl.recv() == "sent"
        return elapsed, sums

    def call(self, cmd):
        self.t_ctl.send(cmd)
        return self.t_ctl.recv()

    def close(self):
        self.t_ctl.send("exit")
        self.trainer.join(60)
        self.shm.close()
        self.shm.unlink()


def verify(name, sums, r_ctl):
    r_ctl.send("sums")
    got = r_ctl.recv()
    bad = sum(a != b for a, b in zip(sums, got))
    if bad or len(got) != len(sums):
        print(f"{name}: {bad} of {len(sums)} parameters differ from the trainer's",
              file=sys.stderr)
        return False
    return True


def measure(session, method, syncs, r_ctl):
    """Runs syncs; verifies after the first and the last. (seconds per sync, ok)."""
    times, ok = [], True
    for k in range(syncs):
        elapsed, sums = session.sync(method, r_ctl)
        times.append(elapsed)
        if k in (0, syncs - 1):
            ok &= verify(f"{method} sync {k + 1}", sums, r_ctl)
    times = times[1:] if len(times) > 1 else times  # the first one opens what it needs
    return sum(times) / len(times), ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--syncs", type=int, default=50, help="ferry syncs (memory over them)")
    ap.add_argument("--baseline-syncs", type=int, default=5,
                    help="syncs through torch's CUDA IPC and through host memory")
    ap.add_argument("--pool", default="384MiB", help="the pool (smaller than the model)")
    ap.add_argument("--bucket", default="64MiB", help="bytes of parameters per send")
    args = ap.parse_args()
    lack = missing()
    if lack:
        print(f"skipped: needs torch, a GPU and transformers ({lack} missing)")
        return 0
    import torch

    import ferry
    args.pool, args.bucket = ferry.parse_size(args.pool), ferry.parse_size(args.bucket)
    s = Session(args)
    ok = True
    try:
        gb = s.nbytes / 1e9
        print(f"model: {sum(torch.Size(x).numel() for x in s.shapes) / 1e9:.2f}B parameters, "
              f"{gb:.2f} GB bf16, {len(buckets_of(s.shapes, 2, args.bucket))} buckets of <= "
              f"{args.bucket >> 20} MiB; pool {args.pool >> 20} MiB; one GPU "
              f"({torch.cuda.get_device_name(DEVICE)}); host buffer "
              f"{'pinned' if s.pinned else 'pageable'}", flush=True)
        proc, r_ctl = s.start_rollout("model")
        # A first ferry sync, untimed, opens what both sides need: from then on torch's caching
        # allocators hold the temporaries of the checksums too. Memory is compared over the
        # syncs after it.
        measure(s, "ferry", 1, r_ctl)
        r_ctl.send("memory")
        before = r_ctl.recv()
        rows = [("ferry", args.syncs), ("torch", args.baseline_syncs),
                ("host", args.baseline_syncs)]
        names = {"ferry": "ferry (pool, recv(out=params))",
                 "torch": "torch CUDA IPC reductions", "host": "staging through host memory"}
        for method, syncs in rows:
            per, good = measure(s, method, syncs, r_ctl)
            ok &= good
            print(f"{names[method]:34s} {per:8.4f} s/sync  {gb / per:8.1f} GB/s  "
                  f"({syncs} syncs, verified)", flush=True)
            if method == "ferry":
                r_ctl.send("memory")
                after = r_ctl.recv()
                flat = abs(after - before) < 0.25
                ok &= flat
                high = s.call("stats")["high_water_bytes"]
                print(f"GPU memory in use: {before:.2f} GiB after a first sync, {after:.2f} GiB "
                      f"after {syncs} more ({'flat' if flat else 'NOT flat'}); the pool's "
                      f"high water {high >> 20} MiB of {args.pool >> 20} MiB", flush=True)
        r_ctl.send("exit")
        proc.join(60)

        # A rollout killed mid-sync: its leases are acknowledged for it and the pool drains.
        dying, d_ctl = s.start_rollout("die")
        s.call("step")
        s.t_ctl.send("ferry_unattended")
        d_ctl.send("ferry")
        assert d_ctl.recv() == "dying"
        dying.kill()
        dying.join(30)
        stats = s.t_ctl.recv()
        reclaimed = stats["leases_in_flight"] == 0 and stats["bytes_in_use"] == 0
        ok &= reclaimed and stats["acked_for_dead"] > 0
        print(f"rollout killed after {KILL_AFTER} buckets of a sync: the sync completed, "
              f"{stats['acked_for_dead']} leases acknowledged for the dead rank, "
              f"{stats['leases_in_flight']} in flight, {stats['bytes_in_use']} bytes in use "
              f"({'reclaimed' if reclaimed else 'NOT reclaimed'})", flush=True)
        fresh, f_ctl = s.start_rollout("scratch")
        per, good = measure(s, "ferry", 1, f_ctl)
        ok &= good
        print(f"a new rollout took rank 0 over: a full sync in {per:.4f} s, verified", flush=True)
        f_ctl.send("exit")
        fresh.join(60)
    finally:
        s.close()
    if not ok:
        return 1
    print("weight sync ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
