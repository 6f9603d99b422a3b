"""Multimodal features: two vision-encoder processes hand patch embeddings to four ranks.

    pip install ferry-tensors torch timm      # or transformers instead of timm
    python examples/python/multimodal_features.py [--batches 150] [--batch 8]

The job ferry exists for. Two encoder processes (the "tokenizer workers" of a multimodal
server) each run a real vision encoder built with random weights, no download (timm's
vit_base_patch16_224, or a transformers ViT from a config where timm is missing), on batches
of images, and send the patch embeddings (batch x 196 x 768, bf16) to four rank processes
(tensor-parallel model workers): pool.send([embeddings, meta]) puts both tensors in one lease
and queues it in every rank's ring. Each rank connects to both encoders' pools
(ferry.connect(address, rank, device, torch=True)), receives every item as torch tensors from
its own allocator (recv: the copy and the acknowledgement enqueued on its stream), checks it
against the checksum the encoder computed, and applies a projection (768 -> 4096, as a
LLaVA-style projector does).

The same program runs a second time with torch.multiprocessing queues (one per rank; both
encoders put (embeddings, meta) into each, CUDA IPC underneath), and both runs print the
items per second at the ranks and the hand-over latency p50/p99: from the encoder's send (its
stream synchronised first, so the encoder's own GPU work is not counted) to the rank holding
the tensor, its stream synchronised. Every tensor is verified in every rank (an integer
checksum of its bytes, computed on the GPU at both ends); the program exits 1 on any mismatch
or missing item. Where torch, a GPU or both timm and transformers are missing it prints
"skipped: ..." and exits 0. Same-GPU numbers want MPS (scripts/gpu-check runs it under MPS).
"""

import argparse
import multiprocessing as mp
import sys
import threading
import time

ENCODERS = 2
RANKS = 4
PATCHES, WIDTH, PROJECTED = 196, 768, 4096


def missing():
    """What this machine lacks for the example (None: nothing)."""
    try:
        import torch
    except ImportError:
        return "torch"
    if not torch.cuda.is_available():
        return "a GPU"
    for name in ("timm", "transformers"):
        try:
            __import__(name)
            return None
        except ImportError:
            pass
    return "timm or transformers"


def build_encoder(device):
    """A ViT-B/16 with random weights (no download), bf16, eval mode: images -> patch
    embeddings (batch, 196, 768)."""
    import torch
    torch.manual_seed(device)
    try:
        import timm
        model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0)

        def patches(m, x):
            return m.forward_features(x)[:, m.num_prefix_tokens:]
    except ImportError:
        from transformers import ViTConfig, ViTModel
        model = ViTModel(ViTConfig(image_size=224, patch_size=16), add_pooling_layer=False)

        def patches(m, x):
            return m(pixel_values=x).last_hidden_state[:, 1:]
    model = model.to(device=f"cuda:{device}", dtype=torch.bfloat16).eval()
    return model, patches


_WEIGHTS = {}


def checksum(t):
    """An order-sensitive integer checksum of a bf16 tensor's bytes, on its GPU."""
    import torch
    v = t.reshape(-1).view(torch.int16).to(torch.int64)
    w = _WEIGHTS.get((v.numel(), v.device))
    if w is None:
        w = _WEIGHTS[(v.numel(), v.device)] = torch.arange(v.numel(), device=v.device) % 251 + 1
    return int((v * w).sum().item())


# ---- encoders ----------------------------------------------------------------------------

def encoder(index, transport, conn, queues, batches, batch, device):
    """Encodes `batches` batches of random images and sends every batch's patch embeddings
    with meta (encoder, batch index, checksum, send time in ns) to every rank."""
    import torch

    import ferry
    torch.cuda.set_device(device)
    model, patches = build_encoder(device)
    images = torch.randn(batch, 3, 224, 224, device=f"cuda:{device}", dtype=torch.bfloat16)
    stream = torch.cuda.current_stream(device)
    pool = None
    if transport == "ferry":
        # Room for ~16 batches; a rank that falls behind makes send wait (on_full="wait").
        pool = ferry.Pool(16 * batch * PATCHES * WIDTH * 2 + (4 << 20), RANKS, device=device,
                          on_full="wait", timeout=60, drain_timeout=60)
        conn.send(pool.address)
    else:
        conn.send(None)
    conn.recv()  # go: every rank is connected
    with torch.no_grad():  # (inference tensors cannot go through torch's CUDA IPC)
        for b in range(batches):
            images.normal_()
            emb = patches(model, images).contiguous()
            meta = torch.tensor([index, b, checksum(emb), 0], dtype=torch.int64)
            stream.synchronize()  # the encoder's work done: the hand-over starts here
            meta[3] = time.monotonic_ns()
            if pool is not None:
                pool.send([emb, meta], stream=stream)  # one lease, every rank's ring
            else:
                for q in queues:
                    q.put((emb, meta))
    if pool is not None:
        pool.close(drain=True)  # every rank read everything; then they see the end
    else:
        for q in queues:
            q.put(None)
    conn.send("done")
    conn.recv()  # torch's CUDA IPC: keep the tensors' memory until the ranks let go


# ---- ranks -----------------------------------------------------------------------------

