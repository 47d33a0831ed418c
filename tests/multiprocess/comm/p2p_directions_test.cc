// Sends and receives on one group run independently of each other and of collectives: patterns that would
// deadlock if a group's calls waited in one queue behind each other, over real processes, at world sizes
// 2, 3 and 5 and both transports, with message sizes 0, 1, 7, a prime and one larger than a shared-memory
// ring (its send cannot finish before the peer reads): every rank receives first and then sends (pairs, and
// a ring where a send to one neighbour must not wait behind a receive from the other); a ring of
// simultaneous sends and receives in both directions; a collective issued while a receive is pending; and
// the order guarantees (one peer, one tag: in order; different tags: matched by tag, whatever the order).
#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/core/error.h"

namespace trident::p2p_directions_test {
namespace {

using testing::run_processes;

const std::vector<size_t> kSizes = {0, 1, 7, 1009, (size_t{1} << 20) + 3};

float value(int src, int dst, size_t i, int round) {
  return static_cast<float>(src * 1000 + dst * 10 + round) + static_cast<float>(i % 97) * 0.5f;
}

std::vector<float> payload(int src, int dst, size_t n, int round) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(src, dst, i, round);
  return v;
}

void check_payload(const std::vector<float>& got, int src, int dst, int round, const char* what) {
  for (size_t i = 0; i < got.size(); ++i)
    TRIDENT_RANK_CHECK(got[i] == value(src, dst, i, round), "{}: {} floats from rank {} to {} (round {}): element {} is {}",
                       what, got.size(), src, dst, round, i, got[i]);
}

std::shared_ptr<ProcessGroup> make_pg(std::shared_ptr<Store> store, int rank, int size, const std::string& transport) {
  GroupOptions o;
  o.transport = transport;
  o.timeout = Seconds(10);  // a deadlock fails in seconds
  return new_process_group(std::move(store), rank, size, o);
}

class P2PDirections : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

// Pairs (0,1), (2,3), ... and, in an odd world, (size-1, 0): both ranks of a pair post a receive from the
// other, then a blocking send to it, then wait for the receive.
TEST_P(P2PDirections, BothRanksReceiveFirstThenSend) {
  auto [world, transport] = GetParam();
  auto res = run_processes(world, [transport = transport](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, transport);
    std::vector<std::pair<int, int>> pairs;
    for (int a = 0; a + 1 < size; a += 2) pairs.emplace_back(a, a + 1);
    if (size % 2 == 1 && size > 1) pairs.emplace_back(size - 1, 0);
    int round = 0;
    for (size_t n : kSizes) {
      for (auto [a, b] : pairs) {
        ++round;
        if (rank != a && rank != b) continue;
        const int other = rank == a ? b : a;
        std::vector<float> in(n);
        auto r = pg->recv_async(in.data(), n, DType::kFloat32, other, 3);
        std::vector<float> out = payload(rank, other, n, round);
        pg->send(out.data(), n, DType::kFloat32, other, 3);
        r->wait();
        check_payload(in, other, rank, round, "pair exchange");
      }
    }
    pg->barrier();
  });
  EXPECT_EQ(testing::failures(res), "");
}

