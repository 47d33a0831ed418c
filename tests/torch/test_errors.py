"""trident's errors through torch.distributed carry c10d's words for the conditions PyTorch's own backends name,
besides trident's detail (the rank, the call, its sequence number, the ranks not heard from), at 3 ranks:

- a barrier past its deadline, and Work.wait(timeout) of one: PyTorch's tests match " (Timed out|closed|timeout) "
  (distributed_test.py, _test_barrier_timeout), gloo says "Timed out waiting ...";
- a receive past its deadline: the same words, and the rank not heard from;
- a peer that dies during a collective: "Connection closed by peer" (gloo's words) and "Rank N failed"."""
import datetime
import os
import re
import time

import torch
import torch.distributed as dist

from harness import spawn

C10D_TIMEOUT = re.compile(" (Timed out|closed|timeout) ")  # PyTorch's own check, distributed_test.py


def barrier_deadline(rank, world):
    dist.all_reduce(torch.ones(2))
    if rank == world - 1:
        time.sleep(7)  # alive, but never joins the barrier
        return None
    w = dist.barrier(async_op=True)
    t0 = time.monotonic()
    try:
        w.wait(timeout=datetime.timedelta(seconds=1))
        raise AssertionError("Work.wait(1 s) of a barrier that cannot complete returned")
    except RuntimeError as e:
        short = str(e)
    try:
        w.wait()
        raise AssertionError("a barrier past its deadline returned")
    except RuntimeError as e:
        return short, str(e), time.monotonic() - t0


def recv_deadline(rank, world):
    dist.all_reduce(torch.ones(2))
    if rank != 0:
        time.sleep(6)
        return None
    try:
        dist.recv(torch.empty(3), src=1)
        raise AssertionError("a receive past its deadline returned")
    except RuntimeError as e:
        return str(e)


def dead_peer(rank, world):
    dist.all_reduce(torch.ones(2))
    if rank == 1:
        os._exit(3)  # dies without a word
    try:
        dist.all_reduce(torch.ones(1 << 12))
        raise AssertionError("all_reduce with a dead peer returned")
    except RuntimeError as e:
        return str(e)


def check(cond, what, msg):
    assert cond, f"{what}: {msg}"


if __name__ == "__main__":
    world = 3
    res = spawn(barrier_deadline, world, init_timeout=datetime.timedelta(seconds=3))
    for r in range(world - 1):
        short, full, s = res[r]
        print(f"barrier: rank {r}: Work.wait(1 s): {short.splitlines()[0]}")
        print(f"barrier: rank {r} after {s:.2f} s: {full.splitlines()[0]}")
        check(C10D_TIMEOUT.search(short) and "Timed out waiting" in short and "barrier" in short, "Work.wait", short)
        check(C10D_TIMEOUT.search(full), "barrier deadline: c10d's words", full)
        check("barrier" in full and f"rank {r}" in full and "not heard from: rank(s)" in full,
              "barrier deadline: trident's detail", full)
        check(2.0 < s < 30, "barrier deadline: raised at the deadline", f"{s:.2f} s")

    msg = spawn(recv_deadline, world, init_timeout=datetime.timedelta(seconds=3))[0]
    print(f"recv: rank 0: {msg.splitlines()[0]}")
    check(C10D_TIMEOUT.search(msg), "recv deadline: c10d's words", msg)
    check("recv" in msg and "not heard from: rank(s) 1" in msg, "recv deadline: trident's detail", msg)

    res = spawn(dead_peer, world, dying=(1,), init_timeout=datetime.timedelta(seconds=120))
    for r in (0, 2):
        msg = res[r]
        print(f"dead peer: rank {r}: {msg.splitlines()[0]}")
        check("Connection closed by peer" in msg and "Rank 1 failed" in msg and C10D_TIMEOUT.search(msg),
              "dead peer: c10d's words", msg)
        check("rank 1" in msg and "died" in msg and "all_reduce" in msg, "dead peer: trident's detail", msg)
    print("PASS")
