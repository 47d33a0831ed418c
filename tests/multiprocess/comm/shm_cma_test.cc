// The single-copy path ("cma": all_reduce, reduce_scatter, all_gather and broadcast moving bytes between
// the ranks' own buffers with process_vm_readv/writev): the collective sweep with it forced at worlds 1,
// 2, 3, 5, with tiny chunks, and with cross-memory attach refused (TRIDENT_CMA=0: the fallbacks); prime
// counts in place and out of place against closed forms; a peer killed while the others move its bytes.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "harness/collective_sweep.h"
#include "harness/multiproc.h"
#include "trident/comm/algorithms/algorithm.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/comm/transport/shm_buffer.h"
#include "trident/core/error.h"

namespace trident::shm_cma_test {
namespace {

std::shared_ptr<ProcessGroup> make_pg(std::shared_ptr<Store> st, int r, int n, double timeout_s = 20,
                                      const std::string& transport = "shm") {
  GroupOptions go;
  go.transport = transport;
  go.timeout = Seconds(timeout_s);
  return new_process_group(st, r, n, go);
}

CallOptions cma() {
  CallOptions o;
  o.algo = Algo::kCma;
  return o;
}

class CmaSweep : public ::testing::TestWithParam<int> {};

// Every collective with TRIDENT_ALGO=cma (the four collectives that have it take it; the others keep the
// cost model's choice), each element checked.
TEST_P(CmaSweep, CollectiveSweepWithCmaForced) {
  const int world = GetParam();
  auto res = testing::run_processes(world, [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = make_pg(st, r, n);
    testing::run_collective_sweep(*pg, {.all_algorithms = false, .large = true});
  }, {.deadline_s = 240, .env = {{"TRIDENT_ALGO", "cma"}}});
  EXPECT_EQ(testing::failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Worlds, CmaSweep, ::testing::Values(1, 2, 3, 5),
                         [](const auto& info) { return fmt::format("w{}", info.param); });

// Tiny chunks: counts of a few hundred elements cross many chunks (one kernel copy per chunk and peer).
TEST(ShmCma, SweepWithTinyChunks) {
  auto res = testing::run_processes(3, [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = make_pg(st, r, n);
    testing::run_collective_sweep(*pg, {.all_algorithms = false, .large = false});
  }, {.deadline_s = 240, .env = {{"TRIDENT_ALGO", "cma"}, {"TRIDENT_CHUNK_BYTES", "256"}}});
  EXPECT_EQ(testing::failures(res), "");
}

// Cross-memory attach refused (TRIDENT_CMA=0 on one rank only: the ranks still agree): all_reduce takes the
// staged shm path, the others their message-based algorithms; every result still checked.
TEST(ShmCma, RefusedOnOneRankFallsBackEverywhere) {
  for (int world : {2, 3}) {
    auto res = testing::run_processes(world, [](int r, int n, std::shared_ptr<Store> st) {
      if (r == n - 1) setenv("TRIDENT_CMA", "0", 1);
      auto pg = make_pg(st, r, n);
      testing::run_collective_sweep(*pg, {.all_algorithms = false, .large = true});
    }, {.deadline_s = 240, .env = {{"TRIDENT_ALGO", "cma"}}});
    EXPECT_EQ(testing::failures(res), "") << "world " << world;
  }
}

// Without a window (TCP) the forced algorithm falls back to message-based ones.
TEST(ShmCma, OverTcpFallsBack) {
  auto res = testing::run_processes(3, [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = make_pg(st, r, n, 120, "tcp");
    testing::run_collective_sweep(*pg, {.all_algorithms = false, .large = false});
  }, {.deadline_s = 240, .env = {{"TRIDENT_ALGO", "cma"}}});
  EXPECT_EQ(testing::failures(res), "");
}

// Small integers: exact in any order of summation.
int32_t value(int rank, size_t i, int call) { return static_cast<int32_t>((i * 7 + static_cast<size_t>(rank) * 13 + call) % 1009) - 500; }

// Prime counts (blocks of unequal length, chunks that do not divide them), every collective, in place and out
// of place (all_gather: send is this rank's block of recv; reduce_scatter: recv is this rank's block of
// send), with the default chunk and a small one; each element against its closed form.
TEST(ShmCma, PrimeCountsInPlaceAndOutOfPlace) {
  for (int world : {2, 3, 5}) {
    auto res = testing::run_processes(world, [](int r, int n, std::shared_ptr<Store> st) {
      auto pg = make_pg(st, r, n);
      const size_t counts[] = {1, 2, 13, 4099, 65537, 262147};
      int call = 0;
      for (size_t count : counts) {
        for (bool inplace : {false, true}) {
          ++call;
          // all_reduce
          std::vector<int32_t> in(count), out(count + 1, -7);
          for (size_t i = 0; i < count; ++i) in[i] = value(r, i, call);
          if (inplace) pg->all_reduce(in.data(), count, DType::kInt32, ReduceOp::kSum, cma());
          else pg->all_reduce(in.data(), out.data(), count, DType::kInt32, ReduceOp::kSum, cma());
          const int32_t* got = inplace ? in.data() : out.data();
          for (size_t i = 0; i < count; ++i) {
            int64_t want = 0;
            for (int q = 0; q < n; ++q) want += value(q, i, call);
            TRIDENT_RANK_CHECK(got[i] == want, "all_reduce count {} inplace {} element {}: {} != {}", count, inplace, i,
                               got[i], want);
          }
          TRIDENT_RANK_CHECK(out[count] == -7, "all_reduce count {}: wrote past the end", count);
          // reduce_scatter: rank q's input element j is value(q, j, call)
          std::vector<int32_t> rs_in(count * n + 1, -9), rs_out(count + 1, -7);
          for (size_t j = 0; j < count * n; ++j) rs_in[j] = value(r, j, call);
          int32_t* rs_dst = inplace ? rs_in.data() + r * count : rs_out.data();
          pg->reduce_scatter(rs_in.data(), rs_dst, count, DType::kInt32, ReduceOp::kMax, cma());
          for (size_t i = 0; i < count; ++i) {
            int32_t want = value(0, r * count + i, call);
            for (int q = 1; q < n; ++q) want = std::max(want, value(q, r * count + i, call));
            TRIDENT_RANK_CHECK(rs_dst[i] == want, "reduce_scatter count {} inplace {} element {}: {} != {}", count,
                               inplace, i, rs_dst[i], want);
          }
          TRIDENT_RANK_CHECK(rs_in[count * n] == -9 && rs_out[count] == -7, "reduce_scatter: wrote past the end");
          // all_gather
          std::vector<int32_t> ag_out(count * n + 1, -7), ag_in(count);
          for (size_t i = 0; i < count; ++i) ag_in[i] = value(r, i, call);
          const int32_t* ag_src = ag_in.data();
          if (inplace) {
            std::copy(ag_in.begin(), ag_in.end(), ag_out.begin() + r * count);
            ag_src = ag_out.data() + r * count;
          }
          pg->all_gather(ag_src, ag_out.data(), count, DType::kInt32, cma());
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i)
              TRIDENT_RANK_CHECK(ag_out[q * count + i] == value(q, i, call), "all_gather count {} inplace {} block {} element {}",
                                 count, inplace, q, i);
          TRIDENT_RANK_CHECK(ag_out[count * n] == -7, "all_gather: wrote past the end");
          // broadcast from the last rank
          std::vector<int32_t> b(count + 1, -7);
          for (size_t i = 0; i < count; ++i) b[i] = r == n - 1 ? value(n - 1, i, call) : 0;
          pg->broadcast(b.data(), count, DType::kInt32, n - 1, cma());
          for (size_t i = 0; i < count; ++i)
            TRIDENT_RANK_CHECK(b[i] == value(n - 1, i, call), "broadcast count {} element {}", count, i);
          TRIDENT_RANK_CHECK(b[count] == -7, "broadcast: wrote past the end");
        }
      }
    }, {.deadline_s = 120, .env = {{"TRIDENT_CHUNK_BYTES", "12K"}}});
    EXPECT_EQ(testing::failures(res), "") << "world " << world;
  }
}

// Float all_reduce: every rank holds bitwise the same result (each block is reduced once, by its owner),
// and mixing with the staged path and message-based algorithms keeps the window's phases in step.
TEST(ShmCma, BitwiseIdenticalAcrossRanksMixedWithOtherAlgorithms) {
  auto res = testing::run_processes(3, [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = make_pg(st, r, n);
    const size_t count = 300007;
    for (int it = 0; it < 12; ++it) {
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = 1.0f / static_cast<float>(1 + (i + 3 * r + it) % 977);
      CallOptions o = cma();
      if (it % 4 == 1) o.algo = Algo::kShm;
      if (it % 4 == 3) o.algo = Algo::kRing;
      pg->all_reduce(v.data(), count, DType::kFloat32, ReduceOp::kSum, o);
      std::vector<float> r0(v);
      pg->broadcast(r0.data(), count, DType::kFloat32, 0, cma());
      TRIDENT_RANK_CHECK(std::memcmp(r0.data(), v.data(), count * sizeof(float)) == 0,
                         "call {} ({}): rank {} differs from rank 0", it, algo_name(o.algo), r);
      for (size_t i = 0; i < count; i += 997) {
        double want = 0;
        for (int q = 0; q < n; ++q) want += 1.0 / (1 + (i + 3 * q + it) % 977);
        TRIDENT_RANK_CHECK(std::abs(v[i] - want) < 1e-5 * want, "call {} element {}: {} vs {}", it, i, v[i], want);
      }
    }
  }, {.deadline_s = 120, .env = {}});
  EXPECT_EQ(testing::failures(res), "");
}

// Calls too large for the cache where some rank is out of place (that path stages through the window
// instead; the choice is made from every rank's post, so it is the same on every rank even when
// placements differ), and an all_gather and a reduce_scatter past the cache. TRIDENT_CACHE_BYTES makes 8 MiB "too large" on
// any machine.
TEST(ShmCma, LargeMixedPlacementsAgree) {
  for (int world : {2, 3}) {
    auto res = testing::run_processes(world, [](int r, int n, std::shared_ptr<Store> st) {
      auto pg = make_pg(st, r, n);
      const size_t count = (size_t{2} << 20) + 3;  // 8 MiB + 12 B of int32
      for (int call = 0; call < 3; ++call) {
        // call 0: all in place (CMA); 1: rank 0 out of place; 2: all out of place.
        const bool inplace = call == 0 || (call == 1 && r != 0);
        std::vector<int32_t> in(count), out(count, -7);
        for (size_t i = 0; i < count; ++i) in[i] = value(r, i, call);
        if (inplace) pg->all_reduce(in.data(), count, DType::kInt32, ReduceOp::kSum, cma());
        else pg->all_reduce(in.data(), out.data(), count, DType::kInt32, ReduceOp::kSum, cma());
        const int32_t* got = inplace ? in.data() : out.data();
        for (size_t i = 0; i < count; i += 1 + i % 7) {
          int64_t want = 0;
          for (int q = 0; q < n; ++q) want += value(q, i, call);
          TRIDENT_RANK_CHECK(got[i] == want, "call {} element {}: {} != {}", call, i, got[i], want);
        }
      }
      // all_gather out of place past the cache: this rank's own block goes out with streaming stores.
      const size_t per = (size_t{1} << 20) + 3;
      std::vector<int32_t> mine(per), all(per * n, -7);
      for (size_t i = 0; i < per; ++i) mine[i] = value(r, i, 9);
      pg->all_gather(mine.data(), all.data(), per, DType::kInt32, cma());
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < per; i += 1 + i % 5)
          TRIDENT_RANK_CHECK(all[q * per + i] == value(q, i, 9), "all_gather block {} element {}: {}", q, i,
                             all[q * per + i]);
      // reduce_scatter out of place past the cache: the reduced block goes out with streaming stores.
      std::vector<int32_t> whole(per * n), mine_sum(per, -7);
      for (size_t i = 0; i < whole.size(); ++i) whole[i] = value(r, i, 11);
      pg->reduce_scatter(whole.data(), mine_sum.data(), per, DType::kInt32, ReduceOp::kSum, cma());
      for (size_t i = 0; i < per; i += 1 + i % 5) {
        int64_t want = 0;
        for (int q = 0; q < n; ++q) want += value(q, r * per + i, 11);
        TRIDENT_RANK_CHECK(mine_sum[i] == want, "reduce_scatter element {}: {} != {}", i, mine_sum[i], want);
      }
    }, {.deadline_s = 120, .env = {{"TRIDENT_CACHE_BYTES", "16M"}}});
    EXPECT_EQ(testing::failures(res), "") << "world " << world;
  }
}

// Ranks whose cache budgets differ (TRIDENT_CACHE_BYTES on one rank only) still take the same all_reduce
// path: each publishes its judgement and any "out of cache" wins (a split would hang or corrupt).
TEST(ShmCma, CacheBudgetsThatDifferAcrossRanksAgree) {
  auto res = testing::run_processes(2, [](int r, int n, std::shared_ptr<Store> st) {
    if (r == 0) setenv("TRIDENT_CACHE_BYTES", "16M", 1);  // before the first call reads it
    auto pg = make_pg(st, r, n);
    const size_t count = (size_t{2} << 20) + 3;  // 8 MiB + 12 B: out of cache for rank 0 only
    std::vector<int32_t> in(count), out(count, -7);
    for (size_t i = 0; i < count; ++i) in[i] = value(r, i, 5);
    for (int call = 0; call < 2; ++call) {
      pg->all_reduce(in.data(), out.data(), count, DType::kInt32, ReduceOp::kSum, cma());
      for (size_t i = 0; i < count; i += 1 + i % 7) {
        int64_t want = 0;
        for (int q = 0; q < n; ++q) want += value(q, i, 5);
        TRIDENT_RANK_CHECK(out[i] == want, "call {} element {}: {} != {}", call, i, out[i], want);
      }
    }
  }, {.deadline_s = 60, .env = {}});
  EXPECT_EQ(testing::failures(res), "");
}

// A peer killed while the others read from and write into its memory: they fail with PeerDiedError naming
// it (process_vm_readv/writev fail with ESRCH, or the window's wait sees the pid gone), never hang.
TEST(ShmCma, KilledPeerDuringTransfersIsNamed) {
  for (int world : {2, 3}) {
    auto res = testing::run_processes(world, [](int r, int n, std::shared_ptr<Store> st) {
      auto pg = make_pg(st, r, n, 20);
      std::vector<float> v(size_t{8} << 20, 1.0f), out(v.size());
      pg->all_reduce(v.data(), out.data(), v.size(), DType::kFloat32, ReduceOp::kSum, cma());
      std::thread killer;
      if (r == n - 1)  // dies in the middle of the transfers below (most of each call is spent in them)
        killer = std::thread([] {
          std::this_thread::sleep_for(std::chrono::milliseconds(150));
          raise(SIGKILL);
        });
      try {
        for (int i = 0; i < 100000; ++i) {
          if (i % 2) pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, cma());  // in place: CMA
          else pg->all_gather(v.data(), out.data(), v.size() / n, DType::kFloat32, cma());
        }
        testing::rank_fail("collectives with a dead peer did not fail");
      } catch (const PeerDiedError& e) {
        std::string what = e.what();
        TRIDENT_RANK_CHECK(e.peer == n - 1, "PeerDiedError::peer is {}, not the killed rank {}: {}", e.peer, n - 1,
                           what);
      }
      if (killer.joinable()) killer.join();
    }, {.deadline_s = 60, .env = {}});
    ASSERT_EQ(static_cast<int>(res.size()), world);
    for (int r = 0; r + 1 < world; ++r) EXPECT_TRUE(res[r].ok) << "world " << world << ": " << testing::failures(res);
    EXPECT_EQ(res[world - 1].signal, SIGKILL) << "world " << world;
  }
}

