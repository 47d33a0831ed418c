// Building blocks shared by the algorithm files: pointer arithmetic on (ptr, count, dtype) buffers, the
// non-power-of-two fold, binomial/chain/star tree links with pipelined tree reduce and broadcast, and the
// pipelined ring driver. Internal to comm/algorithms (not part of the comm API).
//
// Ownership: nothing is owned; buffers belong to the caller. Blocking: every function returns only when
// every request it posted has completed. Thread-safety: as the AlgoContext. Timeouts: the context's.
#pragma once

#include <cstring>
#include <span>
#include <vector>

#include "trident/comm/algorithms/algorithm.h"
#include "trident/comm/reduce.h"
#include "trident/core/error.h"

namespace trident::algo {

inline char* at(void* base, size_t elems, size_t esize) { return static_cast<char*>(base) + elems * esize; }
inline const char* at(const void* base, size_t elems, size_t esize) {
  return static_cast<const char*>(base) + elems * esize;
}
// memcpy that tolerates dst == src (in-place forms) and n == 0 with null pointers.
inline void copy_bytes(void* dst, const void* src, size_t n) {
  if (n != 0 && dst != src) std::memcpy(dst, src, n);
}
inline int mod(int a, int n) { return ((a % n) + n) % n; }
using cost::ceil_log2;
using cost::floor_pow2;
using cost::is_pow2;
inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Elements per pipeline chunk when the largest piece moved in one step is `piece_bytes`: the context's
// chunk_bytes() when set, otherwise the whole piece up to 1 MiB and piece/4 clamped to [512 KiB, 4 MiB]
// beyond. Always >= 1.
size_t chunk_elems(const AlgoContext& ctx, size_t piece_bytes, size_t esize);

// Requests posted by one step, waited together.
class Pending {
 public:
  void add(Request r) { reqs_.push_back(r); }
  void wait(AlgoContext& ctx) {
    if (!reqs_.empty()) ctx.wait(reqs_);
    reqs_.clear();
  }
  bool empty() const { return reqs_.empty(); }

