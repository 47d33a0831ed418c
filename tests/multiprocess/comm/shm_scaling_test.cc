// The shared-memory transport's memory grows with the ranks of a host, not with their pairs: at 32 ranks the
// host's segment is at most a fixed part plus a few MiB per rank, and a rank that talks to two neighbours
// holds only a few MiB of it resident (rings are created on first use, nothing is prefaulted). Point-to-point
// between every ordered pair still works at odd and even world sizes, with messages that wrap both the large
// rings (a rank's first peers) and the small ones (the rest).
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"

namespace trident::shm_scaling_test {
namespace {

using testing::run_processes;

std::shared_ptr<ProcessGroup> make_pg(std::shared_ptr<Store> store, int rank, int size) {
  GroupOptions o;
  o.transport = "shm";
  o.timeout = Seconds(30);  // 32 ranks on 2 cores
  return new_process_group(std::move(store), rank, size, o);
}

// Size and resident bytes of this process's mapping of the group's segment (/dev/shm/trident-*), from
// /proc/self/smaps; {0, 0} when there is none.
struct Mapping {
  size_t size = 0, rss = 0;
};
Mapping segment_mapping() {
  std::ifstream in("/proc/self/smaps");
  Mapping m;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    const bool header = line.find('-') < line.find(' ') && line.find(':') > line.find(' ');
    if (header) {
      inside = line.find("/dev/shm/trident-") != std::string::npos;
      continue;
    }
    if (!inside) continue;
    if (line.rfind("Size:", 0) == 0) m.size += std::stoull(line.substr(5)) * 1024;
    if (line.rfind("Rss:", 0) == 0) m.rss += std::stoull(line.substr(4)) * 1024;
  }
  return m;
}

float value(int src, int dst, size_t i) { return static_cast<float>(src * 100 + dst) + static_cast<float>(i % 251); }

// 32 ranks, each sending 256 KiB to its right neighbour and receiving from its left one, then a small
// all-reduce (the collective window). The segment (sparse) is at most 1 MiB plus 6 MiB per rank (a ring
// for every ordered pair was 31 MiB per rank), and each rank holds at most 4 MiB of it resident (with every
// ring prefaulted it held all of it).
TEST(ShmScaling, SegmentAndResidentBytesLinearInRanks) {
  constexpr int kWorld = 32;
  auto res = run_processes(kWorld, [](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size);
    const int right = (rank + 1) % size, left = (rank + size - 1) % size;
    const size_t n = 64 * 1024;  // floats: 256 KiB
    std::vector<float> out(n), in(n);
    for (size_t i = 0; i < n; ++i) out[i] = value(rank, right, i);
    auto r = pg->recv_async(in.data(), n, DType::kFloat32, left, 1);
    pg->send(out.data(), n, DType::kFloat32, right, 1);
    r->wait();
    for (size_t i = 0; i < n; ++i)
      TRIDENT_RANK_CHECK(in[i] == value(left, rank, i), "element {} from rank {} is {}", i, left, in[i]);
    std::vector<float> x(64, 1.0f);
    pg->all_reduce(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum);
    TRIDENT_RANK_CHECK(x[0] == static_cast<float>(size), "all_reduce gave {}", x[0]);
    const Mapping m = segment_mapping();
    TRIDENT_RANK_CHECK(m.size > 0, "no /dev/shm/trident-* mapping in /proc/self/smaps");
    const size_t mib = size_t{1} << 20;
    TRIDENT_RANK_CHECK(m.size <= mib + 6 * mib * static_cast<size_t>(size),
                       "the segment of {} ranks is {} MiB, more than 1 MiB + 6 MiB per rank", size, m.size / mib);
    TRIDENT_RANK_CHECK(m.rss <= 4 * mib, "rank {} holds {} KiB of the segment resident (talking to 2 peers)", rank,
                       m.rss / 1024);
    pg->barrier();
  }, {.deadline_s = 120, .env = {}});
  EXPECT_EQ(testing::failures(res), "");
}

class ShmEveryPair : public ::testing::TestWithParam<int> {};

// Every rank sends to every other one at once (receives posted first), messages of 1 float and of
// 40000 floats (160 KB: wraps the 16 KiB rings of a rank's later peers and fills the large ones); at 8 ranks
// each rank writes to 7 peers, so both kinds of ring carry traffic. Each rank starts with a different peer.
TEST_P(ShmEveryPair, PointToPointBetweenEveryPair) {
  const int world = GetParam();
  auto res = run_processes(world, [](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size);
    for (size_t n : {size_t{1}, size_t{40000}}) {
      std::vector<std::vector<float>> in(size), out(size);
      std::vector<std::shared_ptr<Work>> works;
      for (int k = 1; k < size; ++k) {
        const int src = (rank + size - k) % size;
        in[src].assign(n, -1.0f);
        works.push_back(pg->recv_async(in[src].data(), n, DType::kFloat32, src, 7));
      }
      for (int k = 1; k < size; ++k) {
        const int dst = (rank + k) % size;
        out[dst].resize(n);
        for (size_t i = 0; i < n; ++i) out[dst][i] = value(rank, dst, i);
        works.push_back(pg->send_async(out[dst].data(), n, DType::kFloat32, dst, 7));
      }
      for (auto& w : works) w->wait();
      for (int src = 0; src < size; ++src) {
        if (src == rank) continue;
        for (size_t i = 0; i < n; ++i)
          TRIDENT_RANK_CHECK(in[src][i] == value(src, rank, i), "{} floats from rank {}: element {} is {}", n, src,
                             i, in[src][i]);
      }
    }
    pg->barrier();
  }, {.deadline_s = 60, .env = {}});
  EXPECT_EQ(testing::failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmEveryPair, ::testing::Values(3, 5, 8),
                         [](const auto& info) { return fmt::format("w{}", info.param); });

}  // namespace
}  // namespace trident::shm_scaling_test
