// TCP under forced partial I/O: small socket buffers (TRIDENT_TCP_SOCKBUF) and a cap on the bytes of every
// send()/recv() call (TRIDENT_TCP_MAX_IO, a different odd cap per rank, set before the group connects), so
// 64-byte headers, payloads, elements being reduced and the padding all arrive split at odd offsets, and a
// full socket stops a send while the other direction must keep draining. Collectives at odd counts (0, 1,
// 7, primes, a few MiB) and world sizes 2, 3, 5 must match a closed-form reference bit for bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"

namespace trident {
namespace {

// Small integers: every sum, in any order, is exact in float32 and float64.
double value(int rank, size_t i) { return static_cast<double>(static_cast<long>((rank + 3) * (i % 97) + i % 13) % 251 - 100); }

template <typename T>
std::vector<T> input(int rank, size_t count) {
  std::vector<T> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<T>(value(rank, i));
  return v;
}

template <typename T>
void expect_same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  TRIDENT_RANK_CHECK(got.size() == want.size(), "{}: size {} vs {}", what, got.size(), want.size());
  if (got.empty() || std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0) return;
  for (size_t i = 0; i < got.size(); ++i)
    TRIDENT_RANK_CHECK(std::memcmp(&got[i], &want[i], sizeof(T)) == 0, "{}: element {} is {}, expected {}", what, i,
                       static_cast<double>(got[i]), static_cast<double>(want[i]));
}

// Each rank caps its own I/O at a different odd size, so the two ends of one connection split the stream
// at different places.
void set_rank_caps(int rank, size_t base_cap) {
  const size_t cap = base_cap + 2 * static_cast<size_t>(rank);  // odd when base_cap is odd
  ::setenv("TRIDENT_TCP_MAX_IO", std::to_string(cap).c_str(), 1);
}

std::shared_ptr<ProcessGroup> tcp_group(std::shared_ptr<Store> st, int r, int n) {
  GroupOptions go;
  go.transport = "tcp";
  go.timeout = Seconds(120);
  return new_process_group(std::move(st), r, n, go);
}

void all_reduce_case(ProcessGroup& pg, size_t count, Algo algo) {
  const int n = pg.size(), r = pg.rank();
  const std::string what = fmt::format("all_reduce {} x {} ranks [{}]", count, n, algo_name(algo));
  CallOptions forced;
  forced.algo = algo;
  {  // float32 sum, out of place
    auto in = input<float>(r, count);
    std::vector<float> out(count, -7.0f), want(count, 0.0f);
    for (int k = 0; k < n; ++k)
      for (size_t i = 0; i < count; ++i) want[i] += static_cast<float>(value(k, i));
    pg.all_reduce(in.data(), out.data(), count, DType::kFloat32, ReduceOp::kSum, forced);
    expect_same(out, want, what + " float32 sum");
  }
  {  // float64 max, in place (8-byte elements split by the odd caps)
    auto buf = input<double>(r, count);
    std::vector<double> want(count, -1e300);
    for (int k = 0; k < n; ++k)
      for (size_t i = 0; i < count; ++i) want[i] = std::max(want[i], value(k, i));
    pg.all_reduce(buf.data(), count, DType::kFloat64, ReduceOp::kMax, forced);
    expect_same(buf, want, what + " float64 max");
  }
}

void other_collectives(ProcessGroup& pg, size_t count) {
  const int n = pg.size(), r = pg.rank();
  {  // reduce_scatter: rank r gets block r of the sum of every rank's n*count input
    auto in = input<float>(r, count * n);
    std::vector<float> out(count, -7.0f), want(count, 0.0f);
    for (int k = 0; k < n; ++k)
      for (size_t i = 0; i < count; ++i) want[i] += static_cast<float>(value(k, r * count + i));
    pg.reduce_scatter(in.data(), out.data(), count, DType::kFloat32, ReduceOp::kSum);
    expect_same(out, want, fmt::format("reduce_scatter {} x {} ranks", count, n));
  }
  {  // all_gather of uint8 (odd byte counts: the frame tail padding is exercised)
    std::vector<uint8_t> in(count), out(count * n, 255), want(count * n);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<uint8_t>(value(r, i) + 100);
    for (int k = 0; k < n; ++k)
      for (size_t i = 0; i < count; ++i) want[k * count + i] = static_cast<uint8_t>(value(k, i) + 100);
    pg.all_gather(in.data(), out.data(), count, DType::kUInt8);
    expect_same(out, want, fmt::format("all_gather {} x {} ranks", count, n));
  }
  {  // broadcast from the last rank
    const int root = n - 1;
    auto buf = r == root ? input<float>(root, count) : std::vector<float>(count, -7.0f);
    pg.broadcast(buf.data(), count, DType::kFloat32, root);
    expect_same(buf, input<float>(root, count), fmt::format("broadcast {} x {} ranks", count, n));
  }
}

// Point-to-point between every pair, pair by pair in one global order (the group runs one operation at a
// time): the lower rank sends first, then receives.
void exchange(ProcessGroup& pg, size_t count) {
  const int n = pg.size(), r = pg.rank();
  auto mine = input<float>(r, count);
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      if (r != a && r != b) continue;
      const int p = r == a ? b : a;
      std::vector<float> got(count, -7.0f);
      if (r == a) pg.send(mine.data(), count, DType::kFloat32, p, 5);
      pg.recv(got.data(), count, DType::kFloat32, p, 5);
      if (r == b) pg.send(mine.data(), count, DType::kFloat32, p, 5);
      expect_same(got, input<float>(p, count), fmt::format("recv of {} from rank {}", count, p));
    }
}

