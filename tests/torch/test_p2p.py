"""Point-to-point through torch.distributed on backend "trident", as c10d programs use it, each pattern checked
against values computed here and against gloo running the same calls:

- batch_isend_irecv in any order: receives listed before sends (a ring, tagged and untagged), a rank sending to
  and receiving from the same peer in one batch (every pair exchanges), rank-dependent orders, several tags
  matched out of order, several messages with one tag (received in the order sent), at 2, 3 and 5 ranks;
- receive from any source: recv(tensor) without src returns the sender's rank, irecv without src and
  Work._source_rank(), with and without a tag, and a receive for one rank posted before an any-source one.

Argument: world sizes (default 2 3 5; any-source and the gloo comparison run at 3)."""
import sys

import torch
import torch.distributed as dist

from harness import spawn


def payload(src, dst, k, n=7):
    """What rank src sends rank dst as its k-th message: small integers, distinct per (src, dst, k)."""
    return torch.arange(n, dtype=torch.float32) + 1000 * src + 100 * dst + 10 * k


def wait_all(reqs):
    for q in reqs:
        q.wait()


def batched(rank, world):
    got = []
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    # 1. A ring with every receive listed before the send, untagged and tagged.
    for tag in (0, 5):
        r = torch.empty(7)
        wait_all(dist.batch_isend_irecv([dist.P2POp(dist.irecv, r, prv, tag=tag),
                                         dist.P2POp(dist.isend, payload(rank, nxt, tag), nxt, tag=tag)]))
        assert torch.equal(r, payload(prv, rank, tag)), f"ring tag {tag}: rank {rank} got {r.tolist()}"
        got.append(r.tolist())
    # 2. Every pair exchanges in one batch: receives from every peer first, then sends to every peer, so a rank
    #    sends to and receives from the same peer in one batch.
    peers = [p for p in range(world) if p != rank]
    rs = {p: torch.empty(7) for p in peers}
    ops = [dist.P2POp(dist.irecv, rs[p], p, tag=1) for p in peers]
    ops += [dist.P2POp(dist.isend, payload(rank, p, 1), p, tag=1) for p in reversed(peers)]
    wait_all(dist.batch_isend_irecv(ops))
    for p in peers:
        assert torch.equal(rs[p], payload(p, rank, 1)), f"all pairs: rank {rank} from {p} got {rs[p].tolist()}"
        got.append(rs[p].tolist())
    # 3. Rank-dependent orders: even ranks send first, odd ranks receive first, both directions of the ring.
    r_prv, r_nxt = torch.empty(7), torch.empty(7)
    sends = [dist.P2POp(dist.isend, payload(rank, nxt, 2), nxt, tag=2),
             dist.P2POp(dist.isend, payload(rank, prv, 3), prv, tag=3)]
    recvs = [dist.P2POp(dist.irecv, r_prv, prv, tag=2), dist.P2POp(dist.irecv, r_nxt, nxt, tag=3)]
    wait_all(dist.batch_isend_irecv(sends + recvs if rank % 2 == 0 else recvs[::-1] + sends))
    assert torch.equal(r_prv, payload(prv, rank, 2)) and torch.equal(r_nxt, payload(nxt, rank, 3)), f"orders: rank {rank}"
    got += [r_prv.tolist(), r_nxt.tolist()]
    # 4. Tags matched whatever the order: rank sends tags 7, 8, 9 to nxt; nxt receives 9, 8, 7 (receives first).
    rt = {t: torch.empty(7) for t in (7, 8, 9)}
    ops = [dist.P2POp(dist.irecv, rt[t], prv, tag=t) for t in (9, 8, 7)]
    ops += [dist.P2POp(dist.isend, payload(rank, nxt, t), nxt, tag=t) for t in (7, 8, 9)]
    wait_all(dist.batch_isend_irecv(ops))
    for t in (7, 8, 9):
        assert torch.equal(rt[t], payload(prv, rank, t)), f"tags: rank {rank} tag {t} got {rt[t].tolist()}"
        got.append(rt[t].tolist())
    # 5. Several messages with one tag arrive in the order sent (MPI's non-overtaking rule), receives first.
    rk = [torch.empty(7) for _ in range(3)]
    ops = [dist.P2POp(dist.irecv, x, prv, tag=4) for x in rk]
    ops += [dist.P2POp(dist.isend, payload(rank, nxt, 20 + k), nxt, tag=4) for k in range(3)]
    wait_all(dist.batch_isend_irecv(ops))
    for k in range(3):
        assert torch.equal(rk[k], payload(prv, rank, 20 + k)), f"order: rank {rank} message {k} got {rk[k].tolist()}"
        got.append(rk[k].tolist())
    # 6. A large message each way between neighbours (more than a shared-memory ring holds), receive first.
    big = torch.empty(3 << 20)
    wait_all(dist.batch_isend_irecv([dist.P2POp(dist.irecv, big, prv),
                                     dist.P2POp(dist.isend, torch.full((3 << 20,), float(rank)), nxt)]))
    assert torch.equal(big, torch.full((3 << 20,), float(prv))), f"large: rank {rank}"
    # A collective after the batch still agrees on every rank.
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(world))), f"all_reduce after p2p: rank {rank}"
    return got


