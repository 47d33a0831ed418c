// Rendezvous from the environment: each launcher's variables, the Slurm host list, bad values, connect_store.
#include "trident/comm/store/rendezvous.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "store_test_util.h"
#include "trident/comm/store/hash_store.h"
#include "trident/comm/store/tcp_store.h"
#include "trident/core/error.h"

namespace trident {
namespace {

const std::vector<std::string> kAllVars = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST",
    "SLURM_NODELIST", "SLURM_STEP_NODELIST", "TRIDENT_STORE_HOSTED", "TRIDENT_STORE_TOKEN"};

// Every test starts from an environment with no launcher variables and gets the original back afterwards.
class Rendezvous : public ::testing::Test {
 protected:
  test::EnvGuard env_{kAllVars};
  void set(const std::string& n, const std::string& v) { env_.set(n, v); }
};

// Expects rendezvous_from_env() to throw InvalidArgument whose message names every one of `words`.
void expect_invalid(std::initializer_list<const char*> words) {
  try {
    rendezvous_from_env();
    ADD_FAILURE() << "accepted an invalid environment";
  } catch (const InvalidArgument& e) {
    for (const char* w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

TEST_F(Rendezvous, NothingSetIsASingleProcess) {
  RendezvousInfo r = rendezvous_from_env();
  EXPECT_EQ(r.source, "single");
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.local_world_size, 1);
  EXPECT_EQ(r.master_addr, "127.0.0.1");
  EXPECT_EQ(r.master_port, 29500);
}

TEST_F(Rendezvous, Torchrun) {
  set("RANK", "5");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "1");
  set("LOCAL_WORLD_SIZE", "4");
  set("MASTER_ADDR", "head.example");
  set("MASTER_PORT", "1234");
  RendezvousInfo r = rendezvous_from_env();
  EXPECT_EQ(r.source, "torchrun");
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 4);
  EXPECT_EQ(r.master_addr, "head.example");
  EXPECT_EQ(r.master_port, 1234);
}

TEST_F(Rendezvous, TorchrunOnOneHostNeedsNoAddressOrLocalVariables) {
  set("RANK", "2");
  set("WORLD_SIZE", "3");
  RendezvousInfo r = rendezvous_from_env();
  EXPECT_EQ(r.local_rank, 2);
  EXPECT_EQ(r.local_world_size, 3);
  EXPECT_EQ(r.master_addr, "127.0.0.1");
  EXPECT_EQ(r.master_port, 29500);
}

TEST_F(Rendezvous, TorchrunBadValuesNameTheVariable) {
  set("RANK", "3");
  expect_invalid({"WORLD_SIZE"});  // one without the other
  set("WORLD_SIZE", "3");
  expect_invalid({"RANK=3", "0..2"});
  set("RANK", "one");
  expect_invalid({"RANK", "not an integer"});
  set("RANK", "1");
  set("WORLD_SIZE", "0");
  expect_invalid({"WORLD_SIZE"});
  set("WORLD_SIZE", "4");
  set("LOCAL_WORLD_SIZE", "2");
  set("LOCAL_RANK", "2");
  expect_invalid({"LOCAL_RANK"});
  set("LOCAL_RANK", "1");
  expect_invalid({"MASTER_ADDR"});  // several hosts, no address
  set("MASTER_ADDR", "10.0.0.1");
  set("MASTER_PORT", "70000");
  expect_invalid({"MASTER_PORT"});
  set("MASTER_PORT", "29x");
  expect_invalid({"MASTER_PORT", "not an integer"});
  set("MASTER_PORT", "29501");
  EXPECT_EQ(rendezvous_from_env().master_port, 29501);
}

TEST_F(Rendezvous, OpenMpi) {
  set("OMPI_COMM_WORLD_RANK", "3");
  set("OMPI_COMM_WORLD_SIZE", "4");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  set("MASTER_ADDR", "node1");
  RendezvousInfo r = rendezvous_from_env();
  EXPECT_EQ(r.source, "mpirun");
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.master_addr, "node1");
  EXPECT_EQ(r.master_port, 29500);
  set("OMPI_COMM_WORLD_LOCAL_RANK", "x");
  expect_invalid({"OMPI_COMM_WORLD_LOCAL_RANK"});
  set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  set("OMPI_COMM_WORLD_RANK", "4");
  expect_invalid({"OMPI_COMM_WORLD_RANK"});
}