class Rank:
    """What one rank received: latencies, items, checksum failures."""

    def __init__(self, rank, device):
        import torch
        self.rank, self.device = rank, device
        self.lock = threading.Lock()
        self.latencies, self.seen, self.bad = [], set(), []
        self.first = self.last = None
        self.proj = torch.nn.Linear(WIDTH, PROJECTED, device=f"cuda:{device}",
                                    dtype=torch.bfloat16)

    def take(self, emb, meta, stream):
        """A received item: its latency (the rank's stream synchronised), its check, the
        projection."""
        import torch
        stream.synchronize()
        now = time.monotonic_ns()
        enc, b, expected, sent = (int(v) for v in meta.tolist())
        ok = emb.shape[1:] == (PATCHES, WIDTH) and checksum(emb) == expected
        with torch.no_grad():
            self.proj(emb)  # the model worker's first use of the features
        with self.lock:
            self.latencies.append((now - sent) / 1e3)
            self.first = self.first or now
            self.last = now
            if not ok:
                self.bad.append((enc, b))
            self.seen.add((enc, b))


def rank_main(rank, transport, addresses, queue, conn, device):
    import torch

    import ferry
    torch.cuda.set_device(device)
    r = Rank(rank, device)
    receivers = [ferry.connect(a, rank, device=device, torch=True) for a in addresses or []]
    conn.send("connected")

    def drain(rx):
        stream = torch.cuda.Stream(device=device)
        with torch.cuda.stream(stream):
            for emb, meta in rx:  # until the encoder closes its pool
                r.take(emb, meta, stream)

    if transport == "ferry":
        threads = [threading.Thread(target=drain, args=(rx,)) for rx in receivers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        stream = torch.cuda.current_stream(device)
        ended = 0
        while ended < ENCODERS:
            item = queue.get()
            if item is None:
                ended += 1
                continue
            r.take(item[0], item[1], stream)
            del item
    conn.send((r.latencies, sorted(r.seen), r.bad, r.first, r.last))


# ---- the run -------------------------------------------------------------------------------

def run(transport, batches, batch, device):
    """One run: encoders and ranks spawned, the encoders released once every rank is
    connected. Returns the ranks' reports."""
    ctx = mp.get_context("spawn")
    if transport == "torch":
        import torch.multiprocessing as tmp
        ctx = tmp.get_context("spawn")
    queues = [ctx.Queue() for _ in range(RANKS)] if transport == "torch" else []
    enc_conns, encoders = [], []
    for i in range(ENCODERS):
        here, there = ctx.Pipe()
        p = ctx.Process(target=encoder,
                        args=(i, transport, there, queues, batches, batch, device))
        p.start()
        enc_conns.append(here)
        encoders.append(p)
    addresses = [c.recv() for c in enc_conns]
    rank_conns, ranks = [], []
    for r in range(RANKS):
        here, there = ctx.Pipe()
        p = ctx.Process(target=rank_main,
                        args=(r, transport, addresses if transport == "ferry" else None,
                              queues[r] if queues else None, there, device))
        p.start()
        rank_conns.append(here)
        ranks.append(p)
    for c in rank_conns:
        assert c.recv() == "connected"
    for c in enc_conns:
        c.send("go")
    reports = [c.recv() for c in rank_conns]
    for c in enc_conns:
        assert c.recv() == "done"
        c.send("exit")
    for p in encoders + ranks:
        p.join(60)
    return reports


def summary(transport, reports, batches, batch):
    expected = {(e, b) for e in range(ENCODERS) for b in range(batches)}
    errors = []
    for rank, (lat, seen, bad, _, _) in enumerate(reports):
        if set(map(tuple, seen)) != expected:
            errors.append(f"rank {rank} got {len(seen)} of {len(expected)} items")
        if bad:
            errors.append(f"rank {rank}: checksum mismatch in {len(bad)} items")
    lat = sorted(v for r in reports for v in r[0])
    span = (max(r[4] for r in reports) - min(r[3] for r in reports)) / 1e9
    items = ENCODERS * batches
    line = (f"{transport:6s} {items / span:9.1f} items/s ({items * batch / span:8.1f} images/s) "
            f"hand-over p50 {lat[len(lat) // 2]:8.1f} us  p99 "
            f"{lat[min(len(lat) - 1, int(len(lat) * 0.99))]:8.1f} us  "
            f"({len(lat)} tensors verified at {RANKS} ranks)")
    return line, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=150, help="batches per encoder")
    ap.add_argument("--batch", type=int, default=8, help="images per batch")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()
    lack = missing()
    if lack:
        print(f"skipped: needs torch, a GPU and timm or transformers ({lack} missing)")
        return 0
    import torch
    print(f"{ENCODERS} encoders -> {RANKS} ranks on {torch.cuda.get_device_name(args.device)}, "
          f"{args.batches} batches of {args.batch} images per encoder, embeddings "
          f"{args.batch}x{PATCHES}x{WIDTH} bf16 ({args.batch * PATCHES * WIDTH * 2 >> 10} KiB)")
    failed = False
    for transport in ("ferry", "torch"):
        line, errors = summary(transport, run(transport, args.batches, args.batch, args.device),
                               args.batches, args.batch)
        print(line, flush=True)
        for e in errors:
            print(f"{transport}: {e}", file=sys.stderr)
        failed |= bool(errors)
    if failed:
        return 1
    print("multimodal features ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
