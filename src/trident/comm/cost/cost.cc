// Every algorithm's cost (cost.h), one function per (op, algorithm), the table of them, HostLayout and
// predict_seconds. The patterns themselves live in comm/algorithms/, one file each.
#include "trident/comm/cost/cost.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trident/comm/collective.h"

namespace trident {

// ---- HostLayout ----

HostLayout HostLayout::from_hosts(std::vector<int> host_of) {
  HostLayout l;
  std::map<int, int> dense;  // given host id -> host index by first appearance
  for (int h : host_of) {
    auto it = dense.find(h);
    if (it == dense.end()) {
      it = dense.emplace(h, static_cast<int>(l.members.size())).first;
      l.members.emplace_back();
    }
    l.members[it->second].push_back(static_cast<int>(l.host_of.size()));
    l.host_of.push_back(it->second);
  }
  return l;
}

HostLayout HostLayout::blocks(int ranks, int per_host) {
  per_host = std::max(1, per_host);
  std::vector<int> h(std::max(0, ranks));
  for (int r = 0; r < ranks; ++r) h[r] = r / per_host;
  return from_hosts(std::move(h));
}

int HostLayout::local_index(int r) const {
  const auto& m = members[host_of[r]];
  return static_cast<int>(std::find(m.begin(), m.end(), r) - m.begin());
}

int HostLayout::min_local() const {
  int v = members.empty() ? 0 : static_cast<int>(members[0].size());
  for (const auto& m : members) v = std::min(v, static_cast<int>(m.size()));
  return v;
}

int HostLayout::max_local() const {
  int v = 0;
  for (const auto& m : members) v = std::max(v, static_cast<int>(m.size()));
  return v;
}

std::string HostLayout::describe() const {
  if (uniform()) return fmt::format("{} host(s) x {} rank(s)", hosts(), max_local());
  std::vector<size_t> sizes;
  for (const auto& m : members) sizes.push_back(m.size());
  return fmt::format("{} hosts ({} ranks)", hosts(), fmt::join(sizes, "+"));
}

bool cost::hierarchical_layout(const HostLayout& l) { return l.hosts() > 1 && l.uniform() && l.min_local() > 1; }

namespace {

using cost::ceil_log2;
using cost::floor_pow2;
using cost::is_pow2;

double d(size_t bytes) { return static_cast<double>(bytes); }

// ---- message-based patterns (flat: one link class) ----

// Reduce-scatter then all-gather around the ring: bandwidth-optimal, so each rank sends the bus bytes
// (nccl-tests' factor is defined by this pattern).
Cost all_reduce_ring(size_t bytes, int n) {
  if (n <= 1) return {};
  return {2.0 * (n - 1), bus_bytes(OpKind::kAllReduce, d(bytes), n)};
}
// Two phases of n-1 concurrent messages of bytes/n each. The engine issues a phase's messages back to
// back, so each extra message costs about half a latency rather than a full one (one host).
Cost all_reduce_direct(size_t bytes, int n) {
  if (n <= 1) return {};
  return {2.0 + (n - 2), bus_bytes(OpKind::kAllReduce, d(bytes), n)};
}
// Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather over the largest power of
// two p <= n; the fold of the other n - p ranks adds two full-buffer steps.
Cost all_reduce_rabenseifner(size_t bytes, int n) {
  if (n <= 1) return {};
  const int p = floor_pow2(n);
  const int k = ceil_log2(p);
  const bool fold = !is_pow2(n);
  return {2.0 * k + (fold ? 2.0 : 0.0), (2.0 * (p - 1) / p + (fold ? 2.0 : 0.0)) * d(bytes)};
}
// log2(p) exchanges of the whole buffer (each rank sends `bytes` per exchange), each followed by a local
// reduction pass that does not overlap the transfer (charged at the local gamma, not as link bytes: the
// link carries each byte once); the fold adds two steps of `bytes` (its reduction is fused in the receive).
Cost all_reduce_recursive_doubling(size_t bytes, int n) {
  if (n <= 1) return {};
  const int k = ceil_log2(floor_pow2(n));
  const double fold = is_pow2(n) ? 0.0 : 2.0;
  const double b = d(bytes);
  return {k + fold, (k + fold) * b, k * b};
}
// Binomial-tree reduce then broadcast: 2 log2 n steps of the whole buffer.
Cost all_reduce_tree(size_t bytes, int n) {
  if (n <= 1) return {};
  const int k = ceil_log2(n);
  return {2.0 * k, 2.0 * k * d(bytes)};
}

// A chain root -> root+1 -> ...: every rank sends the buffer once; the pipeline fills in n-2 chunks.
Cost broadcast_ring(size_t bytes, int n) {
  if (n <= 1) return {};
  constexpr double kChunk = 1 << 20;  // typical chunk (see algo::chunk_elems)
  const double chunks = std::max(1.0, d(bytes) / kChunk);
  const double fill = std::min(d(bytes), kChunk) * (n - 2);
  return {(n - 1) + chunks - 1, d(bytes) + fill};
}
// The root sends the whole buffer to each of its ceil(log2 n) children; chunks pipeline down the levels.
Cost broadcast_tree(size_t bytes, int n) {
  if (n <= 1) return {};
  const int k = ceil_log2(n);
  return {static_cast<double>(k), k * d(bytes)};
}
// n-1 messages issued back to back by the root (about half a latency each beyond the first).
Cost broadcast_direct(size_t bytes, int n) {
  if (n <= 1) return {};
  return {1.0 + 0.5 * (n - 2), (n - 1) * d(bytes)};
}

Cost reduce_tree(size_t bytes, int n) { return broadcast_tree(bytes, n); }
// The root receives n-1 full buffers.
Cost reduce_direct(size_t bytes, int n) { return broadcast_direct(bytes, n); }

// The patterns that move (n-1)/n of the whole buffer per rank (all_gather's bus bytes, whichever op runs
// them): in n-1 steps (ring, pairwise), log2 n
// steps (recursive doubling / halving, trees of gather and scatter), or one burst of n-1 messages issued
// back to back (direct: about half a latency each beyond the first).
Cost spread_steps(size_t bytes, int n) {
  if (n <= 1) return {};
  return {static_cast<double>(n - 1), bus_bytes(OpKind::kAllGather, d(bytes), n)};
}
Cost spread_log(size_t bytes, int n) {
  if (n <= 1) return {};
  return {static_cast<double>(ceil_log2(n)), bus_bytes(OpKind::kAllGather, d(bytes), n)};
}
Cost spread_direct(size_t bytes, int n) {
  if (n <= 1) return {};
  return {1.0 + 0.5 * (n - 2), bus_bytes(OpKind::kAllGather, d(bytes), n)};
}

Cost barrier_dissemination(size_t, int n) {
  if (n <= 1) return {};
  return {static_cast<double>(ceil_log2(n)), 0.0};
}

// ---- hierarchical (inside each host, across hosts, inside again) ----

// Inside: ring reduce-scatter + all-gather over the L = min_local core ranks of a host, plus (uneven
// hosts) one full-buffer hand-in and hand-out per extra rank served by a core rank. Across: the
// all-reduce of a B/L shard over H hosts, by the L core ranks of a host at once, so a host's link
// carries L times one rank's bytes.
TopoCost all_reduce_hierarchical(size_t bytes, const HostLayout& l) {
  TopoCost t;
  const int n = l.ranks(), H = l.hosts(), L = l.min_local();
  if (n <= 1) return t;
  t.intra = all_reduce_ring(bytes, L);
  const int extras_per_core = (l.max_local() - L + L - 1) / L;
  t.intra.alpha_terms += 2.0 * extras_per_core;
  t.intra.beta_bytes += 2.0 * extras_per_core * d(bytes);
  const size_t shard = bytes / L;
  Cost inter = shard >= cost::kHierInterRingBytes ? all_reduce_ring(shard, H) : all_reduce_recursive_doubling(shard, H);
  inter.beta_bytes *= L;
  t.inter = inter;
  return t;
}

// bytes = the gathered buffer (count * n * element size). Across: H-1 steps; a host's L ranks each send
// H-1 blocks, so its link carries (H-1)/H of bytes. Inside: L-1 steps of H-block groups, (L-1)/L of
// bytes, plus one local pass to put the blocks in rank order.
TopoCost all_gather_hierarchical(size_t bytes, const HostLayout& l) {
  TopoCost t;
  if (l.ranks() <= 1) return t;
  if (!cost::hierarchical_layout(l)) {
    (l.hosts() > 1 ? t.inter : t.intra) = spread_steps(bytes, l.ranks());
    return t;
  }
  const int H = l.hosts(), L = l.min_local();
  const double b = d(bytes);
  t.inter = {static_cast<double>(H - 1), (H - 1.0) / H * b, 0};
  t.intra = {static_cast<double>(L - 1), (L - 1.0) / L * b, b};
  return t;
}

// bytes = the whole send buffer (count * n * element size). Inside: a local pack pass, then L-1 ring
// steps of H-block groups ((L-1)/L of bytes). Across: H-1 steps, a host's L ranks each sending H-1
// blocks: (H-1)/H of bytes on the host's link.
// The same steps and bytes as the hierarchical all-gather, in the other direction.
TopoCost reduce_scatter_hierarchical(size_t bytes, const HostLayout& l) { return all_gather_hierarchical(bytes, l); }

// ---- shared-memory window ("shm", one host) ----

// The window's phases cost a store and a load of a shared cache line, not a message: a fraction of a
// shared-memory message latency. Groups across hosts cannot use the window at all.
constexpr double kShmPhaseAlpha = 0.25;

TopoCost single_host_only(Cost c, const HostLayout& layout) {
  TopoCost t;
  t.intra = c;
  if (layout.hosts() > 1) t.intra.alpha_terms = std::numeric_limits<double>::infinity();
  return t;
}

Cost all_reduce_shm(size_t bytes, int n) {
  if (n <= 1) return {};
  if (bytes <= cost::kShmSlotBytes) return {2 * kShmPhaseAlpha, 0.0, d(bytes) * (n - 1)};
  const double rounds = static_cast<double>((bytes + (size_t{1} << 20) - 1) >> 20);
  // Every byte crosses shared memory once into and once out of the staging area per rank.
  return {3 * kShmPhaseAlpha * rounds, d(bytes) * (n - 1) / n, 0.0};
}
TopoCost all_reduce_shm_topo(size_t bytes, const HostLayout& l) { return single_host_only(all_reduce_shm(bytes, l.ranks()), l); }

// Half a message's bytes per byte: the root's copy into the staging buffer and the peers' copies out of
// it stay in cache, and measured about twice the message path's rate (2 ranks: 16 MiB 11.3-13.9 GB/s
// against the tree's 6.2-6.4, 64 MiB 10.7-11.7 against 4.1-4.3; 1-4 MiB level with it).
Cost broadcast_shm(size_t bytes, int n) {
  if (n <= 1) return {};
  const double rounds = static_cast<double>((bytes + (size_t{1} << 20) - 1) >> 20);
  return {2 * kShmPhaseAlpha * std::max(1.0, rounds), 0.5 * d(bytes), 0.0};
}
TopoCost broadcast_shm_topo(size_t bytes, const HostLayout& l) { return single_host_only(broadcast_shm(bytes, l.ranks()), l); }

// ---- single copy between the ranks' buffers ("cma", one host) ----

// In units of the shm link's alpha (1.5 us), fitted to 2 bound ranks on the development VM: a call's two
// phases (addresses, done) cost about 1.8 us together (a phase here ends a spell of work, so the peer is
// rarely already waiting), a process_vm_readv/writev call about 0.2 us before it copies (entry, the peer's
// mm lookup), its page pinning is in beta below.
constexpr double kCmaPhaseAlpha = 0.6;
constexpr double kCmaSyscallAlpha = 0.15;
// Bytes per byte moved, relative to the staged path's beta: one kernel copy instead of a copy into the
// window and a copy out.
constexpr double kCmaBetaFactor = 0.5;

double cma_chunks(double bytes) { return std::max(1.0, bytes / static_cast<double>(cost::kCmaChunkBytes)); }

Cost all_reduce_cma(size_t bytes, int n) {
  if (n <= 1) return {};
  const double b = d(bytes);
  const double calls = 2.0 * (n - 1) * cma_chunks(b / n);
  return {2 * kCmaPhaseAlpha + kCmaSyscallAlpha * calls, kCmaBetaFactor * b * (n - 1) / n, 0.0};
}
Cost reduce_scatter_cma(size_t bytes, int n) {
  if (n <= 1) return {};
  const double b = d(bytes);
  const double calls = (n - 1) * cma_chunks(b / n);
  return {2 * kCmaPhaseAlpha + kCmaSyscallAlpha * calls, kCmaBetaFactor * b * (n - 1) / n, 0.0};
}
Cost all_gather_cma(size_t bytes, int n) {
  if (n <= 1) return {};
  const double b = d(bytes);
  return {2 * kCmaPhaseAlpha + kCmaSyscallAlpha * (n - 1), kCmaBetaFactor * b * (n - 1) / n, 0.0};
}
// Past kCmaBroadcastMaxBytes the staged shm path is faster (shm_cma.cc gives the measurements), and the
// run takes it: so does the cost.
Cost broadcast_cma(size_t bytes, int n) {
  if (n <= 1) return {};
  if (bytes > cost::kCmaBroadcastMaxBytes) return broadcast_shm(bytes, n);
  return {2 * kCmaPhaseAlpha + kCmaSyscallAlpha, kCmaBetaFactor * broadcast_shm(bytes, n).beta_bytes, 0.0};
}
TopoCost all_reduce_cma_topo(size_t b, const HostLayout& l) { return single_host_only(all_reduce_cma(b, l.ranks()), l); }
TopoCost reduce_scatter_cma_topo(size_t b, const HostLayout& l) {
  return single_host_only(reduce_scatter_cma(b, l.ranks()), l);
}
TopoCost all_gather_cma_topo(size_t b, const HostLayout& l) { return single_host_only(all_gather_cma(b, l.ranks()), l); }
TopoCost broadcast_cma_topo(size_t b, const HostLayout& l) { return single_host_only(broadcast_cma(b, l.ranks()), l); }

// How many times one rank's bytes the busiest host link carries under a flat algorithm, on `l` (hosts
// holding adjacent ranks). A ring leaves each host by one edge: one rank's bytes (1). The patterns that
// exchange with every remote rank, or pair ranks at distances up to n/2, have all L ranks of a host cross
// at once: direct all-gather / reduce-scatter / all-reduce / all-to-all send L (n - L) / n of the buffer
// across per host against one rank's (n - 1) / n; recursive doubling (all-gather) and halving
// (reduce-scatter, Rabenseifner's all-reduce) cross in their steps at distance >= L, whose bytes add up to
// the same; recursive-doubling all-reduce sends the whole buffer in each of its log2 n steps, log2 H of
// them across, L at a time. (2 hosts x 2 ranks, 16 MiB on 1 Gbit/s: all_gather ring 107 ms, direct
// 136-160 ms, rd 148-152 ms; the model's 4/3.)
double host_link_share(const AlgoCost& c, const HostLayout& l) {
  const int n = l.ranks(), L = l.max_local(), H = l.hosts();
  if (n <= 1 || L <= 1 || H <= 1) return 1.0;
  const bool many = c.op == OpKind::kAllReduce || c.op == OpKind::kAllGather || c.op == OpKind::kAllGatherV ||
                    c.op == OpKind::kReduceScatter || c.op == OpKind::kAllToAll;
  if (!many) return 1.0;
  const double pairwise = static_cast<double>(L) * (n - L) / (n - 1);
  switch (c.algo) {
    case Algo::kDirect:
    case Algo::kRecursiveHalving:
      return pairwise;
    case Algo::kRecursiveDoubling:
      if (c.op != OpKind::kAllReduce) return pairwise;
      return L * std::log2(static_cast<double>(H)) / std::log2(static_cast<double>(n));
    default:
      return 1.0;
  }
}

}  // namespace

const std::vector<AlgoCost>& cost_table() {
  using O = OpKind;
  using A = Algo;
  static const std::vector<AlgoCost> table = {
      {O::kAllReduce, A::kRing, &all_reduce_ring},
      {O::kAllReduce, A::kDirect, &all_reduce_direct},
      {O::kAllReduce, A::kRecursiveHalving, &all_reduce_rabenseifner},
      {O::kAllReduce, A::kRecursiveDoubling, &all_reduce_recursive_doubling},
      {O::kAllReduce, A::kTree, &all_reduce_tree},
      {O::kAllReduce, A::kHierarchical, &all_reduce_ring, &all_reduce_hierarchical},
      {O::kAllReduce, A::kShm, &all_reduce_shm, &all_reduce_shm_topo},
      {O::kAllReduce, A::kCma, &all_reduce_cma, &all_reduce_cma_topo},

      {O::kBroadcast, A::kRing, &broadcast_ring},
      {O::kBroadcast, A::kTree, &broadcast_tree},
      {O::kBroadcast, A::kDirect, &broadcast_direct},
      {O::kBroadcast, A::kShm, &broadcast_shm, &broadcast_shm_topo},
      {O::kBroadcast, A::kCma, &broadcast_cma, &broadcast_cma_topo},

      {O::kReduce, A::kTree, &reduce_tree},
      {O::kReduce, A::kDirect, &reduce_direct},

      {O::kAllGather, A::kRing, &spread_steps},
      {O::kAllGather, A::kDirect, &spread_direct},
      {O::kAllGather, A::kRecursiveDoubling, &spread_log, nullptr, true},
      {O::kAllGather, A::kHierarchical, &spread_steps, &all_gather_hierarchical},
      {O::kAllGather, A::kCma, &all_gather_cma, &all_gather_cma_topo},

      {O::kAllGatherV, A::kRing, &spread_steps},
      {O::kAllGatherV, A::kDirect, &spread_direct},

      {O::kReduceScatter, A::kRing, &spread_steps},
      {O::kReduceScatter, A::kDirect, &spread_direct},
      {O::kReduceScatter, A::kRecursiveHalving, &spread_log, nullptr, true},
      {O::kReduceScatter, A::kHierarchical, &spread_steps, &reduce_scatter_hierarchical},
      {O::kReduceScatter, A::kCma, &reduce_scatter_cma, &reduce_scatter_cma_topo},

      {O::kGather, A::kDirect, &spread_direct},
      {O::kGather, A::kTree, &spread_log},

      {O::kScatter, A::kDirect, &spread_direct},
      {O::kScatter, A::kTree, &spread_log},

      {O::kAllToAll, A::kPairwise, &spread_steps},
      {O::kAllToAll, A::kDirect, &spread_direct},

      {O::kBarrier, A::kDissemination, &barrier_dissemination},
  };
  return table;
}

const AlgoCost* find_cost(OpKind op, Algo algo) {
  for (const auto& c : cost_table())
    if (c.op == op && c.algo == algo) return &c;
  return nullptr;
}

double predict_seconds(const AlgoCost& c, size_t bytes, const HostLayout& layout, const LinkCost& intra,
                       const LinkCost& inter) {
  if (c.topo_cost) return c.topo_cost(bytes, layout).time(intra, inter);
  Cost flat = c.cost(bytes, layout.ranks());
  if (layout.hosts() <= 1) return flat.time(intra);
  flat.beta_bytes *= host_link_share(c, layout);
  return flat.time(inter);
}

}  // namespace trident
