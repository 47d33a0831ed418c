#!/usr/bin/python3
"""The store under load, trident against PyTorch's TCPStore (Debian's python3-torch), same run: N clients as
threads in P processes, each connecting to one store and doing the rendezvous of `trident bench store` (set its
key, add to a shared counter, the last sets "go", wait for "go", read the next client's key and check it, then a
second counter-and-key barrier). Rounds alternate between the two; prints each round and the medians.

usage: /usr/bin/python3 scripts/store_vs_torch.py [--clients 1024] [--procs 8] [--rounds 3] [--trident build/trident]
"""
import argparse
import datetime
import json
import multiprocessing as mp
import statistics
import subprocess
import threading
import time

import torch.distributed as dist


def torch_client(port, cid, n, out, errors):
    try:
        t0 = time.monotonic()
        s = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=120))
        t1 = time.monotonic()
        s.set(f"client/{cid}", f"client {cid} was here")
        if s.add("arrived", 1) == n:
            s.set("go", "1")
        s.wait(["go"])
        nxt = (cid + 1) % n
        got = s.get(f"client/{nxt}").decode()
        assert got == f"client {nxt} was here", f"client {cid} read {got!r}"
        if s.add("departed", 1) == n:
            s.set("all_departed", "1")
        s.wait(["all_departed"])
        out.append((t1 - t0, time.monotonic() - t1))
    except Exception as e:  # noqa: BLE001  reported by the parent
        errors.append(f"client {cid}: {e}")


def torch_process(port, first, count, n, q):
    out, errors, threads = [], [], []
    for i in range(count):
        t = threading.Thread(target=torch_client, args=(port, first + i, n, out, errors))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    q.put((out, errors))


def torch_round(clients, procs):
    server = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=120), wait_for_workers=False)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    t0 = time.monotonic()
    ps = []
    for p in range(procs):
        first, last = clients * p // procs, clients * (p + 1) // procs
        ps.append(ctx.Process(target=torch_process, args=(server.port, first, last - first, clients, q)))
        ps[-1].start()
    results, errors = [], []
    for _ in ps:
        out, err = q.get(timeout=300)
        results += out
        errors += err
    total = time.monotonic() - t0
    for p in ps:
        p.join()
    arrived, departed = server.add("arrived", 0), server.add("departed", 0)
    ok = not errors and arrived == clients and departed == clients and len(results) == clients
    return {"ok": ok, "total_s": total, "error": errors[0] if errors else "",
            "rendezvous_p50_s": statistics.median(r[1] for r in results) if results else 0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=1024)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trident", default="build/trident")
    a = ap.parse_args()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"# {a.clients} clients in {a.procs} processes; CPU {cpu}")
    tri, tor = [], []
    for r in range(a.rounds):
        out = subprocess.run([a.trident, "bench", "store", "--clients", str(a.clients), "--procs", str(a.procs),
                              "--json"], capture_output=True, text=True, check=False)
        t = json.loads(out.stdout.strip().splitlines()[-1])
        p = torch_round(a.clients, a.procs)
        print(f"round {r + 1}: trident {t['total_s']:.3f} s ({'ok' if t['ok'] else 'FAILED ' + t['error']}), "
              f"PyTorch TCPStore {p['total_s']:.3f} s ({'ok' if p['ok'] else 'FAILED ' + p['error']})")
        tri.append(t["total_s"])
        tor.append(p["total_s"])
    mt, mp_ = statistics.median(tri), statistics.median(tor)
    print(f"median: trident {mt:.3f} s, PyTorch {mp_:.3f} s: trident is {mp_ / mt:.2f}x PyTorch's speed")


if __name__ == "__main__":
    main()