TEST_F(Rendezvous, MpichPmiWithSlurmHostsForTheMaster) {
  set("PMI_RANK", "2");
  set("PMI_SIZE", "6");
  set("MPI_LOCALRANKID", "0");
  set("MPI_LOCALNRANKS", "2");
  set("SLURM_JOB_NODELIST", "cn[101-103]");
  RendezvousInfo r = rendezvous_from_env();
  EXPECT_EQ(r.source, "mpirun");
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.world_size, 6);
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.master_addr, "cn101");
}

TEST_F(Rendezvous, MpirunOnOneHost) {
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "2");
  RendezvousInfo r = rendezvous_from_env();
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.master_addr, "127.0.0.1");
}

TEST_F(Rendezvous, TorchrunVariablesWinOverMpiAndSlurm) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "2");
  set("SLURM_PROCID", "1");
  set("SLURM_NTASKS", "2");
  RendezvousInfo r = rendezvous_from_env();
  EXPECT_EQ(r.source, "torchrun");
  EXPECT_EQ(r.rank, 0);
}

TEST_F(Rendezvous, Slurm) {
  set("SLURM_PROCID", "5");
  set("SLURM_NTASKS", "8");
  set("SLURM_LOCALID", "1");
  set("SLURM_NTASKS_PER_NODE", "4");
  set("SLURM_JOB_NODELIST", "node[03-05,07],gpu1");
  RendezvousInfo r = rendezvous_from_env();
  EXPECT_EQ(r.source, "slurm");
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 4);
  EXPECT_EQ(r.master_addr, "node03");
  EXPECT_EQ(r.master_port, 29500);
  set("MASTER_ADDR", "chosen");
  set("MASTER_PORT", "4000");
  r = rendezvous_from_env();
  EXPECT_EQ(r.master_addr, "chosen");
  EXPECT_EQ(r.master_port, 4000);
}

TEST_F(Rendezvous, SlurmDerivesTasksPerNode) {
  set("SLURM_PROCID", "6");
  set("SLURM_NTASKS", "7");
  set("SLURM_LOCALID", "0");
  set("SLURM_NODEID", "3");
  set("SLURM_TASKS_PER_NODE", "2(x3),1");
  set("SLURM_NODELIST", "a1,b2,c3,d4");
  RendezvousInfo r = rendezvous_from_env();
  EXPECT_EQ(r.local_world_size, 1);
  EXPECT_EQ(r.master_addr, "a1");

  ::unsetenv("SLURM_TASKS_PER_NODE");
  set("SLURM_NTASKS", "8");
  set("SLURM_NNODES", "2");
  set("SLURM_LOCALID", "2");
  r = rendezvous_from_env();
  EXPECT_EQ(r.local_world_size, 4);
  set("SLURM_NNODES", "3");
  expect_invalid({"SLURM_NTASKS_PER_NODE"});  // 8 tasks do not split evenly: the fix is to set it
}

TEST_F(Rendezvous, SlurmBadValuesNameTheVariable) {
  set("SLURM_PROCID", "8");
  set("SLURM_NTASKS", "8");
  set("SLURM_JOB_NODELIST", "n1");
  expect_invalid({"SLURM_PROCID"});
  set("SLURM_PROCID", "1");
  set("SLURM_LOCALID", "-1");
  expect_invalid({"SLURM_LOCALID"});
  set("SLURM_LOCALID", "1");
  set("SLURM_NTASKS_PER_NODE", "four");
  expect_invalid({"SLURM_NTASKS_PER_NODE"});
  set("SLURM_NTASKS_PER_NODE", "2");
  set("SLURM_JOB_NODELIST", "n[1-");
  expect_invalid({"SLURM_JOB_NODELIST"});
  ::unsetenv("SLURM_NTASKS");
  expect_invalid({"SLURM_NTASKS"});
}

