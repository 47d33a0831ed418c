// The collective sweep (tests/harness/collective_sweep.h) over real processes at world sizes 1, 2, 3, 4,
// 5, 8, over shared memory and over TCP. One job per (world, transport) runs the whole sweep.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <thread>

#include "harness/collective_sweep.h"
#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/algorithms/algorithm.h"
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
    testing::run_collective_sweep(*pg, {.large = !testing::kSanitizerBuild});
  }, {.deadline_s = 300, .env = {}});
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

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// Flow control: a broadcast root that runs ahead of a slower receiver is held back by the channel's
// capacity (4 MiB on shared memory, the socket buffers over TCP). Before, the receiver read every message
// that had arrived into a fresh buffer, so its memory grew by every message the root was ahead (and each
// buffer's pages faulted in: a 1 MiB tree broadcast ran at 1.7 GB/s instead of 20).
TEST(FlowControl, BroadcastRootRunningAheadIsHeldBackNotBuffered) {
  for (std::string transport : {"shm", "tcp"}) {
    auto res = testing::run_processes(2, [transport](int r, int n, std::shared_ptr<Store> st) {
      GroupOptions go;
      go.transport = transport;
      go.timeout = Seconds(120);
      auto pg = new_process_group(st, r, n, go);
      CallOptions tree;
      tree.algo = Algo::kTree;  // messages (the window's algorithms run in lockstep anyway)
      constexpr int kCalls = 96;
      std::vector<float> buf(size_t{1} << 18);  // 1 MiB
      pg->broadcast(buf.data(), buf.size(), DType::kFloat32, 0, tree);
      pg->barrier();
      const long before = peak_rss_kib();
      for (int i = 0; i < kCalls; ++i) {
        if (r == 0) std::fill(buf.begin(), buf.end(), static_cast<float>(i));
        pg->broadcast(buf.data(), buf.size(), DType::kFloat32, 0, tree);
        for (size_t k = 0; k < buf.size(); k += 4099)
          TRIDENT_RANK_CHECK(buf[k] == static_cast<float>(i), "call {} element {}: {}", i, k, buf[k]);
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the slower receiver
      }
      pg->barrier();
      const long grew_mib = (peak_rss_kib() - before) / 1024;
      TRIDENT_RANK_CHECK(grew_mib < 16, "{}: rank {}'s peak memory grew by {} MiB over {} broadcasts of 1 MiB", transport,
                         r, grew_mib, kCalls);
    }, {.deadline_s = 120, .env = {}});
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
