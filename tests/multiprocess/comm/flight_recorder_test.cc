// A hang explained: three ranks, rank 2 skips a collective. Ranks 0 and 1 reach the deadline (2 s) and
// dump their flight recorders as the error reaches them; rank 2 dumps on SIGTERM (as `trident launch` sends
// it when the others failed) and then dies of it. The merged dumps name rank 2 and the sequence number.
// Also: TRIDENT_FLIGHT_RECORDER_SIZE=0 records nothing and the collectives still work.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "harness/multiproc.h"
#include "harness/temp_dir.h"
#include "trident/comm/flight_inspect.h"
#include "trident/comm/flight_recorder.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/core/error.h"

namespace trident {
namespace {

TEST(FlightRecorderJob, SkippedCollectiveIsNamedAfterTheDeadline) {
  testing::TempDir dir("flight-hang");
  testing::RunOptions opts;
  opts.deadline_s = 60;
  opts.env = {{"TRIDENT_FLIGHT_RECORDER_DIR", dir.path.string()}};
  constexpr int kBefore = 5;  // all-reduces every rank runs; rank 2 skips the next one
  auto res = testing::run_processes(3, [](int rank, int size, std::shared_ptr<Store> store) {
    GroupOptions o;
    o.timeout = Seconds(2);
    auto pg = new_process_group(store, rank, size, o);
    std::vector<float> v(7);
    for (int i = 0; i < kBefore; ++i) {
      std::fill(v.begin(), v.end(), static_cast<float>(rank + i));
      pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
      TRIDENT_RANK_CHECK(v[6] == static_cast<float>(3 + 3 * i), "all_reduce {} gave {}", i, v[6]);
    }
    if (rank == 2) {
      // Busy elsewhere until the others gave up; then the launcher's SIGTERM.
      store->wait({"failed/0", "failed/1"}, Seconds(30));
      ::kill(::getpid(), SIGTERM);
      ::sleep(20);
      testing::rank_fail("rank 2 survived SIGTERM");
    }
    try {
      pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
      testing::rank_fail("the skipped all_reduce completed");
    } catch (const TimeoutError& e) {
      TRIDENT_RANK_CHECK(e.seq == kBefore + 1, "seq {}", e.seq);
    }
    // The dump was written before the error reached this rank.
    TRIDENT_RANK_CHECK(std::filesystem::exists(flight_recorder::dump_dir() + "/rank_" + std::to_string(rank) + ".json"),
                       "no dump");
    store->set_string("failed/" + std::to_string(rank), "1");
  }, opts);
  ASSERT_TRUE(res[0].ok && res[1].ok) << testing::failures(res);
  EXPECT_EQ(res[2].signal, SIGTERM) << testing::failures(res);

  const auto dumps = load_flight_dumps(dir.path.string());
  ASSERT_EQ(dumps.size(), 3u);
  EXPECT_EQ(dumps[2].reason, "signal SIGTERM");
  const InspectReport rep = inspect_flight_dumps(dumps);
  std::printf("%s", rep.text().c_str());  // what `trident inspect` prints, in the test log
  ASSERT_FALSE(rep.findings.empty()) << rep.text();
  const InspectFinding& f = rep.findings[0];
  EXPECT_EQ(f.kind, InspectFinding::Kind::kHang) << rep.text();
  EXPECT_EQ(f.ranks, std::vector<int>({2})) << rep.text();
  EXPECT_EQ(f.seq, static_cast<uint64_t>(kBefore + 1)) << rep.text();
  EXPECT_EQ(f.text.rfind("rank 2 never entered all_reduce #6 of group 'world' (ranks 0-2); ranks 0,1 waited ", 0), 0u)
      << rep.text();
  EXPECT_NE(f.text.find("TimeoutError"), std::string::npos) << rep.text();
}

TEST(FlightRecorderJob, SizeZeroRecordsNothing) {
  testing::RunOptions opts;
  opts.env = {{"TRIDENT_FLIGHT_RECORDER_SIZE", "0"}};
  auto res = testing::run_processes(2, [](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = new_process_group(store, rank, size);
    TRIDENT_RANK_CHECK(pg->flight_ring() == nullptr, "a ring with size 0");
    float x = 1;
    pg->all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
    TRIDENT_RANK_CHECK(x == 2, "sum {}", x);
  }, opts);
  EXPECT_EQ(testing::failures(res), "");
}

}  // namespace
}  // namespace trident
