// The single-copy path (see shm_cma.h for the protocol and the bytes each rank moves).
#include "trident/comm/algorithms/shm_cma.h"

#include <emmintrin.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/shm_fast_path.h"
#include "trident/comm/reduce.h"
#include "trident/comm/algorithms/shm_window.h"
#include "trident/comm/transport/shm_buffer.h"
#include "trident/core/env.h"
#include "trident/core/log.h"

namespace trident {
namespace {

// What a rank publishes in its window slot for one call.
struct Post {
  uint64_t token;       // this process's probe token ...
  uint64_t token_addr;  // ... and where it lives in this process
  uint64_t send;        // the call's buffers in this process
  uint64_t recv;
  int32_t probe;        // first call only: 1 = this rank reached every peer, else -errno
  int32_t shared[2];    // send, recv: 1 = inside a ShmBuffer (reg[i] says where)
  int32_t big;          // all_reduce: this rank judged the call out of cache (leaves_cache)
  ShmBuffer::Registration reg[2];
};
static_assert(sizeof(Post) <= ShmWindow::kSlotBytes, "a post fits a window slot");

// Peers read this word with process_vm_readv to prove they reach this very process (not another one
// with the same pid in another pid namespace). Set once, before any peer can see its address.
uint64_t g_token = 0;

uint64_t process_token() {
  static const uint64_t t = [] {
    // Under Yama ptrace_scope 1, a process may only be read by its ancestors unless it allows it.
    // Without Yama this fails with EINVAL, which changes nothing.
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    std::random_device rd;
    g_token = ((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid())) | 1;
    return g_token;
  }();
  return t;
}

size_t chunk_bytes_of(const AlgoContext& ctx) {
  const size_t c = ctx.chunk_bytes();
  return c != 0 ? c : cost::kCmaChunkBytes;
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return an != 0 && bn != 0 && a0 < b0 + bn && b0 < a0 + an;
}

// Whether a call whose buffers on all local ranks together span `footprint` bytes leaves the cache:
// against a quarter of the last-level cache (the share a call can expect to keep on a shared machine;
// measured on the development VM, whose 480 MiB L3 held 16 MiB all_reduces on 2 ranks (64 MiB footprint)
// but not 32 MiB ones); at least 8 MiB, 32 MiB when the cache size is unknown. TRIDENT_CACHE_BYTES sets
// the budget instead.
bool leaves_cache(size_t footprint) {
  static const size_t limit = [] {
    if (const int64_t set = env::cache_bytes(); set > 0) return static_cast<size_t>(set);
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return l3 > 0 ? std::max<size_t>(static_cast<size_t>(l3) / 4, size_t{8} << 20) : size_t{32} << 20;
  }();
  return footprint >= limit;
}

enum class Dir { kRead, kWrite };

// Moves n bytes between `local` in this process and `remote` in local rank `peer`; partial transfers are
// continued; failures raise through the window (PeerDiedError when the peer is gone).
void transfer(ShmWindow& w, int peer, Dir dir, void* local, uint64_t remote, size_t n) {
  const pid_t pid = w.peer_pid(peer);
  auto* l = static_cast<uint8_t*>(local);
  w.check_abort();
  while (n > 0) {
    iovec li{l, n}, ri{reinterpret_cast<void*>(remote), n};
    const ssize_t got =
        dir == Dir::kRead ? process_vm_readv(pid, &li, 1, &ri, 1, 0) : process_vm_writev(pid, &li, 1, &ri, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      w.fail_peer_access(peer, got < 0 ? errno : EFAULT,
                         dir == Dir::kRead ? "process_vm_readv from its buffer" : "process_vm_writev into its buffer");
    l += got;
    remote += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
}

// One call's phases on the window: the constructor publishes this rank's buffers, waits for every peer's,
// checks the fingerprints and (first call of the window) decides whether CMA works; finish() is the
// "done" phase after which no peer touches this rank's buffers.
class Session {
 public:
  // send_bytes / recv_bytes: the extent of each buffer this call touches (for the ShmBuffer lookup).
  // big: published for all_reduce's choice of path, which every rank must make alike.
  Session(ShmWindow& w, const void* send, size_t send_bytes, void* recv, size_t recv_bytes, bool big = false)
      : w_(w) {
    buf_ = w.acquire_slot();
    Post* me = post(w.rank());
    me->token = process_token();
    me->token_addr = reinterpret_cast<uint64_t>(&g_token);
    me->send = reinterpret_cast<uint64_t>(send);
    me->recv = reinterpret_cast<uint64_t>(recv);
    me->probe = 0;
    me->big = big ? 1 : 0;
    me->shared[0] = ShmBuffer::lookup(send, send_bytes, &me->reg[0]) ? 1 : 0;
    me->shared[1] = ShmBuffer::lookup(recv, recv_bytes, &me->reg[1]) ? 1 : 0;
    w.publish();
    w.wait_all(w.phase());
    w.check_fingerprints();
    if (w.cma_state == 0) probe();
    if (ok()) map_peers();
  }

  bool ok() const { return w_.cma_state == 1; }
  const Post& peer(int p) const { return *post(p); }
  // Peer p's send / recv buffer mapped into this process (a ShmBuffer of the peer's), or nullptr: then
  // only cross-memory attach reaches it.
  const uint8_t* send_map(int p) const { return maps_[2 * p]; }
  uint8_t* recv_map(int p) const { return maps_[2 * p + 1]; }
  // Copies len bytes at offset off of peer p's send (which = 0) or recv (1) buffer into dst.
  void read(int p, int which, size_t off, void* dst, size_t len) const {
    if (uint8_t* m = maps_[2 * p + which]) std::memcpy(dst, m + off, len);
    else transfer(w_, p, Dir::kRead, dst, (which == 0 ? peer(p).send : peer(p).recv) + off, len);
  }

  void finish() {
    w_.publish();
    w_.wait_all(w_.phase());
    w_.release_slot(buf_, w_.phase());
  }

 private:
  Post* post(int r) const { return reinterpret_cast<Post*>(w_.slot(r, buf_)); }

  void map_peers() {
    maps_.assign(2 * static_cast<size_t>(w_.size()), nullptr);
    for (int p = 0; p < w_.size(); ++p) {
      if (p == w_.rank()) continue;
      for (int i = 0; i < 2; ++i) {
        const Post& q = peer(p);
        if (!q.shared[i]) continue;
        uint8_t* base = ShmBuffer::map_peer(w_.peer_pid(p), q.reg[i]);
        if (base) maps_[2 * p + i] = base + q.reg[i].offset;
      }
    }
  }

  // Every rank reads every peer's token; CMA is used only if every read worked on every rank.
  void probe() {
    int32_t result = 1;
    std::string why;
    if (!env::cma()) {
      result = -EPERM;
      why = "TRIDENT_CMA=0";
    }
    for (int p = 0; p < w_.size() && result == 1; ++p) {
      if (p == w_.rank()) continue;
      uint64_t v = 0;
      iovec li{&v, sizeof v}, ri{reinterpret_cast<void*>(post(p)->token_addr), sizeof v};
      const ssize_t got = process_vm_readv(w_.peer_pid(p), &li, 1, &ri, 1, 0);
      if (got != static_cast<ssize_t>(sizeof v)) {
        const int e = got < 0 ? errno : EFAULT;
        result = -e;
        why = fmt::format("process_vm_readv from local rank {} (pid {}) failed: {}", p, w_.peer_pid(p), std::strerror(e));
      } else if (v != post(p)->token) {
        result = -ESRCH;
        why = fmt::format("pid {} of local rank {} is another process here (another pid namespace?)", w_.peer_pid(p), p);
      }
    }
    post(w_.rank())->probe = result;
    w_.publish();
    w_.wait_all(w_.phase());
    int bad = -1;
    for (int p = 0; p < w_.size() && bad < 0; ++p)
      if (post(p)->probe != 1) bad = p;
    w_.cma_state = bad < 0 ? 1 : -1;
    if (bad >= 0)
      log_debug("comm",
                "local rank {}: cross-memory attach unavailable ({}); the cma algorithm uses the staged shm path "
                "for all_reduce and message-based algorithms for the other collectives",
                w_.rank(), why.empty() ? fmt::format("local rank {} could not read its peers", bad) : why);
  }

  ShmWindow& w_;
  int buf_ = 0;
  std::vector<uint8_t*> maps_;
};

}  // namespace

// ---- all_reduce ----

void AllReduceCma::run(AlgoContext& ctx, const CollArgs& args) {
  if (args.count == 0) return;
  ShmWindow* w = ctx.size() > 1 ? ctx.shm_window() : nullptr;
  if (!w) return AllReduceShm::run(ctx, args);  // one rank or no window: copies send first, then messages
  const size_t es = dtype_size(args.dtype), bytes = args.count * es;
  CollArgs a = args;
  if (a.send == nullptr) a.send = a.recv;
  if (a.send != a.recv && overlaps(a.send, bytes, a.recv, bytes)) {
    std::memmove(a.recv, a.send, bytes);
    a.send = a.recv;
  }
  if (w->cma_state < 0) return all_reduce_shm_staged(*w, ctx, a);
  const int n = w->size(), me = w->rank();
  // Out of cache (every rank's input and output): decided by each rank, published, and taken as true
  // when any rank says so (the budget may differ per process: TRIDENT_CACHE_BYTES).
  bool big = leaves_cache(2 * static_cast<size_t>(n) * bytes);
  Session s(*w, a.send, bytes, a.recv, bytes, big);
  if (!s.ok()) {
    s.finish();
    return all_reduce_shm_staged(*w, ctx, a);
  }
  const size_t per = std::max<size_t>(1, chunk_bytes_of(ctx) / es);
  // Out of cache and out of place on some rank whose output the peers cannot map: the kernel would write
  // that output's lines without having them in cache (a read for ownership of each line first), which
  // measured 1.7x slower than the staged path at 64 MiB (and in place 1.2-1.4x faster than it): stage
  // instead. Decided from every rank's post, so every rank takes the same path. (While the data stays
  // in cache the kernel's writes are cheap: 16 MiB out of place ran 8.4-9.1 GB/s direct, 6.6-7.6 staged.)
  for (int r = 0; r < n; ++r) big |= s.peer(r).big != 0;
  if (big) {
    bool plain_out_of_place = false;
    for (int r = 0; r < n; ++r) plain_out_of_place |= s.peer(r).send != s.peer(r).recv && !s.peer(r).shared[1];
    if (plain_out_of_place) {
      s.finish();
      return all_reduce_shm_staged(*w, ctx, a);
    }
  }
  const size_t off = block_offset(a.count, n, me), cnt = block_count(a.count, n, me);
  const size_t scratch_bytes = std::min(per, std::max<size_t>(cnt, 1)) * es;
  auto* scratch = static_cast<uint8_t*>(ctx.scratch(scratch_bytes));
  // Out of place and too big to stay cached: reduce into a second cache-resident buffer and write this
  // rank's output from it with non-temporal stores (no read-for-ownership of output lines never read).
  const bool stream = a.send != a.recv && big;
  auto* reduced = stream ? static_cast<uint8_t*>(ctx.scratch(scratch_bytes, 1)) : nullptr;
  const auto* in = static_cast<const uint8_t*>(a.send);
  auto* out = static_cast<uint8_t*>(a.recv);
  for (size_t c = 0; c < cnt; c += per) {
    const size_t m = std::min(per, cnt - c), pos = (off + c) * es, len = m * es;
    uint8_t* dst = stream ? reduced : out + pos;
    // Every peer's chunk of this block, reduced with this rank's input (first) into dst.
    // (A peer's ShmBuffer is read in place, with no copy at all.)
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      const uint8_t* theirs = s.send_map(p) ? s.send_map(p) + pos : scratch;
      if (!s.send_map(p)) transfer(*w, p, Dir::kRead, scratch, s.peer(p).send + pos, len);
      if (k == 1) reduce_into3(dst, in + pos, theirs, m, a.dtype, a.redop);
      else reduce_into(dst, theirs, m, a.dtype, a.redop);
    }
    if (stream) shm_stream_copy(out + pos, reduced, len);
    // The reduced chunk (in cache) into every peer's output.
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      if (uint8_t* theirs = s.recv_map(p)) {
        if (stream) shm_stream_copy(theirs + pos, dst, len);
        else std::memcpy(theirs + pos, dst, len);
      } else {
        transfer(*w, p, Dir::kWrite, dst, s.peer(p).recv + pos, len);
      }
    }
  }
  if (stream) _mm_sfence();
  s.finish();
}

// ---- reduce_scatter ----

void ReduceScatterCma::run(AlgoContext& ctx, const CollArgs& args) {
  const int n = ctx.size();
  const size_t es = dtype_size(args.dtype), cnt = args.count, bytes = cnt * es;
  if (n == 1) {
    if (bytes != 0 && args.send != args.recv) std::memmove(args.recv, args.send, bytes);
    return;
  }
  if (cnt == 0) return;
  ShmWindow* w = ctx.shm_window();
  if (!w || w->cma_state < 0) return ReduceScatterRing::run(ctx, args);
  const int me = w->rank();
  CollArgs a = args;
  // recv may be this rank's block of send (in place); any other overlap: peers would read what this rank
  // writes, so work from a copy of send.
  const auto* block = static_cast<const uint8_t*>(a.send) + me * bytes;
  if (a.recv != block && overlaps(a.send, bytes * n, a.recv, bytes)) {
    void* copy = ctx.scratch(bytes * n, 1);
    std::memcpy(copy, a.send, bytes * n);
    a.send = copy;
    block = static_cast<const uint8_t*>(copy) + me * bytes;
  }
  Session s(*w, a.send, bytes * n, a.recv, bytes);
  if (!s.ok()) {
    s.finish();
    return ReduceScatterRing::run(ctx, args);
  }
  const size_t per = std::max<size_t>(1, chunk_bytes_of(ctx) / es);
  auto* scratch = static_cast<uint8_t*>(ctx.scratch(std::min(per, cnt) * es));
  auto* out = static_cast<uint8_t*>(a.recv);
  // Out of cache (every rank's send and recv: n (n + 1) bytes) and not in place: reduce into a second
  // cache-resident buffer and stream it into recv (no read for ownership of recv's lines).
  const bool stream = a.recv != block && leaves_cache(static_cast<size_t>(n) * (n + 1) * bytes);
  auto* reduced = stream ? static_cast<uint8_t*>(ctx.scratch(std::min(per, cnt) * es, 1)) : nullptr;
  const uint64_t remote_off = static_cast<uint64_t>(me) * bytes;
  for (size_t c = 0; c < cnt; c += per) {
    const size_t m = std::min(per, cnt - c), pos = c * es, len = m * es;
    uint8_t* dst = stream ? reduced : out + pos;
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      const uint8_t* theirs = s.send_map(p) ? s.send_map(p) + remote_off + pos : scratch;
      if (!s.send_map(p)) transfer(*w, p, Dir::kRead, scratch, s.peer(p).send + remote_off + pos, len);
      if (k == 1) reduce_into3(dst, block + pos, theirs, m, a.dtype, a.redop);
      else reduce_into(dst, theirs, m, a.dtype, a.redop);
    }
    if (stream) shm_stream_copy(out + pos, reduced, len);
  }
  if (stream) _mm_sfence();
  s.finish();
}

