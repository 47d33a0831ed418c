// The MPI backend under mpirun: the same collective sweep the native backend passes
// (tests/harness/collective_sweep.h, one algorithm per collective since MPI chooses its own), plus in-place
// forms, async ordering, subgroups and deadlines, at 1, 2, 3 and 4 ranks; and `trident train --backend mpi`
// under mpirun, whose loss sequence is the native backend's.
//
// This one executable plays both parts. Run normally, the MpiBackend tests start
//   mpirun --allow-run-as-root --oversubscribe -np N -x TRIDENT_MPI_WORKER=1 <this executable>
//          --gtest_also_run_disabled_tests --gtest_filter=MpiWorker.DISABLED_<case>
// and check its exit code and that every rank reported success. Under mpirun (TRIDENT_MPI_WORKER=1) the
// MpiWorker tests run the checks on the MPI world group; a failing rank prints its error and exits
// non-zero, which makes mpirun end the whole job at once. Without mpirun or MPI the tests skip.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <fstream>

#include <nlohmann/json.hpp>

#include "harness/collective_sweep.h"
#include "harness/skip.h"
#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "trident/comm/backends/mpi_pg.h"
#include "trident/comm/process_group.h"
#include "trident/core/env.h"
#include "trident/core/error.h"

namespace trident {
namespace {

constexpr const char* kOkLine = "trident-mpi-worker ok: rank ";

bool is_worker() { return env::param_bool("TRIDENT_MPI_WORKER"); }

// Ends the whole mpirun job with this rank's error (mpirun kills the others when one exits non-zero).
[[noreturn]] void worker_fail(int rank, const std::string& what) {
  std::fprintf(stderr, "trident-mpi-worker FAILED: rank %d: %s\n", rank, what.c_str());
  std::fflush(nullptr);
  std::_Exit(3);
}

#define WORKER_CHECK(cond, ...)                                                                           \
  do {                                                                                                    \
    if (!(cond)) worker_fail(rank, fmt::format("{}:{}: {}: {}", __FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__))); \
  } while (0)

// Value of rank r's element i in the checks below: small integers, exact in float32.
float val(int r, size_t i) { return static_cast<float>((r * 7 + static_cast<int>(i % 13)) % 17); }

// In-place forms (send aliasing recv), checked in closed form.
void check_in_place(ProcessGroup& pg) {
  const int rank = pg.rank(), size = pg.size();
  const size_t n = 5;
  const DType f = DType::kFloat32;
  {  // all_gather, MPI's in-place layout: own block already at recv + rank*n
    std::vector<float> buf(n * size, -1);
    for (size_t i = 0; i < n; ++i) buf[rank * n + i] = val(rank, i);
    pg.all_gather(buf.data() + rank * n, buf.data(), n, f);
    for (int r = 0; r < size; ++r)
      for (size_t i = 0; i < n; ++i) WORKER_CHECK(buf[r * n + i] == val(r, i), "all_gather in place r={} i={}", r, i);
  }
  {  // all_gather with send == recv (own block at offset 0)
    std::vector<float> buf(n * size, -1);
    for (size_t i = 0; i < n; ++i) buf[i] = val(rank, i);
    pg.all_gather(buf.data(), buf.data(), n, f);
    for (int r = 0; r < size; ++r)
      for (size_t i = 0; i < n; ++i) WORKER_CHECK(buf[r * n + i] == val(r, i), "all_gather send==recv r={} i={}", r, i);
  }
  {  // gather at root with send == recv
    const int root = size - 1;
    std::vector<float> buf(n * size, -1);
    for (size_t i = 0; i < n; ++i) buf[i] = val(rank, i);
    pg.gather(buf.data(), buf.data(), n, f, root);
    if (rank == root)
      for (int r = 0; r < size; ++r)
        for (size_t i = 0; i < n; ++i) WORKER_CHECK(buf[r * n + i] == val(r, i), "gather send==recv r={} i={}", r, i);
  }
  {  // scatter at root with recv == send
    const int root = size - 1;
    std::vector<float> buf(n * size, -1);
    if (rank == root)
      for (int r = 0; r < size; ++r)
        for (size_t i = 0; i < n; ++i) buf[r * n + i] = val(100 + r, i);
    pg.scatter(buf.data(), buf.data(), n, f, root);
    for (size_t i = 0; i < n; ++i) WORKER_CHECK(buf[i] == val(100 + rank, i), "scatter recv==send i={}", i);
  }
  {  // reduce at root with send == recv; avg
    std::vector<float> buf(n);
    for (size_t i = 0; i < n; ++i) buf[i] = val(rank, i) * static_cast<float>(size);
    pg.reduce(buf.data(), buf.data(), n, f, ReduceOp::kAvg, 0);
    if (rank == 0)
      for (size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r = 0; r < size; ++r) want += val(r, i);
        WORKER_CHECK(buf[i] == want, "reduce avg in place i={}: {} vs {}", i, buf[i], want);
      }
  }
  {  // reduce_scatter with send == recv: the result is the first block
    std::vector<float> buf(n * size);
    for (size_t i = 0; i < n * size; ++i) buf[i] = val(rank, i);
    pg.reduce_scatter(buf.data(), buf.data(), n, f, ReduceOp::kSum);
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += val(r, rank * n + i);
      WORKER_CHECK(buf[i] == want, "reduce_scatter in place i={}: {} vs {}", i, buf[i], want);
    }
  }
  {  // all_to_all with send == recv
    std::vector<float> buf(n * size);
    for (int j = 0; j < size; ++j)
      for (size_t i = 0; i < n; ++i) buf[j * n + i] = val(rank * 10 + j, i);
    pg.all_to_all(buf.data(), buf.data(), n, f);
    for (int j = 0; j < size; ++j)
      for (size_t i = 0; i < n; ++i) WORKER_CHECK(buf[j * n + i] == val(j * 10 + rank, i), "all_to_all in place j={}", j);
  }
  {  // all_gatherv with send == recv
    std::vector<size_t> counts(size);
    for (int r = 0; r < size; ++r) counts[r] = static_cast<size_t>(r % 2 == 0 ? 3 : 1);
    size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    std::vector<float> buf(total, -1);
    for (size_t i = 0; i < counts[rank]; ++i) buf[i] = val(rank, i);
    pg.all_gatherv(buf.data(), buf.data(), counts, f);
    size_t off = 0;
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < counts[r]; ++i) WORKER_CHECK(buf[off + i] == val(r, i), "all_gatherv in place r={}", r);
      off += counts[r];
    }
  }
}