// Every rank receives from its left neighbour before it sends to its right one: each send must proceed
// while a receive from another rank (which comes only after this send went round the ring) is pending.
// Then the same in both directions at once, all calls asynchronous, every size in flight.
TEST_P(P2PDirections, RingOfSimultaneousSendsAndReceives) {
  auto [world, transport] = GetParam();
  auto res = run_processes(world, [transport = transport](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, transport);
    const int next = (rank + 1) % size, prev = (rank - 1 + size) % size;
    int round = 0;
    for (size_t n : kSizes) {
      ++round;
      // One direction, the ring closed by rank 0's send: rank 0 sends first, every other rank forwards.
      std::vector<float> in(n);
      auto r = pg->recv_async(in.data(), n, DType::kFloat32, prev, 11);
      if (rank != 0) {
        r->wait();
        check_payload(in, prev, rank, round, "ring forward");
      }
      std::vector<float> out = payload(rank, next, n, round);
      pg->send(out.data(), n, DType::kFloat32, next, 11);
      if (rank == 0) {
        r->wait();
        check_payload(in, prev, rank, round, "ring closing");
      }
    }
    // Both directions, every size in flight at once.
    for (int rep = 0; rep < 1; ++rep) {
      std::vector<std::shared_ptr<Work>> works;
      std::vector<std::vector<float>> from_prev, from_next, sent;
      from_prev.reserve(kSizes.size());
      from_next.reserve(kSizes.size());
      sent.reserve(2 * kSizes.size());
      for (size_t k = 0; k < kSizes.size(); ++k) {
        const size_t n = kSizes[k];
        const int rd = 100 + rep * 10 + static_cast<int>(k);
        from_prev.emplace_back(n);
        from_next.emplace_back(n);
        works.push_back(pg->recv_async(from_prev.back().data(), n, DType::kFloat32, prev, 20 + static_cast<uint32_t>(k)));
        works.push_back(pg->recv_async(from_next.back().data(), n, DType::kFloat32, next, 40 + static_cast<uint32_t>(k)));
        sent.push_back(payload(rank, next, n, rd));
        works.push_back(pg->send_async(sent.back().data(), n, DType::kFloat32, next, 20 + static_cast<uint32_t>(k)));
        sent.push_back(payload(rank, prev, n, rd));
        works.push_back(pg->send_async(sent.back().data(), n, DType::kFloat32, prev, 40 + static_cast<uint32_t>(k)));
      }
      for (auto& w : works) w->wait();
      for (size_t k = 0; k < kSizes.size(); ++k) {
        const int rd = 100 + rep * 10 + static_cast<int>(k);
        check_payload(from_prev[k], prev, rank, rd, "both directions, from the left");
        check_payload(from_next[k], next, rank, rd, "both directions, from the right");
      }
    }
    pg->barrier();
  });
  EXPECT_EQ(testing::failures(res), "");
}

// Receives from any source (kAnySource): each matches the first message with its tag from any rank and
// its Work names the sender; one that names the peer and one from any source compete in posting order
// (either way round); a message that arrived before its receive was posted is taken at once.
TEST_P(P2PDirections, ReceiveFromAnySourceMatchesByTagInPostingOrder) {
  auto [world, transport] = GetParam();
  auto res = run_processes(world, [transport = transport](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, transport);
    const size_t n = 7;
    if (rank == 0) {
      // One message with tag 5 from every other rank, received in whatever order they come.
      std::vector<std::vector<float>> in(size - 1, std::vector<float>(n));
      std::vector<std::shared_ptr<Work>> w;
      for (auto& b : in) w.push_back(pg->recv_async(b.data(), n, DType::kFloat32, kAnySource, 5));
      std::vector<bool> seen(size, false);
      for (int i = 0; i + 1 < size; ++i) {
        w[i]->wait();
        const int src = w[i]->source_rank();
        TRIDENT_RANK_CHECK(src > 0 && src < size && !seen[src], "any-source receive {} names rank {}", i, src);
        seen[src] = true;
        check_payload(in[i], src, 0, 5, "any source, tag 5");
      }
      // Rank 1 sends tag 7 twice and tag 8 twice once these receives are posted (the barrier): a named receive
      // posted first takes the first message, the any-source one after it the second; and the other way round.
      std::vector<float> a(n), b(n), c(n), d(n);
      auto wa = pg->recv_async(a.data(), n, DType::kFloat32, 1, 7);
      auto wb = pg->recv_async(b.data(), n, DType::kFloat32, kAnySource, 7);
      auto wc = pg->recv_async(c.data(), n, DType::kFloat32, kAnySource, 8);
      auto wd = pg->recv_async(d.data(), n, DType::kFloat32, 1, 8);
      pg->barrier();
      for (auto* w2 : {&wa, &wb, &wc, &wd}) (*w2)->wait();
      check_payload(a, 1, 0, 70, "named, posted first");
      check_payload(b, 1, 0, 71, "any source, posted second");
      check_payload(c, 1, 0, 80, "any source, posted first");
      check_payload(d, 1, 0, 81, "named, posted second");
      TRIDENT_RANK_CHECK(wb->source_rank() == 1 && wc->source_rank() == 1, "sources {} {}", wb->source_rank(),
                         wc->source_rank());
      pg->barrier();  // the tag-9 message from the last rank was sent before it
      std::vector<float> e(n);
      auto we = pg->recv_async(e.data(), n, DType::kFloat32, kAnySource, 9);
      we->wait();
      TRIDENT_RANK_CHECK(we->source_rank() == size - 1, "early message: source {}", we->source_rank());
      check_payload(e, size - 1, 0, 9, "early message");
    } else {
      std::vector<std::shared_ptr<Work>> w;
      std::vector<std::vector<float>> out;
      out.reserve(8);
      auto send = [&](int round, uint32_t tag) {
        out.push_back(payload(rank, 0, n, round));
        w.push_back(pg->send_async(out.back().data(), n, DType::kFloat32, 0, tag));
      };
      send(5, 5);
      pg->barrier();  // rank 0 posted its tag-7 and tag-8 receives
      if (rank == 1) {
        send(70, 7);
        send(71, 7);
        send(80, 8);
        send(81, 8);
      }
      if (rank == size - 1) send(9, 9);
      for (auto& x : w) x->wait();
      pg->barrier();
    }
    pg->barrier();
  });
  EXPECT_EQ(testing::failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Worlds, P2PDirections,
                         ::testing::Combine(::testing::Values(2, 3, 5), ::testing::Values("shm", "tcp")));