// ---- all_gather ----

void AllGatherCma::run(AlgoContext& ctx, const CollArgs& args) {
  const int n = ctx.size();
  const size_t es = dtype_size(args.dtype), bytes = args.count * es;
  if (n == 1) {
    if (bytes != 0 && args.send != args.recv) std::memmove(args.recv, args.send, bytes);
    return;
  }
  if (bytes == 0) return;
  ShmWindow* w = ctx.shm_window();
  if (!w || w->cma_state < 0) return AllGatherRing::run(ctx, args);
  const int me = w->rank();
  CollArgs a = args;
  auto* out = static_cast<uint8_t*>(a.recv);
  // send may be this rank's block of recv (in place); any other overlap: work from a copy of send.
  if (a.send != out + me * bytes && overlaps(a.send, bytes, a.recv, bytes * n)) {
    void* copy = ctx.scratch(bytes, 1);
    std::memcpy(copy, a.send, bytes);
    a.send = copy;
  }
  Session s(*w, a.send, bytes, a.recv, bytes * n);
  if (!s.ok()) {
    s.finish();
    return AllGatherRing::run(ctx, args);
  }
  if (a.send != out + me * bytes) {
    // Out of cache: this rank's own block with non-temporal stores (glibc's memcpy keeps ordinary stores up
    // to a share of the last-level cache, which on a large L3 means a read for ownership of every line:
    // 2 ranks, 64 MiB, 9.2-9.6 ms against 10.6-11.4). Reading the peers' blocks through a cached scratch
    // and streaming them out measured slower (9.4-10.1 ms): the kernel copies straight into the output.
    if (leaves_cache(static_cast<size_t>(n) * bytes * (n + 1))) {
      shm_stream_copy(out + me * bytes, static_cast<const uint8_t*>(a.send), bytes);
      _mm_sfence();
    } else {
      std::memcpy(out + me * bytes, a.send, bytes);
    }
  }
  for (int k = 1; k < n; ++k) {
    const int p = (me + k) % n;
    s.read(p, 0, 0, out + p * bytes, bytes);
  }
  s.finish();
}

