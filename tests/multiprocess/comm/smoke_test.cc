// Smoke tests of the native process group over real processes: one all-reduce per transport and world.
#include <gtest/gtest.h>

#include <numeric>

#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"

namespace trident {
namespace {

using testing::run_processes;

class Smoke : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(Smoke, AllReduceSum) {
  auto [world, transport] = GetParam();
  auto res = run_processes(world, [transport = transport](int rank, int size, std::shared_ptr<Store> store) {
    GroupOptions o;
    o.transport = transport;
    o.timeout = Seconds(10);  // a deadlock fails in seconds
    auto pg = new_process_group(store, rank, size, o);
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1023), size_t(1 << 20) + 3}) {
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((rank + 1) * ((i % 13) + 1));
      pg->all_reduce(v.data(), n, DType::kFloat32, ReduceOp::kSum);
      const float ranks_sum = size * (size + 1) / 2.0f;
      for (size_t i = 0; i < n; ++i)
        TRIDENT_RANK_CHECK(v[i] == ranks_sum * ((i % 13) + 1), "n={} i={} got {} want {}", n, i, v[i],
                           ranks_sum * ((i % 13) + 1));
    }
    pg->barrier();
  });
  EXPECT_EQ(testing::failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Worlds, Smoke,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5), ::testing::Values("shm", "tcp")));

}  // namespace
}  // namespace trident
