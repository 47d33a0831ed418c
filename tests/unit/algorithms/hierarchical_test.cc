// The hierarchical algorithms (all_reduce, all_gather, reduce_scatter "hier") over the thread-based
// AlgoContext with a host layout laid on top (HostedContext), swept over layouts (even, interleaved,
// uneven, one rank per host, one host), counts (0, 1, primes, more than the ranks, multi-chunk) and
// dtypes/ops. Expected values are computed here by a naive loop over ranks from small-integer inputs
// (exact in any order). Also: HostLayout, and the cost model's choices between flat and hierarchical.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>

#include "thread_world.h"
#include "trident/comm/algorithms/algorithm.h"
#include "trident/comm/algorithms/hierarchical.h"
#include "trident/comm/reduce.h"

namespace trident {
namespace {

using testing::ThreadWorld;

// Forwards everything to the thread world's context, and answers host_of from a fixed layout.
class HostedContext final : public AlgoContext {
 public:
  HostedContext(AlgoContext& inner, const std::vector<int>& hosts) : inner_(inner), hosts_(hosts) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Request isend(int p, uint32_t s, const void* d, size_t n) override { return inner_.isend(p, s, d, n); }
  Request irecv(int p, uint32_t s, void* d, size_t n) override { return inner_.irecv(p, s, d, n); }
  Request irecv_reduce(int p, uint32_t s, void* d, size_t c, DType t, ReduceOp o, const void* own = nullptr) override {
    return inner_.irecv_reduce(p, s, d, c, t, o, own);
  }
  void wait(std::span<const Request> r) override { inner_.wait(r); }
  using AlgoContext::wait;
  void* scratch(size_t n, int slot) override { return inner_.scratch(n, slot); }
  size_t chunk_bytes() const override { return inner_.chunk_bytes(); }
  int host_of(int r) const override { return hosts_[r]; }

 private:
  AlgoContext& inner_;
  const std::vector<int>& hosts_;
};

// Input of rank r at element i: small integers ({-2,-1,1,2} for prod).
double value(int r, size_t i, ReduceOp op) {
  const uint64_t h = (static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xBF58476D1CE4E5B9ull) >> 33;
  if (op == ReduceOp::kProd) {
    static const double kVals[4] = {-2, -1, 1, 2};
    return kVals[h & 3];
  }
  return static_cast<double>(h % 13) - 6;
}

void put(DType t, void* p, size_t i, double v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::kBFloat16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); return;
    case DType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DType::kFloat64: static_cast<double*>(p)[i] = v; return;
    default: FAIL() << "dtype not used here";
  }
}
double get(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DType::kFloat64: return static_cast<const double*>(p)[i];
    default: return -1e300;
  }
}
double reduce_ref(int n, size_t i, ReduceOp op) {
  double acc = value(0, i, op);
  for (int r = 1; r < n; ++r) {
    const double v = value(r, i, op);
    acc = op == ReduceOp::kProd ? acc * v : op == ReduceOp::kMax ? std::max(acc, v) : op == ReduceOp::kMin ? std::min(acc, v) : acc + v;
  }
  return acc;
}

// Runs `op` hier on `hosts` with count/dtype/redop; returns "" or the first wrong element.
std::string run_hier(OpKind op, const std::vector<int>& hosts, size_t count, DType t, ReduceOp rop, size_t chunk) {
  const int n = static_cast<int>(hosts.size());
  const size_t es = dtype_size(t);
  const size_t in_elems = op == OpKind::kReduceScatter ? count * n : count;
  const size_t out_elems = op == OpKind::kAllGather ? count * n : count;
  std::vector<std::vector<unsigned char>> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    in[r].assign(in_elems * es + 8, 0xAB);
    out[r].assign(out_elems * es + 8, 0xCD);
    for (size_t i = 0; i < in_elems; ++i) put(t, in[r].data(), i, value(r, i, rop));
    if (op == OpKind::kAllReduce) std::memcpy(out[r].data(), in[r].data(), in_elems * es);
  }
  ThreadWorld w(n);
  w.set_chunk_bytes(chunk);
  const AlgorithmInfo* info = find_algorithm(op, Algo::kHierarchical);
  if (info == nullptr) return "hier is not registered";
  auto res = w.run([&](AlgoContext& inner) {
    HostedContext ctx(inner, hosts);
    const int r = ctx.rank();
    CollArgs a;
    a.op = op;
    a.count = count;
    a.dtype = t;
    a.redop = rop;
    a.send = op == OpKind::kAllReduce ? out[r].data() : in[r].data();
    a.recv = out[r].data();
    info->run(ctx, a);
  });
  const std::string what = fmt::format("{} hier hosts=[{}] count={} dtype={} op={} chunk={}", op_name(op),
                                       fmt::join(hosts, ","), count, dtype_name(t), reduce_op_name(rop), chunk);
  if (!res.ok()) return what + ": " + res.summary();
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < out_elems; ++i) {
      double want = 0;
      if (op == OpKind::kAllReduce) want = reduce_ref(n, i, rop);
      else if (op == OpKind::kReduceScatter) want = reduce_ref(n, r * count + i, rop);
      else want = value(static_cast<int>(i / count), i % count, rop);
      const double got = get(t, out[r].data(), i);
      if (got != want) return fmt::format("{}: rank {} element {} is {}, expected {}", what, r, i, got, want);
    }
    if (out[r][out_elems * es] != 0xCD) return fmt::format("{}: rank {} wrote past the end", what, r);
  }
  return "";
}