 private:
  std::vector<Request> reqs_;
};

// Tags reserved for the non-power-of-two fold (algorithm steps use small numbers).
inline constexpr uint32_t kFoldInTag = 0xFFFF0000u;
inline constexpr uint32_t kFoldOutTag = 0xFFFF0001u;

// Non-power-of-two fold (MPICH): of n ranks, the first 2*rem (rem = n - p, p = 2^floor(log2 n)) pair up;
// even ones hand their buffer to the odd neighbour and sit out; the p survivors get new ranks 0..p-1.
struct Fold {
  int p = 1;
  int rem = 0;
  int newrank = -1;  // -1: this rank sits out
  int real(int q) const { return q < rem ? 2 * q + 1 : q + rem; }
};
// Folds `buf` (count elements) into the survivors; returns this rank's place.
Fold fold_in(AlgoContext& ctx, void* buf, size_t count, DType dtype, ReduceOp op);
// Hands the result back to the ranks that sat out.
void fold_out(AlgoContext& ctx, const Fold& f, void* buf, size_t bytes);

// Receiving from several peers into one buffer. A float reduction's bits depend on the order of its
// operands ((a + b) + c is not (a + c) + b), so combining each peer's data as it arrives would make the
// result depend on timing: two runs of the same program would differ in the last bits (and a training run
// resumed from a checkpoint would not equal the uninterrupted one). Every receive that combines more than
// one peer into the same elements does so in a fixed order instead, whatever order the data arrives in.
//
// Scratch slot of the later peers' data (algorithms calling these keep slots 0..2 for their own buffers),
// and the most scratch it takes beyond one peer's piece: more peers are received in a rolling window.
inline constexpr int kOrderedReduceSlot = 3;
inline constexpr size_t kOrderedScratchBytes = size_t{64} << 20;
// Receives count (> 0) elements from each of `peers` (step `step`) and combines them into dst in the listed
// order: dst = ((dst op peers[0]) op peers[1]) ... The first combines on arrival; each later one lands in
// scratch and is combined once every one before it has been. Returns when all are combined.
void reduce_in_order(AlgoContext& ctx, std::span<const int> peers, uint32_t step, void* dst, size_t count,
                     DType dtype, ReduceOp op);

// Links of one rank in a tree rooted at `root`; children in the order they should be served (largest
// subtree first).
struct TreeLinks {
  int parent = -1;
  std::vector<int> children;
};
TreeLinks binomial_links(int rank, int root, int n);
TreeLinks chain_links(int rank, int root, int n);  // root -> root+1 -> ... (a pipeline)
TreeLinks star_links(int rank, int root, int n);   // root <-> everyone

// Pipelined reduce toward the root of `t`: combines every child's chunk into `acc` in the order of
// t.children (the first on arrival, the others from scratch: see reduce_in_order), then sends the chunk to
// the parent. `acc` holds this rank's contribution on entry and is written only when
// this rank has children (a leaf may pass a read-only buffer). Tags tag_base + chunk index.
void tree_reduce(AlgoContext& ctx, const TreeLinks& t, void* acc, size_t count, DType dtype, ReduceOp op,
                 size_t chunk, uint32_t tag_base);
// Pipelined broadcast from the root of `t`: receives each chunk from the parent, forwards it to children.
void tree_bcast(AlgoContext& ctx, const TreeLinks& t, void* buf, size_t count, size_t esize, size_t chunk,
                uint32_t tag_base);

// One step of one chunk of a ring: send to the next rank, receive (optionally reduce) from the previous.
// A side with zero elements is skipped (both ends compute the same sizes).
struct RingUnit {
  const void* send = nullptr;
  size_t send_elems = 0;
  void* recv = nullptr;
  size_t recv_elems = 0;
  bool reduce = false;
  const void* own = nullptr;  // reduce: recv = own op incoming (an out-of-place input), else recv op= incoming
};

// Drives `steps` ring steps of `chunks` chunks each. plan(step, chunk, unit) fills the unit (and may do
// local work, e.g. copy this rank's contribution into the receive slot) right before it is posted. Unit
// (s, c) is posted only after unit (s-1, c) has completed on this rank, so a chunk received at step s-1
// may be sent at step s, and a buffer sent at step s-1 may be overwritten at step s; the other chunks of
// step s-1 stay in flight meanwhile, which keeps both directions busy. Tag of unit (s, c): s*chunks + c.
template <class Plan>
void ring_pipeline(AlgoContext& ctx, int steps, size_t chunks, size_t esize, DType dtype, ReduceOp op, Plan&& plan) {
  const int n = ctx.size(), r = ctx.rank();
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  TRIDENT_CHECK(static_cast<uint64_t>(steps) * chunks < 0xFFFF0000ull, InvalidArgument,
                "ring: {} steps x {} chunks overflow the step tags; raise TRIDENT_CHUNK_BYTES", steps, chunks);
  std::vector<Pending> inflight(chunks);
  for (int s = 0; s < steps; ++s) {
    for (size_t c = 0; c < chunks; ++c) {
      inflight[c].wait(ctx);
      RingUnit u;
      plan(s, c, u);
      const auto tag = static_cast<uint32_t>(static_cast<uint64_t>(s) * chunks + c);
      if (u.send_elems != 0) inflight[c].add(ctx.isend(next, tag, u.send, u.send_elems * esize));
      if (u.recv_elems != 0) {
        inflight[c].add(u.reduce ? ctx.irecv_reduce(prev, tag, u.recv, u.recv_elems, dtype, op, u.own)
                                 : ctx.irecv(prev, tag, u.recv, u.recv_elems * esize));
      }
    }
  }
  for (auto& p : inflight) p.wait(ctx);
}

// Elements of chunk c (chunk elements each) of a block of `block` elements; 0 past its end.
inline size_t chunk_len(size_t block, size_t c, size_t chunk) {
  const size_t off = c * chunk;
  return off >= block ? 0 : std::min(chunk, block - off);
}

}  // namespace trident::algo
