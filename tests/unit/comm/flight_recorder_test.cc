// The flight recorder: the ring (wraparound at sizes 1 and 7, updates of overwritten calls ignored), what a
// process group records for every kind of call, the dump (atomic, parsable back), and the analysis behind
// `trident inspect` on synthetic dumps whose answer is known: a rank that never entered a collective, a
// mismatch, a missing dump, the slowest rank, and clear errors for missing folders and corrupt files.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "harness/multiproc.h"
#include "harness/temp_dir.h"
#include "trident/comm/flight_inspect.h"
#include "trident/comm/flight_recorder.h"
#include "trident/comm/process_group.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/core/stamp_clock.h"

namespace trident {
namespace {

using nlohmann::json;

CollArgs all_reduce_args(size_t count) {
  CollArgs a;
  a.op = OpKind::kAllReduce;
  a.count = count;
  return a;
}

// Sizes 1 and 7 with 0, 1, capacity and 3x capacity + 2 calls: the last min(n, capacity) calls, oldest
// first, with consecutive ids and sequence numbers.
TEST(FlightRing, KeepsTheLastCallsAcrossWraparound) {
  for (size_t cap : {size_t{1}, size_t{7}}) {
    for (size_t n : {size_t{0}, size_t{1}, cap, 3 * cap + 2}) {
      FlightRing ring("world", 0, 2, 0, cap);
      for (size_t i = 0; i < n; ++i) {
        const uint64_t id = ring.enqueue(all_reduce_args(i));
        ASSERT_EQ(id, i + 1);
        ring.started(id, i + 1, Algo::kRing, 100 + static_cast<int64_t>(i));
        ring.finished(id, 200 + static_cast<int64_t>(i), nullptr);
      }
      auto s = ring.snapshot();
      ASSERT_EQ(s.issued, n);
      ASSERT_EQ(s.records.size(), std::min(n, cap)) << "cap " << cap << " n " << n;
      for (size_t k = 0; k < s.records.size(); ++k) {
        const uint64_t id = n - s.records.size() + k + 1;
        EXPECT_EQ(s.records[k].id, id);
        EXPECT_EQ(s.records[k].seq, id);
        EXPECT_EQ(s.records[k].count, id - 1);
        EXPECT_EQ(s.records[k].state, CallState::kCompleted);
        EXPECT_EQ(s.records[k].algo, Algo::kRing);
        EXPECT_EQ(s.records[k].start_stamp, 100 + static_cast<int64_t>(id - 1));
        EXPECT_EQ(s.records[k].end_stamp, 200 + static_cast<int64_t>(id - 1));
      }
    }
  }
}

// A call overwritten while still in flight (ring of 1, two calls queued) keeps the newer call's record.
TEST(FlightRing, UpdatesOfOverwrittenCallsAreIgnored) {
  FlightRing ring("g", 1, 3, 0, 1);
  const uint64_t a = ring.enqueue(all_reduce_args(4));
  CollArgs send;
  send.op = OpKind::kSend;
  send.peer = 2;
  send.tag = 9;
  send.count = 3;
  const uint64_t b = ring.enqueue(send);
  ring.started(a, 1, Algo::kTree, 5);
  ring.finished(a, 6, std::make_exception_ptr(TimeoutError("late", 1, "all_reduce", 1)));
  auto s = ring.snapshot();
  ASSERT_EQ(s.records.size(), 1u);
  EXPECT_EQ(s.records[0].id, b);
  EXPECT_EQ(s.records[0].op, OpKind::kSend);
  EXPECT_EQ(s.records[0].seq, 0u);  // point-to-point: outside the collective sequence
  EXPECT_EQ(s.records[0].peer, 2);
  EXPECT_EQ(s.records[0].tag, 9u);
  EXPECT_EQ(s.records[0].state, CallState::kQueued);
  EXPECT_EQ(s.records[0].start_stamp, 0);
  // The failure is recorded with its type on a call still in the ring.
  ring.finished(b, 7, std::make_exception_ptr(PeerDiedError("gone", 1, 2, "send", 0)));
  s = ring.snapshot();
  EXPECT_EQ(s.records[0].state, CallState::kFailed);
  EXPECT_STREQ(s.records[0].error_type, "PeerDiedError");
  EXPECT_EQ(s.records[0].error, "Rank 2 failed - Connection closed by peer - gone");  // with c10d's words
}

// Every call of a group is recorded, blocking and async, collectives and point-to-point, with the
// native backend's sequence number and algorithm; the dump parses back.
TEST(FlightRecorder, GroupRecordsEveryCallAndDumpsParseBack) {
  ASSERT_GT(flight_recorder::capacity(), 0u) << "TRIDENT_FLIGHT_RECORDER_SIZE=0 in the test environment";
  testing::TempDir dir("flight");
  auto res = testing::run_threads(3, [&](int rank, int size, std::shared_ptr<Store> store) {
    GroupOptions o;
    o.name = "fr_calls";
    auto pg = new_process_group(store, rank, size, o);
    std::vector<float> v(7, 1.0f);
    pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
    pg->broadcast(v.data(), 5, DType::kFloat32, 1);
    auto w = pg->all_reduce_async(v.data(), 1, DType::kFloat32, ReduceOp::kMax);
    w->wait();
    if (rank == 0) pg->send(v.data(), 3, DType::kFloat32, 2, 4);
    if (rank == 2) pg->recv(v.data(), 3, DType::kFloat32, 0, 4);
    pg->barrier();
    auto s = pg->flight_ring()->snapshot();
    TRIDENT_RANK_CHECK(s.backend == "native", "backend {}", s.backend);
    TRIDENT_RANK_CHECK(s.global_ranks == std::vector<int>({0, 1, 2}), "ranks");
    const size_t expect = rank == 1 ? 4 : 5;
    TRIDENT_RANK_CHECK(s.records.size() == expect, "{} records", s.records.size());
    uint64_t seq = 0;
    for (const auto& r : s.records) {
      TRIDENT_RANK_CHECK(r.state == CallState::kCompleted, "state {}", call_state_name(r.state));
      TRIDENT_RANK_CHECK(r.enqueue_stamp > 0 && r.start_stamp >= r.enqueue_stamp && r.end_stamp >= r.start_stamp, "times of {}",
                         op_name(r.op));
      if (r.op == OpKind::kSend || r.op == OpKind::kRecv) {
        TRIDENT_RANK_CHECK(r.seq == 0 && r.count == 3 && r.tag == 4, "p2p record");
        TRIDENT_RANK_CHECK(r.peer == (rank == 0 ? 2 : 0), "peer {}", r.peer);
      } else {
        TRIDENT_RANK_CHECK(r.seq == ++seq, "seq {} expected {}", r.seq, seq);
        TRIDENT_RANK_CHECK(r.algo != Algo::kAuto, "no algorithm for {}", op_name(r.op));
      }
    }
    TRIDENT_RANK_CHECK(s.records[1].op == OpKind::kBroadcast && s.records[1].root == 1 && s.records[1].count == 5,
                       "broadcast record");
    TRIDENT_RANK_CHECK(s.records[2].redop == ReduceOp::kMax && s.records[2].count == 1, "async all_reduce record");
  });
  ASSERT_EQ(testing::failures(res), "");

  // The dump (of every live ring in this process; these groups are gone, so make one more) parses back.
  const std::string path = flight_recorder::dump("test request", dir.path.string());
  EXPECT_TRUE(std::filesystem::exists(path));
  for (const auto& e : std::filesystem::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  RankDump d = parse_flight_dump(ss.str(), path);
  EXPECT_EQ(d.reason, "test request");
  EXPECT_EQ(d.pid, getpid());
}

// The dump's times are wall-clock microseconds of when the calls happened: the ring's stamps (time-stamp
// counter ticks where available) are converted on the way out, within a few microseconds of clock reads
// taken on either side of the call.
TEST(FlightRecorder, DumpTimesAreWallClockOfTheCalls) {
  ASSERT_GT(flight_recorder::capacity(), 0u) << "TRIDENT_FLIGHT_RECORDER_SIZE=0 in the test environment";
  testing::TempDir dir("flight_times");
  auto wall_us = [] {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
  };
  std::shared_ptr<FlightRing> ring = flight_recorder::make_ring("stamped", 0, 1);
  ring->describe("test", {0});
  const int64_t before = wall_us();
  const uint64_t id = ring->enqueue(all_reduce_args(3));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ring->started(id, 1, Algo::kRing, stamp_clock::now());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ring->finished(id, stamp_clock::now(), nullptr);
  const int64_t after = wall_us();
  const json doc = json::parse(flight_recorder::dump_json("times"));
  const json* rec = nullptr;
  for (const auto& g : doc["groups"])
    if (g["name"] == "stamped") rec = &g["records"][0];
  ASSERT_NE(rec, nullptr);
  const int64_t enq = (*rec)["enqueue_us"], start = (*rec)["start_us"], end = (*rec)["end_us"];
  constexpr int64_t kSlackUs = 200;  // CLOCK_REALTIME against CLOCK_MONOTONIC read at different instants
  EXPECT_GE(enq, before - kSlackUs);
  EXPECT_LE(end, after + kSlackUs);
  EXPECT_GE(start - enq, 20000 - kSlackUs) << "a 20 ms sleep between enqueue and start";
  EXPECT_GE(end - start, 20000 - kSlackUs) << "a 20 ms sleep between start and end";
  EXPECT_LE(enq, start);
  EXPECT_LE(start, end);
}

// Dumps of one process can overlap: a failure's dump on the caller's thread and the dump thread's on the
// SIGTERM that the launcher sends when another rank failed first. Each must leave a whole file (they once
// shared one temporary file, and a rename could publish the other's half-written or truncated one: an empty
// rank_1.json, seen once in CI), and no temporary file may be left behind.
TEST(FlightRecorder, ConcurrentDumpsLeaveAWholeFile) {
  testing::TempDir dir("flight_concurrent");
  constexpr int kThreads = 4, kDumps = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kDumps; ++i) {
        try {
          const std::string path = flight_recorder::dump(fmt::format("thread {} dump {}", t, i), dir.path.string());
          std::ifstream in(path);
          std::stringstream ss;
          ss << in.rdbuf();
          (void)parse_flight_dump(ss.str(), path);
        } catch (const std::exception& e) {
          if (failures.fetch_add(1) < 3) ADD_FAILURE() << "thread " << t << " dump " << i << ": " << e.what();
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left.size(), 1u) << fmt::format("{}", fmt::join(left, ", "));
}

TEST(FlightRecorder, DumpWithoutAFolderIsAClearError) {
  // No folder from the environment nor from the program, whatever this process had: restored after.
  const char* env_dir = std::getenv("TRIDENT_FLIGHT_RECORDER_DIR");
  const std::string saved_env = env_dir ? env_dir : "";
  ::unsetenv("TRIDENT_FLIGHT_RECORDER_DIR");
  const std::string saved_dir = flight_recorder::dump_dir();
  flight_recorder::set_dump_dir("");
  std::string what;
  try {
    flight_recorder::dump("x");
  } catch (const InvalidArgument& e) {
    what = e.what();
  }
  flight_recorder::set_dump_dir(saved_dir);
  if (env_dir) ::setenv("TRIDENT_FLIGHT_RECORDER_DIR", saved_env.c_str(), 1);
  EXPECT_NE(what.find("TRIDENT_FLIGHT_RECORDER_DIR"), std::string::npos) << "no clear error: '" << what << "'";
}

// A rank that ends by exit() after an error while `trident launch` stops it with SIGTERM: the dump thread
// serves the signal while the main thread runs the static destructors, and reads the environment table and
// the log prefix (dump_dir(), the dump's log line). Those must outlive the destructors: once they were
// destroyed there, and 4 of 32 ranks of an emulated cluster whose link was cut died of SIGSEGV in
// env::param_string instead of reporting the timeout. The child is a fresh process (this binary again) so
// that its exit hook is registered before the table is built and so runs after the table's destructor;
// the hook reuses the freed memory (a read of the dead table then reads garbage, not stale values) and has
// the dump thread serve SIGUSR1, whose dump calls dump_dir() and logs.
TEST(FlightRecorderExit, DISABLED_ChildServesASignalDuringExit) {
  std::atexit([] {
    static void* blocks[256];
    for (int i = 0; i < 256; ++i) {
      blocks[i] = std::malloc(static_cast<size_t>(64 + 64 * (i % 64)));
      if (blocks[i] != nullptr) std::memset(blocks[i], 0x5a, static_cast<size_t>(64 + 64 * (i % 64)));
    }
    ::kill(::getpid(), SIGUSR1);
    ::usleep(500 * 1000);
    for (void* b : blocks) std::free(b);  // served by now; nothing left for a leak checker
  });
  (void)env::timeout_seconds();  // builds the table, after the hook's registration
  set_log_prefix("[rank 18] a prefix longer than the small-string buffer");
  auto ring = flight_recorder::make_ring("exit", 0, 1);  // starts the dump thread
  ASSERT_NE(ring, nullptr);
  std::exit(0);
}

TEST(FlightRecorderExit, SignalServedDuringExitDoesNotCrash) {
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(len, 0);
  self[len] = '\0';
  for (int run = 0; run < 3; ++run) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::unsetenv("TRIDENT_FLIGHT_RECORDER_DIR");
      ::execl(self, self, "--gtest_also_run_disabled_tests",
              "--gtest_filter=FlightRecorderExit.DISABLED_ChildServesASignalDuringExit", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "run " << run << ": the child died of signal "
                                   << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << " during exit";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "run " << run;
  }
}

// ---- synthetic dumps: rank r's calls in group `world` of `size` ranks ----
json call(uint64_t seq, const std::string& op, const std::string& state, int64_t start, int64_t end,
          const std::string& error_type = {}) {
  json c = {{"id", seq}, {"seq", seq}, {"op", op}, {"count", 1024}, {"bytes", 4096}, {"dtype", "float32"},
            {"redop", op == "all_reduce" ? json("sum") : json(nullptr)}, {"root", op == "broadcast" ? 0 : -1},
            {"peer", -1}, {"tag", 0}, {"algo", "ring"}, {"state", state}, {"enqueue_us", start}, {"start_us", start},
            {"end_us", end ? json(end) : json(nullptr)}};
  if (!error_type.empty()) c["error_type"] = error_type, c["error"] = "deadline of 20 s expired";
  return c;
}
json dump_of(int rank, int size, json calls, int64_t dump_time, const std::string& host = "h") {
  std::vector<int> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(r);
  return {{"format", "trident-flight-recorder"}, {"version", 1}, {"rank", rank}, {"pid", 100 + rank}, {"host", host},
          {"reason", "test"}, {"dump_time_us", dump_time},
          {"groups", json::array({{{"name", "world"}, {"generation", 0}, {"rank", rank}, {"size", size},
                                   {"ranks", ranks}, {"backend", "native"}, {"capacity", 2048},
                                   {"issued", calls.size()}, {"records", calls}}})}};
}

// Three ranks, 57 all-reduces on ranks 0 and 1 (the last one failed after 20 s), 56 on rank 2; rank 1
// arrives 5 ms late at every completed one.
std::vector<RankDump> hang_job(bool with_rank2 = true) {
  std::vector<RankDump> out;
  const int64_t t0 = 1'700'000'000'000'000;
  for (int r = 0; r < 3; ++r) {
    if (r == 2 && !with_rank2) continue;
    json calls = json::array();
    for (uint64_t s = 1; s <= 56; ++s) {
      const int64_t start = t0 + static_cast<int64_t>(s) * 100'000 + (r == 1 ? 5'000 : 0);
      calls.push_back(call(s, "all_reduce", "completed", start, t0 + static_cast<int64_t>(s) * 100'000 + 6'000));
    }
    const int64_t start57 = t0 + 57 * 100'000;
    if (r < 2) calls.push_back(call(57, "all_reduce", "failed", start57, start57 + 20'000'000, "TimeoutError"));
    out.push_back(parse_flight_dump(dump_of(r, 3, calls, start57 + 20'100'000).dump(), fmt::format("rank_{}.json", r)));
  }
  return out;
}

TEST(FlightInspect, NamesTheRankThatNeverEnteredAndWhoWaited) {
  auto rep = inspect_flight_dumps(hang_job(), 50);
  ASSERT_FALSE(rep.findings.empty()) << rep.text();
  const auto& f = rep.findings[0];
  EXPECT_EQ(f.kind, InspectFinding::Kind::kHang);
  EXPECT_EQ(f.seq, 57u);
  EXPECT_EQ(f.ranks, std::vector<int>({2}));
  EXPECT_EQ(f.text.rfind("rank 2 never entered all_reduce #57 of group 'world' (ranks 0-2); ranks 0,1 waited 20.0 s "
                         "and failed (TimeoutError on ranks 0,1).",
                         0),
            0u)
      << f.text;
  EXPECT_NE(f.text.find("Rank 2's last call in the group was all_reduce #56 (completed"), std::string::npos) << f.text;
}

TEST(FlightInspect, SlowestRankOverTheLastK) {
  auto rep = inspect_flight_dumps(hang_job(), 10);
  const InspectFinding* slow = nullptr;
  for (const auto& f : rep.findings)
    if (f.kind == InspectFinding::Kind::kSlowest) slow = &f;
  ASSERT_NE(slow, nullptr) << rep.text();
  EXPECT_EQ(slow->ranks, std::vector<int>({1}));
  EXPECT_NE(slow->text.find("over its last 10 completed collectives (#47-#56): rank 1, on average 5.0 ms after the "
                            "first rank and last in 10 of 10"),
            std::string::npos)
      << slow->text;
}

TEST(FlightInspect, MissingDumpIsNamed) {
  auto rep = inspect_flight_dumps(hang_job(false), 50);
  ASSERT_FALSE(rep.findings.empty());
  EXPECT_EQ(rep.findings[0].ranks, std::vector<int>({2}));
  EXPECT_NE(rep.findings[0].text.find("ranks 0,1 waited 20.0 s in all_reduce #57 of group 'world' (ranks 0-2) and "
                                      "failed (TimeoutError on ranks 0,1); rank 2 left no dump"),
            std::string::npos)
      << rep.findings[0].text;
}

// SIGUSR1 of a live job: rank 0 dumped inside #3, rank 1 dumped later, inside #4 (after #3 completed there).
// Neither is stuck and nobody is accused.
TEST(FlightInspect, LiveDumpsAtDifferentTimesAccuseNobody) {
  std::vector<RankDump> dumps;
  json c0 = json::array({call(1, "all_reduce", "completed", 10, 20), call(2, "all_reduce", "completed", 30, 40),
                         call(3, "all_reduce", "started", 50, 0)});
  json c1 = json::array({call(1, "all_reduce", "completed", 10, 20), call(2, "all_reduce", "completed", 30, 40),
                         call(3, "all_reduce", "completed", 52, 60), call(4, "all_reduce", "started", 70, 0)});
  dumps.push_back(parse_flight_dump(dump_of(0, 2, c0, 55).dump(), "a"));
  dumps.push_back(parse_flight_dump(dump_of(1, 2, c1, 80).dump(), "b"));
  auto rep = inspect_flight_dumps(dumps);
  for (const auto& f : rep.findings)
    EXPECT_TRUE(f.kind == InspectFinding::Kind::kInFlight || f.kind == InspectFinding::Kind::kSlowest) << f.text;
  EXPECT_NE(rep.text().find("no collective is stuck"), std::string::npos) << rep.text();
  EXPECT_NE(rep.text().find("all_reduce #4 of group 'world' (ranks 0,1) was in progress on rank 1"), std::string::npos)
      << rep.text();
}

TEST(FlightInspect, MismatchSaysWhatEachRankIssued) {
  std::vector<RankDump> dumps;
  for (int r = 0; r < 5; ++r) {
    json calls = json::array();
    calls.push_back(call(1, "all_reduce", "completed", 10, 20));
    calls.push_back(call(2, r == 3 ? "broadcast" : "all_reduce", "failed", 30, 40, "MismatchError"));
    dumps.push_back(parse_flight_dump(dump_of(r, 5, calls, 50).dump(), "x"));
  }
  auto rep = inspect_flight_dumps(dumps);
  ASSERT_FALSE(rep.findings.empty());
  EXPECT_EQ(rep.findings[0].kind, InspectFinding::Kind::kMismatch);
  EXPECT_EQ(rep.findings[0].ranks, std::vector<int>({3}));
  EXPECT_EQ(rep.findings[0].text,
            "collective #2 of group 'world' (ranks 0-4) mismatched: ranks 0-2,4 issued all_reduce(count=1024, float32, "
            "sum); rank 3 issued broadcast(count=1024, float32, root 0).");
}

TEST(FlightInspect, ChromeTraceHasOneEventPerRecordedCall) {
  testing::TempDir dir("flight-trace");
  const std::string path = (dir.path / "t.json").string();
  write_flight_trace(hang_job(), path);
  std::ifstream in(path);
  json t = json::parse(in);
  int calls = 0;
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == "X") ++calls;
  EXPECT_EQ(calls, 57 + 57 + 56);
}

TEST(FlightInspect, ClearErrorsForBadFolders) {
  testing::TempDir dir("flight-bad");
  auto expect_io = [](const std::string& d, const std::string& needle) {
    try {
      load_flight_dumps(d);
      ADD_FAILURE() << "no error for " << d;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_io((dir.path / "nope").string(), "does not exist");
  expect_io(dir.path.string(), "no flight-recorder dumps");
  const std::string full = dump_of(0, 1, json::array({call(1, "barrier", "completed", 1, 2)}), 3).dump();
  std::ofstream((dir.path / "rank_0.json").string()) << full.substr(0, full.size() / 2);
  expect_io(dir.path.string(), "rank_0.json' is not valid JSON");
  std::ofstream((dir.path / "rank_0.json").string()) << R"({"format": "trident-flight-recorder", "version": 1})";
  expect_io(dir.path.string(), "rank_0.json': a field is missing");
  std::ofstream((dir.path / "rank_0.json").string()) << full;
  EXPECT_EQ(load_flight_dumps(dir.path.string()).size(), 1u);
}

}  // namespace
}  // namespace trident