const std::vector<std::vector<int>> kLayouts = {
    {0, 0, 1, 1},           // 2 hosts x 2
    {0, 1, 0, 1},           // 2 x 2, interleaved ranks
    {0, 0, 0, 1, 1},        // 3 + 2
    {0, 0, 1, 1, 2, 2},     // 3 x 2
    {5, 5, 5, 9, 9, 9},     // 2 x 3, sparse host ids
    {0, 1, 1, 1},           // 1 + 3
    {0, 0, 1, 1, 1, 2, 2},  // 2 + 3 + 2
    {0, 1, 2},              // one rank per host
    {0, 0, 0},              // one host
    {0},                    // one rank
};

TEST(Hierarchical, EveryLayoutCountAndOpIsExact) {
  for (OpKind op : {OpKind::kAllReduce, OpKind::kAllGather, OpKind::kReduceScatter})
    for (const auto& hosts : kLayouts)
      for (size_t count : {0, 1, 2, 3, 7, 13, 1031})
        for (ReduceOp rop : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProd}) {
          if (op == OpKind::kAllGather && rop != ReduceOp::kSum) continue;
          const std::string e = run_hier(op, hosts, count, DType::kFloat32, rop, 0);
          ASSERT_EQ(e, "");
        }
}

TEST(Hierarchical, OtherDtypesAndMultiChunkPipelines) {
  for (OpKind op : {OpKind::kAllReduce, OpKind::kAllGather, OpKind::kReduceScatter})
    for (const auto& hosts : {kLayouts[0], kLayouts[2], kLayouts[3]})
      for (DType t : {DType::kBFloat16, DType::kInt32, DType::kFloat64})
        for (size_t chunk : {size_t(0), size_t(64)}) {
          ASSERT_EQ(run_hier(op, hosts, 997, t, ReduceOp::kSum, chunk), "");
          ASSERT_EQ(run_hier(op, hosts, 5, t, ReduceOp::kMin, chunk), "");
        }
  // Larger than the inter-host ring threshold (64 KiB shards), so the shard ring runs too.
  ASSERT_EQ(run_hier(OpKind::kAllReduce, kLayouts[3], (200 << 10) + 3, DType::kFloat32, ReduceOp::kSum, 0), "");
}

