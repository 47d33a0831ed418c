// A peer that delivered everything and then exited is not a dead peer: the engine's periodic dead-peer
// check (a waited peer whose process is gone) must first read what that peer left in the channel.
//
// Made deterministic with SIGSTOP: rank 0 blocks in a receive from rank 1; rank 1 stops rank 0 (asleep in
// the engine's wait, its next periodic check already due when it resumes), sends its message, and exits; a
// watcher process resumes rank 0 only once rank 1 is gone. Rank 0 then wakes with the message unread in
// its channel and the sender dead: it must complete the receive with the right bytes, not raise
// PeerDiedError. Then a real death (the peer exits without sending) is still reported, naming the peer.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <typeinfo>

#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/comm/transport/shm.h"
#include "trident/core/error.h"

namespace trident::exit_after_send_test {
namespace {

using testing::RunOptions;

std::shared_ptr<ProcessGroup> make_pg(std::shared_ptr<Store> store, int rank, int size, const std::string& transport) {
  GroupOptions o;
  o.transport = transport;
  o.timeout = Seconds(30);
  return new_process_group(store, rank, size, o);
}

// Forks a watcher that resumes `stopped` once `gone` is no longer alive (and its periodic check is due),
// whatever happens: bounded, then it exits.
void resume_after_exit(pid_t stopped, pid_t gone) {
  const uint64_t st = process_starttime(gone);
  if (fork() != 0) return;
  for (int i = 0; i < 10000 && process_alive(gone, st); ++i) usleep(1000);
  usleep(400 * 1000);  // longer than the engine's 250 ms check period: rank 0's next check is due at once
  kill(stopped, SIGCONT);
  _exit(0);
}

class ExitAfterSend : public ::testing::TestWithParam<std::string> {};

TEST_P(ExitAfterSend, MessageFromAPeerThatExitedIsDelivered) {
  const std::string transport = GetParam();
  constexpr size_t kCount = 1000;
  auto res = testing::run_processes(2, [transport](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, transport);
    if (rank == 0) {
      std::vector<int32_t> got(kCount, -1);
      store->set_string("pid0", std::to_string(getpid()));
      pg->recv(got.data(), kCount, DType::kInt32, 1, /*tag=*/7);
      for (size_t i = 0; i < kCount; ++i)
        TRIDENT_RANK_CHECK(got[i] == static_cast<int32_t>(3 * i + 1), "element {} is {}, expected {}", i, got[i],
                           3 * i + 1);
      return;
    }
    const pid_t pid0 = static_cast<pid_t>(std::atoll(store->get_string("pid0", Seconds(30)).c_str()));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 is asleep inside its receive
    std::vector<int32_t> data(kCount);
    for (size_t i = 0; i < kCount; ++i) data[i] = static_cast<int32_t>(3 * i + 1);
    resume_after_exit(pid0, getpid());
    kill(pid0, SIGSTOP);
    pg->send(data.data(), kCount, DType::kInt32, 0, /*tag=*/7);
    std::fflush(nullptr);
    _exit(0);  // gone before rank 0 runs again, with the message unread in rank 0's channel
  }, RunOptions{.deadline_s = 60, .env = {}});
  ASSERT_EQ(res.size(), 2u);
  EXPECT_TRUE(res[0].ok) << testing::failures(res);
  EXPECT_TRUE(res[1].ok) << testing::failures(res);
}

// The re-check does not hide a real death: a peer that exits owing the message is named.
TEST_P(ExitAfterSend, PeerThatExitsWithoutSendingIsNamed) {
  const std::string transport = GetParam();
  auto res = testing::run_processes(2, [transport](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, transport);
    if (rank == 1) {
      store->get_string("ready0", Seconds(30));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::fflush(nullptr);
      _exit(0);
    }
    std::vector<int32_t> got(16);
    store->set_string("ready0", "1");
    try {
      pg->recv(got.data(), got.size(), DType::kInt32, 1, /*tag=*/7);
      testing::rank_fail("a receive from a peer that exited without sending succeeded");
    } catch (const NetworkError& e) {
      const std::string what = e.what();
      TRIDENT_RANK_CHECK(e.peer == 1, "{}::peer is {}, not rank 1 which exited: {}", typeid(e).name(), e.peer, what);
    }
  }, RunOptions{.deadline_s = 60, .env = {}});
  ASSERT_EQ(res.size(), 2u);
  EXPECT_TRUE(res[0].ok) << testing::failures(res);
  EXPECT_TRUE(res[1].ok) << testing::failures(res);
}

INSTANTIATE_TEST_SUITE_P(Transports, ExitAfterSend, ::testing::Values("shm", "tcp"));

}  // namespace
}  // namespace trident::exit_after_send_test
