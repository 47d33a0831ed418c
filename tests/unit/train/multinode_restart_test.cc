// Elastic restart across nodes: 2 and 3 `trident launch` processes on this host play the nodes of one ZeRO-2
// `trident train` job (one rank each, --max-restarts 2). The rank of node 1 SIGKILLs itself at step 7 (after
// the checkpoint of step 6): every node stops its rank, all rejoin the next round, the job resumes from its
// newest complete checkpoint, and its losses, final evaluation and final checkpoint files equal an uninterrupted
// `trident train --nproc N` run's byte for byte.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "unit/launch/process_runner.h"

namespace multinode_restart_test {
namespace {

namespace fs = std::filesystem;
using trident::testing::ProcessRunner;

constexpr int kSteps = 10;
constexpr int kInterval = 3;
constexpr int kKillStep = 7;
constexpr double kHangGuard = 240;

const std::vector<std::string> kLauncherVars = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "TRIDENT_TEST_KILL_AT",
                                                "TRIDENT_STORE_TOKEN", "TRIDENT_RESTART_COUNT", "MASTER_PORT"};

std::vector<std::string> train_args(const std::string& corpus, const fs::path& out_dir) {
  return {"train", "--data", corpus, "--out_dir", out_dir.string(), "--n-layer", "2", "--n-head", "2", "--n-embd",
          "16", "--block-size", "16", "--batch-size", "2", "--max-iters", std::to_string(kSteps), "--eval-interval",
          "5", "--eval-iters", "2", "--checkpoint-interval", std::to_string(kInterval), "--learning-rate", "3e-3",
          "--warmup-iters", "2", "--lr-decay-iters", std::to_string(kSteps), "--sample-tokens", "0", "--threads", "1",
          "--json", "--parallel", "zero2"};
}

struct JobRun {
  std::vector<int> exit_codes;
  std::string logs;
  std::vector<std::string> node_logs;  // each launcher's output
  std::map<int64_t, std::string> step_loss;  // each step's last logged loss, as printed
  nlohmann::json final_record;
};

void parse_records(const std::string& out, JobRun& r) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    auto rec = nlohmann::json::parse(line, nullptr, false);
    if (rec.is_discarded()) continue;
    if (rec.value("type", "") == "step") r.step_loss[rec.at("step").get<int64_t>()] = rec.at("loss").dump();
    if (rec.value("type", "") == "final") r.final_record = rec;
  }
}

JobRun uninterrupted(int world, const std::string& corpus, const fs::path& out_dir) {
  std::vector<std::string> argv = {TRIDENT_BIN};
  for (auto& a : train_args(corpus, out_dir)) argv.push_back(a);
  argv.insert(argv.end(), {"--nproc", std::to_string(world)});
  ProcessRunner p(argv, trident::testing::make_env(kLauncherVars, {}));
  auto status = p.wait(kHangGuard);
  JobRun r;
  r.exit_codes.push_back(status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1);
  r.logs = p.out() + p.err();
  parse_records(p.out(), r);
  return r;
}