TEST(Hierarchical, HostLayout) {
  HostLayout l = HostLayout::from_hosts({7, 7, 3, 7, 3});
  EXPECT_EQ(l.hosts(), 2);
  EXPECT_EQ(l.host_of, (std::vector<int>{0, 0, 1, 0, 1}));
  EXPECT_EQ(l.members[0], (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(l.members[1], (std::vector<int>{2, 4}));
  EXPECT_EQ(l.local_index(3), 2);
  EXPECT_EQ(l.local_index(4), 1);
  EXPECT_EQ(l.min_local(), 2);
  EXPECT_EQ(l.max_local(), 3);
  EXPECT_FALSE(l.uniform());
  EXPECT_EQ(l.describe(), "2 hosts (3+2 ranks)");
  EXPECT_EQ(HostLayout::from_hosts({0, 0, 1, 1}).describe(), "2 host(s) x 2 rank(s)");
}

// Links of the emulated hosts: shared memory inside, 1 Gbit/s with 200 us latency across.
const LinkCost kShm{1.5e-6, 1.0 / 6e9, 1.0 / 10e9};
const LinkCost kNet{200e-6, 1.0 / 125e6, 1.0 / 10e9};

Algo cheapest(OpKind op, size_t bytes, const HostLayout& l) {
  const AlgorithmInfo* best = nullptr;
  double bt = 0;
  CollArgs a;
  a.op = op;
  for (const AlgorithmInfo* c : algorithms_for(op)) {
    if (c->applicable && !c->applicable(a, l.ranks())) continue;
    const double t = predict_seconds(*c, bytes, l, kShm, kNet);
    if (!best || t < bt) best = c, bt = t;
  }
  return best->algo;
}

TEST(Hierarchical, CostModelPicksHierarchyAcrossHostsAndFlatOnOne) {
  const HostLayout two = HostLayout::from_hosts({0, 0, 1, 1}), three = HostLayout::from_hosts({0, 0, 1, 1, 2, 2});
  const HostLayout one = HostLayout::from_hosts({0, 0, 0, 0}), solo = HostLayout::from_hosts({0, 1, 2, 3});
  for (size_t bytes : {size_t(1) << 20, size_t(16) << 20, size_t(64) << 20}) {
    for (OpKind op : {OpKind::kAllReduce, OpKind::kAllGather, OpKind::kReduceScatter}) {
      EXPECT_EQ(cheapest(op, bytes, two), Algo::kHierarchical) << op_name(op) << " " << bytes;
      EXPECT_EQ(cheapest(op, bytes, three), Algo::kHierarchical) << op_name(op) << " " << bytes;
      EXPECT_NE(cheapest(op, bytes, one), Algo::kHierarchical) << op_name(op) << " " << bytes;
      EXPECT_NE(cheapest(op, bytes, solo), Algo::kHierarchical) << op_name(op) << " " << bytes;
    }
  }
  // 2 x 2 at 16 MiB: the flat ring's host link carries 2(n-1)/n = 1.5 x the buffer, the hierarchy's
  // 2(H-1)/H = 1 x: the predicted gain is close to 1.5.
  const AlgorithmInfo* ring = find_algorithm(OpKind::kAllReduce, Algo::kRing);
  const AlgorithmInfo* hier = find_algorithm(OpKind::kAllReduce, Algo::kHierarchical);
  const double gain = predict_seconds(*ring, 16 << 20, two, kShm, kNet) / predict_seconds(*hier, 16 << 20, two, kShm, kNet);
  EXPECT_GT(gain, 1.4);
  EXPECT_LT(gain, 1.55);
  // One host: the hierarchy costs exactly the ring (it is the ring), and the ring wins the tie.
  EXPECT_EQ(predict_seconds(*hier, 1 << 20, one, kShm, kNet), predict_seconds(*ring, 1 << 20, one, kShm, kNet));
}

// The direct patterns send every rank's blocks to every remote rank at once: a host's link
// carries L (n - L) / n of the buffer, against one rank's (n - 1) / n for the ring (one ring edge leaves
// each host). 2 hosts x 2 ranks: 4/3 of the ring's bytes (measured on the emulated hosts: all_gather 16
// MiB, direct 136-142 ms, ring 107-113 ms). One rank per host: the same as the ring.
// Recursive doubling (all-gather) and halving (reduce-scatter) cross hosts in their large steps, all L
// ranks at once: the same share (measured: all_gather rd 148-152 ms against the ring's 107).
TEST(Hierarchical, DirectIsChargedItsShareOfTheHostLink) {
  const HostLayout two = HostLayout::from_hosts({0, 0, 1, 1}), solo = HostLayout::from_hosts({0, 1, 2, 3});
  const size_t b = 16 << 20;
  auto ratio = [&](OpKind op, Algo algo, const HostLayout& l) {
    return predict_seconds(*find_algorithm(op, algo), b, l, kShm, kNet) /
           predict_seconds(*find_algorithm(op, Algo::kRing), b, l, kShm, kNet);
  };
  for (auto [op, algo] : {std::pair{OpKind::kAllGather, Algo::kDirect}, {OpKind::kReduceScatter, Algo::kDirect},
                          {OpKind::kAllGather, Algo::kRecursiveDoubling},
                          {OpKind::kReduceScatter, Algo::kRecursiveHalving}}) {
    EXPECT_NEAR(ratio(op, algo, two), 4.0 / 3.0, 0.02) << op_name(op) << " " << algo_name(algo);
    EXPECT_NEAR(ratio(op, algo, solo), 1.0, 0.02) << op_name(op) << " " << algo_name(algo);
  }
  // Recursive-doubling all-reduce: 2 steps of the whole buffer, 1 across with both ranks: 2 buffers on
  // the link, as its per-rank charge says; the ring sends 1.5.
  EXPECT_NEAR(ratio(OpKind::kAllReduce, Algo::kRecursiveDoubling, two), 2.0 / 1.5, 0.02);
}

// What recursive doubling and the ring really send at 2 ranks: each rank sends the buffer once in both
// (rd: one exchange of the whole buffer; ring: two half-buffer steps), so both charge `bytes` to the
// link; rd's reduction after the receive is a local pass, the ring's is fused into the receive. Between
// the two, the ring then wins for large buffers and rd for tiny ones.
TEST(Hierarchical, TwoRankCostsChargeWhatIsSent) {
  const size_t b = 64 << 20;
  const Cost rd = find_algorithm(OpKind::kAllReduce, Algo::kRecursiveDoubling)->cost(b, 2);
  const Cost ring = find_algorithm(OpKind::kAllReduce, Algo::kRing)->cost(b, 2);
  EXPECT_EQ(rd.beta_bytes, static_cast<double>(b));
  EXPECT_EQ(ring.beta_bytes, static_cast<double>(b));
  EXPECT_EQ(rd.local_bytes, static_cast<double>(b));
  EXPECT_EQ(ring.local_bytes, 0.0);
  const HostLayout pair = HostLayout::from_hosts({0, 0});
  auto t = [&](Algo algo, size_t bytes) {
    return predict_seconds(*find_algorithm(OpKind::kAllReduce, algo), bytes, pair, kShm, kNet);
  };
  EXPECT_LT(t(Algo::kRecursiveDoubling, 8), t(Algo::kRing, 8));
  EXPECT_LT(t(Algo::kRing, b), t(Algo::kRecursiveDoubling, b));
}

}  // namespace
}  // namespace trident
