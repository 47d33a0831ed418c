"""SIGTERM ends a process that uses backend "trident", whatever its calls are doing: 3 ranks block in a call that
cannot complete (a collective, batch_isend_irecv, a receive from any source, a barrier; one rank stays out of it),
the parent sends every rank SIGTERM (as Process.terminate(), torchrun, Slurm and Kubernetes do first), and each rank
must die of it within a bounded time (the default action), with and without a flight-recorder folder; with one,
each blocked rank leaves its dump there first."""
import datetime
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import harness

KILL_WITHIN_S = 10.0  # after SIGTERM (a program with its own handler has 5 s); the calls' deadline is 120 s


def collective(rank, world, ready):
    dist.all_reduce(torch.ones(4))  # everyone is connected
    ready.put(rank)
    if rank == world - 1:
        time.sleep(600)  # never joins
    dist.all_reduce(torch.ones(1 << 10))


def batched_p2p(rank, world, ready):
    dist.all_reduce(torch.ones(4))
    ready.put(rank)
    # Receives from both neighbours listed first; the sends go to the next rank only, so every rank's receive
    # from its next rank never completes.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    a, b = torch.empty(5), torch.empty(5)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, a, prv), dist.P2POp(dist.irecv, b, nxt),
                                   dist.P2POp(dist.isend, torch.ones(5), nxt)])
    for q in reqs:
        q.wait()


def any_source(rank, world, ready):
    dist.all_reduce(torch.ones(4))
    ready.put(rank)
    dist.recv(torch.empty(3))  # no rank sends


def barrier(rank, world, ready):
    dist.all_reduce(torch.ones(4))
    ready.put(rank)
    if rank == world - 1:
        time.sleep(600)
    dist.barrier()


class Terminated(Exception):
    pass


def _raise_terminated(signum, frame):
    raise Terminated(f"signal {signum}")


def with_python_handler(fn):
    """fn in a program that handles SIGTERM itself (as torchelastic's workers do: a Python handler that raises),
    installed before the process group exists: Python runs it only between bytecodes, so a call blocked in C++
    must return for it to run."""
    def wrapped(rank, world, ready):
        return fn(rank, world, ready)
    wrapped.__name__ = fn.__name__ + "_python_handler"
    wrapped.python_handler = True
    return wrapped


def stubborn(rank, world, ready):
    """A program whose SIGTERM handler does not end it, and which carries on after its call failed: the
    default action must still run, after the grace period."""
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    time.sleep(2.5)  # trident looks for a handler installed after its own once a second
    dist.all_reduce(torch.ones(4))
    ready.put(rank)
    try:
        dist.recv(torch.empty(3))  # no rank sends
    except RuntimeError:
        pass
    time.sleep(600)


def run(fn, world, fr_dir):
    """Starts the ranks, sends SIGTERM once all are blocked, returns [(exitcode, seconds to exit)] per rank."""
    ctx = mp.get_context("fork")
    q, ready = ctx.Queue(), ctx.Queue()
    port = ctx.Value("i", 0)
    if fr_dir:
        os.environ["TRIDENT_FLIGHT_RECORDER_DIR"] = fr_dir
    else:
        os.environ.pop("TRIDENT_FLIGHT_RECORDER_DIR", None)
    long = datetime.timedelta(seconds=120)
    procs = [ctx.Process(target=harness._child, args=(fn, r, world, "trident", port, (ready,), q, long, world))
             for r in range(world)]
    if getattr(fn, "python_handler", False):
        signal.signal(signal.SIGTERM, _raise_terminated)  # inherited by the forked ranks
    try:
        for p in procs:
            p.start()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for _ in range(world):
        ready.get(timeout=60)  # every rank reached its call
    time.sleep(1.5)  # ... and blocks in it
    for p in procs:
        assert p.is_alive(), f"{fn.__name__}: rank {procs.index(p)} ended before SIGTERM (exit code {p.exitcode})"
    t0 = time.monotonic()
    for p in procs:
        os.kill(p.pid, signal.SIGTERM)
    out = []
    for p in procs:
        p.join(timeout=max(0.1, KILL_WITHIN_S - (time.monotonic() - t0)))
        out.append((p.exitcode, time.monotonic() - t0))
    survivors = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not survivors, f"{fn.__name__}: rank(s) {survivors} still alive {KILL_WITHIN_S} s after SIGTERM"
    return out


if __name__ == "__main__":
    world = 3
    cases = [collective, batched_p2p, any_source, barrier]
    for fn in cases + [with_python_handler(f) for f in cases] + [stubborn]:
        for with_dir in ((False,) if fn is stubborn else (False, True)):
            with tempfile.TemporaryDirectory() as d:
                out = run(fn, world, d if with_dir else None)
                for r, (code, s) in enumerate(out):
                    if fn is stubborn:
                        assert code == -signal.SIGTERM and s > 4, f"stubborn: rank {r} exited with {code} after {s:.2f} s"
                    elif getattr(fn, "python_handler", False):
                        # The program's handler ran (the harness reports its exception and exits 1) or, past the
                        # grace period, the default action did.
                        assert code in (1, -signal.SIGTERM), f"{fn.__name__}: rank {r} exited with {code}"
                    else:
                        assert code == -signal.SIGTERM, f"{fn.__name__}: rank {r} exited with {code}, not by SIGTERM"
                dumps = sorted(os.listdir(d)) if with_dir else []
                if with_dir:
                    # Every rank blocked in a trident call dumps (the last rank in `collective` and `barrier`
                    # sleeps in Python, outside trident, and may or may not have its dump written first).
                    assert len(dumps) >= world - 1, f"{fn.__name__}: flight-recorder dumps {dumps}"
                print(f"{fn.__name__}{' (flight recorder folder)' if with_dir else ''}: every rank died of SIGTERM "
                      f"within {max(s for _, s in out):.2f} s; dumps: {len(dumps)}")
    print("PASS")
