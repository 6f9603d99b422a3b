"""Two "hosts" for tests of consumers on other hosts: two network namespaces joined by a veth
pair where the test can make them (root with `ip`), loopback twice otherwise."""

import ctypes
import os
import shutil
import subprocess
import sys


def have_ucx():
    """Whether UCX (libucp.so.0, or $FERRY_UCX_LIBRARY) can be loaded."""
    try:
        ctypes.CDLL(os.environ.get("FERRY_UCX_LIBRARY") or "libucp.so.0")
        return True
    except OSError:
        return False


class Hosts:
    """Two network namespaces joined by a veth pair (root), else loopback twice."""

    def __init__(self):
        pid = os.getpid()
        self.ns = [f"fypy-{pid}-a", f"fypy-{pid}-b"]
        self.dev = [f"fpa{pid % 100000}", f"fpb{pid % 100000}"]
        x = pid % 250 + 1
        self.ip = [f"10.232.{x}.1", f"10.232.{x}.2"]
        self.netns = os.geteuid() == 0 and shutil.which("ip") is not None
        if self.netns and not self._up():
            self.down()
            self.netns = False
        if not self.netns:
            self.ip = ["127.0.0.1", "127.0.0.1"]

    def _up(self):
        a, b = self.ns
        da, db = self.dev
        cmds = [f"ip netns add {a}", f"ip netns add {b}",
                f"ip link add {da} type veth peer name {db}",
                f"ip link set {da} netns {a}", f"ip link set {db} netns {b}",
                f"ip -n {a} addr add {self.ip[0]}/30 dev {da}",
                f"ip -n {b} addr add {self.ip[1]}/30 dev {db}",
                f"ip -n {a} link set {da} up", f"ip -n {b} link set {db} up",
                f"ip -n {a} link set lo up", f"ip -n {b} link set lo up"]
        return all(subprocess.run(c.split(), capture_output=True).returncode == 0 for c in cmds)

    def down(self):
        if not self.netns:
            return
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def run(self, side, args, env=None, stdin=None):
        """Starts `python args` on host side (0 or 1), UCX on its link; text pipes."""
        env = dict(os.environ, UCX_TLS="tcp",
                   UCX_NET_DEVICES=self.dev[side] if self.netns else "lo", **(env or {}))
        prefix = ["ip", "netns", "exec", self.ns[side]] if self.netns else []
        return subprocess.Popen(prefix + [sys.executable] + args, env=env, text=True,
                                stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def hand_over(self, producer, consumer, producer_env=None):
        """Runs producer (python arguments) on host 0 and, with the first line it prints,
        consumer(line) -> (arguments, stdin text or None) on host 1. The consumer must exit 0;
        then the producer is told "done", must print 0 (its leases in flight once drained)
        and exit 0. Returns what the consumer printed."""
        prod = self.run(0, producer, env=producer_env, stdin=subprocess.PIPE)
        first = prod.stdout.readline()
        assert first.strip(), prod.stderr.read()
        args, text = consumer(first.strip())
        cons = self.run(1, args, stdin=subprocess.PIPE if text is not None else None)
        out, err = cons.communicate(text, timeout=120)
        assert cons.returncode == 0, err
        prod.stdin.write("done\n")
        prod.stdin.flush()
        assert prod.stdout.readline().strip() == "0"
        assert prod.wait(timeout=60) == 0, prod.stderr.read()
        return out
