"""Every example under examples/python runs as written, and says what it did."""

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"


def run(name):
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True,
                          text=True, timeout=180, cwd=EXAMPLES)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


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
