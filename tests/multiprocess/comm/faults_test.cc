// Never hang silently: a killed peer, mismatched collectives and expired deadlines are reported on every
// rank with what happened and who was involved. Also subgroups used concurrently and async overlap.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/ranges.h>

#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/core/error.h"

namespace trident::faults_test {
namespace {

using Clock = std::chrono::steady_clock;
using testing::RunOptions;

std::shared_ptr<ProcessGroup> make_pg(std::shared_ptr<Store> store, int rank, int size, const std::string& transport,
                                      double timeout_s = 10) {  // a deadlock fails in seconds
  GroupOptions o;
  o.transport = transport;
  o.timeout = Seconds(timeout_s);
  return new_process_group(store, rank, size, o);
}

class Faults : public ::testing::TestWithParam<std::string> {};

// A rank killed with SIGKILL in the middle of a large all-reduce: the others fail within 10 s naming it.
TEST_P(Faults, KilledPeerIsNamedWithin10s) {
  std::string transport = GetParam();
  auto res = testing::run_processes(3, [transport](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, transport);
    std::vector<float> v(1 << 22, 1.0f);
    auto start = Clock::now();
    try {
      pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
      if (rank == 2) {
        // Die in the middle of the next all-reduce: start it asynchronously, then SIGKILL ourselves.
        auto w = pg->all_reduce_async(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        raise(SIGKILL);
      }
      start = Clock::now();
      for (int i = 0; i < 1000; ++i) pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
      testing::rank_fail("all-reduces with a dead peer did not fail");
    } catch (const PeerDiedError& e) {
      // Rank 2 may die while a survivor still finishes the first all-reduce (its last bytes can be lost with
      // the connection): wherever it happens, the error names rank 2 and comes quickly.
      double s = std::chrono::duration<double>(Clock::now() - start).count();
      std::string what = e.what();
      TRIDENT_RANK_CHECK(e.peer == 2, "PeerDiedError::peer is {}, not the killed rank 2: {}", e.peer, what);
      TRIDENT_RANK_CHECK(e.rank == rank, "PeerDiedError::rank is {}, not this rank {}", e.rank, rank);
      TRIDENT_RANK_CHECK(s < 10.0, "took {:.1f}s to notice (limit 10 s): {}", s, what);
    }
    // The group stays failed: the next call fails at once.
    try {
      pg->barrier();
      testing::rank_fail("barrier after failure succeeded");
    } catch (const NetworkError&) {
    }
  }, RunOptions{.deadline_s = 60, .env = {}});
  ASSERT_EQ(res.size(), 3u);
  EXPECT_TRUE(res[0].ok) << testing::failures(res);
  EXPECT_TRUE(res[1].ok) << testing::failures(res);
  EXPECT_EQ(res[2].signal, SIGKILL);
}

// Different collectives at the same sequence number: every rank gets a MismatchError naming both.
TEST_P(Faults, MismatchedCollectiveReportedOnEveryRank) {
  std::string transport = GetParam();
  auto res = testing::run_processes(3, [transport](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, transport);
    std::vector<float> v(1024, 1.0f);
    try {
      // Fine in itself; but a slow rank may still be finishing it when a faster one detects the mismatch
      // of the next collective and aborts the group, so the error may surface here too.
      pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
      if (rank == 1) pg->broadcast(v.data(), v.size(), DType::kFloat32, 0);
      else pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
      testing::rank_fail("mismatched collectives completed");
    } catch (const MismatchError& e) {
      std::string what = e.what();
      TRIDENT_RANK_CHECK(what.find("broadcast") != std::string::npos && what.find("all_reduce") != std::string::npos,
                         "error does not name both collectives: {}", what);
      // The two ranks whose calls differ: rank 1 and the one that noticed; the peer is the other of them.
      TRIDENT_RANK_CHECK(e.ranks.size() == 2 && (e.ranks[0] == 1 || e.ranks[1] == 1) && e.ranks[0] != e.ranks[1],
                         "MismatchError::ranks {} does not hold rank 1 and one other: {}", fmt::join(e.ranks, ","), what);
      TRIDENT_RANK_CHECK(e.peer != rank && (e.peer == e.ranks[0] || e.peer == e.ranks[1]),
                         "MismatchError::peer {} on rank {} (ranks {})", e.peer, rank, fmt::join(e.ranks, ","));
      TRIDENT_RANK_CHECK(e.seq == 2, "MismatchError::seq {} (want 2): {}", e.seq, what);
    }
  });
  EXPECT_EQ(testing::failures(res), "");
}

// Same op, different count: caught before any data is used.
TEST_P(Faults, MismatchedCountReported) {
  std::string transport = GetParam();
  auto res = testing::run_processes(2, [transport](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, transport);
    std::vector<int32_t> v(100, 7);
    try {
      pg->all_reduce(v.data(), rank == 0 ? 100 : 99, DType::kInt32, ReduceOp::kSum);
      testing::rank_fail("mismatched counts completed");
    } catch (const MismatchError& e) {
      std::string what = e.what();
      TRIDENT_RANK_CHECK(what.find("count=100") != std::string::npos && what.find("count=99") != std::string::npos,
                         "error does not show both counts: {}", what);
      TRIDENT_RANK_CHECK(e.ranks == (std::vector<int>{0, 1}) && e.peer == 1 - rank,
                         "MismatchError::ranks {} peer {} on rank {}", fmt::join(e.ranks, ","), e.peer, rank);
    }
    for (int i = 0; i < 100; ++i) TRIDENT_RANK_CHECK(v[i] == 7, "data was modified at {}: {}", i, v[i]);
  });
  EXPECT_EQ(testing::failures(res), "");
}