// Async calls complete in issue order with the right values, mixed with a blocking call.
void check_async(ProcessGroup& pg) {
  const int rank = pg.rank(), size = pg.size();
  const int k = 16;
  const size_t n = 1000;
  std::vector<std::vector<int64_t>> bufs(k, std::vector<int64_t>(n));
  std::vector<std::shared_ptr<Work>> works;
  for (int j = 0; j < k; ++j) {
    for (size_t i = 0; i < n; ++i) bufs[j][i] = rank * 1000 + j * 10 + static_cast<int64_t>(i % 7);
    works.push_back(pg.all_reduce_async(bufs[j].data(), n, DType::kInt64, ReduceOp::kSum));
  }
  std::vector<int32_t> b(3, rank);
  pg.broadcast(b.data(), b.size(), DType::kInt32, 0);  // blocking, behind the async ones
  for (int j = 0; j < k; ++j) WORKER_CHECK(works[j]->completed(), "async call {} not complete after a later blocking one", j);
  for (int j = k - 1; j >= 0; --j) {
    works[j]->wait();
    for (size_t i = 0; i < n; ++i) {
      int64_t want = 1000LL * size * (size - 1) / 2 + size * (j * 10 + static_cast<int64_t>(i % 7));
      WORKER_CHECK(bufs[j][i] == want, "async all_reduce {} element {}: {} vs {}", j, i, bufs[j][i], want);
    }
  }
  for (int32_t v : b) WORKER_CHECK(v == 0, "broadcast got {}", v);
}

