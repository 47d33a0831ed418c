"""Runs a function on N ranks (forked processes) over torch.distributed, for the trident_torch tests.

spawn(fn, world, backend) forks `world` processes; each calls init_process_group(backend) over a TCPStore that
rank 0 hosts on a port the kernel picks, then
fn(rank, world, *args). Any exception on any rank fails the run with that rank's traceback; a rank that does
not finish within `timeout` seconds fails it too (nothing waits forever)."""
import multiprocessing as mp
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import trident_torch  # noqa: F401  registers backend "trident"


def _child(fn, rank, world, backend, port, args, q, init_timeout, finishers):
    torch.set_num_threads(1)
    try:
        # Rank 0 hosts torch's store on a port the kernel picks and tells the others (nothing picks a port and
        # binds it later, so nothing else on the machine can take it in between), as init_method tcp:// would.
        timeout = init_timeout if init_timeout is not None else dist.default_pg_timeout
        if rank == 0:
            store = dist.TCPStore("127.0.0.1", 0, world, True, timeout, wait_for_workers=False)
            port.value = store.port
        else:
            deadline = time.monotonic() + timeout.total_seconds()
            while port.value == 0:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank 0 published no store port within {timeout}")
                time.sleep(0.01)
            store = dist.TCPStore("127.0.0.1", port.value, world, False, timeout)
        kw = {"timeout": init_timeout} if init_timeout is not None else {}
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, **kw)
        result = fn(rank, world, *args)
        dist.destroy_process_group()
        q.put((rank, "ok", result))
        # Rank 0's process hosts the store: were it to exit first, a rank still polling the store (the end of
        # init_process_group's barrier, when fn communicates nothing) would get "Broken pipe". So every rank
        # that finishes says so, and rank 0 waits for the `finishers` expected (bounded: never a hang).
        # Best effort: this rank's result is already reported.
        try:
            store.add("harness/finished", 1)
            if rank == 0:
                deadline = time.monotonic() + 30
                while store.add("harness/finished", 0) < finishers and time.monotonic() < deadline:
                    time.sleep(0.01)
        except Exception:  # noqa: BLE001  the store's host is gone: nothing left to wait for
            pass
    except BaseException:
        q.put((rank, "error", traceback.format_exc()))
        # os._exit skips the queue's feeder thread: flush the report first, or the parent waits its timeout.
        q.close()
        q.join_thread()
        sys.stderr.flush()
        os._exit(1)


def spawn(fn, world, backend="trident", args=(), timeout=120, dying=(), init_timeout=None):
    """Returns {rank: fn's result}; raises AssertionError naming the failing ranks. Ranks in `dying` are
    expected to end without reporting (fault tests kill them)."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = ctx.Value("i", 0)  # rank 0's store port, once it listens
    finishers = world - len(dying)
    procs = [ctx.Process(target=_child, args=(fn, r, world, backend, port, args, q, init_timeout, finishers))
             for r in range(world)]
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
