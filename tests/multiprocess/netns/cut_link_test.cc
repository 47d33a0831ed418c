// A link cut completely on emulated hosts (scripts/netns_hosts.sh): 2 hosts x 1 rank of `trident bench comm`
// started by a `trident launch` per host, TRIDENT_TIMEOUT=3. Once both ranks are past their first
// collectives, host 1's veth is set down on the switch (no packet in either direction, no reset: a pulled
// cable). Both launchers must exit non-zero within 2 x the deadline plus the launcher's grace, and host 0's
// rank must name the rank it did not hear from and its host ("rank(s) 1 (on host emu1)"): on a cluster the
// host is what an operator checks first.
//
// CutHostIsNamedAndTheJobResumesOnceTheLinkIsBack: the same cut under training. 3 hosts x 1 rank of a ZeRO-2
// `trident train` (links rate-limited so a step lasts tens of milliseconds), one `trident launch
// --max-restarts 1` per host. Host 2's link is cut after the checkpoint of step 10: every rank fails, every
// launcher stops its ranks, the healthy launchers wait in the next round naming node 2 (host emu2); once the
// link is back host 2's launcher rejoins, the job resumes from the checkpoint and ends with the losses and
// final weights of an uninterrupted run on the same hosts, bit for bit. The 8-host version is
// scripts/cluster_emulation.sh.
//
// Skips (with the reason) only where the machine cannot run network namespaces (no root, no privilege);
// a missing `ip`/`tc` is a missing dependency. The namespaces are removed at scope exit, failure included.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <thread>

#include <map>

#include <nlohmann/json.hpp>

#include "harness/skip.h"
#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "multiprocess/netns/netns_hosts.h"

