// Emulated hosts from network namespaces (scripts/netns_hosts.sh): 2 and 3 hosts x 2 ranks, each rank a
// `trident bench comm --check` started by a `trident launch` per host under `ip netns exec`, TRIDENT_HOST_ID and MASTER_ADDR on the
// namespaces' private subnet (10.77.0.0/24; nothing outside this machine). Ranks on one emulated host
// talk over shared memory, across hosts over TCP through veth pairs and a bridge, links shaped by tc.
// Passes when every launcher exits 0 (so did every rank; the bench verifies every element of every
// iteration and exits 1 on a wrong one), rank 0 reports the expected host layout and transports, and the
// hier rows ran.
//
// Skips (with the precise reason) without root, without `ip` or `tc`, or when namespaces cannot be
// created (containers without CAP_SYS_ADMIN). The namespaces are removed at scope exit, failure included.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "harness/skip.h"
#include "harness/temp_dir.h"
#include "multiprocess/netns/netns_hosts.h"

namespace trident {
namespace {

void run_layout(int hosts, int per_host) {
  const std::string prefix = fmt::format("trt{}h{}", ::getpid(), hosts);
  Hosts h(hosts, prefix);
  ASSERT_EQ(h.rc, 0) << h.setup;
  testing::TempDir dir("netns");
  const int n = hosts * per_host;
  // One shell job: a `trident launch` per emulated host (node), each starting that host's ranks in its
  // namespace and bounded by `timeout`; node 0's launcher hosts the store until every node is done. The
  // job's status is the worst node's.
  std::string job = "rc=0; pids=;";
  for (int host = 0; host < hosts; ++host) {
    job += fmt::format(
        " ip netns exec {p}-h{h} env TRIDENT_HOST_ID=emu{h} TRIDENT_STORE_TOKEN=netns-test timeout -k 5 50 {bin} "
        "launch --nnodes {H} --node-rank {h} -n {l} --master-addr 10.77.0.10 --master-port 29400 -- {bin} bench comm "
        "--op all_reduce,all_gather,reduce_scatter -b 1K -e 1M -f 32 --algo hier,ring,auto --check -n 2 -w 1 "
        "--timeout 30s > {d}/host{h}.log 2>&1 & pids=\"$pids $!\";",
        fmt::arg("p", prefix), fmt::arg("h", host), fmt::arg("H", hosts), fmt::arg("l", per_host),
        fmt::arg("bin", TRIDENT_BIN), fmt::arg("d", dir.path.string()));
  }
  job += " for p in $pids; do wait $p || rc=1; done; exit $rc";
  auto [rc, out] = sh("bash -c '" + job + "'");
  std::string logs;
  for (int host = 0; host < hosts; ++host)
    logs += fmt::format("---- host {}:\n{}", host, slurp(dir.path / fmt::format("host{}.log", host)));
  EXPECT_EQ(rc, 0) << h.setup << out << logs;
  const std::string log0 = slurp(dir.path / "host0.log");
  EXPECT_NE(log0.find(fmt::format("{} host(s) x {} rank(s)", hosts, per_host)), std::string::npos) << log0;
  EXPECT_NE(log0.find(fmt::format("{} shm peers, {} tcp peers", per_host - 1, n - per_host)), std::string::npos) << log0;
  EXPECT_NE(log0.find("in use shm+tcp"), std::string::npos) << log0;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter"})
    EXPECT_NE(log0.find(fmt::format("# {}  algo hier", op)), std::string::npos) << op << "\n" << log0;
}

TEST(NetnsHosts, TwoAndThreeHostsOfTwoRanks) {
  if (const std::string tool = missing_tool(); !tool.empty()) TRIDENT_SKIP_MISSING(tool);
  if (const std::string why = no_privilege(); !why.empty()) TRIDENT_SKIP_MACHINE(why);
  run_layout(2, 2);
  run_layout(3, 2);
}

}  // namespace
}  // namespace trident
