// Every reduction algorithm gives the same bits whatever order the peers' data arrives in. Float addition
// is not associative, so an algorithm that combined each peer's data as it arrived would make a result
// depend on timing: two runs of one training program would differ in the last bits, and a run resumed from
// a checkpoint would not equal the uninterrupted one.
//
// Each case runs the algorithm several times over the thread-based AlgoContext (thread_world.h), each time
// with the ranks entering in another order (a rank sleeps its position in that order times a few
// milliseconds first), so the receives of a rank that combines several peers complete in another order.
// The inputs are float32 values of very different magnitudes and both signs, where nearly every change of
// order changes the sum's bits. Every rank's output must be bitwise equal to the first run's.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "thread_world.h"
#include "trident/comm/algorithms/algorithm.h"

namespace trident {
namespace {

using testing::ThreadWorld;

bool reduces(OpKind op) {
  return op == OpKind::kAllReduce || op == OpKind::kReduce || op == OpKind::kReduceScatter;
}

// Sign and exponent drawn per (rank, element): 2^-8 .. 2^26, so one rank's value can vanish in another's.
float value(int rank, size_t i) {
  uint64_t h = (static_cast<uint64_t>(rank) + 1) * 0x9e3779b97f4a7c15ull ^ (i * 0xbf58476d1ce4e5b9ull);
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  const float mant = 1.0f + static_cast<float>(h & 0xFFFF) / 65536.0f;
  const int exp = static_cast<int>((h >> 16) % 35) - 8;
  return ((h >> 40) & 1 ? -1.0f : 1.0f) * std::ldexp(mant, exp);
}

// One run: the outputs of every rank (the root's only for reduce), entering in `order`.
std::vector<std::vector<float>> run_once(const AlgorithmInfo& info, int n, size_t count, size_t chunk_bytes,
                                         const std::vector<int>& order, std::string* error) {
  std::vector<std::vector<float>> send(n), recv(n);
  std::vector<CollArgs> args(n);
  for (int r = 0; r < n; ++r) {
    CollArgs& a = args[r];
    a.op = info.op;
    a.count = count;
    a.dtype = DType::kFloat32;
    a.redop = ReduceOp::kSum;
    a.root = n - 1;
    const size_t in = info.op == OpKind::kReduceScatter ? count * n : count;
    send[r].resize(in);
    for (size_t i = 0; i < in; ++i) send[r][i] = value(r, i);
    recv[r].assign(count, 0.0f);
    if (info.op == OpKind::kAllReduce) recv[r] = send[r];  // in place, as the engine hands it over
    a.send = send[r].data();
    a.recv = recv[r].data();
  }
  std::vector<int> position(n);
  for (int k = 0; k < n; ++k) position[order[k]] = k;
  ThreadWorld world(n);
  world.set_chunk_bytes(chunk_bytes);
  const auto result = world.run([&](AlgoContext& ctx) {
    std::this_thread::sleep_for(std::chrono::milliseconds(6 * position[ctx.rank()]));
    info.run(ctx, args[ctx.rank()]);
  });
  if (!result.ok()) *error = result.summary();
  if (info.op == OpKind::kReduce)
    for (int r = 0; r < n - 1; ++r) recv[r].clear();  // only the root's output is defined
  return recv;
}

class ReductionOrder : public ::testing::TestWithParam<size_t> {};

TEST_P(ReductionOrder, SameBitsWhateverOrderPeersArriveIn) {
  const AlgorithmInfo& info = algorithm_table()[GetParam()];
  int cases = 0;
  // 4: for the algorithms that need a power of two. 1023 elements in 40-byte chunks: many pipeline chunks and
  // uneven blocks; 7: one chunk, some empty blocks.
  for (int n : {3, 4, 5}) {
    for (auto [count, chunk] : {std::pair<size_t, size_t>{1023, 40}, {7, 0}}) {
      CollArgs probe;
      probe.op = info.op;
      probe.count = count;
      if (info.applicable != nullptr && !info.applicable(probe, n)) continue;
      // In rank order, reversed, and two rotations: every rank that combines two or more peers sees them
      // arrive in at least two different orders.
      std::vector<std::vector<int>> orders(4, std::vector<int>(n));
      for (int k = 0; k < n; ++k) {
        orders[0][k] = k;
        orders[1][k] = n - 1 - k;
        orders[2][k] = (k + 1) % n;
        orders[3][k] = (n - 1 - k + 2) % n;
      }
      std::string err;
      const auto first = run_once(info, n, count, chunk, orders[0], &err);
      ASSERT_EQ(err, "") << algo_name(info.algo);
      for (size_t o = 1; o < orders.size(); ++o) {
        const auto again = run_once(info, n, count, chunk, orders[o], &err);
        ASSERT_EQ(err, "") << algo_name(info.algo);
        ++cases;
        for (int r = 0; r < n; ++r) {
          const auto& a = first[r];
          const auto& b = again[r];
          ASSERT_EQ(a.size(), b.size());
          for (size_t i = 0; i < a.size(); ++i) {
            uint32_t x, y;
            std::memcpy(&x, &a[i], 4);
            std::memcpy(&y, &b[i], 4);
            ASSERT_EQ(x, y) << fmt::format("{} {} at {} ranks, count {}: rank {} element {} is {} when the ranks "
                                           "enter in order {}, {} when they enter in order {}",
                                           op_name(info.op), algo_name(info.algo), n, count, r, i, a[i],
                                           fmt::join(orders[0], ","), b[i], fmt::join(orders[o], ","));
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 0) << "no world size applies to " << algo_name(info.algo);
}

std::string order_case_name(const ::testing::TestParamInfo<size_t>& p) {
  const AlgorithmInfo& info = algorithm_table()[p.param];
  return fmt::format("{}_{}", op_name(info.op), algo_name(info.algo));
}

std::vector<size_t> reductions() {
  std::vector<size_t> idx;
  for (size_t i = 0; i < algorithm_table().size(); ++i)
    if (reduces(algorithm_table()[i].op)) idx.push_back(i);
  return idx;
}

INSTANTIATE_TEST_SUITE_P(Table, ReductionOrder, ::testing::ValuesIn(reductions()), order_case_name);

}  // namespace
}  // namespace trident