// One argument differs on rank 1 (dtype, reduce op, root; the payload size is the same, so only the
// fingerprint can tell): every rank raises MismatchError with rank 1 among the two ranks it names, and the
// message shows both values.
TEST_P(Faults, DisagreeingDtypeReduceOpOrRootIsNamedWithBothValues) {
  std::string transport = GetParam();
  for (std::string field : {"dtype", "reduce op", "root"}) {
    auto res = testing::run_processes(3, [transport, field](int rank, int size, std::shared_ptr<Store> store) {
      auto pg = make_pg(store, rank, size, transport, 10);
      std::vector<int32_t> v(64, 1);
      const bool odd = rank == 1;
      std::vector<std::string> both;
      try {
        if (field == "dtype") {
          both = {"float32", "int32"};
          pg->all_reduce(v.data(), v.size(), odd ? DType::kInt32 : DType::kFloat32, ReduceOp::kSum);
        } else if (field == "reduce op") {
          both = {"sum", "max"};
          pg->all_reduce(v.data(), v.size(), DType::kInt32, odd ? ReduceOp::kMax : ReduceOp::kSum);
        } else {
          both = {"root=0", "root=1"};
          pg->broadcast(v.data(), v.size(), DType::kInt32, odd ? 1 : 0);
        }
        // A root's sends may complete before any rank compares: the abort then surfaces in the next call,
        // still as the record of sequence number 1.
        pg->barrier();
        testing::rank_fail(fmt::format("collectives with a different {} on rank 1 completed", field));
      } catch (const MismatchError& e) {
        const std::string what = e.what();
        TRIDENT_RANK_CHECK(std::find(e.ranks.begin(), e.ranks.end(), 1) != e.ranks.end() && e.ranks.size() == 2,
                           "{}: MismatchError::ranks [{}] does not hold rank 1 and one other: {}", field,
                           fmt::join(e.ranks, ","), what);
        TRIDENT_RANK_CHECK(e.rank == rank && e.seq == 1, "{}: MismatchError rank {} seq {}", field, e.rank, e.seq);
        for (const auto& value : both)
          TRIDENT_RANK_CHECK(what.find(value) != std::string::npos, "{}: the error does not show '{}': {}", field,
                             value, what);
      }
    });
    EXPECT_EQ(testing::failures(res), "") << field;
  }
}

// A rank that never joins: the deadline names the op, its sequence number, the group and the silent rank.
TEST_P(Faults, DeadlineNamesTheSilentRank) {
  std::string transport = GetParam();
  auto res = testing::run_processes(3, [transport](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, transport);
    pg->barrier();
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      return;  // never issues the all-reduce
    }
    std::vector<float> v(10, 1.0f);
    CallOptions o;
    o.timeout = Seconds(1.0);
    auto start = Clock::now();
    try {
      pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, o);
      testing::rank_fail("all_reduce without rank 2 completed");
    } catch (const TimeoutError& e) {
      std::string what = e.what();
      double s = std::chrono::duration<double>(Clock::now() - start).count();
      // Whichever rank's deadline expired first, every waiting rank raises its TimeoutError with its fields.
      TRIDENT_RANK_CHECK(e.op == "all_reduce" && e.seq == 2 && what.find("'world'") != std::string::npos,
                         "TimeoutError op '{}' seq {} (want all_reduce, 2), or no group: {}", e.op, e.seq, what);
      TRIDENT_RANK_CHECK(e.missing == std::vector<int>{2}, "TimeoutError::missing is [{}], not [2]: {}",
                         fmt::join(e.missing, ","), what);
      TRIDENT_RANK_CHECK(s < 30, "deadline of 1 s took {:.1f}s", s);
    }
  });
  EXPECT_EQ(testing::failures(res), "");
}