// ProcessGroup::alloc_shared: registered memory where the group has a shared-memory window (every rank on
// this host, two ranks or more), nullptr where it gains nothing (one rank, TCP).
TEST(ShmCma, AllocSharedOnlyWhereItHelps) {
  for (int world : {1, 2, 3}) {
    for (const char* transport : {"shm", "tcp"}) {
      auto res = testing::run_processes(world, [&](int r, int n, std::shared_ptr<Store> st) {
        auto pg = make_pg(st, r, n, 120, transport);
        auto b = pg->alloc_shared(12345);
        const bool want = n > 1 && std::string(transport) == "shm";
        TRIDENT_RANK_CHECK((b != nullptr) == want, "alloc_shared on {} ranks over {} returned {}", n, transport,
                           b ? "memory" : "nullptr");
        if (!b) return;
        TRIDENT_RANK_CHECK(b->size() >= 12345, "alloc_shared(12345) gave {} bytes", b->size());
        ShmBuffer::Registration reg;
        TRIDENT_RANK_CHECK(ShmBuffer::lookup(b->data(), 12345, &reg), "alloc_shared memory is not registered");
        // The buffer outlives the group that allocated it.
        pg.reset();
        std::memset(b->data(), 7, 12345);
      }, {.deadline_s = 120, .env = {}});
      EXPECT_EQ(testing::failures(res), "") << "world " << world << " " << transport;
    }
  }
}