const std::vector<Algo> kAllReduceAlgos = {Algo::kAuto, Algo::kRing, Algo::kRecursiveDoubling, Algo::kDirect,
                                           Algo::kTree, Algo::kRecursiveHalving};

class TcpPartialIo : public ::testing::TestWithParam<int> {};

// Caps of 61+ bytes per call: headers arrive in two pieces, elements straddle reads.
TEST_P(TcpPartialIo, TinyPiecesAtOddCounts) {
  const int world = GetParam();
  auto res = testing::run_processes(world, [](int r, int n, std::shared_ptr<Store> st) {
    set_rank_caps(r, 61);
    auto pg = tcp_group(std::move(st), r, n);
    for (size_t count : {0, 1, 7, 61, 1021}) {
      for (Algo a : kAllReduceAlgos) all_reduce_case(*pg, count, a);
      other_collectives(*pg, count);
      exchange(*pg, count);
    }
  }, {.deadline_s = 240, .env = {{"TRIDENT_TCP_SOCKBUF", "256K"}}});
  EXPECT_EQ(testing::failures(res), "");
}

// Small socket buffers (256 KiB: smaller ones make loopback TCP fall back to slow zero-window probes)
// and 4093+-byte calls at a few MiB: hundreds of partial sends and receives per message, full send
// buffers, pipelined chunks (TRIDENT_CHUNK_BYTES) crossing them.
TEST_P(TcpPartialIo, FewMiBThroughSmallBuffers) {
  const int world = GetParam();
  auto res = testing::run_processes(world, [](int r, int n, std::shared_ptr<Store> st) {
    set_rank_caps(r, 4093);
    auto pg = tcp_group(std::move(st), r, n);
    const size_t big = 786433;  // prime; 3 MiB of float32
    all_reduce_case(*pg, big, Algo::kRing);
    all_reduce_case(*pg, 65537, Algo::kRecursiveDoubling);
    other_collectives(*pg, 262147);  // prime
    exchange(*pg, big);
  }, {.deadline_s = 240, .env = {{"TRIDENT_TCP_SOCKBUF", "256K"}, {"TRIDENT_CHUNK_BYTES", "192K"}}});
  EXPECT_EQ(testing::failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Worlds, TcpPartialIo, ::testing::Values(2, 3, 5),
                         [](const auto& info) { return fmt::format("w{}", info.param); });

}  // namespace
}  // namespace trident