// Overlapping subgroups used at the same time, plus split(): results exact, sequence numbers independent.
TEST_P(Faults, OverlappingSubgroupsConcurrently) {
  std::string transport = GetParam();
  auto res = testing::run_processes(5, [transport](int rank, int size, std::shared_ptr<Store> store) {
    auto world = make_pg(store, rank, size, transport);
    auto a = world->new_group({0, 1, 2, 3});
    auto b = world->new_group({4, 3, 2});  // order defines subgroup ranks
    auto parity = world->split(rank % 2, -rank);  // reverse order inside each color
    TRIDENT_RANK_CHECK(parity && parity->size() == (rank % 2 ? 2 : 3), "split size {}", parity ? parity->size() : -1);
    if (b) TRIDENT_RANK_CHECK(b->rank() == (rank == 4 ? 0 : rank == 3 ? 1 : 2), "b rank {}", b->rank());
    std::vector<int64_t> va(1000, rank), vb(1000, rank * 10), vp(1000, rank + 1), vw(1000, 1);
    std::vector<std::shared_ptr<Work>> works;
    for (int it = 0; it < 5; ++it) {
      if (a) works.push_back(a->all_reduce_async(va.data(), va.size(), DType::kInt64, ReduceOp::kMax));
      if (b) works.push_back(b->all_reduce_async(vb.data(), vb.size(), DType::kInt64, ReduceOp::kMax));
      works.push_back(parity->all_reduce_async(vp.data(), vp.size(), DType::kInt64, ReduceOp::kMax));
      works.push_back(world->all_reduce_async(vw.data(), vw.size(), DType::kInt64, ReduceOp::kMax));
    }
    for (auto& w : works) w->wait();
    if (a) TRIDENT_RANK_CHECK(va[999] == 3, "group a max {}", va[999]);
    if (b) TRIDENT_RANK_CHECK(vb[0] == 40, "group b max {}", vb[0]);
    int64_t pmax = rank % 2 ? 4 : 5;
    TRIDENT_RANK_CHECK(vp[500] == pmax, "parity max {} want {}", vp[500], pmax);
    TRIDENT_RANK_CHECK(vw[0] == 1, "world {}", vw[0]);
    // The split ordered ranks by descending key: rank 0 of the even group is global rank 4.
    std::vector<int32_t> who(1, rank);
    parity->broadcast(who.data(), 1, DType::kInt32, 0);
    TRIDENT_RANK_CHECK(who[0] == (rank % 2 ? 3 : 4), "split root is global {}", who[0]);
    world->barrier();
  });
  EXPECT_EQ(testing::failures(res), "");
}

// Async collectives complete in issue order and overlap with computation on the caller's thread.
TEST_P(Faults, AsyncOverlapAndOrder) {
  std::string transport = GetParam();
  auto res = testing::run_processes(3, [transport](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, transport);
    const int kOps = 8;
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(1 << 16));
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < kOps; ++k) {
      std::fill(bufs[k].begin(), bufs[k].end(), static_cast<float>(rank + k));
      works.push_back(pg->all_reduce_async(bufs[k].data(), bufs[k].size(), DType::kFloat32, ReduceOp::kSum));
    }
    // Computation while the collectives run.
    double acc = 0;
    for (int i = 0; i < 2000000; ++i) acc += i * 1e-9;
    TRIDENT_RANK_CHECK(acc > 0, "compute");
    // Completion is in issue order: once the last is done, all earlier ones are.
    works.back()->wait();
    for (auto& w : works) TRIDENT_RANK_CHECK(w->completed(), "an earlier collective is not complete");
    for (int k = 0; k < kOps; ++k) {
      float want = static_cast<float>(size * (size - 1) / 2 + size * k);
      TRIDENT_RANK_CHECK(bufs[k][123] == want, "op {} got {} want {}", k, bufs[k][123], want);
    }
  });
  EXPECT_EQ(testing::failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Transports, Faults, ::testing::Values("shm", "tcp"));

}  // namespace
}  // namespace trident::faults_test