// The collective sweep (every collective, dtype and reduce op; counts 0, 1, 7, 1023, 1M+3) with every buffer
// fresh from alloc_shared, cma forced where a collective has it: the zero-copy path at odd sizes and worlds.
class SharedSweep : public ::testing::TestWithParam<int> {};

TEST_P(SharedSweep, CollectiveSweepOnAllocSharedBuffers) {
  auto res = testing::run_processes(GetParam(), [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = make_pg(st, r, n);
    testing::run_collective_sweep(*pg, {.all_algorithms = false, .large = true, .shared_buffers = true});
  }, {.deadline_s = 240, .env = {{"TRIDENT_ALGO", "cma"}}});
  EXPECT_EQ(testing::failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Worlds, SharedSweep, ::testing::Values(2, 3, 5),
                         [](const auto& info) { return fmt::format("w{}", info.param); });

// Buffers in ShmBuffers (the peers map them and read/write them in place, no kernel copy), on every rank,
// on some ranks only, for send only or recv only; reused across calls (the peers' mapping cache) and
// reallocated (a new buffer at a reused descriptor or inode is not confused with the old one).
TEST(ShmCma, RegisteredBuffersInPlaceOfTheKernelCopy) {
  for (int world : {2, 3}) {
    auto res = testing::run_processes(world, [](int r, int n, std::shared_ptr<Store> st) {
      auto pg = make_pg(st, r, n);
      const size_t count = 100003;
      for (int call = 0; call < 12; ++call) {
        // call % 4: 0 all registered, 1 only rank 0, 2 send only, 3 recv only; a fresh buffer every 3 calls.
        const int mode = call % 4;
        const bool reg_send = mode == 0 || (mode == 1 && r == 0) || mode == 2;
        const bool reg_recv = mode == 0 || (mode == 1 && r == 0) || mode == 3;
        auto sb = ShmBuffer::allocate(count * n * sizeof(int32_t));
        auto rb = ShmBuffer::allocate((count * n + 1) * sizeof(int32_t));
        std::vector<int32_t> plain_s(count * n), plain_r(count * n + 1);
        auto* in = reg_send ? static_cast<int32_t*>(sb->data()) : plain_s.data();
        auto* out = reg_recv ? static_cast<int32_t*>(rb->data()) : plain_r.data();
        out[count] = -7;
        for (size_t i = 0; i < count; ++i) in[i] = value(r, i, call);
        pg->all_reduce(in, out, count, DType::kInt32, ReduceOp::kSum, cma());
        for (size_t i = 0; i < count; ++i) {
          int64_t want = 0;
          for (int q = 0; q < n; ++q) want += value(q, i, call);
          TRIDENT_RANK_CHECK(out[i] == want, "all_reduce call {} element {}: {} != {}", call, i, out[i], want);
        }
        TRIDENT_RANK_CHECK(out[count] == -7, "all_reduce call {}: wrote past the end", call);
        pg->all_reduce(in, count, DType::kInt32, ReduceOp::kMax, cma());  // in place
        for (size_t i = 0; i < count; ++i) {
          int32_t want = value(0, i, call);
          for (int q = 1; q < n; ++q) want = std::max(want, value(q, i, call));
          TRIDENT_RANK_CHECK(in[i] == want, "in-place all_reduce call {} element {}: {} != {}", call, i, in[i], want);
        }
        for (size_t j = 0; j < count * n; ++j) in[j] = value(r, j, call);
        pg->reduce_scatter(in, out, count, DType::kInt32, ReduceOp::kSum, cma());
        for (size_t i = 0; i < count; ++i) {
          int64_t want = 0;
          for (int q = 0; q < n; ++q) want += value(q, r * count + i, call);
          TRIDENT_RANK_CHECK(out[i] == want, "reduce_scatter call {} element {}", call, i);
        }
        pg->all_gather(in, out, count, DType::kInt32, cma());
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i)
            TRIDENT_RANK_CHECK(out[q * count + i] == value(q, i, call), "all_gather call {} block {} element {}", call, q, i);
        for (size_t i = 0; i < count; ++i) out[i] = r == 1 ? value(7, i, call) : 0;
        pg->broadcast(out, count, DType::kInt32, 1, cma());
        for (size_t i = 0; i < count; ++i) TRIDENT_RANK_CHECK(out[i] == value(7, i, call), "broadcast call {} element {}", call, i);
      }
    }, {.deadline_s = 120, .env = {}});
    EXPECT_EQ(testing::failures(res), "") << "world " << world;
  }
}

