"""Runs a function on N ranks (forked processes) over torch.distributed, for the trident_torch tests.

spawn(fn, world, backend) forks `world` processes; each calls init_process_group(backend, tcp://...) and
fn(rank, world, *args). Any exception on any rank fails the run with that rank's traceback; a rank that does
not finish within `timeout` seconds fails it too (nothing waits forever)."""
import multiprocessing as mp
import os
import socket
import sys
import traceback

import torch
import torch.distributed as dist

import trident_torch  # noqa: F401  registers backend "trident"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn, rank, world, backend, port, args, q, init_timeout):
    torch.set_num_threads(1)
    try:
        kw = {"timeout": init_timeout} if init_timeout is not None else {}
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **kw)
        result = fn(rank, world, *args)
        dist.destroy_process_group()
        q.put((rank, "ok", result))
    except BaseException:
        q.put((rank, "error", traceback.format_exc()))
        sys.stderr.flush()
        os._exit(1)


def spawn(fn, world, backend="trident", args=(), timeout=120, dying=(), init_timeout=None):
    """Returns {rank: fn's result}; raises AssertionError naming the failing ranks. Ranks in `dying` are
    expected to end without reporting (fault tests kill them)."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world, backend, port, args, q, init_timeout)) for r in range(world)]
    for p in procs:
        p.start()
    results, errors = {}, []
    import queue as _queue
    for _ in range(world - len(dying)):
        try:
            rank, status, payload = q.get(timeout=timeout)
        except _queue.Empty:
            errors.append(f"a rank did not finish within {timeout} s")
            break
        if status == "ok":
            results[rank] = payload
        else:
            errors.append(f"rank {rank}:\n{payload}")
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    assert not errors, f"{backend} world {world}: " + "\n".join(errors)
    return results
