// Test harness: runs N ranks as real processes (fork) or as threads, each with a Store shared by all,
// and reports every rank's failure (exception text, exit code or signal) to the test.
//
// Processes share a FileStore in a fresh temporary folder (no threads in the parent at fork time). A rank
// function returns normally to pass; an exception or a failed EXPECT is reported with the rank's number.
// The whole run has a deadline; ranks still running at the deadline are killed and reported as hung.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace trident {
class Store;
}

namespace trident::testing {

struct RankResult {
  int rank = 0;
  bool ok = false;
  int exit_code = 0;
  int signal = 0;
  bool hung = false;
  std::string error;  // what the rank reported (exception text, failed expectations)
  double seconds = 0;  // wall time from start until this rank ended
};

using RankFn = std::function<void(int rank, int size, std::shared_ptr<Store> store)>;

struct RunOptions {
  double deadline_s = 120;
  std::vector<std::pair<std::string, std::string>> env;  // set in each child before fn runs
};

// Forks `size` processes. Returns one result per rank.
std::vector<RankResult> run_processes(int size, const RankFn& fn, const RunOptions& opts = {});
// Runs ranks as threads over one HashStore (fast sweeps; failures still reported per rank).
std::vector<RankResult> run_threads(int size, const RankFn& fn, const RunOptions& opts = {});

// "rank 2: exited with code 1: <error>" lines for every failed rank; empty when all passed.
std::string failures(const std::vector<RankResult>& results);

// Records a failure inside a rank function (works in processes and threads). Throws to end the rank.
[[noreturn]] void rank_fail(const std::string& what);
#define TRIDENT_RANK_CHECK(cond, ...)                                                                  \
  do {                                                                                                 \
    if (!(cond)) ::trident::testing::rank_fail(::fmt::format("{}:{}: check failed: {}: {}", __FILE__, \
                                                             __LINE__, #cond, ::fmt::format(__VA_ARGS__))); \
  } while (0)

}  // namespace trident::testing