// A collective issued after a receive that can only be satisfied after that collective: the collective
// runs while the receive is pending (with one queue per group it would wait behind it forever).
TEST(P2POrder, CollectiveRunsWhileReceivePending) {
  auto res = run_processes(3, [](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, "auto");
    const int next = (rank + 1) % size, prev = (rank - 1 + size) % size;
    std::vector<float> in(7);
    auto r = pg->recv_async(in.data(), in.size(), DType::kFloat32, prev, 5);
    std::vector<double> x(5, rank + 1.0);
    pg->all_reduce(x.data(), x.size(), DType::kFloat64, ReduceOp::kSum);
    TRIDENT_RANK_CHECK(x[4] == 6.0, "all-reduce gave {}", x[4]);
    std::vector<float> out = payload(rank, next, in.size(), 1);
    pg->send(out.data(), out.size(), DType::kFloat32, next, 5);
    r->wait();
    check_payload(in, prev, rank, 1, "receive posted before the all-reduce");
    pg->barrier();
  });
  EXPECT_EQ(testing::failures(res), "");
}

// One peer and one tag: messages arrive in send order. Different tags: each receive gets its own tag's
// message although the receiver posts them in the opposite order to the sends.
TEST(P2POrder, SameTagInOrderOtherTagsByTag) {
  auto res = run_processes(2, [](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, "auto");
    constexpr int kMsgs = 5;
    if (rank == 0) {
      std::vector<std::vector<float>> out;
      std::vector<std::shared_ptr<Work>> works;
      for (int i = 0; i < kMsgs; ++i) {
        out.push_back(payload(0, 1, 13, i));
        works.push_back(pg->send_async(out.back().data(), 13, DType::kFloat32, 1, 9));
      }
      std::vector<float> a = payload(0, 1, 3, 50), b = payload(0, 1, 3, 60);
      pg->send(a.data(), 3, DType::kFloat32, 1, 1);
      pg->send(b.data(), 3, DType::kFloat32, 1, 2);
      for (auto& w : works) w->wait();
    } else {
      std::vector<float> b(3), a(3);
      auto wb = pg->recv_async(b.data(), 3, DType::kFloat32, 0, 2);
      auto wa = pg->recv_async(a.data(), 3, DType::kFloat32, 0, 1);
      for (int i = 0; i < kMsgs; ++i) {
        std::vector<float> in(13);
        pg->recv(in.data(), 13, DType::kFloat32, 0, 9);
        check_payload(in, 0, 1, i, "same tag");
      }
      wa->wait();
      wb->wait();
      check_payload(a, 0, 1, 50, "tag 1");
      check_payload(b, 0, 1, 60, "tag 2");
    }
    pg->barrier();
  });
  EXPECT_EQ(testing::failures(res), "");
}

// A receive whose message never comes times out alone at its own deadline, naming the call, the group
// and the silent rank; the rank that never sent fails too (the group is aborted) instead of hanging.
TEST(P2POrder, PendingReceiveTimesOutNamingThePeer) {
  auto res = run_processes(2, [](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, "auto");
    if (rank == 1) {
      std::vector<float> in(7);
      CallOptions o;
      o.timeout = Seconds(0.5);
      auto r = pg->recv_async(in.data(), in.size(), DType::kFloat32, 0, 4, o);
      try {
        r->wait();
        testing::rank_fail("a receive with no sender completed");
      } catch (const TimeoutError& e) {
        const std::string w = e.what();
        TRIDENT_RANK_CHECK(w.find("recv(count=7") != std::string::npos && w.find("group 'world'") != std::string::npos &&
                               w.find("not heard from: rank(s) 0") != std::string::npos,
                           "the error does not name the call, the group and rank 0: {}", w);
      }
    }
    try {
      pg->barrier();
      TRIDENT_RANK_CHECK(false, "the barrier after the timeout succeeded");
    } catch (const NetworkError&) {
    }
  });
  EXPECT_EQ(testing::failures(res), "");
}

}  // namespace
}  // namespace trident::p2p_directions_test