TEST(SlurmNodelist, Expands) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_nodelist("node[03-05,07],gpu1"), (V{"node03", "node04", "node05", "node07", "gpu1"}));
  EXPECT_EQ(expand_slurm_nodelist("single"), (V{"single"}));
  EXPECT_EQ(expand_slurm_nodelist("a1,b2"), (V{"a1", "b2"}));
  EXPECT_EQ(expand_slurm_nodelist("n[8-11]"), (V{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_slurm_nodelist("n[098-101]"), (V{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_slurm_nodelist("x[1,3]-ib"), (V{"x1-ib", "x3-ib"}));
  EXPECT_EQ(expand_slurm_nodelist("r[1-2]n[01-02]"), (V{"r1n01", "r1n02", "r2n01", "r2n02"}));
  EXPECT_EQ(expand_slurm_nodelist("gpu[7],cpu[0-1]"), (V{"gpu7", "cpu0", "cpu1"}));
}

TEST(SlurmNodelist, RejectsMalformedLists) {
  for (const char* bad : {"", "node[03-05", "node03]", "node[05-03]", "node[a-b]", "a,,b", "n[]", "n[1-2,]"}) {
    SCOPED_TRACE(bad);
    try {
      expand_slurm_nodelist(bad, "SLURM_JOB_NODELIST");
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST"), std::string::npos) << e.what();
    }
  }
}

TEST(SlurmTasksPerNode, Expands) {
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("4"), (std::vector<int>{4}));
  EXPECT_EQ(expand_slurm_tasks_per_node("1,3(x2)"), (std::vector<int>{1, 3, 3}));
  for (const char* bad : {"", "2(x", "x", "2(3)", "2,,1"}) EXPECT_THROW(expand_slurm_tasks_per_node(bad), InvalidArgument) << bad;
}

TEST_F(Rendezvous, SingleProcessGetsAnInProcessStore) {
  auto store = connect_store(rendezvous_from_env(), Seconds(5));
  EXPECT_NE(dynamic_cast<HashStore*>(store.get()), nullptr);
  store->set_string("k", "v");
  EXPECT_EQ(store->get_string("k"), "v");
}

TEST_F(Rendezvous, RankZeroHostsTheStoreForEveryRank) {
  set("TRIDENT_STORE_TOKEN", "job-secret");
  constexpr int kWorld = 3;
  // Rank 0 hosts on port 0 (the kernel picks a free one) and its store reports the port it got; the other
  // ranks learn it from there, so no port is picked first and bound later.
  std::promise<int> hosted;
  std::shared_future<int> hosted_port = hosted.get_future().share();
  std::vector<std::string> seen(kWorld);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      if (rank != 0 && hosted_port.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
        ADD_FAILURE() << "rank " << rank << ": rank 0 did not report its store's port within 30 s";
        return;
      }
      const int port = rank == 0 ? 0 : hosted_port.get();
      RendezvousInfo info;
      info.rank = rank;
      info.world_size = kWorld;
      info.local_rank = rank;
      info.local_world_size = kWorld;
      info.master_addr = "127.0.0.1";
      info.master_port = port;
      info.source = "torchrun";
      auto store = connect_store(info, Seconds(30));
      if (rank == 0) {
        auto* tcp = dynamic_cast<TCPStore*>(store.get());
        ASSERT_NE(tcp, nullptr);
        ASSERT_GT(tcp->port(), 0);
        hosted.set_value(tcp->port());
      }
      store->set_string("rank/" + std::to_string(rank), std::to_string(rank * 10));
      store->add("arrived", 1);
      std::string all;
      for (int r = 0; r < kWorld; ++r) all += store->get_string("rank/" + std::to_string(r)) + ",";
      seen[rank] = all;
      // Rank 0 owns the server: it leaves last.
      store->add("left", 1);
      while (rank == 0 && store->add("left", 0) < kWorld) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(seen[r], "0,10,20,") << "rank " << r;
}

TEST_F(Rendezvous, LauncherHostedStoreIsUsedAndTheTokenChecked) {
  TCPStoreServer launcher("127.0.0.1", 0, "launch-token");
  set("TRIDENT_STORE_HOSTED", "1");
  set("TRIDENT_STORE_TOKEN", "launch-token");
  RendezvousInfo info;
  info.world_size = 2;
  info.local_world_size = 2;
  info.master_port = launcher.port();
  info.source = "torchrun";
  auto store = connect_store(info, Seconds(10));  // rank 0, but does not host
  EXPECT_EQ(launcher.num_clients(), 1);
  store->set_string("x", "y");
  EXPECT_EQ(TCPStore("127.0.0.1", launcher.port(), "launch-token", Seconds(10)).get_string("x"), "y");
  set("TRIDENT_STORE_TOKEN", "stale");
  EXPECT_THROW(connect_store(info, Seconds(10)), StoreError);
}

}  // namespace
}  // namespace trident
