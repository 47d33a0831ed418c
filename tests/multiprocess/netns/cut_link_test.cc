// A link cut completely on emulated hosts (scripts/netns_hosts.sh): 2 hosts x 1 rank of `trident bench comm`
// started by a `trident launch` per host, TRIDENT_TIMEOUT=3. Once both ranks are past their first
// collectives, host 1's veth is set down on the switch (no packet in either direction, no reset: a pulled
// cable). Both launchers must exit non-zero within 2 x the deadline plus the launcher's grace, and host 0's
// rank must name the rank it did not hear from and its host ("rank(s) 1 (on host emu1)"): on a cluster the
// host is what an operator checks first. The 8-host version (training, restart from the checkpoint) is
// scripts/cluster_emulation.sh.
//
// Skips (with the reason) only where the machine cannot run network namespaces (no root, no privilege);
// a missing `ip`/`tc` is a missing dependency. The namespaces are removed at scope exit, failure included.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <thread>

#include "harness/skip.h"
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

}  // namespace
}  // namespace trident