// One launcher per node, node 0 first (it writes the store's port); rank 0's records are node 0's output.
JobRun multinode(int nodes, const std::string& corpus, const fs::path& out_dir, const fs::path& work) {
  const std::string port_file = (work / "port").string();
  auto argv = [&](int node, const std::string& port) {
    std::vector<std::string> a = {TRIDENT_BIN, "launch", "-n", "1", "--nnodes", std::to_string(nodes),
                                  "--node-rank", std::to_string(node), "--master-addr", "127.0.0.1", "--master-port",
                                  port, "--max-restarts", "2", "--join-timeout", "60", "--grace-period", "1"};
    if (node == 0) a.insert(a.end(), {"--port-file", port_file});
    a.push_back("--");
    a.push_back(TRIDENT_BIN);
    for (auto& x : train_args(corpus, out_dir)) a.push_back(x);
    return a;
  };
  const auto env = trident::testing::make_env(
      kLauncherVars, {"TRIDENT_STORE_TOKEN=multinode-train", fmt::format("TRIDENT_TEST_KILL_AT=1:{}", kKillStep)});
  std::vector<std::unique_ptr<ProcessRunner>> runners;
  runners.push_back(std::make_unique<ProcessRunner>(argv(0, "0"), env));
  int port = -1;
  runners[0]->read_until(
      [&] {
        std::ifstream in(port_file);
        return static_cast<bool>(in >> port);
      },
      60);
  JobRun r;
  if (port <= 0) {
    r.logs = runners[0]->err();
    return r;
  }
  for (int k = 1; k < nodes; ++k)
    runners.push_back(std::make_unique<ProcessRunner>(argv(k, std::to_string(port)), env));
  for (int k = nodes - 1; k >= 0; --k) {
    auto status = runners[static_cast<size_t>(k)]->wait(kHangGuard);
    r.exit_codes.insert(r.exit_codes.begin(), status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1);
  }
  for (int k = 0; k < nodes; ++k) {
    const auto& p = *runners[static_cast<size_t>(k)];
    r.node_logs.push_back(p.out() + p.err());
    r.logs += fmt::format("---- node {}:\n{}", k, r.node_logs.back());
  }
  parse_records(runners[0]->out(), r);
  return r;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class MultiNodeElasticRestart : public ::testing::TestWithParam<int> {};

TEST_P(MultiNodeElasticRestart, KilledRankOnNodeOneRestartsEveryNodeAndMatchesTheUninterruptedRun) {
  const int nodes = GetParam();
  trident::testing::TempDir d("multinode-train");
  const std::string corpus = trident::testing::write_word_corpus(d.path);
  const JobRun ref = uninterrupted(nodes, corpus, d.path / "ref");
  ASSERT_EQ(ref.exit_codes, std::vector<int>{0}) << ref.logs;
  ASSERT_EQ(ref.step_loss.size(), static_cast<size_t>(kSteps)) << ref.logs;

  const JobRun run = multinode(nodes, corpus, d.path / "restarted", d.path);
  ASSERT_EQ(run.exit_codes, std::vector<int>(static_cast<size_t>(nodes), 0)) << run.logs;
  // Node 1 named its killed rank; every other node names it as the cause (its launcher stopped its rank
  // because of it, or its rank failed first as a peer of it); all restarted once, together.
  ASSERT_EQ(run.node_logs.size(), static_cast<size_t>(nodes));
  EXPECT_NE(run.node_logs[1].find("trident launch: rank 1 (pid "), std::string::npos) << run.logs;
  EXPECT_NE(run.node_logs[1].find("was killed by signal 9 (SIGKILL); restarting all 1 rank (restart 1 of 2)"),
            std::string::npos)
      << run.logs;
  for (int k = 0; k < nodes; ++k) {
    if (k == 1) continue;
    const std::string& log = run.node_logs[static_cast<size_t>(k)];
    const std::string stop_line = fmt::format("trident launch: node {} stopped 1 rank because node 1: rank 1 (pid ", k);
    const bool stopped = log.find(stop_line) != std::string::npos;
    const bool peer = log.find("the round's cause: node 1: rank 1 (pid ") != std::string::npos;
    EXPECT_TRUE(stopped || peer) << "node " << k << " does not name rank 1 of node 1\n" << run.logs;
  }
  EXPECT_EQ(trident::testing::count_of(run.logs, "(restart 1 of 2)"), static_cast<size_t>(nodes)) << run.logs;
  EXPECT_EQ(run.logs.find("(restart 2 of 2)"), std::string::npos) << run.logs;
  // Resumed from a checkpoint: the newest complete one (the one of step 6 is written asynchronously by rank 0,
  // which the launcher may stop before it is complete; the save of step 6 waits for the earlier ones).
  EXPECT_NE(run.logs.find("info: resuming from "), std::string::npos) << run.logs;

  EXPECT_EQ(run.step_loss, ref.step_loss);
  ASSERT_FALSE(run.final_record.is_null()) << run.logs;
  for (const char* key : {"step", "val_loss", "train_loss"})
    EXPECT_EQ(run.final_record[key], ref.final_record[key]) << key;
  const std::string ckpt = fmt::format("ckpt-{:08d}", kSteps);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const fs::path a = d.path / "ref" / ckpt / file, b = d.path / "restarted" / ckpt / file;
    ASSERT_TRUE(fs::exists(a) && fs::exists(b)) << a << " " << b;
    EXPECT_TRUE(file_bytes(a) == file_bytes(b)) << file << " differs from the uninterrupted run's";
  }
}

INSTANTIATE_TEST_SUITE_P(Nodes, MultiNodeElasticRestart, ::testing::Values(2, 3));

}  // namespace
}  // namespace multinode_restart_test