// new_group and split: membership, order, global ranks, and a collective on each.
void check_subgroups(ProcessGroup& pg) {
  const int rank = pg.rank(), size = pg.size();
  std::vector<int> evens;  // in reverse order: the list's order is the new group's rank order
  for (int r = size - 1; r >= 0; --r)
    if (r % 2 == 0) evens.push_back(r);
  auto g = pg.new_group(evens, "evens");
  if (rank % 2 != 0) {
    WORKER_CHECK(g == nullptr, "rank {} is not in the even group but got one", rank);
  } else {
    WORKER_CHECK(g != nullptr, "rank {} is in the even group but got none", rank);
    int want_rank = static_cast<int>(std::find(evens.begin(), evens.end(), rank) - evens.begin());
    WORKER_CHECK(g->rank() == want_rank && g->size() == static_cast<int>(evens.size()), "even group rank {} size {}",
                 g->rank(), g->size());
    WORKER_CHECK(g->backend_name() == "mpi", "backend {}", g->backend_name());
    for (int r = 0; r < g->size(); ++r) WORKER_CHECK(g->global_rank(r) == evens[r], "global_rank({})", r);
    std::vector<int32_t> all(g->size());
    int32_t mine = rank;
    g->all_gather(&mine, all.data(), 1, DType::kInt32);
    for (int r = 0; r < g->size(); ++r) WORKER_CHECK(all[r] == evens[r], "even group all_gather [{}] = {}", r, all[r]);
  }
  // color = rank % 2 (rank 3 opts out with -1 when size is 4), key = -rank: each group in reverse rank order.
  int color = (size == 4 && rank == 3) ? -1 : rank % 2;
  auto s = pg.split(color, -rank);
  if (color < 0) {
    WORKER_CHECK(s == nullptr, "color -1 got a group");
  } else {
    std::vector<int> members;
    for (int r = size - 1; r >= 0; --r)
      if (r % 2 == color && !(size == 4 && r == 3)) members.push_back(r);
    WORKER_CHECK(s != nullptr, "split gave no group");
    WORKER_CHECK(s->size() == static_cast<int>(members.size()), "split size {} want {}", s->size(), members.size());
    for (int r = 0; r < s->size(); ++r) WORKER_CHECK(s->global_rank(r) == members[r], "split global_rank({})", r);
    double v = rank + 1, sum = 0;
    s->all_reduce(&v, &sum, 1, DType::kFloat64, ReduceOp::kSum);
    double want = 0;
    for (int m : members) want += m + 1;
    WORKER_CHECK(sum == want, "split all_reduce {} want {}", sum, want);
  }
  pg.barrier();
}

// A send's Work does not wait for an earlier receive whose message has not arrived: rank 0 receives from
// rank 1 (which sends only after rank 0's second send), then sends twice; if the first send's completion
// waited for the receive, the second send would never be posted.
void check_directions(ProcessGroup& pg) {
  const int rank = pg.rank();
  if (pg.size() < 2 || rank > 1) return;
  std::vector<int32_t> a(5, 0), b(5, 0), c(5, 0);
  if (rank == 0) {
    auto r = pg.recv_async(a.data(), a.size(), DType::kInt32, 1, 1);
    std::fill(b.begin(), b.end(), 2);
    std::fill(c.begin(), c.end(), 3);
    pg.send(b.data(), b.size(), DType::kInt32, 1, 2);
    pg.send(c.data(), c.size(), DType::kInt32, 1, 3);
    r->wait();
    for (int32_t v : a) WORKER_CHECK(v == 1, "rank 0 received {} with tag 1", v);
  } else {
    pg.recv(c.data(), c.size(), DType::kInt32, 0, 3);
    std::fill(a.begin(), a.end(), 1);
    pg.send(a.data(), a.size(), DType::kInt32, 0, 1);
    pg.recv(b.data(), b.size(), DType::kInt32, 0, 2);
    for (size_t i = 0; i < b.size(); ++i)
      WORKER_CHECK(b[i] == 2 && c[i] == 3, "rank 1 received {} (tag 2) and {} (tag 3)", b[i], c[i]);
  }
}

TEST(MpiWorker, DISABLED_Sweep) {
  if (!is_worker()) GTEST_SKIP() << "runs only as a rank under mpirun (TRIDENT_MPI_WORKER=1); see MpiBackend.*";
  GroupOptions o;
  o.backend = "mpi";
  o.timeout = Seconds(60);
  auto pg = init_process_group(o);
  const int rank = pg->rank();
  try {
    WORKER_CHECK(pg->backend_name() == "mpi", "backend {}", pg->backend_name());
    testing::run_collective_sweep(*pg, testing::SweepOptions{.all_algorithms = false});
    check_in_place(*pg);
    check_async(*pg);
    check_directions(*pg);
    check_subgroups(*pg);
    // new_process_group with backend mpi: rank and size must be MPI's; then it is an MPI group too.
    bool refused = false;
    try {
      new_process_group(nullptr, rank, pg->size() + 1, o);
    } catch (const InvalidArgument&) {
      refused = true;
    }
    WORKER_CHECK(refused, "new_process_group accepted a size that is not MPI's");
    auto again = new_process_group(nullptr, rank, pg->size(), o);
    WORKER_CHECK(again->backend_name() == "mpi" && again->rank() == rank, "new_process_group gave {} rank {}",
                 again->backend_name(), again->rank());
    int64_t one = 1, total = 0;
    again->all_reduce(&one, &total, 1, DType::kInt64, ReduceOp::kSum);
    WORKER_CHECK(total == pg->size(), "all_reduce of ones on the second world group: {}", total);
  } catch (const std::exception& e) {
    worker_fail(rank, e.what());
  }
  std::printf("%s%d of %d\n", kOkLine, rank, pg->size());
  std::fflush(stdout);
}

