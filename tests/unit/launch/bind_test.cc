// CPU binding of local ranks (trident launch --bind none|core|auto, TRIDENT_BIND): the rank-to-CPU mapping,
// the affinity a launched rank really has (read back from /proc/self/status), and the errors for bad values.
// Every wait on a launched CLI has a hang guard (kHangGuard) that fails the test; none is a timing assertion.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "harness/skip.h"
#include "process_runner.h"
#include "trident/core/error.h"
#include "trident/launch/launcher.h"
#include "trident/launch/supervisor.h"

namespace {

using trident::launch::Bind;
using trident::launch::rank_cpus;
using trident::testing::make_env;
using trident::testing::parse_fields;
using trident::testing::ProcessRunner;
using trident::testing::split_lines;

constexpr double kHangGuard = 20.0;

const std::vector<std::string> kDrop = {"RANK",        "WORLD_SIZE",          "LOCAL_RANK",   "LOCAL_WORLD_SIZE",
                                        "GROUP_RANK",  "GROUP_WORLD_SIZE",    "MASTER_ADDR",  "MASTER_PORT",
                                        "TRIDENT_STORE_TOKEN", "TRIDENT_STORE_HOSTED", "TRIDENT_BIND"};

// --- The mapping, against references written out by hand or computed independently. ---

TEST(BindMapping, CoreIsRoundRobinOverTheAllowedSet) {
  const std::vector<std::vector<int>> sets = {{0, 1}, {0, 1, 2, 3, 4, 5, 6, 7}, {3, 5}};
  for (const auto& allowed : sets) {
    for (int ranks = 1; ranks <= 9; ++ranks) {
      std::map<int, int> per_cpu;  // how many ranks each CPU got
      for (int r = 0; r < ranks; ++r) {
        // Reference: walk the allowed set r times, wrapping at its end.
        size_t at = 0;
        for (int step = 0; step < r; ++step) at = at + 1 == allowed.size() ? 0 : at + 1;
        const std::vector<int> got = rank_cpus(Bind::kCore, allowed, r, ranks);
        ASSERT_EQ(got, std::vector<int>{allowed[at]}) << "rank " << r << " of " << ranks;
        ++per_cpu[got[0]];
      }
      // Balanced: loads differ by at most one rank, and no CPU is used while another is idle.
      int lo = ranks, hi = 0;
      for (int c : allowed) lo = std::min(lo, per_cpu[c]), hi = std::max(hi, per_cpu[c]);
      EXPECT_LE(hi - lo, 1) << ranks << " ranks over " << allowed.size() << " CPUs";
    }
  }
  // Hand-written cases.
  EXPECT_EQ(rank_cpus(Bind::kCore, {3, 5}, 0, 3), std::vector<int>{3});
  EXPECT_EQ(rank_cpus(Bind::kCore, {3, 5}, 1, 3), std::vector<int>{5});
  EXPECT_EQ(rank_cpus(Bind::kCore, {3, 5}, 2, 3), std::vector<int>{3});
  EXPECT_EQ(rank_cpus(Bind::kCore, {0, 1, 2, 3, 4, 5, 6, 7}, 8, 9), std::vector<int>{0});
}

TEST(BindMapping, NoneNeverBinds) {
  for (const auto& allowed : std::vector<std::vector<int>>{{0, 1}, {0, 1, 2, 3, 4, 5, 6, 7}, {3, 5}}) {
    for (int ranks = 1; ranks <= 9; ++ranks) {
      for (int r = 0; r < ranks; ++r) EXPECT_TRUE(rank_cpus(Bind::kNone, allowed, r, ranks).empty());
    }
  }
}

TEST(BindMapping, AutoGivesDisjointSharesOrRoundRobinWhenOversubscribed) {
  for (const auto& allowed : std::vector<std::vector<int>>{{0, 1}, {0, 1, 2, 3, 4, 5, 6, 7}, {3, 5}}) {
    const int n = static_cast<int>(allowed.size());
    for (int ranks = 1; ranks <= 9; ++ranks) {
      std::vector<int> covered;
      for (int r = 0; r < ranks; ++r) {
        const std::vector<int> got = rank_cpus(Bind::kAuto, allowed, r, ranks);
        if (ranks > n) {
          EXPECT_EQ(got, rank_cpus(Bind::kCore, allowed, r, ranks)) << "rank " << r << " of " << ranks << " over " << n
                                                                  << " CPUs: round-robin";
          continue;
        }
        if (ranks == 1) {
          EXPECT_TRUE(got.empty()) << "one rank keeps the whole set";
          continue;
        }
        // A contiguous share of size n/ranks or n/ranks + 1, following the previous rank's share.
        ASSERT_FALSE(got.empty());
        EXPECT_GE(static_cast<int>(got.size()), n / ranks);
        EXPECT_LE(static_cast<int>(got.size()), n / ranks + 1);
        for (int c : got) covered.push_back(c);
      }
      if (ranks <= n && ranks > 1) {
        EXPECT_EQ(covered, allowed) << ranks << " ranks: shares tile the allowed set";
      }
      if (ranks == n) {  // one CPU each: the same as core
        for (int r = 0; r < ranks; ++r)
          EXPECT_EQ(rank_cpus(Bind::kAuto, allowed, r, ranks), rank_cpus(Bind::kCore, allowed, r, ranks));
      }
    }
  }
  EXPECT_EQ(rank_cpus(Bind::kAuto, {0, 1, 2, 3, 4, 5, 6, 7}, 1, 3), (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(rank_cpus(Bind::kAuto, {0, 1, 2, 3, 4, 5, 6, 7}, 2, 3), (std::vector<int>{5, 6, 7}));
}

TEST(BindMapping, BadValueNamesTheAllowedValues) {
  EXPECT_EQ(trident::launch::parse_bind("none"), Bind::kNone);
  EXPECT_EQ(trident::launch::parse_bind("core"), Bind::kCore);
  EXPECT_EQ(trident::launch::parse_bind("auto"), Bind::kAuto);
  for (const char* bad : {"", "cores", "Core", "socket", "1"}) {
    try {
      trident::launch::parse_bind(bad, "--bind");
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const trident::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--bind '" + std::string(bad) + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("none, core, auto"), std::string::npos) << e.what();
    }
  }
}

// --- Real affinity of children. ---

std::vector<int> my_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

// "0-2,5" -> {0, 1, 2, 5} (the format of Cpus_allowed_list in /proc/PID/status).
std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (part.empty()) continue;
    auto dash = part.find('-');
    const int lo = std::stoi(part.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) out.push_back(c);
  }
  return out;
}

TEST(BindSupervisor, ChildRunsOnExactlyTheGivenCpus) {
  const std::vector<int> allowed = my_cpus();
  ASSERT_FALSE(allowed.empty());
  trident::launch::SuperviseOptions o;
  o.on_line = [](int, trident::launch::StreamKind, std::string_view) {};
  trident::launch::Supervisor sup(o);
  for (int c : {allowed.front(), allowed.back()}) {
    trident::launch::ChildSpec spec;
    spec.cpus = {c};
    spec.body = [c] { return my_cpus() == std::vector<int>{c} ? 0 : 3; };
    sup.spawn(spec);
  }
  trident::launch::ChildSpec inherit;  // no cpus: the parent's set
  inherit.body = [allowed] { return my_cpus() == allowed ? 0 : 4; };
  sup.spawn(inherit);
  auto result = sup.run();
  ASSERT_EQ(result.children.size(), 3u);
  for (const auto& c : result.children) EXPECT_TRUE(c.ok()) << c.describe();
}

TEST(BindSupervisor, ImpossibleCpuSetIsAClearError) {
  // CPU_SETSIZE - 1 exists on no machine this runs on: the kernel refuses a set with no online CPU.
  const std::vector<int> allowed = my_cpus();
  if (std::find(allowed.begin(), allowed.end(), CPU_SETSIZE - 1) != allowed.end())
    TRIDENT_SKIP_MACHINE("this machine has a CPU numbered CPU_SETSIZE - 1: no impossible set to ask for");
  trident::launch::Supervisor sup;
  trident::launch::ChildSpec spec;
  spec.argv = {"true"};
  spec.env = {"PATH=/usr/bin:/bin"};
  spec.cpus = {CPU_SETSIZE - 1};
  try {
    sup.spawn(spec);
    ADD_FAILURE() << "binding to CPU " << CPU_SETSIZE - 1 << " was accepted";
  } catch (const trident::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot bind 'true' to CPUs " + std::to_string(CPU_SETSIZE - 1)),
              std::string::npos)
        << e.what();
  }
  sup.run();
}

