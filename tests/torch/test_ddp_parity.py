"""PyTorch DDP, unchanged, on backend "trident" against the same run on gloo: 2 and 3 ranks, float32, same
seeds, 20 steps of a small MLP with AdamW; every rank's loss at every step must agree within 1e-6. The 3-rank
runs accumulate gradients over 3 micro-batches per step with DDP's no_sync(), as PyTorch programs do (the
micro-batches before the last communicate nothing, and the step is the one gloo takes), once with DDP's own
reducer and once through its communication hooks (allreduce_hook: the bucket's all_reduce future, divided by
the world; fp16_compress_hook: the bucket sent as float16, within float16's rounding of gloo)."""
import torch
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from harness import spawn

STEPS = 20


def train(rank, world, accum, hook=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8))
    ddp = DDP(model, bucket_cap_mb=0.01)  # small buckets: several all-reduces per step, overlapped with backward
    if hook is not None:
        ddp.register_comm_hook(state=None, hook=getattr(default_hooks, hook))
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    teacher = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)) / 4  # a target the model can learn
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        for micro in range(accum):
            x = torch.randn(16, 32, generator=g)
            y = x @ teacher
            loss = nn.functional.mse_loss(ddp(x), y) / accum
            if micro + 1 < accum:
                with ddp.no_sync():
                    loss.backward()
            else:
                loss.backward()
            step_loss += loss.item()
        opt.step()
        losses.append(step_loss)
    return losses


if __name__ == "__main__":
    for world, accum, hook in ((2, 1, None), (3, 3, None), (3, 3, "allreduce_hook"), (3, 1, "fp16_compress_hook")):
        ref = spawn(train, world, backend="gloo", args=(accum, hook))
        got = spawn(train, world, backend="trident", args=(accum, hook))
        # float16 buckets: every partial sum rounds to float16, and gloo's algorithm adds the ranks' buckets in
        # another order than trident's, so the sums differ in float16's last bits.
        tol = 1e-3 if hook == "fp16_compress_hook" else 1e-6
        worst = 0.0
        for r in range(world):
            for step, (a, b) in enumerate(zip(ref[r], got[r])):
                worst = max(worst, abs(a - b))
                assert abs(a - b) <= tol * max(1.0, abs(a)), f"{world} ranks, accumulation {accum}, hook {hook}, rank {r} step {step}: gloo {a} trident {b}"
        assert ref[0][-1] < ref[0][0], "the model did not train"
        print(f"{world} ranks, accumulation {accum}, hook {hook}: losses step 0 {got[0][0]:.6f} step {STEPS - 1} {got[0][-1]:.6f}; "
              f"max |trident - gloo| = {worst:.3g}")
    print("PASS")
