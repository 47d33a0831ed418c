// A hang explained: three ranks, rank 2 skips a collective. Ranks 0 and 1 reach the deadline (2 s) and
// dump their flight recorders as the error reaches them; rank 2 dumps on SIGTERM (as `trident launch` sends
// it when the others failed) and then dies of it. The merged dumps name rank 2 and the sequence number.
// Also: TRIDENT_FLIGHT_RECORDER_SIZE=0 records nothing and the collectives still work.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
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

// SIGTERM ends a rank whatever it is blocked in, also in a program with a SIGTERM handler of its own that
// does not end it (installed before the group): trident's handler runs the program's, aborts the group (the
// blocked receive returns with an error) and, when the program carries on, runs the default action after
// its grace period (5 s). With and without recording.
TEST(FlightRecorderJob, SigtermEndsARankWhoseOwnHandlerDoesNot) {
  for (const char* size : {"2048", "0"}) {
    testing::RunOptions opts;
    opts.deadline_s = 40;
    opts.env = {{"TRIDENT_FLIGHT_RECORDER_SIZE", size}};
    auto res = testing::run_processes(2, [](int rank, int n, std::shared_ptr<Store> store) {
      static std::atomic<int> handled{0};
      struct sigaction sa {};
      sa.sa_handler = [](int) { handled.fetch_add(1); };
      sigemptyset(&sa.sa_mask);
      ::sigaction(SIGTERM, &sa, nullptr);
      GroupOptions o;
      o.timeout = Seconds(60);
      auto pg = new_process_group(store, rank, n, o);
      if (rank == 1) {
        store->wait({"blocked"}, Seconds(30));
        ::usleep(300 * 1000);  // rank 0 is in its receive
        ::kill(static_cast<pid_t>(std::stoi(store->get_string("blocked", Seconds(1)))), SIGTERM);
        // Rank 0's receive returned (the group was aborted) well before the grace period ended.
        store->wait({"returned"}, Seconds(3));
        ::sleep(6);  // alive until rank 0 is gone: its receive failed of SIGTERM, not of this rank's exit
        return;
      }
      std::vector<float> v(3);
      store->set_string("blocked", std::to_string(::getpid()));
      try {
        pg->recv(v.data(), v.size(), DType::kFloat32, 1, 0);
        testing::rank_fail("a receive with no sender completed");
      } catch (const NetworkError&) {
        // the group was aborted on SIGTERM; this program carries on regardless
      }
      store->set_string("returned", "1");
      TRIDENT_RANK_CHECK(handled.load() == 1, "the program's own handler ran {} times", handled.load());
      ::sleep(30);
      testing::rank_fail("rank 0 survived SIGTERM");
    }, opts);
    EXPECT_TRUE(res[1].ok) << size << ": " << testing::failures(res);
    EXPECT_EQ(res[0].signal, SIGTERM) << size << ": " << testing::failures(res);
  }
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
