"""The engine adapters against the engines' own paths, in one run: ``python -m ferry.enginebench``.

One producer (this process) hands a feature tensor to N consumer processes (spawned), each
on the producer's GPU (``--device``; ``-1``: host tensors), over a multiprocessing pipe per
consumer as SGLang's and vLLM's processes do over ZMQ: the producer wraps or saves the
tensor, sends the message (a pickled proxy, or the feature's hash), and each consumer
materialises the tensor on its GPU, synchronises, and replies. One round trip is the time
from the producer's call to the last reply. Methods:

- ``floor``: the message, then the consumer's own copy of the same bytes on its GPU (a
  tensor it holds), synchronised, then the reply: what any hand-over costs at least.
- ``ferry_sglang``: ferry.sglang's pool and proxy (``wrap_tensor`` /
  ``reconstruct_on_target_device``), what SGLang runs with ``FERRY_SGLANG=1``.
- ``sglang``: SGLang's own ``MmItemMemoryPool`` and ``CudaIpcTensorTransportProxy`` (its
  CUDA IPC pool: ``--mm-feature-transport cuda_ipc``); GPU only.
- ``ferry_vllm``: ferry.vllm's connector, one consumer instance (scheduler and worker in the
  consumer's process): ``save_caches`` in the producer; ``has_cache_item``,
  ``update_state_after_alloc`` (the claim), ``build_connector_meta`` and
  ``start_load_caches`` in the consumer.
- ``vllm_example``: vLLM's own ``ECExampleConnector`` (its reference connector: safetensors
  files in shared storage, here /dev/shm) through the same calls. Where vLLM runs on its
  CPU platform (``VLLM_TARGET_DEVICE=cpu``: its CUDA platform needs its compiled kernels),
  the tensor it loads is then copied to the consumer's GPU, as its CUDA platform's load
  does.

The vLLM methods run with one consumer only (a consumer instance's scheduler claims once
for all its ranks). Prints a table (p50 and mean, microseconds, and p50 against the floor)
and, with ``--json``, the rows.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import statistics
import sys
import tempfile
import time
import types

METHODS = ("floor", "ferry_sglang", "sglang", "ferry_vllm", "vllm_example")
VLLM = ("ferry_vllm", "vllm_example")


def _sync(device):
    import torch
    if device >= 0:
        torch.cuda.current_stream(device).synchronize()


def _vllm_connector(kind, role, ec_role, port, size, device, storage):
    from vllm.config import ECTransferConfig
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
    if kind == "ferry_vllm":
        cfg = ECTransferConfig(ec_connector="FerryECConnector",
                               ec_connector_module_path="ferry.vllm", ec_role=ec_role,
                               ec_ip="127.0.0.1", ec_port=port, ec_buffer_size=size,
                               ec_buffer_device="cpu" if device < 0 else "cuda")
    else:
        cfg = ECTransferConfig(ec_connector="ECExampleConnector", ec_role=ec_role,
                               ec_connector_extra_config={"shared_storage_path": storage})
    # What connectors read of the engine's VllmConfig (a full one needs a model).
    vcfg = types.SimpleNamespace(ec_transfer_config=cfg, model_config=None)
    return ECConnectorFactory.create_connector(
        vcfg, getattr(ECConnectorRole, role))


def _consumer(rank, device, conn, args):
    """Serves (method, size) rows until None: per item, materialise and reply b"k". A failure
    is replied (pickled) in place of b"k" for that item and every later one of the row, so
    that the producer stops the row and the process serves the next."""
    import torch
    torch.set_num_threads(1)
    if device >= 0:
        torch.cuda.set_device(device)
    while True:
        row = conn.recv()
        if row is None:
            return
        method, size, port, storage = row
        try:
            own = dst = sched = worker = None
            if method == "floor":
                dev = "cpu" if device < 0 else f"cuda:{device}"
                own = torch.ones(size, dtype=torch.uint8, device=dev)
                dst = torch.empty_like(own)
            if method in VLLM:
                sched = _vllm_connector(method, "SCHEDULER", "ec_consumer", port, size, device,
                                        storage)
                worker = _vllm_connector(method, "WORKER", "ec_consumer", port, size, device,
                                         storage)
        except Exception as e:
            conn.send(("error", repr(e)))
            continue
        conn.send("ready")
        failed = None
        while True:
            msg = conn.recv_bytes()
            if msg == b"end":
                break
            if failed is None:
                try:
                    _item(method, msg, rank, device, dst, own, sched, worker)
                except Exception as e:
                    failed = pickle.dumps(repr(e))
            conn.send_bytes(b"k" if failed is None else failed)
        if worker is not None and hasattr(worker, "shutdown"):
            worker.shutdown()


def _item(method, msg, rank, device, dst, own, sched, worker):
    if method == "floor":
        dst.copy_(own)
    elif method in ("ferry_sglang", "sglang"):
        proxy = pickle.loads(msg)
        proxy.reconstruct_on_target_device(max(device, 0), consumer_rank=rank)
    else:
        h = msg.decode()
        assert sched.has_cache_item(h), h
        req = types.SimpleNamespace(mm_features=[types.SimpleNamespace(identifier=h)],
                                    get_num_encoder_embeds=lambda i: 1)
        sched.update_state_after_alloc(req, 0)
        worker.bind_connector_metadata(sched.build_connector_meta(None))
        cache = {}
        worker.start_load_caches(cache)
        assert h in cache, h
        assert not getattr(worker, "wait_for_load", set)(), h  # (older vLLM's)
        if device >= 0 and cache[h].device.type == "cpu":  # vLLM on its CPU platform
            cache[h] = cache[h].to(f"cuda:{device}")
        worker.clear_connector_metadata()
    _sync(device)


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(method, size, conns, device, args, storage):
    """p50 and mean round trip (us) of one method at one size with len(conns) consumers."""
    import torch
    n = len(conns)
    dev = "cpu" if device < 0 else f"cuda:{device}"
    x = torch.ones(size // 2, dtype=torch.bfloat16, device=dev)
    pool = prod = None
    port = _free_port()
    if method == "ferry_sglang":
        from ferry.sglang import FerryMmItemMemoryPool
        pool = FerryMmItemMemoryPool(args.pool, 0.05, device, n)
    elif method == "sglang":
        from sglang.srt.multimodal.transport.cuda_ipc import MmItemMemoryPool
        pool = MmItemMemoryPool(args.pool, 0.05, device, n)
    elif method in VLLM:
        prod = _vllm_connector(method, "WORKER", "ec_producer", port, args.pool, device, storage)
    for c in conns:
        c.send((method, size, port, storage))
    ready = [c.recv() for c in conns]
    errors = [r[1] for r in ready if r != "ready"]
    times = []
    for i in range(args.warmup + args.iterations):
        if errors:
            break
        t0 = time.perf_counter()
        if method == "floor":
            msg = pickle.dumps(("feature", i))
        elif pool is not None:
            proxy = pool.wrap_tensor(x, use_pool_handle_cache=True)
            if proxy is None:
                errors.append("the pool is full")
                break
            msg = pickle.dumps(proxy)
        else:
            h = f"mm-{method}-{size}-{i}"
            prod.save_caches({h: x}, h)
            msg = h.encode()
        for c in conns:
            c.send_bytes(msg)
        for c in conns:
            r = c.recv_bytes()
            if r != b"k":
                errors.append(pickle.loads(r))
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e6)
    for c, r in zip(conns, ready):
        if r == "ready":
            c.send_bytes(b"end")
    if pool is not None:
        pool.shutdown()
    if prod is not None and hasattr(prod, "shutdown"):
        prod.shutdown()
    if errors:
        raise RuntimeError(f"consumer: {errors[0]}")
    return statistics.median(times), statistics.fmean(times)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ferry.enginebench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--sizes", default="1MiB,4.5MiB,16MiB")
    ap.add_argument("--consumers", default="1,4")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--pool", type=int, default=4 << 30,
                    help="pool bytes (SGLang's pool recycles every 50 ms: it must hold what "
                         "is sent meanwhile)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from ferry import parse_size
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        ap.error(f"unknown methods {unknown}; from {METHODS}")
    if args.device < 0 and "sglang" in methods:  # SGLang's pool is GPU memory
        methods.remove("sglang")
    sizes = [parse_size(s) // 2 * 2 for s in args.sizes.split(",")]
    counts = [int(n) for n in args.consumers.split(",")]
    ctx = mp.get_context("spawn")
    rows = []
    storage = tempfile.mkdtemp(prefix="ferry-ec-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                               else None)
    print(f"{'consumers':>9} {'size':>8} {'method':>13} {'p50 us':>9} {'mean us':>9} "
          f"{'p50/floor':>9}", flush=True)
    for n in counts:
        ends = [ctx.Pipe() for _ in range(n)]
        procs = [ctx.Process(target=_consumer, args=(r, args.device, ends[r][1], args),
                             daemon=True) for r in range(n)]
        for p in procs:
            p.start()
        conns = [e[0] for e in ends]
        for size in sizes:
            floor = None
            for method in methods:
                if method in VLLM and n != 1:
                    continue
                try:
                    p50, mean = measure(method, size, conns, args.device, args, storage)
                except Exception as e:  # said, and the run goes on with the next method
                    print(f"{n:>9} {size:>8} {method:>13} failed: {e}", flush=True)
                    rows.append({"consumers": n, "size": size, "method": method,
                                 "error": str(e)})
                    continue
                if method == "floor":
                    floor = p50
                ratio = p50 / floor if floor else float("nan")
                rows.append({"consumers": n, "size": size, "method": method, "p50_us": p50,
                             "mean_us": mean, "p50_over_floor": ratio})
                print(f"{n:>9} {size:>8} {method:>13} {p50:>9.1f} {mean:>9.1f} {ratio:>9.2f}",
                      flush=True)
        for c in conns:
            c.send(None)
        for p in procs:
            p.join(30)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "iterations": args.iterations, "rows": rows}, f,
                      indent=1)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
