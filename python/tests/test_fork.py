"""fork(): a consumer process that forks. The child receives with consumers of its own (its
parent's cached ones hold the parent's rank claims), cannot take a rank its live parent holds,
is refused the pool it inherited, and dropping that pool there leaves the parent's alone."""

import numpy as np

import ferry


def test_forked_child(worker):
    with ferry.Pool(1 << 20, 1, drain_timeout=0) as a, ferry.Pool(1 << 20, 1) as b:
        cached, claimed = a.publish(np.arange(2)), a.publish(np.arange(3))
        fresh = b.publish(np.arange(4))
        seen = worker.call("fork_and_receive", cached, claimed, fresh, 0)
        child = seen["child"]
        assert seen["status"] == 0
        assert child["fresh"] == ["ok", [0, 1, 2, 3]]  # a consumer of the child's own
        name, status, message = child["claimed"]
        assert (name, status) == ("RankInUse", "RANK_IN_USE")
        assert str(worker.pid) in message
        name, status, message = child["publish"]
        assert (name, status) == ("Forked", "FORKED") and "forked child" in message
        # The child's dropping the inherited pool closed nothing: the parent still uses it.
        assert seen["after"] == list(range(7)) and seen["first"] == list(range(5))
        assert b.consumer_info(0)["outstanding"] == 0
        assert a.consumer_info(0)["pid"] == worker.pid and a.consumer_info(0)["outstanding"] == 1