// A collective that only rank 0 issues times out there with a TimeoutError naming op, seq and group; the
// group is then failed (later calls fail at once). The other ranks wait for rank 0's verdict, then exit.
TEST(MpiWorker, DISABLED_Timeout) {
  if (!is_worker()) GTEST_SKIP() << "runs only as a rank under mpirun (TRIDENT_MPI_WORKER=1); see MpiBackend.*";
  GroupOptions o;
  o.backend = "mpi";
  o.timeout = Seconds(30);
  auto world = init_process_group(o);
  const int rank = world->rank();
  auto g = world->split(0, rank);  // a group to break; `world` stays usable
  if (rank == 0) {
    bool timed_out = false;
    try {
      CallOptions c;
      c.timeout = Seconds(0.3);
      g->barrier(c);  // no other rank joins it
    } catch (const TimeoutError& e) {
      std::string m = e.what();
      timed_out = m.find("barrier") != std::string::npos && m.find("seq") != std::string::npos &&
                  m.find(g->name()) != std::string::npos && m.find("cannot cancel") != std::string::npos;
      WORKER_CHECK(timed_out, "timeout message lacks op, seq, group or the failure note: {}", m);
      std::printf("rank 0 got the expected TimeoutError: %s\n", m.c_str());
    }
    WORKER_CHECK(timed_out, "a barrier no other rank joined did not time out");
    bool failed_at_once = false;
    try {
      int32_t x = 1;
      g->all_reduce(&x, 1, DType::kInt32, ReduceOp::kSum);
    } catch (const TimeoutError&) {
      failed_at_once = true;  // the group's first error, rethrown
    }
    WORKER_CHECK(failed_at_once, "a call on the failed group did not fail with its first error");
  }
  int32_t verdict = rank == 0 ? 1 : 0;
  world->broadcast(&verdict, 1, DType::kInt32, 0);
  WORKER_CHECK(verdict == 1, "verdict {}", verdict);
  // Rank 0 leaves its abandoned request behind; the others join it now so that it completes.
  if (rank != 0) g->barrier();
  world->barrier();
  std::printf("%s%d of %d\n", kOkLine, rank, world->size());
  std::fflush(stdout);
}

// TRIDENT_MPI_CHECK=1: ranks that issue different collectives (count, then kind) get MismatchError naming
// the other rank and both calls, instead of a hang; the group is failed, the world group stays usable.
TEST(MpiWorker, DISABLED_Mismatch) {
  if (!is_worker()) GTEST_SKIP() << "runs only as a rank under mpirun (TRIDENT_MPI_WORKER=1); see MpiBackend.*";
  GroupOptions o;
  o.backend = "mpi";
  o.timeout = Seconds(30);
  auto world = init_process_group(o);
  const int rank = world->rank(), size = world->size();
  WORKER_CHECK(size >= 2, "needs 2 ranks, got {}", size);
  auto expect_mismatch = [&](ProcessGroup& g, const std::function<void()>& call, const std::string& theirs) {
    try {
      call();
    } catch (const MismatchError& e) {
      const std::string m = e.what();
      WORKER_CHECK(m.find("collective mismatch") != std::string::npos && m.find(theirs) != std::string::npos &&
                       m.find(g.name()) != std::string::npos,
                   "mismatch message lacks the group or the other call ({}): {}", theirs, m);
      std::printf("rank %d got the expected MismatchError: %s\n", rank, m.c_str());
      return;
    }
    worker_fail(rank, "mismatched collectives did not raise MismatchError");
  };
  std::vector<float> v(5, 1.0f);
  auto g1 = world->split(0, rank);
  // Rank 0 all-reduces 4 elements, the others 5.
  expect_mismatch(*g1, [&] { g1->all_reduce(v.data(), rank == 0 ? 4 : 5, DType::kFloat32, ReduceOp::kSum); },
                  rank == 0 ? "all_reduce(count=5, float32, sum)" : "all_reduce(count=4, float32, sum)");
  auto g2 = world->split(0, rank);
  // Rank 0 broadcasts, the others all-reduce.
  expect_mismatch(*g2, [&] {
    if (rank == 0) g2->broadcast(v.data(), 5, DType::kFloat32, 0);
    else g2->all_reduce(v.data(), 5, DType::kFloat32, ReduceOp::kSum);
  }, rank == 0 ? "all_reduce(count=5, float32, sum)" : "broadcast(count=5, float32, root=0)");
  world->barrier();
  std::printf("%s%d of %d\n", kOkLine, rank, size);
  std::fflush(stdout);
}

