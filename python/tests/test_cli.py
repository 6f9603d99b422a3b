"""python -m ferry doctor|bench|version, and the ferry console script."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import ferry
from ferry import cli


def run(*args, exe=None):
    cmd = [exe] if exe else [sys.executable, "-m", "ferry"]
    done = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120,
                          cwd=pathlib.Path(__file__).parent)
    return done.returncode, done.stdout, done.stderr


def test_version():
    rc, out, err = run("version")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("ferry-tensors ")
    assert lines[1] == f"libferry {ferry.version()}"
    assert any(line.startswith("numpy ") for line in lines)
    assert run("--version")[1] == out


def test_doctor_text_and_json():
    rc, out, err = run("doctor")
    assert rc == 0, err
    assert out.strip() == ferry.doctor().strip() and out.strip()
    rc, out, err = run("doctor", "--json")
    assert rc == 0, err
    assert isinstance(json.loads(out), dict)


def test_unknown_command_is_an_error():
    rc, out, err = run("frobnicate")
    assert rc == 2 and "invalid choice" in err


def test_host_bench():
    rc, out, err = run("bench", "--host", "--sizes", "4KiB,64KiB", "--iterations", "20")
    assert rc == 0, err
    assert "pickle/ferry" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("4KiB",
                                                                                 "64KiB"))]
    assert [r[0] for r in rows] == ["4KiB", "64KiB"] and all(len(r) == 5 for r in rows)


def test_python_bench_on_the_cpu(tmp_path):
    # python -m ferry.bench --cpu: every method but torch's, from the same consumer processes,
    # each row against the floor of its size, every warm-up item verified by the consumers.
    out_json = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "ferry.bench", "--cpu", "--sizes", "4KiB,96KiB",
                           "--consumers", "1,2", "--iterations", "20", "--warmup", "2",
                           "--row-budget", "120", "--json", str(out_json)],
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    from ferry.bench import METHODS

    report = json.loads(out_json.read_text())
    results = report["results"]
    # ferry_remote (its consumers remote ones, over UCX) runs wherever UCX loads.
    cpu_methods = [m for m in METHODS if not m.startswith("torch") and m not in report["skipped"]]
    assert set(report["skipped"]) <= {"ferry_remote"}
    assert all("need UCX" in why for why in report["skipped"].values())
    assert [(r["method"], r["size"], r["consumers"]) for r in results] == [
        (m, size, n) for n in (1, 2) for size in (4096, 96 << 10) for m in cpu_methods]
    assert all(r["items"] == 20 and 0 < r["p50_us"] <= r["p99_us"] for r in results)
    assert all(r["x_floor"] == r["p50_us"] / next(
        f["p50_us"] for f in results if f["method"] == "floor" and f["size"] == r["size"] and
        f["consumers"] == r["consumers"]) for r in results)
    assert "x floor" in done.stdout and "ferry_channel_drain" in done.stdout
    # A row past its budget times fewer items, 5 at least.
    done = subprocess.run([sys.executable, "-m", "ferry.bench", "--cpu", "--sizes", "4KiB",
                           "--consumers", "1", "--methods", "floor,ferry_out", "--row-budget",
                           "0", "--json", str(out_json)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert [r["items"] for r in json.loads(out_json.read_text())["results"]] == [5, 5]
    # Without UCX, ferry_remote's rows are skipped with the library's reason.
    done = subprocess.run([sys.executable, "-m", "ferry.bench", "--cpu", "--sizes", "4KiB",
                           "--consumers", "1", "--methods", "floor,ferry_remote", "--json",
                           str(out_json)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FERRY_UCX_LIBRARY": "/nonexistent/libucp.so.0"})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out_json.read_text())
    assert [r["method"] for r in report["results"]] == ["floor"]
    assert "remote pools need UCX: /nonexistent/libucp.so.0" in report["skipped"]["ferry_remote"]
    assert "ferry_remote         skipped: " in done.stdout
    bad = subprocess.run([sys.executable, "-m", "ferry.bench", "--cpu", "--methods", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown method(s) nope" in bad.stderr


def test_bench_help():
    rc, out, err = run("bench", "--help")
    assert rc == 0, err
    assert "--host" in out and "--sizes" in out


@pytest.mark.skipif(cli.gpu_missing() is None, reason="torch has a GPU here")
def test_gpu_bench_without_gpu_says_what_it_needs():
    rc, out, err = run("bench", "--sizes", "4KiB", "--iterations", "10")
    assert rc == 0, err
    assert "needs torch with CUDA and a GPU" in err and "Traceback" not in err
    assert "pickle/ferry" in out  # the host bench ran instead
    done = subprocess.run([sys.executable, "-m", "ferry.bench"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "needs torch with CUDA and a GPU" in done.stderr
    assert "ferry bench --host" in done.stderr and "Traceback" not in done.stderr


def test_console_script():
    script = pathlib.Path(sys.executable).parent / "ferry"
    if not script.exists():
        pytest.skip(f"no console script next to {sys.executable}")
    rc, out, err = run("version", exe=str(script))
    assert rc == 0, err and out.startswith("ferry-tensors ")
    assert os.access(script, os.X_OK)
