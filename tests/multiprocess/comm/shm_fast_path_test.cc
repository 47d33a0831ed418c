// The shared-memory fast path ("shm": all_reduce and broadcast through the group's ShmWindow):
// the collective sweep with it forced at worlds 1, 2, 3, 5, 8 (and with tiny rounds), many calls in a
// row mixed with message-based algorithms (buffer reuse, phase counters), and its failure reports:
// mismatched collectives (window against window, window against messages), a killed peer, a deadline.
#include <gtest/gtest.h>

#include <algorithm>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <thread>

#include <fmt/ranges.h>

#include "harness/collective_sweep.h"
#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/core/error.h"

namespace trident::shm_fast_path_test {
namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<ProcessGroup> make_pg(std::shared_ptr<Store> st, int r, int n, double timeout_s = 20) {
  GroupOptions go;
  go.transport = "shm";
  go.timeout = Seconds(timeout_s);
  return new_process_group(st, r, n, go);
}

CallOptions shm_algo() {
  CallOptions o;
  o.algo = Algo::kShm;
  return o;
}

class ShmSweep : public ::testing::TestWithParam<int> {};

// Every collective with TRIDENT_ALGO=shm (all_reduce and broadcast take the fast path; the other
// collectives have no "shm" algorithm and keep the cost model's choice), each element checked.
TEST_P(ShmSweep, CollectiveSweepWithShmForced) {
  const int world = GetParam();
  auto res = testing::run_processes(world, [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = make_pg(st, r, n);
    testing::run_collective_sweep(*pg, {.all_algorithms = false, .large = true});
  }, {.deadline_s = 240, .env = {{"TRIDENT_ALGO", "shm"}}});
  EXPECT_EQ(testing::failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmSweep, ::testing::Values(1, 2, 3, 5, 8),
                         [](const auto& info) { return fmt::format("w{}", info.param); });

// Tiny rounds (TRIDENT_CHUNK_BYTES) so counts of a few hundred elements cross many staging rounds and
// both staging buffers are reused many times within one call.
TEST(ShmFastPath, SweepWithTinyRounds) {
  auto res = testing::run_processes(3, [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = make_pg(st, r, n);
    testing::run_collective_sweep(*pg, {.all_algorithms = false, .large = false});
  }, {.deadline_s = 240, .env = {{"TRIDENT_ALGO", "shm"}, {"TRIDENT_CHUNK_BYTES", "256"}}});
  EXPECT_EQ(testing::failures(res), "");
}

// Many calls in a row, alternating the fast path with message-based algorithms, small and large,
// in place and out of place; each result against its closed form (integers: exact in any order).
TEST(ShmFastPath, RepeatedCallsMixedWithMessageAlgorithms) {
  for (int world : {2, 3, 4}) {
    auto res = testing::run_processes(world, [](int r, int n, std::shared_ptr<Store> st) {
      auto pg = make_pg(st, r, n);
      const size_t counts[] = {1, 3, 1024, 1025, 4099, 70001, 300007};
      for (int it = 0; it < 40; ++it) {
        const size_t count = counts[it % 7];
        std::vector<int32_t> in(count), out(count + 1, -7);
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>((i * 7 + r * 13 + it) % 1000);
        CallOptions o = shm_algo();
        if (it % 3 == 2) o.algo = Algo::kRing;
        const bool inplace = it % 2 == 0;
        if (inplace) pg->all_reduce(in.data(), count, DType::kInt32, ReduceOp::kSum, o);
        else pg->all_reduce(in.data(), out.data(), count, DType::kInt32, ReduceOp::kSum, o);
        const int32_t* got = inplace ? in.data() : out.data();
        for (size_t i = 0; i < count; ++i) {
          int64_t want = 0;
          for (int q = 0; q < n; ++q) want += static_cast<int64_t>((i * 7 + q * 13 + it) % 1000);
          TRIDENT_RANK_CHECK(got[i] == want, "call {} count {} element {}: {} != {}", it, count, i, got[i], want);
        }
        if (!inplace) TRIDENT_RANK_CHECK(out[count] == -7, "call {}: wrote past the end", it);
        // A broadcast on the window and a barrier over messages between the all-reduces.
        std::vector<float> b(it % 2 ? 5 : 100003, r == it % n ? 2.5f : -1.0f);
        pg->broadcast(b.data(), b.size(), DType::kFloat32, it % n, shm_algo());
        for (size_t i = 0; i < b.size(); ++i) TRIDENT_RANK_CHECK(b[i] == 2.5f, "broadcast {} element {}", it, i);
        if (it % 5 == 0) pg->barrier();
      }
    }, {.deadline_s = 120, .env = {}});
    EXPECT_EQ(testing::failures(res), "") << "world " << world;
  }
}

// Window against window: different counts at the same sequence number (on the same or on different paths
// of the window) are caught before any data is used, with both counts named, on every rank.
TEST(ShmFastPath, MismatchedCountOnTheWindow) {
  // 8 vs 7: tiny lines on both; 9 vs 8: slots against a tiny line; 100 vs 99: slots; 100000: staging.
  for (size_t base : {size_t{8}, size_t{9}, size_t{100}, size_t{100000}}) {
    auto res = testing::run_processes(2, [base](int r, int n, std::shared_ptr<Store> st) {
      auto pg = make_pg(st, r, n);
      std::vector<int32_t> v(base, 7);
      try {
        pg->all_reduce(v.data(), r == 0 ? base : base - 1, DType::kInt32, ReduceOp::kSum, shm_algo());
        testing::rank_fail("mismatched counts completed");
      } catch (const MismatchError& e) {
        std::string what = e.what();
        TRIDENT_RANK_CHECK(what.find(fmt::format("count={}", base)) != std::string::npos &&
                               what.find(fmt::format("count={}", base - 1)) != std::string::npos,
                           "error does not show both counts: {}", what);
      }
      for (size_t i = 0; i < base; ++i) TRIDENT_RANK_CHECK(v[i] == 7, "data was modified at {}: {}", i, v[i]);
    });
    EXPECT_EQ(testing::failures(res), "") << base;
  }
}

// Window against messages: rank 1 issues a broadcast over the tree while the others all-reduce on the
// window; every rank gets a MismatchError naming both collectives.
TEST(ShmFastPath, MismatchWindowAgainstMessages) {
  auto res = testing::run_processes(3, [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = make_pg(st, r, n);
    std::vector<float> v(64, 1.0f);
    try {
      pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, shm_algo());
      CallOptions tree;
      tree.algo = Algo::kTree;
      if (r == 1) pg->broadcast(v.data(), v.size(), DType::kFloat32, 0, tree);
      else pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, shm_algo());
      testing::rank_fail("mismatched collectives completed");
    } catch (const MismatchError& e) {
      std::string what = e.what();
      TRIDENT_RANK_CHECK(what.find("broadcast") != std::string::npos && what.find("all_reduce") != std::string::npos,
                         "error does not name both collectives: {}", what);
      TRIDENT_RANK_CHECK(std::find(e.ranks.begin(), e.ranks.end(), 1) != e.ranks.end() && e.ranks.size() == 2,
                         "MismatchError::ranks [{}] does not hold rank 1 and one other: {}", fmt::join(e.ranks, ","),
                         what);
    }
  }, {.deadline_s = 60, .env = {}});
  EXPECT_EQ(testing::failures(res), "");
}

