"""Shared fixtures: consumer worker processes (spawned once per session) and small helpers."""

import builtins
import json
import multiprocessing
import os
import pathlib
import subprocess
import sys
import time

import pytest

import ferry
import workers

# The remote path is what the remote tests test, on one host: a consumer of this host's pool
# by its remote address would open it through its broker instead (test_remote.py's
# test_same_host_receiver_maps_the_pool asks for that).
os.environ["FERRY_REMOTE_LOCAL"] = "0"

CTX = multiprocessing.get_context("spawn")
TESTS = pathlib.Path(__file__).resolve().parent


class Worker:
    """A spawned consumer process that runs workers.OPS on request."""

    def __init__(self, env=None):
        self.conn, child = CTX.Pipe()
        self.process = CTX.Process(target=workers.serve, args=(child, env), daemon=True)
        self.process.start()
        child.close()
        self.pid = self.call("pid")

    def submit(self, op, *args, **kwargs):
        self.conn.send((op, args, kwargs))

    def result(self, timeout=60):
        if not self.conn.poll(timeout):
            raise TimeoutError("the worker did not answer")
        answer = self.conn.recv()
        if answer[0] == "ok":
            return answer[1]
        _, name, message, status = answer
        cls = getattr(ferry, name, None) or getattr(builtins, name, RuntimeError)
        exc = cls(message)
        exc.status = status
        raise exc

    def call(self, op, *args, **kwargs):
        self.submit(op, *args, **kwargs)
        return self.result()

    def stop(self):
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()


@pytest.fixture(scope="session")
def workers_pair():
    pair = [Worker(), Worker()]
    yield pair
    for w in pair:
        w.stop()


@pytest.fixture
def worker(workers_pair):
    return workers_pair[0]


def wait_until(condition, timeout=5.0, interval=0.005):
    """Polls condition() until it is true; fails the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    assert condition(), "condition not met in time"


def in_flight(pool):
    return pool.stats()["leases_in_flight"]


def isolated(op, *args, env=None, timeout=60):
    """Runs workers.<op>(*args) in a fresh interpreter (for what may crash it, or needs an
    environment of its own: PYTHONMALLOC=debug finds use-after-free). Returns its exit status,
    what it returned (None unless it returned) and its stderr."""
    code = ("import json, sys, workers; "
            "print(json.dumps(getattr(workers, sys.argv[1])(*json.loads(sys.argv[2]))))")
    done = subprocess.run([sys.executable, "-c", code, op, json.dumps(args)], cwd=TESTS,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    return done.returncode, result, done.stderr