// ---- broadcast ----

// Past 1 MiB the kernel's copy into the non-roots' buffers (pinned page by page, written without the
// lines in cache) ran slower than the window's two cached copies: 2 ranks, 2 MiB 11.7-11.9 GB/s against
// 13.0-13.3, 64 MiB 5.4-5.7 against 7.9-8.4 (1 MiB: 16.9-21.7 against 13.4-13.5, 256 KiB 26-30 against
// 16-17: its cost in comm/cost/cost.cc is half the staged path's bytes). So broadcast takes the staged shm path there
// (cost and run alike: cost::kCmaBroadcastMaxBytes).

void BroadcastCma::run(AlgoContext& ctx, const CollArgs& a) {
  if (ctx.size() == 1 || a.count == 0) return;
  ShmWindow* w = ctx.shm_window();
  if (!w || w->cma_state < 0) return BroadcastTree::run(ctx, a);
  const size_t bytes = a.count * dtype_size(a.dtype);
  if (bytes > cost::kCmaBroadcastMaxBytes) return BroadcastShm::run(ctx, a);
  Session s(*w, a.recv, bytes, a.recv, bytes);
  if (!s.ok()) {
    s.finish();
    return BroadcastTree::run(ctx, a);
  }
  if (w->rank() != a.root) s.read(a.root, 1, 0, a.recv, bytes);
  s.finish();
}

}  // namespace trident
