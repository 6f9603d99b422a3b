"""Ctrl-C: a process blocked in a receive that waits forever, or in a publish or reserve that
waits for space, gets SIGINT: the call raises KeyboardInterrupt within about a second and
leaves nothing half-done (no lease taken, nothing read or acknowledged)."""

import queue
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ferry
from conftest import TESTS


class Child:
    """python -c workers.interruptible(...), its stdout read line by line on a thread."""

    def __init__(self, *args):
        code = "import sys, workers; workers.interruptible(*sys.argv[1:])"
        self.process = subprocess.Popen([sys.executable, "-c", code, *args], cwd=TESTS,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.put(line.strip().split(maxsplit=1))

    def line(self, timeout):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def interrupt(self):
        """SIGINT once the call is surely blocked in the library: seconds until it raised."""
        assert self.line(60) == ["blocking"]
        time.sleep(0.5)
        start = time.monotonic()
        self.process.send_signal(signal.SIGINT)
        got = self.line(5)
        assert got == ["interrupted"], (got, self.finish())
        return time.monotonic() - start

    def go(self):
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        return self.line(30)

    def finish(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)
        return self.process.stderr.read()


@pytest.mark.parametrize("op", ["receive", "receive_many", "receive_out"])
def test_receive_waiting_forever_is_interrupted(op):
    with ferry.Pool(1 << 20, 1) as pool:
        r = pool.reserve((4,), "float32")
        child = Child(op, bytes(r.descriptor).hex())
        try:
            assert child.interrupt() < 1.0
            np.from_dlpack(r)[:] = np.arange(4)
            r.commit()
            # Not read nor acknowledged by the interrupted call: the same process gets it.
            expected = [0.0, 1.0, 2.0, 3.0]
            assert child.go() == ["again", str([expected] if op == "receive_many" else expected)]
            assert child.process.wait(30) == 0
        finally:
            child.finish()


@pytest.mark.parametrize("op", ["publish", "publish_many", "reserve"])
def test_wait_for_space_is_interrupted(op):
    child = Child(op)
    try:
        assert child.interrupt() < 1.0
        assert child.line(30) == ["stats", "1 1"]  # only the first lease; nothing leaked
        assert child.go() == ["again", "[(1024,)]" if op == "publish_many" else "(1024,)"]
        assert child.process.wait(30) == 0
    finally:
        child.finish()
