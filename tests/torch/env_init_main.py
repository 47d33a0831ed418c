"""One rank of a job started by a launcher (`trident launch` or torchrun): init_process_group("trident") with
init_method env:// from the launcher's variables, a subgroup, and a collective in each. Exits 0 on success."""
import os

import torch
import torch.distributed as dist

import trident_torch  # noqa: F401

dist.init_process_group("trident")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == world * (world + 1) / 2, t
g = dist.new_group([0, world - 1])
if rank in (0, world - 1):
    u = torch.tensor([float(rank)])
    dist.all_reduce(u, group=g)
    assert u.item() == world - 1, u
dist.barrier()
print(f"rank {rank}/{world}: env:// init ok (store hosted by the launcher: {os.environ.get('TRIDENT_STORE_HOSTED') == '1'})")
dist.destroy_process_group()