struct Launched {
  bool finished = false;
  int exit_code = -1;
  std::string out, err;
  std::map<int, std::vector<int>> cpus;  // local rank -> its Cpus_allowed_list
};

const char* kPrintCpus = "echo L=$LOCAL_RANK C=$(grep '^Cpus_allowed_list:' /proc/self/status | cut -f2)";

Launched launch_cpus(const std::vector<std::string>& flags, const std::vector<std::string>& env = {}) {
  if (::access(TRIDENT_BIN, X_OK) != 0) ADD_FAILURE() << "the CLI is not built at " << TRIDENT_BIN;
  std::vector<std::string> argv = {TRIDENT_BIN, "launch", "--master-port", "0"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  for (const char* a : {"--", "sh", "-c", kPrintCpus}) argv.push_back(a);
  ProcessRunner p(argv, make_env(kDrop, env));
  auto status = p.wait(kHangGuard);
  Launched l;
  l.out = p.out();
  l.err = p.err();
  if (status && WIFEXITED(*status)) {
    l.finished = true;
    l.exit_code = WEXITSTATUS(*status);
  }
  for (const auto& line : split_lines(l.out)) {
    auto f = parse_fields(line);
    if (f.count("L") && f.count("C")) l.cpus[std::stoi(f["L"])] = parse_cpu_list(f["C"]);
  }
  return l;
}

TEST(BindLaunch, CoreBindsEachRankToItsCpu) {
  const std::vector<int> allowed = my_cpus();
  for (int n : {1, 2, 3}) {
    Launched l = launch_cpus({"-n", std::to_string(n), "--bind", "core"});
    ASSERT_TRUE(l.finished) << l.err;
    ASSERT_EQ(l.exit_code, 0) << l.err;
    ASSERT_EQ(l.cpus.size(), static_cast<size_t>(n)) << l.out;
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(l.cpus[r], std::vector<int>{allowed[static_cast<size_t>(r) % allowed.size()]}) << "rank " << r;
  }
  // TRIDENT_BIND is the default of --bind; the flag wins over it.
  Launched e = launch_cpus({"-n", "2"}, {"TRIDENT_BIND=core"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.cpus[1], std::vector<int>{allowed[1 % allowed.size()]});
  Launched f = launch_cpus({"-n", "2", "--bind", "none"}, {"TRIDENT_BIND=core"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(f.cpus[1], allowed);
}

TEST(BindLaunch, NoneLeavesTheAffinityUntouched) {
  const std::vector<int> allowed = my_cpus();
  Launched l = launch_cpus({"-n", "2", "--bind", "none"});
  ASSERT_TRUE(l.finished) << l.err;
  ASSERT_EQ(l.exit_code, 0) << l.err;
  ASSERT_EQ(l.cpus.size(), 2u) << l.out;
  for (const auto& [r, cpus] : l.cpus) EXPECT_EQ(cpus, allowed) << "rank " << r;
  if (allowed.size() < 2) return;
  // Started from a narrowed set, the ranks keep exactly that set (not the machine's CPUs).
  cpu_set_t narrow, full;
  CPU_ZERO(&narrow);
  CPU_SET(allowed.back(), &narrow);
  ASSERT_EQ(::sched_getaffinity(0, sizeof full, &full), 0);
  ASSERT_EQ(::sched_setaffinity(0, sizeof narrow, &narrow), 0);
  Launched m = launch_cpus({"-n", "3", "--bind", "none"});
  Launched c = launch_cpus({"-n", "3", "--bind", "core"});  // round-robin over the one allowed CPU
  ASSERT_EQ(::sched_setaffinity(0, sizeof full, &full), 0);
  ASSERT_EQ(m.exit_code, 0) << m.err;
  ASSERT_EQ(c.exit_code, 0) << c.err;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(m.cpus[r], std::vector<int>{allowed.back()}) << "rank " << r;
    EXPECT_EQ(c.cpus[r], std::vector<int>{allowed.back()}) << "rank " << r;
  }
}

TEST(BindLaunch, BadValuesAreErrorsNamingTheAllowedValues) {
  Launched l = launch_cpus({"-n", "2", "--bind", "socket"});
  ASSERT_TRUE(l.finished);
  EXPECT_NE(l.exit_code, 0);
  EXPECT_NE(l.err.find("--bind 'socket'"), std::string::npos) << l.err;
  EXPECT_NE(l.err.find("none, core, auto"), std::string::npos) << l.err;
  EXPECT_EQ(l.out, "") << "nothing may run on a bad value";
  Launched e = launch_cpus({"-n", "2"}, {"TRIDENT_BIND=cores"});
  ASSERT_TRUE(e.finished);
  EXPECT_NE(e.exit_code, 0);
  EXPECT_NE(e.err.find("TRIDENT_BIND 'cores'"), std::string::npos) << e.err;
  EXPECT_NE(e.err.find("none, core, auto"), std::string::npos) << e.err;
  EXPECT_EQ(e.out, "");
  // bench comm --nproc checks it before starting any rank.
  ProcessRunner b({TRIDENT_BIN, "bench", "comm", "--nproc", "2", "--bind", "numa", "-b", "8", "-e", "8"},
                  make_env(kDrop, {}));
  auto status = b.wait(kHangGuard);
  ASSERT_TRUE(status && WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 2) << b.err();
  EXPECT_NE(b.err().find("--bind 'numa'"), std::string::npos) << b.err();
  EXPECT_NE(b.err().find("none, core, auto"), std::string::npos) << b.err();
  // So does train --nproc (the flag is taken before the config is read).
  ProcessRunner t({TRIDENT_BIN, "train", "--nproc", "2", "--bind", "numa"}, make_env(kDrop, {}));
  status = t.wait(kHangGuard);
  ASSERT_TRUE(status && WIFEXITED(*status));
  EXPECT_NE(WEXITSTATUS(*status), 0) << t.err();
  EXPECT_NE(t.err().find("--bind 'numa'"), std::string::npos) << t.err();
  EXPECT_NE(t.err().find("none, core, auto"), std::string::npos) << t.err();
}

}  // namespace

namespace {

TEST(BindLaunch, BenchNprocTakesBindAndKeepsItFromItsRanks) {
  // Both spellings: a rank that received --bind would refuse it (it only applies with --nproc) and fail.
  for (const std::vector<std::string>& flag : {std::vector<std::string>{"--bind", "core"},
                                               std::vector<std::string>{"--bind=none"}}) {
    std::vector<std::string> argv = {TRIDENT_BIN, "bench", "comm", "--nproc", "2", "-b", "8", "-e", "8",
                                     "--iters", "2", "--warmup", "1", "--check"};
    argv.insert(argv.end(), flag.begin(), flag.end());
    ProcessRunner p(argv, make_env(kDrop, {}));
    auto status = p.wait(kHangGuard);
    ASSERT_TRUE(status && WIFEXITED(*status)) << p.err();
    EXPECT_EQ(WEXITSTATUS(*status), 0) << flag[0] << "\n" << p.out() << p.err();
  }
  // Without --nproc it is an error that says where binding belongs.
  ProcessRunner q({TRIDENT_BIN, "bench", "comm", "--bind", "core", "-b", "8", "-e", "8"}, make_env(kDrop, {}));
  auto status = q.wait(kHangGuard);
  ASSERT_TRUE(status && WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 2);
  EXPECT_NE(q.err().find("applies to the ranks --nproc starts"), std::string::npos) << q.err();
}

}  // namespace