// A peer killed while the others wait on the window: they fail with PeerDiedError naming it, quickly.
TEST(ShmFastPath, KilledPeerIsNamed) {
  auto res = testing::run_processes(3, [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = make_pg(st, r, n, 20);
    std::vector<float> v(1 << 20, 1.0f);
    pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, shm_algo());
    if (r == 2) raise(SIGKILL);
    auto start = Clock::now();
    try {
      for (int i = 0; i < 100; ++i) pg->all_reduce(v.data(), 16, DType::kFloat32, ReduceOp::kSum, shm_algo());
      testing::rank_fail("all-reduces with a dead peer did not fail");
    } catch (const PeerDiedError& e) {
      double s = std::chrono::duration<double>(Clock::now() - start).count();
      std::string what = e.what();
      TRIDENT_RANK_CHECK(e.peer == 2, "PeerDiedError::peer is {}, not the killed rank 2: {}", e.peer, what);
      TRIDENT_RANK_CHECK(s < 10.0, "took {:.1f}s to notice: {}", s, what);
    }
    try {
      pg->barrier();
      testing::rank_fail("barrier after failure succeeded");
    } catch (const NetworkError&) {
    }
  }, {.deadline_s = 60, .env = {}});
  ASSERT_EQ(res.size(), 3u);
  EXPECT_TRUE(res[0].ok) << testing::failures(res);
  EXPECT_TRUE(res[1].ok) << testing::failures(res);
  EXPECT_EQ(res[2].signal, SIGKILL);
}

// A rank that never joins: the deadline names the op, the sequence number, the group and the silent rank.
TEST(ShmFastPath, DeadlineNamesTheSilentRank) {
  auto res = testing::run_processes(3, [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = make_pg(st, r, n, 20);
    pg->barrier();
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      return;
    }
    std::vector<float> v(10, 1.0f);
    CallOptions o = shm_algo();
    o.timeout = Seconds(1.0);
    try {
      pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, o);
      testing::rank_fail("all_reduce without rank 2 completed");
    } catch (const NetworkError& e) {
      std::string what = e.what();
      TRIDENT_RANK_CHECK(what.find("all_reduce") != std::string::npos && what.find("sequence number 2") != std::string::npos,
                         "error lacks op or sequence number: {}", what);
      TRIDENT_RANK_CHECK(what.find("timed out") != std::string::npos && what.find("2") != std::string::npos,
                         "error is not a timeout naming rank 2: {}", what);
    }
  }, {.deadline_s = 60, .env = {}});
  EXPECT_EQ(testing::failures(res), "");
}

}  // namespace
}  // namespace trident::shm_fast_path_test
