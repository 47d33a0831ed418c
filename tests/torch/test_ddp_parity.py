"""PyTorch DDP, unchanged, on backend "trident" against the same run on gloo: 2 ranks, float32, same seeds, 20
steps of a small MLP with AdamW; every rank's loss at every step must agree within 1e-6."""
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from harness import spawn

STEPS = 20


def train(rank, world):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8))
    ddp = DDP(model, bucket_cap_mb=0.01)  # small buckets: several all-reduces per step, overlapped with backward
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=g)
        y = torch.randn(16, 8, generator=g)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    ref = spawn(train, 2, backend="gloo")
    got = spawn(train, 2, backend="trident")
    worst = 0.0
    for r in range(2):
        for step, (a, b) in enumerate(zip(ref[r], got[r])):
            worst = max(worst, abs(a - b))
            assert abs(a - b) <= 1e-6, f"rank {r} step {step}: gloo {a} trident {b}"
    assert ref[0][-1] < ref[0][0], "the model did not train"
    print(f"losses step 0 {got[0][0]:.6f} step {STEPS - 1} {got[0][-1]:.6f}; max |trident - gloo| = {worst:.3g}")
    print("PASS")