// Not a test: timings of all_reduce with ordinary buffers against ShmBuffers, for docs/PERFORMANCE.md.
// Run: test_multiprocess_comm --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_Timing*'
TEST(ShmCma, DISABLED_TimingOrdinaryVersusRegistered) {
  auto res = testing::run_processes(2, [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = make_pg(st, r, n);
    for (size_t bytes : {size_t{1} << 20, size_t{16} << 20, size_t{64} << 20, size_t{256} << 20}) {
      const size_t count = bytes / 4;
      auto sb = ShmBuffer::allocate(bytes), rb = ShmBuffer::allocate(bytes);
      std::vector<float> ps(count, 1.0f), pr(count, 0.0f);
      std::fill_n(static_cast<float*>(sb->data()), count, 1.0f);
      for (int reg = 0; reg < 2; ++reg) {
        for (int variant = 0; variant < 4; ++variant) {  // shm out of place, shm in place, cma out, cma in
          const Algo algo = variant < 2 ? Algo::kShm : Algo::kCma;
          const bool inplace = variant % 2 == 1;
          if (reg && algo == Algo::kShm) continue;
          float* in = reg ? static_cast<float*>(sb->data()) : ps.data();
          float* out = inplace ? in : (reg ? static_cast<float*>(rb->data()) : pr.data());
          CallOptions o;
          o.algo = algo;
          const int iters = bytes >= (size_t{64} << 20) ? 10 : 50;
          std::vector<double> t;
          for (int i = 0; i < iters + 3; ++i) {
            std::fill_n(in, count, 1.0f);
            pg->barrier();
            auto t0 = std::chrono::steady_clock::now();
            pg->all_reduce(in, out, count, DType::kFloat32, ReduceOp::kSum, o);
            if (i >= 3) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          }
          std::sort(t.begin(), t.end());
          TRIDENT_RANK_CHECK(out[count / 2] == 2.0f, "wrong result {}", out[count / 2]);
          if (r == 0)
            fmt::print("all_reduce {:>10} B {:>4} {:<10} {:<12} p50 {:>9.1f} us  busbw {:6.2f} GB/s\n", bytes,
                       algo_name(algo), reg ? "ShmBuffer" : "ordinary", inplace ? "in place" : "out of place",
                       t[t.size() / 2] * 1e6, bytes / t[t.size() / 2] / 1e9);
        }
      }
    }
  }, {.deadline_s = 600, .env = {}});
  EXPECT_EQ(testing::failures(res), "");
}