// ---- the driver side ----

std::string find_mpirun() {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string dir = p.substr(start, end - start);
    if (!dir.empty()) {
      std::string cand = dir + "/mpirun";
      if (access(cand.c_str(), X_OK) == 0) return cand;
    }
    start = end + 1;
  }
  return {};
}

struct RunResult {
  int exit_code = -1;
  std::string output;
};

RunResult run_command(const std::string& cmd) {
  RunResult res;
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (!f) return res;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0) res.output.append(buf, got);
  int status = pclose(f);
  res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return res;
}

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

RunResult run_workers(int np, const std::string& test_case, const std::string& extra_mpirun_args = {}) {
  std::string cmd = fmt::format(
      "timeout -k 5 150 {} --allow-run-as-root --oversubscribe -np {} {} -x TRIDENT_MPI_WORKER=1 {} "
      "--gtest_also_run_disabled_tests --gtest_filter=MpiWorker.DISABLED_{}",
      find_mpirun(), np, extra_mpirun_args, self_exe(), test_case);
  return run_command(cmd);
}

int count_ok(const std::string& out) {
  int n = 0;
  for (size_t pos = out.find(kOkLine); pos != std::string::npos; pos = out.find(kOkLine, pos + 1)) ++n;
  return n;
}

void skip_unless_mpi(bool& skip) {
  skip = true;
  if (!mpi_backend_built()) TRIDENT_SKIP_MISSING("trident was built without MPI (apt-get install libopenmpi-dev, then reconfigure)");
  if (find_mpirun().empty()) TRIDENT_SKIP_MISSING("mpirun is not installed (apt-get install openmpi-bin)");
  skip = false;
}

class MpiBackend : public ::testing::TestWithParam<int> {};

TEST_P(MpiBackend, CollectiveSweepUnderMpirun) {
  if (is_worker()) GTEST_SKIP() << "driver test; not run inside a worker";
  bool skip;
  skip_unless_mpi(skip);
  if (skip) return;
  const int np = GetParam();
  RunResult r = run_workers(np, "Sweep");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("FAILED"), std::string::npos) << r.output;
  EXPECT_EQ(count_ok(r.output), np) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Worlds, MpiBackend, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return fmt::format("np{}", info.param); });

TEST(MpiBackendTcp, CollectiveSweepOverTcpBtl) {
  if (is_worker()) GTEST_SKIP() << "driver test; not run inside a worker";
  bool skip;
  skip_unless_mpi(skip);
  if (skip) return;
  RunResult r = run_workers(2, "Sweep", "--mca btl self,tcp");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("FAILED"), std::string::npos) << r.output;
  EXPECT_EQ(count_ok(r.output), 2) << r.output;
}

// The path taken when MPI is not thread-multiple: every MPI call under one mutex (async calls included).
TEST(MpiBackendSerialized, CollectiveSweepWithSerializedMpiCalls) {
  if (is_worker()) GTEST_SKIP() << "driver test; not run inside a worker";
  bool skip;
  skip_unless_mpi(skip);
  if (skip) return;
  RunResult r = run_workers(3, "Sweep", "-x TRIDENT_MPI_SERIALIZE=1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("FAILED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("backend mpi (MPI calls serialized)"), std::string::npos) << r.output;
  EXPECT_EQ(count_ok(r.output), 3) << r.output;
}

TEST(MpiBackendTimeout, AbandonedCollectiveFailsTheGroup) {
  if (is_worker()) GTEST_SKIP() << "driver test; not run inside a worker";
  bool skip;
  skip_unless_mpi(skip);
  if (skip) return;
  RunResult r = run_workers(2, "Timeout");
  // 0: the abandoned barrier completed once the other rank joined it, so rank 0 could finalize.
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("FAILED"), std::string::npos) << r.output;
  EXPECT_EQ(count_ok(r.output), 2) << r.output;
}

