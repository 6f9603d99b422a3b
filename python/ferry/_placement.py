"""Where an engine adapter's rank reads a pool from (ferry.sglang, ferry.vllm): mapped, on
the producer's node, or over UCX through a connection to the pool's remote address."""

from __future__ import annotations

import os
import socket
import threading
from typing import Optional

import ferry

_node: Optional[str] = None


def node_id() -> str:
    """Where a mapped ferry pool can be opened: this boot of this machine, seen from this
    process's IPC and network namespaces (shared memory segments and abstract sockets live
    there). Two processes with the same id read a pool mapped; others read it over UCX. Read
    once per process."""
    global _node
    if _node is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot = f.read().strip()
        except OSError:
            boot = socket.gethostname()
        parts = [boot]
        for ns in ("ipc", "net"):
            try:
                parts.append(str(os.stat(f"/proc/self/ns/{ns}").st_ino))
            except OSError:
                parts.append("?")
        _node = ":".join(parts)
    return _node


_receivers: dict[tuple[str, int, Optional[int]], ferry.Receiver] = {}
_receivers_lock = threading.Lock()


def _receiver(address: str, rank: int, device: Optional[int]) -> ferry.Receiver:
    """This process's connection to a remote pool as rank (one per pool, rank and GPU; None:
    a host pool's)."""
    key = (address, rank, device)
    with _receivers_lock:
        rx = _receivers.get(key)
        if rx is None or rx.closed:
            rx = _receivers[key] = ferry.connect(address, rank=rank, device=device)
        return rx


def _reader(node: str, remote: Optional[str], rank: int,
            device: Optional[int]) -> Optional[ferry.Receiver]:
    """None where the pool is mapped here (node is this process's), else the connection to
    its remote address. RuntimeError for a pool elsewhere that serves no other host."""
    if node == node_id():
        return None
    if remote is None:
        raise RuntimeError("ferry: the pool is on another host and serves none: its producer "
                           "must make it with listen= (FERRY_SGLANG_LISTEN, or the vLLM "
                           "connector's extra config listen)")
    return _receiver(remote, rank, device)


def receive(d: ferry.Descriptor, *, node: str, remote: Optional[str], rank: int,
            device: Optional[int], **kwargs):
    """Reads lease d as rank, from where this process reads the pool (ferry.receive's
    keywords; device None: a host pool's)."""
    rx = _reader(node, remote, rank, device)
    if rx is None:
        return ferry.receive(d, rank=rank, device=device, **kwargs)
    return rx.receive(d, **kwargs)


def ack(d: ferry.Descriptor, *, node: str, remote: Optional[str], rank: int,
        device: Optional[int], ranks: Optional[range] = None, lease: bool = False) -> None:
    """Acknowledges lease d for ranks (default: rank's alone) without reading it, from where
    this process reads the pool; lease: the whole lease d is part of."""
    ranks = range(rank, rank + 1) if ranks is None else ranks
    rx = _reader(node, remote, rank, device)
    if rx is None:
        ferry.ack(d, ranks=ranks, device=device, lease=lease)
    else:
        rx.ack(d, ranks=ranks, lease=lease)


def close_receivers() -> None:
    """Closes this process's connections to remote pools (the proxies reconnect on use)."""
    with _receivers_lock:
        for rx in _receivers.values():
            rx.close()
        _receivers.clear()


_raw_stream = None


def current_stream(device: int) -> int:
    """torch's current CUDA stream on device, as a handle: torch's raw getter (under 1 us),
    where ``torch.cuda.current_stream(device)`` builds a Stream object (about 6 us on the GPU
    machine, twice per hand-over)."""
    global _raw_stream
    if _raw_stream is None:
        import torch
        getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _raw_stream = getter or (lambda d: torch.cuda.current_stream(d).cuda_stream)
    return _raw_stream(device)