def any_source(rank, world):
    """Rank 0 receives from whoever sends first; every other rank sends. Returns what rank 0 saw."""
    seen = []
    if rank == 0:
        # recv without src: returns the sender; the tensor is that sender's message.
        for _ in range(world - 1):
            t = torch.empty(7)
            src = dist.recv(t)
            assert 0 < src < world and torch.equal(t, payload(src, 0, 0)), f"recv any: src {src} got {t.tolist()}"
            seen.append(src)
        assert sorted(seen) == list(range(1, world)), f"recv any: sources {seen}"
        # irecv without src, with a tag: only messages with that tag match; _source_rank() names the sender.
        works = [(dist.irecv(t := torch.empty(7), tag=11), t) for _ in range(world - 1)]
        srcs = []
        for w, t in works:
            w.wait()
            s = w._source_rank()
            assert torch.equal(t, payload(s, 0, 11)), f"irecv any tag 11: src {s} got {t.tolist()}"
            srcs.append(s)
        assert sorted(srcs) == list(range(1, world)), f"irecv any: sources {srcs}"
        # The tag-12 messages, sent before the tag-11 ones, are still there: one receive from rank 1 named, then
        # any-source receives for the rest.
        t1 = torch.empty(7)
        dist.recv(t1, src=1, tag=12)
        assert torch.equal(t1, payload(1, 0, 12)), f"named recv: {t1.tolist()}"
        rest = []
        for _ in range(world - 2):
            t = torch.empty(7)
            s = dist.recv(t, tag=12)
            assert s != 1 and torch.equal(t, payload(s, 0, 12)), f"recv any tag 12: src {s} got {t.tolist()}"
            rest.append(s)
        assert sorted(rest) == list(range(2, world)), f"recv any tag 12: {rest}"
    else:
        # isend (gloo's sends wait for the matching receive): the tag-12 message goes before the tag-11 one.
        wait_all([dist.isend(payload(rank, 0, 0), 0), dist.isend(payload(rank, 0, 12), 0, tag=12),
                  dist.isend(payload(rank, 0, 11), 0, tag=11)])
    dist.barrier()
    return sorted(seen)


if __name__ == "__main__":
    worlds = [int(w) for w in sys.argv[1:]] or [2, 3, 5]
    for w in worlds:
        tri = spawn(batched, w, "trident", timeout=120)
        print(f"world {w}: batch_isend_irecv in every order completes with the values sent")
        if w == 3:
            glo = spawn(batched, w, "gloo", timeout=120)
            for r in range(w):
                assert tri[r] == glo[r], f"world {w} rank {r}: trident and gloo received differently"
            print(f"world {w}: trident received what gloo receives")
    tri = spawn(any_source, 3, "trident", timeout=120)
    glo = spawn(any_source, 3, "gloo", timeout=120)
    assert tri[0] == glo[0] == [1, 2], (tri, glo)
    print("world 3: recv and irecv without src match the first message from any rank; _source_rank() names it")
    print("PASS")
