"""Every c10d collective through torch.distributed on backend "trident", at world sizes 1, 2, 3, 5, for each
dtype and for counts 0, 1, 7 and primes, against values computed here independently (small integers, so every
reduction is exact in any order)."""
import functools
import sys

import torch
import torch.distributed as dist

from harness import spawn

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int32, torch.int64,
          torch.uint8, torch.bool]
COUNTS = [0, 1, 7, 13, 1031]
OPS = {dist.ReduceOp.SUM: lambda a, b: a + b, dist.ReduceOp.PRODUCT: lambda a, b: a * b,
       dist.ReduceOp.MIN: torch.minimum, dist.ReduceOp.MAX: torch.maximum}


def value(rank, n, dtype, salt=0):
    """Rank `rank`'s input: small integers (1..3), or alternating booleans."""
    i = torch.arange(n, dtype=torch.int64)
    v = (i + rank + salt) % 3 + 1
    if dtype == torch.bool:
        return (v % 2) == 0
    return v.to(dtype)


def reduced(world, n, dtype, op, salt=0):
    xs = [value(r, n, dtype, salt) for r in range(world)]
    if dtype == torch.bool:  # sum/max = or, min/prod = and (torch's own bool semantics)
        f = torch.logical_or if op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX) else torch.logical_and
        return functools.reduce(f, xs)
    return functools.reduce(OPS[op], xs)  # in the dtype: int8/uint8 wrap as the backend's do


