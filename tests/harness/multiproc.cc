#include "harness/multiproc.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <typeinfo>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "trident/comm/store/file_store.h"

#ifdef TRIDENT_COVERAGE
// A rank leaves through _exit (no atexit handlers: the parent's gtest state must not run twice), which skips
// gcov's own write at exit; scripts/coverage.sh defines TRIDENT_COVERAGE so each rank writes its counts first.
extern "C" void __gcov_dump(void);
#endif
#include "trident/comm/store/hash_store.h"

namespace trident::testing {

namespace {
struct RankFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
using Clock = std::chrono::steady_clock;
}  // namespace

void rank_fail(const std::string& what) { throw RankFailure(what); }

std::vector<RankResult> run_processes(int size, const RankFn& fn, const RunOptions& opts) {
  char tmpl[] = "/tmp/trident-test-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::string store_path = dir + "/store";
  std::vector<pid_t> pids(size);
  std::vector<RankResult> results(size);
  auto start = Clock::now();
  std::fflush(nullptr);
  for (int r = 0; r < size; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      for (auto& [k, v] : opts.env) setenv(k.c_str(), v.c_str(), 1);
      std::string err;
      int code = 0;
      try {
        auto store = std::make_shared<FileStore>(store_path, Seconds(opts.deadline_s));
        fn(r, size, store);
      } catch (const std::exception& e) {
        err = fmt::format("[{}] {}", typeid(e).name(), e.what());
        code = 1;
      } catch (...) {
        err = "unknown exception";
        code = 1;
      }
      if (code) {
        std::ofstream(fmt::format("{}/rank{}.err", dir, r)) << err;
      }
      std::fflush(nullptr);
#ifdef TRIDENT_COVERAGE
      __gcov_dump();
#endif
      _exit(code);
    }
    pids[r] = pid;
    results[r].rank = r;
  }
  int remaining = size;
  std::vector<bool> done(size, false);
  auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.deadline_s));
  while (remaining > 0) {
    int status = 0;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < size; ++r) {
        if (pids[r] != p || done[r]) continue;
        done[r] = true;
        --remaining;
        auto& res = results[r];
        res.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) res.signal = WTERMSIG(status);
        res.ok = WIFEXITED(status) && res.exit_code == 0;
      }
      continue;
    }
    if (Clock::now() > deadline) {
      for (int r = 0; r < size; ++r)
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          results[r].hung = true;
        }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int r = 0; r < size; ++r) {
    std::ifstream in(fmt::format("{}/rank{}.err", dir, r));
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      results[r].error = ss.str();
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return results;
}

std::vector<RankResult> run_threads(int size, const RankFn& fn, const RunOptions& opts) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(Seconds(opts.deadline_s));
  std::vector<RankResult> results(size);
  std::vector<std::thread> threads;
  auto start = Clock::now();
  for (int r = 0; r < size; ++r) {
    results[r].rank = r;
    threads.emplace_back([&, r] {
      try {
        fn(r, size, store);
        results[r].ok = true;
      } catch (const std::exception& e) {
        results[r].error = e.what();
        results[r].exit_code = 1;
      }
      results[r].seconds = std::chrono::duration<double>(Clock::now() - start).count();
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::string failures(const std::vector<RankResult>& results) {
  std::string out;
  for (auto& r : results) {
    if (r.ok) continue;
    out += fmt::format("rank {}: ", r.rank);
    if (r.hung) out += "hung (killed at the deadline)";
    else if (r.signal) out += fmt::format("killed by signal {} ({})", r.signal, strsignal(r.signal));
    else out += fmt::format("exited with code {}", r.exit_code);
    if (!r.error.empty()) out += ": " + r.error;
    out += "\n";
  }
  return out;
}

}  // namespace trident::testing
