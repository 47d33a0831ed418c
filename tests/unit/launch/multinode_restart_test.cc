// `trident launch --max-restarts` across nodes: 2 and 3 launchers on this host play the nodes of one job
// (node 0 hosts the store, the others join it). A rank failing on node 1 restarts every node's ranks in the
// next round; restarts are counted for the job; with none left every launcher exits non-zero naming the
// failed rank; a node that never rejoins is named by the others within --join-timeout. Ranks are `sh -c`
// scripts (the training version, resumed from a checkpoint, is tests/unit/train/multinode_restart_test.cc).
// Every wait has a hang guard: a guard that fires fails the test; it is not a performance assertion.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/temp_dir.h"
#include "process_runner.h"

namespace multinode_restart_test {
namespace {

using trident::testing::make_env;
using trident::testing::ProcessRunner;
using trident::testing::split_lines;

constexpr double kHangGuard = 30.0;
constexpr int kPerNode = 2;

const std::vector<std::string> kLauncherVars = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                                "TRIDENT_STORE_TOKEN", "TRIDENT_STORE_HOSTED", "TRIDENT_HOST_ID",
                                                "TRIDENT_RESTART_COUNT", "TRIDENT_MAX_RESTARTS"};

struct NodeResult {
  int exit_code = -1;  // -1: the hang guard fired, or the launcher died of a signal
  std::string out, err;
};

// One job of `nodes` launchers (kPerNode ranks each) running `script` under sh -c; node k gets
// TRIDENT_HOST_ID=fakehost<k>. Returns each launcher's outcome.
std::vector<NodeResult> run_job(int nodes, const std::string& script, const std::vector<std::string>& flags) {
  trident::testing::TempDir dir("multinode");
  const std::string port_file = (dir.path / "port").string();
  auto argv = [&](int node, const std::string& port) {
    std::vector<std::string> a = {TRIDENT_BIN, "launch", "-n", std::to_string(kPerNode), "--nnodes",
                                  std::to_string(nodes), "--node-rank", std::to_string(node), "--master-addr",
                                  "127.0.0.1", "--master-port", port, "--grace-period", "1"};
    if (node == 0) a.insert(a.end(), {"--port-file", port_file});
    a.insert(a.end(), flags.begin(), flags.end());
    a.insert(a.end(), {"--", "sh", "-c", script});
    return a;
  };
  auto env = [&](int node) {
    return make_env(kLauncherVars,
                    {"TRIDENT_STORE_TOKEN=multinode-secret", fmt::format("TRIDENT_HOST_ID=fakehost{}", node)});
  };
  std::vector<std::unique_ptr<ProcessRunner>> runners;
  runners.push_back(std::make_unique<ProcessRunner>(argv(0, "0"), env(0)));
  int port = -1;
  runners[0]->read_until(
      [&] {
        std::ifstream in(port_file);
        return static_cast<bool>(in >> port);
      },
      kHangGuard);
  std::vector<NodeResult> results(static_cast<size_t>(nodes));
  if (port <= 0) {
    ADD_FAILURE() << "node 0 wrote no port to " << port_file << ": " << runners[0]->err();
    return results;
  }
  for (int k = 1; k < nodes; ++k)
    runners.push_back(std::make_unique<ProcessRunner>(argv(k, std::to_string(port)), env(k)));
  for (int k = nodes - 1; k >= 0; --k) {
    auto status = runners[static_cast<size_t>(k)]->wait(kHangGuard);
    NodeResult& r = results[static_cast<size_t>(k)];
    r.out = runners[static_cast<size_t>(k)]->out();
    r.err = runners[static_cast<size_t>(k)]->err();
    if (status && WIFEXITED(*status)) r.exit_code = WEXITSTATUS(*status);
  }
  return results;
}

std::string logs(const std::vector<NodeResult>& nodes) {
  std::string s;
  for (size_t k = 0; k < nodes.size(); ++k) s += fmt::format("---- node {}:\n{}{}", k, nodes[k].out, nodes[k].err);
  return s;
}

// Every rank process a launcher started ("pid N" lines) has ended.
void expect_ranks_gone(const std::vector<NodeResult>& nodes) {
  for (const auto& n : nodes)
    for (const auto& line : split_lines(n.out)) {
      if (line.rfind("pid ", 0) != 0) continue;
      const pid_t pid = static_cast<pid_t>(std::stol(line.substr(4)));
      errno = 0;
      EXPECT_TRUE(::kill(pid, 0) == -1 && errno == ESRCH) << "rank process " << pid << " outlived its launcher";
    }
}

class MultiNodeRestart : public ::testing::TestWithParam<int> {};

TEST_P(MultiNodeRestart, RankFailureOnNodeOneRestartsEveryNode) {
  const int nodes = GetParam();
  // Round 0: rank 3 (node 1) fails while every other rank sleeps; round 1: every rank succeeds.
  const std::string script =
      "echo pid $$; echo round=$TRIDENT_RESTART_COUNT rank=$RANK max=$TRIDENT_MAX_RESTARTS; "
      "if [ $TRIDENT_RESTART_COUNT = 0 ]; then if [ $RANK = 3 ]; then sleep 0.3; exit 7; fi; exec sleep 60; fi";
  const auto r = run_job(nodes, script, {"--max-restarts", "2"});
  const std::string all = logs(r);
  for (int k = 0; k < nodes; ++k) {
    const NodeResult& n = r[static_cast<size_t>(k)];
    EXPECT_EQ(n.exit_code, 0) << "node " << k << "\n" << all;
    for (int local = 0; local < kPerNode; ++local) {
      const int rank = k * kPerNode + local;
      EXPECT_NE(n.out.find(fmt::format("round=1 rank={} max=2", rank)), std::string::npos)
          << "node " << k << "\n" << all;
    }
    EXPECT_EQ(n.out.find("round=2"), std::string::npos) << all;
    EXPECT_NE(n.err.find("(restart 1 of 2)"), std::string::npos) << "node " << k << "\n" << all;
    EXPECT_EQ(n.err.find("(restart 2 of 2)"), std::string::npos) << "node " << k << "\n" << all;
    EXPECT_NE(n.err.find("trident launch: every rank finished after 1 restart (--max-restarts 2)"), std::string::npos)
        << "node " << k << "\n" << all;
    if (k == 1) {
      EXPECT_NE(n.err.find("exited with code 7; stopped the other 1 rank; restarting all 2 ranks (restart 1 of 2)"),
                std::string::npos)
          << all;
    } else {
      EXPECT_NE(n.err.find(fmt::format("trident launch: node {} stopped 2 ranks because node 1: rank 3 (pid ", k)),
                std::string::npos)
          << "node " << k << "\n" << all;
    }
  }
  expect_ranks_gone(r);
}

TEST_P(MultiNodeRestart, RestartsExhaustedEveryLauncherExitsNonZeroNamingTheFailedRank) {
  const int nodes = GetParam();
  const std::string script = "echo pid $$; echo start round=$TRIDENT_RESTART_COUNT rank=$RANK; "
                             "if [ $RANK = 3 ]; then sleep 0.3; exit 3; fi; exec sleep 60";
  const auto r = run_job(nodes, script, {"--max-restarts", "1"});
  const std::string all = logs(r);
  for (int k = 0; k < nodes; ++k) {
    const NodeResult& n = r[static_cast<size_t>(k)];
    // Restarts are the job's: every node ran rounds 0 and 1, none a third.
    EXPECT_NE(n.out.find(fmt::format("start round=1 rank={}", k * kPerNode)), std::string::npos) << all;
    EXPECT_EQ(n.out.find("start round=2"), std::string::npos) << all;
    if (k == 1) {
      EXPECT_EQ(n.exit_code, 3) << all;
      EXPECT_NE(n.err.find("exited with code 3; stopped the other 1 rank; no restart left (--max-restarts 1: "
                           "restarted 1 time)"),
                std::string::npos)
          << all;
    } else {
      EXPECT_EQ(n.exit_code, 1) << "node " << k << "\n" << all;
      const std::string want = fmt::format("trident launch: node {} stopped 2 ranks because node 1: rank 3 (pid ", k);
      std::string last;
      for (const auto& line : split_lines(n.err))
        if (line.rfind(want, 0) == 0) last = line;
      EXPECT_NE(last.find("exited with code 3; no restart left (--max-restarts 1: restarted 1 time)"),
                std::string::npos)
          << "node " << k << "\n" << all;
    }
  }
  expect_ranks_gone(r);
}

INSTANTIATE_TEST_SUITE_P(Nodes, MultiNodeRestart, ::testing::Values(2, 3));

TEST(MultiNodeRestartDeadline, NodeThatNeverRejoinsIsNamedByTheOthers) {
  // Node 2's launcher dies with its ranks in round 0 (its first rank SIGKILLs it: a host lost), and the
  // other ranks then fail as peers of a lost host do. Nodes 0 and 1 must restart, wait --join-timeout for
  // node 2 in round 1, and exit 1 naming it and its host. Rank 5 never exits by itself: were it to exit
  // on the mark before the kill lands, node 2's launcher would restart instead of being lost.
  trident::testing::TempDir dir("never-rejoins");
  const std::string mark = (dir.path / "node2-lost").string();
  const std::string script = fmt::format(
      "echo pid $$; if [ $TRIDENT_RESTART_COUNT != 0 ]; then exec sleep 60; fi; "
      "if [ $RANK = 4 ]; then sleep 0.3; touch {m}; kill -KILL $PPID; sleep 60; fi; "
      "if [ $RANK = 5 ]; then exec sleep 60; fi; "
      "while [ ! -e {m} ]; do sleep 0.05; done; exit 9",
      fmt::arg("m", mark));
  const auto r = run_job(3, script, {"--max-restarts", "2", "--join-timeout", "3"});
  const std::string all = logs(r);
  EXPECT_EQ(r[2].exit_code, -1) << "node 2's launcher was SIGKILLed\n" << all;
  for (int k : {0, 1}) {
    const NodeResult& n = r[static_cast<size_t>(k)];
    EXPECT_EQ(n.exit_code, 1) << "node " << k << "\n" << all;
    EXPECT_NE(n.err.find("(restart 1 of 2)"), std::string::npos) << all;
    std::string stop;
    for (const auto& line : split_lines(n.err))
      if (line.rfind(fmt::format("trident launch: node {} stops: ", k), 0) == 0) stop = line;
    EXPECT_NE(stop.find("node 2 (host fakehost2) did not join restart round 1 within 3 s"), std::string::npos)
        << "node " << k << "\n" << all;
    EXPECT_EQ(stop.find("node 1 (host"), std::string::npos) << stop;
  }
  expect_ranks_gone(r);
}

}  // namespace
}  // namespace multinode_restart_test
