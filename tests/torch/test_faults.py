"""trident's guarantees through torch.distributed: a dead peer and an expired deadline raise RuntimeError naming
the rank and the collective; ranks that issue different collectives each get an error naming what each issued.
The group deadline is long (120 s) in the dead-peer and mismatch cases, so an error there comes from trident's
detection, not from the deadline."""
import datetime
import os
import time

import torch
import torch.distributed as dist

from harness import spawn


def dead_peer(rank, world):
    dist.all_reduce(torch.ones(4))
    if rank == 1:
        os._exit(3)  # dies without a word
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1 << 16))
    except RuntimeError as e:
        return str(e), time.monotonic() - t0
    raise AssertionError("all_reduce with a dead peer returned")


def deadline(rank, world):
    dist.all_reduce(torch.ones(4))
    if rank == 1:
        time.sleep(8)  # alive, but never joins the next collective
        return "slept", 0.0
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError as e:
        return str(e), time.monotonic() - t0
    raise AssertionError("all_reduce past its deadline returned")


def mismatch(rank, world):
    dist.all_reduce(torch.ones(4))
    t = torch.ones(4)
    t0 = time.monotonic()
    try:
        if rank == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=0)
    except RuntimeError as e:
        return str(e), time.monotonic() - t0
    raise AssertionError("mismatched collectives returned")


if __name__ == "__main__":
    long = datetime.timedelta(seconds=120)
    msg, s = spawn(dead_peer, 3, dying=(1,), init_timeout=long)[0]
    print(f"dead peer: rank 0 raised after {s:.2f} s: {msg.splitlines()[0]}")
    assert "rank 1" in msg and "all_reduce" in msg and "died" in msg, msg

    res = spawn(deadline, 2, init_timeout=datetime.timedelta(seconds=3))
    msg, s = res[0]
    print(f"deadline: rank 0 raised after {s:.2f} s: {msg.splitlines()[0]}")
    assert "all_reduce" in msg and "rank 0" in msg and ("timed out" in msg or "deadline" in msg or "timeout" in msg), msg

    res = spawn(mismatch, 2, init_timeout=long)
    for r in (0, 1):
        msg, s = res[r]
        print(f"mismatch: rank {r} raised after {s:.2f} s: {msg.splitlines()[0]}")
        assert "all_reduce" in msg and "broadcast" in msg, msg
    print("PASS")
