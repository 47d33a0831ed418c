// The shared-memory fast path (see shm_fast_path.h for the protocol and the bytes each rank moves).
#include "trident/comm/algorithms/shm_fast_path.h"

#include <emmintrin.h>

#include <cstring>
#include <limits>

#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"
#include "trident/comm/reduce.h"
#include "trident/comm/algorithms/shm_window.h"

namespace trident {

// Copy into the caller's output with non-temporal stores (no read-for-ownership of lines this rank never
// read: out of place, the output is otherwise read once before it is written). The stores are ordered
// before the call returns by the sfence in all_reduce_staged.
void shm_stream_copy(uint8_t* dst, const uint8_t* src, size_t n) {
  const size_t head = std::min(n, (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
}

namespace {

static_assert(cost::kShmSlotBytes == ShmWindow::kSlotBytes, "the cost model's slot size is the window's");

uint8_t* at(void* p, size_t elems, size_t es) { return static_cast<uint8_t*>(p) + elems * es; }

// Tiny path: one cache line per rank carries stamp, fingerprint and payload.
void all_reduce_tiny(ShmWindow& w, const CollArgs& a, size_t bytes) {
  w.post_tiny(a.send, bytes);
  w.wait_tiny();
  reduce_into3(a.recv, w.tiny(0), w.tiny(1), a.count, a.dtype, a.redop);
  for (int p = 2; p < w.size(); ++p) reduce_into(a.recv, w.tiny(p), a.count, a.dtype, a.redop);
}

// Latency path: every rank reduces every slot, in rank order. One phase, no "done reading" phase: this
// rank's slot `buf` is rewritten two slot calls later, after this rank waited in the call between for every
// peer's next phase (or tiny line), which each peer publishes only after it finished reading this call's
// slots (the tiny path's argument; every window collective waits on every peer). So the slot is free once
// this call's own phase is reached, which the acquire two calls later finds without waiting.
void all_reduce_slots(ShmWindow& w, const CollArgs& a, size_t bytes) {
  const int n = w.size(), me = w.rank();
  const int buf = w.acquire_slot();
  std::memcpy(w.slot(me, buf), a.send, bytes);
  w.publish();
  const uint64_t ready = w.phase();
  w.wait_all(ready);
  w.check_fingerprints();
  reduce_into3(a.recv, w.slot(0, buf), w.slot(1, buf), a.count, a.dtype, a.redop);
  for (int p = 2; p < n; ++p) reduce_into(a.recv, w.slot(p, buf), a.count, a.dtype, a.redop);
  w.release_slot(buf, ready);
}

// Bandwidth path: rounds through the double-buffered staging area.
void all_reduce_staged(ShmWindow& w, const AlgoContext& ctx, const CollArgs& a) {
  const int n = w.size(), me = w.rank();
  const size_t es = dtype_size(a.dtype);
  size_t round_bytes = w.stage_bytes();
  if (ctx.chunk_bytes() != 0) round_bytes = std::min(round_bytes, ctx.chunk_bytes() * static_cast<size_t>(n));
  const size_t per_round = std::max<size_t>(1, round_bytes / es);
  bool checked = false;
  // Out of place and too big to stay cached: write the output with non-temporal stores.
  const bool stream = a.send != a.recv && a.count * es >= (size_t{8} << 20);
  auto out_copy = [stream](uint8_t* dst, const uint8_t* src, size_t n) {
    if (stream) shm_stream_copy(dst, src, n);
    else std::memcpy(dst, src, n);
  };
  for (size_t s = 0; s < a.count; s += per_round) {
    const size_t m = std::min(per_round, a.count - s);
    uint8_t* user = at(a.recv, s, es);
    const uint8_t* in = at(const_cast<void*>(a.send), s, es);
    const size_t ob = block_offset(m, n, me), lb = block_count(m, n, me);
    const int buf = w.acquire_stage();
    uint8_t* mine = w.stage(me, buf);
    // Copy in the blocks the other ranks reduce (everything but this rank's block).
    if (ob > 0) std::memcpy(mine, in, ob * es);
    if (ob + lb < m) std::memcpy(mine + (ob + lb) * es, in + (ob + lb) * es, (m - ob - lb) * es);
    w.publish();
    w.wait_all(w.phase());
    if (!checked) {
      w.check_fingerprints();
      checked = true;
    }
    // Reduce this rank's block: own input with every peer's staged copy, into the staging block (for the
    // peers) and the output.
    if (lb > 0) {
      uint8_t* dst = mine + ob * es;
      const int first = me == 0 ? 1 : 0;
      reduce_into3(dst, in + ob * es, w.stage(first, buf) + ob * es, lb, a.dtype, a.redop);
      for (int p = first + 1; p < n; ++p)
        if (p != me) reduce_into(dst, w.stage(p, buf) + ob * es, lb, a.dtype, a.redop);
      out_copy(user + ob * es, dst, lb * es);
    }
    w.publish();
    w.wait_all(w.phase());
    // Gather the other reduced blocks from their owners.
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      const size_t op = block_offset(m, n, p), lp = block_count(m, n, p);
      if (lp > 0) out_copy(user + op * es, w.stage(p, buf) + op * es, lp * es);
    }
    w.publish();
    w.release_stage(buf, w.phase());
  }
  if (stream) _mm_sfence();
}

}  // namespace

// ---- all_reduce ----

// Out of place, the process group leaves the copy of send into recv to this algorithm: the window paths
// read send directly; everything else (no window, overlapping buffers, one rank) copies first.
void AllReduceShm::run(AlgoContext& ctx, const CollArgs& args) {
  if (args.count == 0) return;
  const size_t bytes = args.count * dtype_size(args.dtype);
  CollArgs a = args;
  ShmWindow* w = ctx.size() > 1 ? ctx.shm_window() : nullptr;
  if (a.send != nullptr && a.send != a.recv) {
    auto s0 = reinterpret_cast<uintptr_t>(a.send), r0 = reinterpret_cast<uintptr_t>(a.recv);
    if (!w || (s0 < r0 + bytes && r0 < s0 + bytes)) {
      std::memmove(a.recv, a.send, bytes);
      a.send = a.recv;
    }
  }
  if (ctx.size() == 1) return;
  if (!w) {
    if (bytes <= ShmWindow::kSlotBytes) return AllReduceRecursiveDoubling::run(ctx, a);
    return AllReduceRing::run(ctx, a);
  }
  if (a.send == nullptr) a.send = a.recv;
  if (bytes <= ShmWindow::kTinyBytes) all_reduce_tiny(*w, a, bytes);
  else if (bytes <= ShmWindow::kSlotBytes) all_reduce_slots(*w, a, bytes);
  else all_reduce_staged(*w, ctx, a);
}

// ---- broadcast ----

bool BroadcastShm::applicable(const CollArgs&, int) { return true; }

void BroadcastShm::run(AlgoContext& ctx, const CollArgs& a) {
  if (ctx.size() == 1 || a.count == 0) return;
  ShmWindow* w = ctx.shm_window();
  if (!w) return BroadcastTree::run(ctx, a);
  const int me = w->rank();
  const size_t es = dtype_size(a.dtype), bytes = a.count * es;
  const bool small = bytes <= ShmWindow::kSlotBytes;
  const size_t per_round = small ? a.count : std::max<size_t>(1, w->stage_bytes() / es);
  bool checked = false;
  for (size_t s = 0; s < a.count; s += per_round) {
    const size_t m = std::min(per_round, a.count - s);
    uint8_t* user = at(a.recv, s, es);
    const int buf = small ? w->acquire_slot() : w->acquire_stage();
    uint8_t* root_buf = small ? w->slot(a.root, buf) : w->stage(a.root, buf);
    if (me == a.root) std::memcpy(root_buf, user, m * es);
    w->publish();
    w->wait_all(w->phase());
    if (!checked) {
      w->check_fingerprints();
      checked = true;
    }
    if (me != a.root) std::memcpy(user, root_buf, m * es);
    w->publish();
    if (small) w->release_slot(buf, w->phase());
    else w->release_stage(buf, w->phase());
  }
}

}  // namespace trident

// ---- hook for the single-copy path (shm_cma.cc): the staged bandwidth path on a window it already began,
// used when cross-memory attach is refused ----
namespace trident {
void all_reduce_shm_staged(ShmWindow& w, const AlgoContext& ctx, const CollArgs& a) { all_reduce_staged(w, ctx, a); }
}  // namespace trident
