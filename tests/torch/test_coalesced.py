"""The coalesced collectives torch.distributed calls on a backend (all_reduce_coalesced, all_gather_coalesced,
batch_isend_irecv's coalescing) on backend "trident" at world sizes 1, 2, 3, each checked against gloo running
the same calls on the same inputs (and against values computed here)."""
import sys

import torch
import torch.distributed as dist

from harness import spawn

SHAPES = [(3, 5), (1,), (0,), (7,), (2, 2, 3)]  # odd sizes, an empty one, several ranks of shapes


def inputs(rank, dtype, salt=0):
    out = []
    for k, shape in enumerate(SHAPES):
        n = 1
        for d in shape:
            n *= d
        v = (torch.arange(n, dtype=torch.int64) + rank + salt + k) % 3 + 1  # small integers: exact in any order
        out.append(v.view(shape).to(dtype))
    return out


def calls(rank, world):
    """Every coalesced call; returns what this rank received, as plain lists (compared across backends)."""
    got = []
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
            ts = inputs(rank, dtype)
            dist.all_reduce_coalesced(ts, op=op)
            got.append([t.tolist() for t in ts])
        # all_gather_coalesced: outs[r][i] is rank r's input i
        ins = inputs(rank, dtype, salt=1)
        outs = [[torch.full(t.shape, -1, dtype=dtype) for t in ins] for _ in range(world)]
        dist.all_gather_coalesced(outs, ins)
        for r in range(world):
            for i, want in enumerate(inputs(r, dtype, salt=1)):
                assert torch.equal(outs[r][i], want), f"all_gather_coalesced [{r}][{i}] {dtype} rank {rank}"
        got.append([[t.tolist() for t in l] for l in outs])
        # Async form: the future carries the outputs.
        ts = inputs(rank, dtype, salt=2)
        fut = dist.all_reduce_coalesced(ts, async_op=True)
        fut.wait()
        got.append([t.tolist() for t in ts])
    # Non-contiguous members of a coalesced all_reduce are written back in place.
    m = torch.arange(6, dtype=torch.float32).view(2, 3).t() * (rank + 1)
    v = torch.ones(4, dtype=torch.float32)
    dist.all_reduce_coalesced([m, v])
    got.append([m.tolist(), v.tolist()])
    # batch_isend_irecv (torch's coalescing manager): a ring exchange, tagged.
    if world > 1:
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        send = torch.arange(9, dtype=torch.float32) + 10 * rank
        recv = torch.empty(9, dtype=torch.float32)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt, tag=3), dist.P2POp(dist.irecv, recv, prv, tag=3)])
        for q in reqs:
            q.wait()
        assert torch.equal(recv, torch.arange(9, dtype=torch.float32) + 10 * prv), f"batch_isend_irecv rank {rank}"
        got.append(recv.tolist())
    return got


def refused(rank, world):
    """What the backend cannot do is refused with a message naming it."""
    try:
        dist.all_reduce_coalesced([torch.ones(2), torch.ones(2)], op=dist.ReduceOp.BXOR)
        raise AssertionError("BXOR was accepted")
    except RuntimeError as e:
        assert "trident" in str(e) and "BXOR" in str(e), str(e)
    outs = [[torch.empty(3)] for _ in range(world)]
    outs[0][0] = torch.empty(4)  # wrong size
    try:
        dist.all_gather_coalesced(outs, [torch.ones(3)])
        raise AssertionError("a wrong-sized output was accepted")
    except RuntimeError as e:
        assert "all_gather_coalesced" in str(e) and "[0][0]" in str(e), str(e)
    return True


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", message=".*_coalesced will be deprecated.*")
    worlds = [int(w) for w in sys.argv[1:]] or [1, 2, 3]
    for w in worlds:
        tri = spawn(calls, w, "trident", timeout=120)
        glo = spawn(calls, w, "gloo", timeout=120)
        for r in range(w):
            assert tri[r] == glo[r], f"world {w} rank {r}: trident and gloo differ"
        spawn(refused, w, "trident", timeout=60)
        print(f"world {w}: coalesced calls equal gloo's on every rank")
    print("PASS")