namespace trident {
namespace {

TEST(NetnsCutLink, EveryRankFailsWithinItsDeadlineNamingTheCutHost) {
  if (const std::string tool = missing_tool(); !tool.empty()) TRIDENT_SKIP_MISSING(tool);
  if (const std::string why = no_privilege(); !why.empty()) TRIDENT_SKIP_MACHINE(why);
  const std::string prefix = fmt::format("trc{}", ::getpid());
  Hosts h(2, prefix, "--no-shape");
  ASSERT_EQ(h.rc, 0) << h.setup;
  testing::TempDir dir("cut_link");
  constexpr int kDeadline = 3;
  // Each launcher's exit status and the seconds it ran, one line per host, written when it ends.
  std::string job = "pids=;";
  for (int host = 0; host < 2; ++host) {
    job += fmt::format(
        " (s=$(date +%s.%N); ip netns exec {p}-h{h} env TRIDENT_HOST_ID=emu{h} TRIDENT_STORE_TOKEN=cut-test "
        "TRIDENT_TIMEOUT={t} timeout -k 5 60 {bin} launch --nnodes 2 --node-rank {h} -n 1 --master-addr 10.77.0.10 "
        "--master-port 29400 --grace-period 1 -- {bin} bench comm --op all_reduce -b 8 -e 8 -n 1000000 -w 1 "
        "> {d}/host{h}.log 2>&1; echo $? $(date +%s.%N) > {d}/host{h}.end) & pids=\"$pids $!\";",
        fmt::arg("p", prefix), fmt::arg("h", host), fmt::arg("t", kDeadline), fmt::arg("bin", TRIDENT_BIN),
        fmt::arg("d", dir.path.string()));
  }
  job += " for p in $pids; do wait $p; done";
  std::thread runner([&] { sh("bash -c '" + job + "'"); });
  // Both ranks are connected and about to run their collectives once rank 0 has listed both ranks (rows are
  // printed only after all the iterations of a size, which this run never ends).
  bool running = false;
  for (int i = 0; i < 300 && !running; ++i) {
    running = slurp(dir.path / "host0.log").find("#  Rank  1 Pid") != std::string::npos;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // well into the timed loop
  const auto [cut_rc, cut_out] = sh(fmt::format("ip -n {}-sw link set v1 down && date +%s.%N", prefix));
  runner.join();
  const std::string logs = "---- host 0:\n" + slurp(dir.path / "host0.log") + "---- host 1:\n" + slurp(dir.path / "host1.log");
  ASSERT_TRUE(running) << "rank 0 printed no result row within 30 s\n" << logs;
  ASSERT_EQ(cut_rc, 0) << cut_out;
  const double cut_at = std::stod(cut_out);
  for (int host = 0; host < 2; ++host) {
    double end_at = 0;
    int rc = -1;
    std::istringstream(slurp(dir.path / fmt::format("host{}.end", host))) >> rc >> end_at;
    std::printf("host %d: launcher exit status %d, %.1f s after the cut\n", host, rc, end_at - cut_at);
    EXPECT_NE(rc, 0) << "host " << host << "'s launcher exited 0 after the cut\n" << logs;
    // The rank's deadline, the launcher's store requests (bounded by the same deadline) and its grace.
    EXPECT_LT(end_at - cut_at, 2 * kDeadline + 4) << "host " << host << " ended " << end_at - cut_at
                                                  << " s after the cut\n" << logs;
  }
  EXPECT_NE(slurp(dir.path / "host0.log").find("not heard from: rank(s) 1 (on host emu1)"), std::string::npos) << logs;
}

// step -> its last logged loss (as printed) in DIR/metrics.jsonl; a resumed run's records replace the others.
std::map<int64_t, std::string> logged_losses(const std::filesystem::path& dir) {
  std::map<int64_t, std::string> out;
  std::istringstream in(slurp(dir / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto rec = nlohmann::json::parse(line, nullptr, false);
    if (rec.is_object() && rec.value("type", "") == "step") out[rec.at("step").get<int64_t>()] = rec.at("loss").dump();
  }
  return out;
}

TEST(NetnsCutLink, CutHostIsNamedAndTheJobResumesOnceTheLinkIsBack) {
  if (const std::string tool = missing_tool(); !tool.empty()) TRIDENT_SKIP_MISSING(tool);
  if (const std::string why = no_privilege(); !why.empty()) TRIDENT_SKIP_MACHINE(why);
  constexpr int kHosts = 3, kCutHost = 2, kSteps = 40, kInterval = 10, kCutAfter = 12;
  const std::string prefix = fmt::format("trr{}", ::getpid());
  // 4 mbit links: a step's reduce-scatter and all-gather take tens of milliseconds, so the cut lands mid-run.
  Hosts h(kHosts, prefix, "--rate 4mbit --burst 32kb");
  ASSERT_EQ(h.rc, 0) << h.setup;
  testing::TempDir dir("cut_resume");
  const std::string corpus = testing::write_word_corpus(dir.path);
  // One launcher per host in the background; each writes NAME.hostH.log and, when it ends, its exit status
  // to NAME.hostH.end. The algorithms are the automatic choice, as a user runs them: their reductions combine
  // peers in a fixed order (tests/unit/algorithms/reduction_order_test.cc), so the two runs' bits agree.
  auto job = [&](const std::string& name, int port) {
    std::string cmd = "pids=;";
    for (int host = 0; host < kHosts; ++host) {
      cmd += fmt::format(
          " (ip netns exec {p}-h{h} env TRIDENT_HOST_ID=emu{h} TRIDENT_STORE_TOKEN=cut-resume TRIDENT_TIMEOUT=5 "
          "timeout -k 5 120 {bin} launch --nnodes {H} --node-rank {h} -n 1 --master-addr "
          "10.77.0.10 --master-port {port} --grace-period 1 --max-restarts 1 --join-timeout 60 -- {bin} train "
          "--data {data} --out_dir {d}/{n} "
          "--n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --batch-size 2 --max-iters {steps} --lr-decay-iters "
          "{steps} --eval-interval 1000 --checkpoint-interval {ci} --learning-rate 3e-3 --warmup-iters 2 "
          "--sample-tokens 0 --threads 1 --json --parallel zero2 > {d}/{n}.host{h}.log 2>&1; echo $? > "
          "{d}/{n}.host{h}.end) & pids=\"$pids $!\";",
          fmt::arg("p", prefix), fmt::arg("h", host), fmt::arg("H", kHosts), fmt::arg("bin", TRIDENT_BIN),
          fmt::arg("port", port), fmt::arg("data", corpus), fmt::arg("d", dir.path.string()), fmt::arg("n", name),
          fmt::arg("steps", kSteps), fmt::arg("ci", kInterval));
    }
    return cmd + " for p in $pids; do wait $p; done";
  };
  auto logs = [&](const std::string& name) {
    std::string out;
    for (int host = 0; host < kHosts; ++host)
      out += fmt::format("---- {} host {}:\n{}", name, host,
                         slurp(dir.path / fmt::format("{}.host{}.log", name, host)));
    return out;
  };
  auto exit_status = [&](const std::string& name, int host) {
    int rc = -1;
    std::istringstream(slurp(dir.path / fmt::format("{}.host{}.end", name, host))) >> rc;
    return rc;
  };

  // The uninterrupted run on the same hosts.
  sh("bash -c '" + job("ref", 29410) + "'");
  for (int host = 0; host < kHosts; ++host) ASSERT_EQ(exit_status("ref", host), 0) << logs("ref");
  const auto ref = logged_losses(dir.path / "ref");
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps)) << logs("ref");

  std::thread runner([&] { sh("bash -c '" + job("cut", 29411) + "'"); });
  auto last_step = [&] {
    const auto l = logged_losses(dir.path / "cut");
    return l.empty() ? int64_t{-1} : l.rbegin()->first;
  };
  bool reached = false;
  for (int i = 0; i < 1200 && !reached; ++i) {
    reached = last_step() >= kCutAfter;
    if (!reached) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int64_t cut_step = last_step();
  const auto [cut_rc, cut_out] = sh(fmt::format("ip -n {}-sw link set v{} down", prefix, kCutHost));
  // Every launcher stops its ranks and is about to restart, and the healthy ones name the host they wait for.
  auto torn_down = [&] {
    for (int host = 0; host < kHosts; ++host) {
      const std::string log = slurp(dir.path / fmt::format("cut.host{}.log", host));
      if (log.find("(restart 1 of 1)") == std::string::npos) return false;
      if (host != kCutHost && log.find(fmt::format("waiting for node {} (host emu{}) to join restart round 1",
                                                   kCutHost, kCutHost)) == std::string::npos)
        return false;
    }
    return true;
  };
  bool down = false;
  for (int i = 0; i < 600 && !down && reached; ++i) {
    down = torn_down();
    if (!down) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const auto [up_rc, up_out] = sh(fmt::format("ip -n {}-sw link set v{} up", prefix, kCutHost));
  runner.join();
  const std::string all = logs("cut");
  ASSERT_TRUE(reached) << "training never reached step " << kCutAfter << "\n" << all;
  ASSERT_EQ(cut_rc, 0) << cut_out;
  ASSERT_EQ(up_rc, 0) << up_out;
  ASSERT_LT(cut_step, kSteps - 1) << "the job ended before the cut: raise kSteps or lower the rate\n" << all;
  EXPECT_TRUE(down) << "not every launcher stopped its ranks with the healthy ones naming node 2 (host emu2)\n" << all;
  for (int host = 0; host < kHosts; ++host) {
    EXPECT_EQ(exit_status("cut", host), 0) << "host " << host << "\n" << all;
    const std::string log = slurp(dir.path / fmt::format("cut.host{}.log", host));
    EXPECT_NE(log.find("every rank finished after 1 restart (--max-restarts 1)"), std::string::npos) << all;
  }
  EXPECT_NE(all.find("info: resuming from "), std::string::npos)
      << "did not resume from a checkpoint (cut after step " << cut_step << ")\n" << all;
  EXPECT_EQ(logged_losses(dir.path / "cut"), ref) << all;
  const std::string ckpt = fmt::format("ckpt-{:08d}", kSteps);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string a = slurp(dir.path / "ref" / ckpt / file), b = slurp(dir.path / "cut" / ckpt / file);
    EXPECT_TRUE(!a.empty() && a == b) << file << " differs from the uninterrupted run's (" << a.size() << " and "
                                      << b.size() << " bytes)";
  }
  std::printf("cut after step %lld; resumed; %d steps equal to the uninterrupted run\n",
              static_cast<long long>(cut_step), kSteps);
}

}  // namespace
}  // namespace trident
