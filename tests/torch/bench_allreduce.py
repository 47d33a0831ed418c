"""dist.all_reduce busbw (float32 sum, in place) of backends "trident" and "gloo" at given sizes, the backends
alternating in one run so that both see the same machine load. Not a test: speed is measured, never asserted.

    PYTHONPATH=build/python:tests/torch env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=1 \\
        /usr/bin/python3 tests/torch/bench_allreduce.py [--world 2] [--sizes 1M,64M] [--rounds 3]

busbw = size / time x 2(n-1)/n (nccl-tests' convention; GB = 1e9 B); time is the median of the slowest
rank's per-op time over batches of back-to-back calls."""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

from harness import spawn


def parse_size(s):
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def measure(rank, world, nbytes, seconds):
    t = torch.ones(nbytes // 4, dtype=torch.float32)
    for _ in range(3):
        dist.all_reduce(t)
    per_op = []
    deadline = time.perf_counter() + seconds
    iters = 1
    while True:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        # The slowest rank's time, and whether any rank's time is up: every rank leaves the loop together.
        dt = torch.tensor([(time.perf_counter() - t0) / iters, float(time.perf_counter() >= deadline)],
                          dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        per_op.append(dt[0].item())
        if dt[1].item() > 0 and len(per_op) >= 3:
            break
        if dt[0].item() * iters < 0.01:
            iters *= 2
    return statistics.median(per_op)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--sizes", default="1M,64M")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the backends")
    ap.add_argument("--seconds", type=float, default=1.0, help="per backend, size and round")
    a = ap.parse_args()
    n = a.world
    print(f"{'size':>8} {'backend':>8} {'round':>5} {'us/op':>10} {'busbw GB/s':>10}")
    best = {}
    for size in a.sizes.split(","):
        nb = parse_size(size)
        for r in range(a.rounds):
            for backend in ("gloo", "trident") if r % 2 == 0 else ("trident", "gloo"):
                sec = spawn(measure, n, backend, args=(nb, a.seconds), timeout=300)[0]
                bus = nb / sec * 2 * (n - 1) / n / 1e9
                best.setdefault((size, backend), []).append(bus)
                print(f"{size:>8} {backend:>8} {r:>5} {sec * 1e6:>10.1f} {bus:>10.3f}", flush=True)
    for size in a.sizes.split(","):
        g, t = statistics.median(best[(size, "gloo")]), statistics.median(best[(size, "trident")])
        print(f"{size}: median busbw trident {t:.3f} GB/s, gloo {g:.3f} GB/s, ratio {t / g:.2f}x")


if __name__ == "__main__":
    main()
