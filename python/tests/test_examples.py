"""Every example under examples/python runs as written, and says what it did."""

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"


def run(name, *args, timeout=180):
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=EXAMPLES)
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)  # the numbers, in the log of a run with -s (scripts/gpu-check)
    return done.stdout


def skipped(out):
    if out.startswith("skipped: "):
        pytest.skip(f"the example skipped itself: {out.strip()[len('skipped: '):]}")


def test_host_roundtrip():
    out = run("host_roundtrip.py")
    assert "ferry.Pool(backend='host', size='64MiB', consumers=2" in out
    assert "consumer 0: sum 7340032 (expected 7340032) ok" in out
    assert "consumer 1: sum 7340032 (expected 7340032) ok" in out
    assert out.rstrip().endswith("host round trip ok")


def test_torch_gpu():
    out = run("torch_gpu.py")
    try:
        import torch
        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if not gpu:
        assert out.strip() == "skipped: needs torch and a GPU"
        pytest.skip("the example skipped itself: needs torch and a GPU")
    assert out.rstrip().endswith("torch GPU hand-over ok")


def test_multimodal_features():
    out = run("multimodal_features.py", timeout=300)
    skipped(out)
    lines = out.splitlines()
    for transport in ("ferry", "torch"):
        row = next(line for line in lines if line.startswith(transport + " "))
        assert "items/s" in row and "p50" in row and "p99" in row
        assert "tensors verified at 4 ranks" in row
    assert out.rstrip().endswith("multimodal features ok")


def test_weight_sync():
    out = run("weight_sync.py", timeout=420)
    skipped(out)
    for what in ("ferry (pool, recv(out=params))", "torch CUDA IPC reductions",
                 "staging through host memory"):
        row = next(line for line in out.splitlines() if line.startswith(what))
        assert "s/sync" in row and "GB/s" in row and "verified" in row
    assert "(flat)" in out and "(reclaimed)" in out and "took rank 0 over" in out
    assert out.rstrip().endswith("weight sync ok")
