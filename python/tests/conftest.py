"""Shared fixtures: consumer worker processes (spawned once per session) and small helpers."""

import builtins
import multiprocessing
import time

import pytest

import ferry
import workers

CTX = multiprocessing.get_context("spawn")


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