def same(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{tuple(got.shape)} vs {want.dtype}{tuple(want.shape)}"
    assert torch.equal(got, want), f"{what}: got {got[:8].tolist()} want {want[:8].tolist()}"


def sweep(rank, world):
    checked = 0
    for dtype in DTYPES:
        for n in COUNTS:
            tag = f"{dtype} n={n} world={world} rank={rank}"
            # broadcast from the last rank
            root = world - 1
            t = value(rank, n, dtype)
            dist.broadcast(t, src=root)
            same(t, value(root, n, dtype), f"broadcast {tag}")
            # all_reduce, every op
            for op in OPS:
                t = value(rank, n, dtype)
                dist.all_reduce(t, op=op)
                same(t, reduced(world, n, dtype, op), f"all_reduce {op} {tag}")
            if dtype.is_floating_point:
                t = value(rank, n, dtype)
                dist.all_reduce(t, op=dist.ReduceOp.AVG)
                want = (reduced(world, n, torch.float64, dist.ReduceOp.SUM) / world).to(dtype)
                assert torch.allclose(t.double(), want.double(), rtol=1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-12), f"avg {tag}"
            # reduce to rank 0
            t = value(rank, n, dtype)
            dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
            if rank == 0:
                same(t, reduced(world, n, dtype, dist.ReduceOp.SUM), f"reduce {tag}")
            # all_gather (list) and into one tensor
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, value(rank, n, dtype))
            for r in range(world):
                same(outs[r], value(r, n, dtype), f"all_gather[{r}] {tag}")
            big = torch.empty(n * world, dtype=dtype)
            dist.all_gather_into_tensor(big, value(rank, n, dtype))
            same(big, torch.cat([value(r, n, dtype) for r in range(world)]), f"all_gather_into_tensor {tag}")
            # gather to rank 1 % world, scatter from rank 0
            groot = 1 % world
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)] if rank == groot else None
            dist.gather(value(rank, n, dtype), gather_list=outs, dst=groot)
            if rank == groot:
                for r in range(world):
                    same(outs[r], value(r, n, dtype), f"gather[{r}] {tag}")
            t = torch.empty(n, dtype=dtype)
            dist.scatter(t, scatter_list=[value(r, n, dtype, salt=5) for r in range(world)] if rank == 0 else None, src=0)
            same(t, value(rank, n, dtype, salt=5), f"scatter {tag}")
            # reduce_scatter (list) and from one tensor: block j of rank r is value(r, n, salt=j)
            t = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(t, [value(rank, n, dtype, salt=j) for j in range(world)], op=dist.ReduceOp.MAX)
            same(t, reduced(world, n, dtype, dist.ReduceOp.MAX, salt=rank), f"reduce_scatter {tag}")
            t = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(t, torch.cat([value(rank, n, dtype, salt=j) for j in range(world)]))
            same(t, reduced(world, n, dtype, dist.ReduceOp.SUM, salt=rank), f"reduce_scatter_tensor {tag}")
            # all_to_all_single, equal splits: block j of rank r is value(r, n, salt=j)
            out = torch.empty(n * world, dtype=dtype)
            dist.all_to_all_single(out, torch.cat([value(rank, n, dtype, salt=j) for j in range(world)]))
            same(out, torch.cat([value(r, n, dtype, salt=rank) for r in range(world)]), f"all_to_all_single {tag}")
            # uneven splits: rank r sends (n + r + j) % 4 elements to rank j
            size = lambda src, dst: (n + src + dst) % 4  # noqa: E731
            inp = torch.cat([value(rank, size(rank, j), dtype, salt=j) for j in range(world)])
            out = torch.empty(sum(size(r, rank) for r in range(world)), dtype=dtype)
            dist.all_to_all_single(out, inp, output_split_sizes=[size(r, rank) for r in range(world)],
                                   input_split_sizes=[size(rank, j) for j in range(world)])
            same(out, torch.cat([value(r, size(r, rank), dtype, salt=rank) for r in range(world)]), f"all_to_all_single uneven {tag}")
            # all_to_all (lists)
            outs = [torch.empty(size(r, rank), dtype=dtype) for r in range(world)]
            dist.all_to_all(outs, [value(rank, size(rank, j), dtype, salt=j) for j in range(world)])
            for r in range(world):
                same(outs[r], value(r, size(r, rank), dtype, salt=rank), f"all_to_all[{r}] {tag}")
            # send/recv around the ring, tagged
            if world > 1:
                nxt, prv = (rank + 1) % world, (rank - 1) % world
                req = dist.isend(value(rank, n, dtype, salt=9), dst=nxt, tag=7)
                t = torch.empty(n, dtype=dtype)
                dist.recv(t, src=prv, tag=7)
                req.wait()
                same(t, value(prv, n, dtype, salt=9), f"send/recv {tag}")
            checked += 1
    dist.barrier()
    # Non-contiguous tensors: a transposed view is reduced in place.
    m = torch.arange(12, dtype=torch.float32).view(3, 4).t() * (rank + 1)
    dist.all_reduce(m)
    same(m, torch.arange(12, dtype=torch.float32).view(3, 4).t() * (world * (world + 1) // 2), "non-contiguous all_reduce")
    # Async work and its future (what DDP comm hooks use).
    t = torch.full((5,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    got = work.get_future().wait()[0]
    same(got, torch.full((5,), float(world * (world + 1) // 2)), "future value")
    assert work.is_completed()
    # What trident cannot do is refused clearly.
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BAND)
        raise AssertionError("BAND was accepted")
    except RuntimeError as e:
        assert "BAND" in str(e) and "trident" in str(e), str(e)
    return checked


def subgroups(rank, world):
    """dist.new_group: a group of the even ranks and one of the odd ranks, collectives inside each."""
    evens, odds = list(range(0, world, 2)), list(range(1, world, 2))
    ge = dist.new_group(evens, backend="trident")
    go = dist.new_group(odds, backend="trident") if odds else None
    mine = evens if rank % 2 == 0 else odds
    g = ge if rank % 2 == 0 else go
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=g)
    assert t.item() == sum(r + 1 for r in mine), (rank, t.item(), mine)
    dist.all_reduce(t)  # the world group still works alongside
    return True


if __name__ == "__main__":
    worlds = [int(w) for w in sys.argv[1:]] or [1, 2, 3, 5]
    for w in worlds:
        res = spawn(sweep, w, timeout=600)
        print(f"world {w}: {res[0]} (dtype, count) cases checked on each of {w} ranks")
        if w > 1:
            spawn(subgroups, w)
            print(f"world {w}: subgroups ok")
    print("PASS")
