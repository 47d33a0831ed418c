// JobRounds, the launchers' rounds, with launchers as threads over one HashStore: every node joins a round
// before it starts; a node missing at the deadline is named in TimeoutError::missing (and every waiter stops
// with it); a node that cannot reach the store rejoins once it can; a round's first failure wins (a death by
// a signal over an exit) and no round reads another's; await_success tells a node whose ranks finished
// whether another node failed.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "trident/comm/store/hash_store.h"
#include "trident/core/error.h"
#include "trident/launch/job_rounds.h"

namespace job_rounds_test {
namespace {

using trident::launch::JobRounds;
using trident::launch::RoundsOptions;

// Node `node` of `nnodes`, its store a view of `shared`; while `cut` is set it cannot connect (a cut link).
std::unique_ptr<JobRounds> node_of(int node, int nnodes, std::shared_ptr<trident::Store> shared, double join_timeout,
                                   std::shared_ptr<std::atomic<bool>> cut = nullptr) {
  RoundsOptions o;
  o.nnodes = nnodes;
  o.node_rank = node;
  o.host = "host" + std::to_string(node);
  o.join_timeout = join_timeout;
  o.request_timeout = 1;
  o.poll_seconds = 0.005;
  o.store_where = "the test's store";
  return std::make_unique<JobRounds>(o, [shared, cut](double) -> std::unique_ptr<trident::Store> {
    if (cut && cut->load()) throw trident::StoreError("connection attempt timed out (the link is cut)");
    return std::make_unique<trident::PrefixStore>("job", shared);
  });
}

TEST(JobRounds, EveryNodeJoinsEachRoundAndTheFirstFailureOfARoundWins) {
  auto shared = std::make_shared<trident::HashStore>();
  constexpr int kNodes = 3;
  std::vector<std::unique_ptr<JobRounds>> nodes;
  for (int k = 0; k < kNodes; ++k) nodes.push_back(node_of(k, kNodes, shared, 10));
  for (int round = 0; round < 3; ++round) {
    std::vector<std::string> got(kNodes, "unset");
    std::vector<std::thread> threads;
    for (int k = 0; k < kNodes; ++k) threads.emplace_back([&, k] { got[k] = nodes[k]->join(round); });
    for (auto& t : threads) t.join();
    for (int k = 0; k < kNodes; ++k) EXPECT_EQ(got[k], "") << "node " << k << " round " << round;
    // Nothing of the previous round's failure is seen in this one.
    for (int k = 0; k < kNodes; ++k) EXPECT_EQ(nodes[k]->failure(round).why, "") << "round " << round;
    nodes[1]->publish_failure(round, "rank 4 exited with code 7");
    nodes[2]->publish_failure(round, "rank 6 exited with code 1");
    for (int k = 0; k < kNodes; ++k) {
      const auto f = nodes[k]->failure(round);
      EXPECT_EQ(f.why, "node 1: rank 4 exited with code 7");
      EXPECT_FALSE(f.final);
    }
    // A rank's death by a signal is the cause of the failures it provokes: it wins over an earlier exit.
    nodes[0]->publish_failure(round, "rank 1 was killed by signal 9 (SIGKILL)", true);
    nodes[2]->publish_failure(round, "rank 7 was killed by signal 9 (SIGKILL)", true);
    for (int k = 0; k < kNodes; ++k)
      EXPECT_EQ(nodes[k]->failure(round).why, "node 0: rank 1 was killed by signal 9 (SIGKILL)");
  }
  EXPECT_EQ(nodes[0]->node_name(2), "node 2 (host host2)");
}

TEST(JobRounds, NodeMissingAtTheDeadlineIsNamedAndEveryWaiterStops) {
  auto shared = std::make_shared<trident::HashStore>();
  constexpr int kNodes = 4;
  std::vector<std::unique_ptr<JobRounds>> nodes;
  for (int k = 0; k < kNodes; ++k) nodes.push_back(node_of(k, kNodes, shared, k == 0 ? 0.3 : 30));
  std::vector<std::thread> threads;
  for (int k = 0; k < kNodes; ++k) threads.emplace_back([&, k] { EXPECT_EQ(nodes[k]->join(0), ""); });
  for (auto& t : threads) t.join();
  // Round 1: node 2 never joins. Node 0's deadline (0.3 s) passes first: it names node 2; nodes 1 and 3,
  // whose own deadline is far, stop with its reason instead of waiting.
  std::vector<std::string> stopped(kNodes);
  threads.clear();
  for (int k : {1, 3}) threads.emplace_back([&, k] { stopped[k] = nodes[k]->join(1); });
  try {
    nodes[0]->join(1);
    ADD_FAILURE() << "node 0 joined a round node 2 never joined";
  } catch (const trident::TimeoutError& e) {
    EXPECT_EQ(e.missing, std::vector<int>{2});
    EXPECT_EQ(e.rank, 0);
    EXPECT_EQ(e.seq, 1);
    EXPECT_EQ(e.op, "launch rendezvous");
  }
  for (auto& t : threads) t.join();
  for (int k : {1, 3}) {
    EXPECT_NE(stopped[k].find("node 0: node 2 (host host2) did not join restart round 1"), std::string::npos)
        << stopped[k];
    EXPECT_TRUE(nodes[k]->failure(1).final);
  }
}

TEST(JobRounds, NodeCutOffRejoinsOnceItCanReachTheStoreAgain) {
  auto shared = std::make_shared<trident::HashStore>();
  auto cut = std::make_shared<std::atomic<bool>>(false);
  auto n0 = node_of(0, 2, shared, 30);
  auto n1 = node_of(1, 2, shared, 30, cut);
  std::thread t0([&] { EXPECT_EQ(n0->join(0), ""); });
  EXPECT_EQ(n1->join(0), "");
  t0.join();
  cut->store(true);
  n1->drop_store();  // its connection broke with the link
  EXPECT_THROW(n1->failure(0), trident::StoreError);
  std::atomic<bool> joined{false};
  std::thread t1([&] {
    EXPECT_EQ(n1->join(1), "");
    joined = true;
  });
  std::thread u0([&] { EXPECT_EQ(n0->join(1), ""); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(joined.load()) << "node 1 joined round 1 through a cut link";
  cut->store(false);  // the link is back
  t1.join();
  u0.join();
  EXPECT_TRUE(joined.load());
}

TEST(JobRounds, StoreNeverReachedIsAStoreErrorNamingIt) {
  auto shared = std::make_shared<trident::HashStore>();
  auto cut = std::make_shared<std::atomic<bool>>(true);
  auto n1 = node_of(1, 2, shared, 0.2, cut);
  // Round 0: the first connection's error, at once.
  EXPECT_THROW(n1->join(0), trident::StoreError);
  // A later round: retried until the deadline, then an error naming the store.
  try {
    n1->join(1);
    ADD_FAILURE() << "joined without a store";
  } catch (const trident::StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("could not reach the test's store to join restart round 1"), std::string::npos)
        << e.what();
  }
}

TEST(JobRounds, FinishedNodeLearnsWhetherAnotherNodeFailedTheRound) {
  auto shared = std::make_shared<trident::HashStore>();
  auto n0 = node_of(0, 2, shared, 30);
  auto n1 = node_of(1, 2, shared, 30);
  // Both finish round 0: success.
  std::thread t([&] { EXPECT_EQ(n1->await_success(0, 30, nullptr).why, ""); });
  EXPECT_EQ(n0->await_success(0, 30, nullptr).why, "");
  t.join();
  // Round 1: node 0 finished, node 1's rank then fails: node 0 learns it (and restarts with it).
  std::thread f([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    n1->publish_failure(1, "rank 1 exited with code 3");
  });
  EXPECT_EQ(n0->await_success(1, 30, nullptr).why, "node 1: rank 1 exited with code 3");
  f.join();
  // Round 2: node 1 never reports: node 0 gives up after its timeout, naming it.
  std::vector<int> unfinished;
  EXPECT_EQ(n0->await_success(2, 0.2, &unfinished).why, "");
  EXPECT_EQ(unfinished, std::vector<int>{1});
}

}  // namespace
}  // namespace job_rounds_test
