// The collective sweep (tests/harness/collective_sweep.h) over real processes at world sizes 1, 2, 3, 4,
// 5, 8, over shared memory and over TCP. One job per (world, transport) runs the whole sweep.
#include <gtest/gtest.h>

#include "harness/collective_sweep.h"
#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"

namespace trident {
namespace {

class CollectiveSweep : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(CollectiveSweep, EveryCollectiveAlgorithmDtypeOp) {
  auto [world, transport] = GetParam();
  auto res = testing::run_processes(world, [transport = transport](int r, int n, std::shared_ptr<Store> st) {
    GroupOptions go;
    go.transport = transport;
    go.timeout = Seconds(120);
    auto pg = new_process_group(st, r, n, go);
    testing::run_collective_sweep(*pg);
  }, {.deadline_s = 300});
  EXPECT_EQ(testing::failures(res), "");
}

// Small pipelining chunks and small shared-memory rings: every large message wraps the ring many times
// and crosses many chunk boundaries (TRIDENT_CHUNK_BYTES, TRIDENT_SHM_RING_BYTES shrink them).
TEST(CollectiveSweepSmallBuffers, ChunkAndRingBoundaries) {
  for (std::string transport : {"shm", "tcp"}) {
    auto res = testing::run_processes(3, [transport](int r, int n, std::shared_ptr<Store> st) {
      GroupOptions go;
      go.transport = transport;
      go.timeout = Seconds(120);
      auto pg = new_process_group(st, r, n, go);
      testing::run_collective_sweep(*pg);
    }, {.deadline_s = 300, .env = {{"TRIDENT_CHUNK_BYTES", "64K"}, {"TRIDENT_SHM_RING_BYTES", "64K"}}});
    EXPECT_EQ(testing::failures(res), "") << transport;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, CollectiveSweep,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8), ::testing::Values("shm", "tcp")),
                         [](const auto& info) {
                           return fmt::format("w{}_{}", std::get<0>(info.param), std::get<1>(info.param));
                         });

}  // namespace
}  // namespace trident