// The cost model: across hosts never; on one host, the bandwidth sizes of all_reduce go to cma rather
// than the staged shm path, and the latency sizes stay on shm.
TEST(ShmCma, CostModelPrefersCmaForLargeMessagesOnOneHost) {
  const LinkCost shm_link{1.5e-6, 1.0 / 6e9, 1.0 / 10e9}, tcp_link{25e-6, 1.0 / 2e9, 1.0 / 10e9};
  const HostLayout one = HostLayout::from_hosts({0, 0}), two = HostLayout::from_hosts({0, 1});
  auto t = [&](OpKind op, Algo a, size_t bytes, const HostLayout& l) {
    return predict_seconds(*find_algorithm(op, a), bytes, l, shm_link, tcp_link);
  };
  for (size_t bytes : {size_t{4} << 20, size_t{64} << 20, size_t{1} << 30}) {
    EXPECT_LT(t(OpKind::kAllReduce, Algo::kCma, bytes, one), t(OpKind::kAllReduce, Algo::kShm, bytes, one)) << bytes;
    EXPECT_LT(t(OpKind::kReduceScatter, Algo::kCma, bytes, one), t(OpKind::kReduceScatter, Algo::kRing, bytes, one));
    EXPECT_LT(t(OpKind::kAllGather, Algo::kCma, bytes, one), t(OpKind::kAllGather, Algo::kRing, bytes, one));
    // Past 1 MiB the cma broadcast is the shm one (measured faster there): the same cost.
    EXPECT_EQ(t(OpKind::kBroadcast, Algo::kCma, bytes, one), t(OpKind::kBroadcast, Algo::kShm, bytes, one));
    EXPECT_FALSE(std::isfinite(t(OpKind::kAllReduce, Algo::kCma, bytes, two)));
  }
  EXPECT_GT(t(OpKind::kAllReduce, Algo::kCma, 4096, one), t(OpKind::kAllReduce, Algo::kShm, 4096, one));
  EXPECT_LT(t(OpKind::kBroadcast, Algo::kCma, 512 << 10, one), t(OpKind::kBroadcast, Algo::kShm, 512 << 10, one));
}

}  // namespace
}  // namespace trident::shm_cma_test