TEST(MpiBackendCheck, MismatchedCollectivesAreNamed) {
  if (is_worker()) GTEST_SKIP() << "driver test; not run inside a worker";
  bool skip;
  skip_unless_mpi(skip);
  if (skip) return;
  for (int np : {2, 3}) {
    RunResult r = run_workers(np, "Mismatch", "-x TRIDENT_MPI_CHECK=1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("FAILED"), std::string::npos) << r.output;
    EXPECT_EQ(count_ok(r.output), np) << r.output;
  }
}

// The check on matching calls (every collective of the sweep, all_gatherv's counts included): no false
// mismatch.
TEST(MpiBackendCheck, CollectiveSweepWithTheCheckOn) {
  if (is_worker()) GTEST_SKIP() << "driver test; not run inside a worker";
  bool skip;
  skip_unless_mpi(skip);
  if (skip) return;
  RunResult r = run_workers(3, "Sweep", "-x TRIDENT_MPI_CHECK=1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("FAILED"), std::string::npos) << r.output;
  EXPECT_EQ(count_ok(r.output), 3) << r.output;
}

// `trident train --backend mpi` under mpirun trains as the native backend under trident's launcher: the same
// loss sequence within 1e-4 relative (the reductions' order may differ), for ZeRO-2 and for TP 2.
std::vector<double> step_losses(const std::filesystem::path& out) {
  std::vector<double> v;
  std::ifstream in(out / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto r = nlohmann::json::parse(line, nullptr, false);
    if (r.is_object() && r.value("type", "") == "step" && r.contains("loss")) v.push_back(r["loss"].get<double>());
  }
  return v;
}

TEST(MpiBackendTrain, TrainUnderMpirunMatchesTheNativeBackend) {
  if (is_worker()) GTEST_SKIP() << "driver test; not run inside a worker";
  bool skip;
  skip_unless_mpi(skip);
  if (skip) return;
  testing::TempDir dir("mpi-train");
  const std::string corpus = testing::write_word_corpus(dir.path);
  const std::string args = fmt::format(
      "train --data {} --n_layer 2 --n_head 2 --n_embd 16 --block_size 16 --batch_size 4 --max_iters 8 "
      "--warmup_iters 2 --lr_decay_iters 8 --learning_rate 3e-3 --grad_clip 0.1 --eval_interval 1000 --eval_iters 1 "
      "--sample_tokens 0 --threads 1 --json",
      corpus);
  for (const char* layout : {"--parallel zero2", "--tp 2"}) {
    const auto mpi_out = dir.path / fmt::format("mpi{}", layout[2]), native_out = dir.path / fmt::format("native{}", layout[2]);
    RunResult m = run_command(fmt::format("timeout -k 5 150 {} --allow-run-as-root --oversubscribe -np 2 {} {} {} "
                                          "--backend mpi --out_dir {}",
                                          find_mpirun(), TRIDENT_BIN, args, layout, mpi_out.string()));
    ASSERT_EQ(m.exit_code, 0) << layout << "\n" << m.output;
    RunResult n = run_command(fmt::format("timeout -k 5 150 {} {} {} --nproc 2 --out_dir {}", TRIDENT_BIN, args, layout,
                                          native_out.string()));
    ASSERT_EQ(n.exit_code, 0) << layout << "\n" << n.output;
    const auto a = step_losses(mpi_out), b = step_losses(native_out);
    ASSERT_EQ(a.size(), 8u) << layout << "\n" << m.output;
    ASSERT_EQ(b.size(), 8u) << layout << "\n" << n.output;
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_LE(std::abs(a[i] - b[i]), 1e-4 * std::abs(b[i])) << layout << " step " << i << ": mpi " << a[i]
                                                             << ", native " << b[i];
  }
}

// The backend is checked before any rank starts: nccl without --device cuda, mpi with --nproc.
TEST(MpiBackendTrain, BadBackendCombinationsAreRefusedByName) {
  if (is_worker()) GTEST_SKIP() << "driver test; not run inside a worker";
  RunResult r = run_command(fmt::format("{} train --backend nccl --max_iters 1", TRIDENT_BIN));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("add --device cuda"), std::string::npos) << r.output;
  r = run_command(fmt::format("{} train --backend mpi --nproc 2 --max_iters 1", TRIDENT_BIN));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("mpirun -np N trident train --backend mpi"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace trident
