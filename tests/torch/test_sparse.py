"""all_reduce of sparse COO tensors on backend "trident" at 3 ranks, as gloo does it: the sum of every rank's tensor,
coalesced, in the tensor passed. Inputs are uncoalesced (repeated indices), overlap across ranks, include a rank
with no nonzeros and a hybrid tensor (a dense dimension under the sparse ones), in float32, float64, int32 and
int64; each result is checked against the dense sum computed here and against gloo's result (indices and values).
What a sparse tensor cannot do is refused by name: other reduce ops, other collectives, differing sizes."""
import torch
import torch.distributed as dist

from harness import spawn

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]


def sparse_input(rank, dtype, hybrid=False):
    """Rank `rank`'s tensor: shape (6, 5) (or (6, 5, 3) with a dense last dimension), repeated and overlapping
    indices, small integer values (sums exact in any order); rank 1 has no nonzeros."""
    if rank == 1:
        idx = torch.zeros((2, 0), dtype=torch.int64)
    else:
        rows = torch.tensor([rank % 6, 2, 2, 5, (rank * 3) % 6])
        cols = torch.tensor([1, 3, 3, 4, rank % 5])
        idx = torch.stack([rows, cols])
    nnz = idx.shape[1]
    vals = (torch.arange(nnz * (3 if hybrid else 1)) % 4 + 1 + rank).to(dtype)
    if hybrid:
        vals = vals.view(nnz, 3)
    return torch.sparse_coo_tensor(idx, vals, (6, 5, 3) if hybrid else (6, 5))


def reduce_all(rank, world):
    got = []
    for dtype in DTYPES:
        for hybrid in (False, True):
            t = sparse_input(rank, dtype, hybrid)
            dist.all_reduce(t)
            want = sum(sparse_input(r, dtype, hybrid).to_dense() for r in range(world))
            assert t.is_sparse and t.is_coalesced(), f"{dtype} hybrid={hybrid}: result not a coalesced sparse tensor"
            assert t.dtype == dtype and torch.equal(t.to_dense(), want), f"{dtype} hybrid={hybrid}: wrong sum"
            got.append((t.indices().tolist(), t.values().tolist()))
    # Async form: the future's value is the reduced tensor.
    t = sparse_input(rank, torch.float32)
    fut = dist.all_reduce(t, async_op=True).get_future()
    out = fut.wait()[0]
    assert torch.equal(out.to_dense(), sum(sparse_input(r, torch.float32).to_dense() for r in range(world)))
    got.append((out.indices().tolist(), out.values().tolist()))
    return got


def refused(rank, world):
    """Other reduce ops, other collectives and differing sizes are refused with a message naming them."""
    t = sparse_input(rank, torch.float32)
    try:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        raise AssertionError("MAX on a sparse tensor was accepted")
    except RuntimeError as e:
        assert "sparse" in str(e) and "MAX" in str(e) and "SUM" in str(e), str(e)
    try:
        dist.broadcast(t, src=0)
        raise AssertionError("broadcast of a sparse tensor was accepted")
    except RuntimeError as e:
        assert "broadcast" in str(e) and "sparse" in str(e), str(e)
    u = torch.sparse_coo_tensor(torch.zeros((2, 1), dtype=torch.int64), torch.ones(1), (6, 5 + (rank == 2)))
    try:
        dist.all_reduce(u)
        raise AssertionError("sparse tensors of different sizes were reduced")
    except RuntimeError as e:
        assert "sparse" in str(e) and "rank 2" in str(e) and "[6, 6]" in str(e), str(e)
    # The group is still usable afterwards.
    t = sparse_input(rank, torch.int64)
    dist.all_reduce(t)
    assert torch.equal(t.to_dense(), sum(sparse_input(r, torch.int64).to_dense() for r in range(world)))
    return True


if __name__ == "__main__":
    world = 3
    tri = spawn(reduce_all, world, "trident", timeout=120)
    glo = spawn(reduce_all, world, "gloo", timeout=120)
    for r in range(world):
        assert tri[r] == glo[r], f"rank {r}: trident's sparse sums differ from gloo's"
    print(f"world {world}: sparse all_reduce equals the dense sum and gloo's coalesced result on every rank")
    spawn(refused, world, "trident", timeout=60)
    print(f"world {world}: other ops, other collectives and differing sizes are refused by name")
    print("PASS")
