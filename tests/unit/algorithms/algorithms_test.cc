// Every algorithm in algorithm_table() over the thread-based AlgoContext (thread_world.h), swept over
// world sizes, counts (including 0, 1, odd and large), dtypes, reduce ops, roots and in-place forms.
// Inputs are generated per (seed, rank, element): small integers for reductions (exact in any order and
// in bfloat16/float16), arbitrary bytes for data movement. Each expected output is computed here by a
// naive loop over ranks, and every element of every rank is compared.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <set>

#include "harness/keep_freed_memory.h"
#include "thread_world.h"
#include "trident/comm/algorithms/algorithm.h"
#include "trident/comm/reduce.h"

namespace trident {
namespace {

using testing::ThreadWorld;

const bool kKeepFreedMemory = testing::keep_freed_memory();

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash3(uint64_t seed, uint64_t rank, uint64_t i) { return mix(seed * 0x100000001b3ull ^ mix(rank * 7919 + mix(i))); }

// Small integers: [-8, 8] for sum/max/min (|sum over 8 ranks| <= 64, exact in bfloat16), and
// {-2, -1, 1, 2} for prod (|product over 8 ranks| <= 256, a power of two).
int64_t small_value(uint64_t seed, int rank, size_t i, ReduceOp op) {
  const uint64_t h = ((mix(seed + static_cast<uint64_t>(rank)) ^ i) * 0x9e3779b97f4a7c15ull) >> 40;
  if (op == ReduceOp::kProd) {
    static const int64_t kVals[4] = {-2, -1, 1, 2};
    return kVals[h & 3];
  }
  return static_cast<int64_t>(h % 17) - 8;
}

void store(DType t, void* base, size_t i, double v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(base)[i] = static_cast<float>(v); return;
    case DType::kFloat64: static_cast<double*>(base)[i] = v; return;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = float_to_bf16(static_cast<float>(v)); return;
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = float_to_fp16(static_cast<float>(v)); return;
    case DType::kInt32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); return;
    case DType::kInt64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); return;
    case DType::kUInt8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); return;
  }
}

double load(DType t, const void* base, size_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kFloat64: return static_cast<const double*>(base)[i];
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat16: return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kInt32: return static_cast<const int32_t*>(base)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::kUInt8: return static_cast<const uint8_t*>(base)[i];
  }
  return 0;
}

double combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kMin: return std::min(a, b);
  }
  return 0;
}

// A buffer with guard bytes on both sides, to catch writes out of bounds.
class Buf {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr unsigned char kGuardByte = 0xE7;
  explicit Buf(size_t bytes = 0) : bytes_(bytes), mem_(bytes + 2 * kGuard, kGuardByte) {}
  void* data() { return mem_.data() + kGuard; }
  const void* data() const { return mem_.data() + kGuard; }
  size_t bytes() const { return bytes_; }
  bool guards_ok() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (mem_[i] != kGuardByte || mem_[kGuard + bytes_ + i] != kGuardByte) return false;
    return true;
  }
  void fill_bytes(uint64_t seed) {
    auto* p = static_cast<unsigned char*>(data());
    const uint64_t h = mix(seed);
    for (size_t i = 0; i < bytes_; ++i) p[i] = static_cast<unsigned char>(((h ^ i) * 0x9e3779b97f4a7c15ull) >> 56);
  }
  std::vector<unsigned char> copy() const {
    auto* p = static_cast<const unsigned char*>(data());
    return {p, p + bytes_};
  }

 private:
  size_t bytes_;
  std::vector<unsigned char> mem_;
};

struct Case {
  const AlgorithmInfo* info;
  int world;
  size_t count;
  DType dtype;
  ReduceOp redop;
  int root;
  bool inplace;
  size_t chunk;

  std::string str() const {
    return fmt::format("{} algo={} world={} count={} dtype={} op={} root={} inplace={} chunk_bytes={}",
                       op_name(info->op), algo_name(info->algo), world, count, dtype_name(dtype),
                       reduce_op_name(redop), root, inplace, chunk);
  }
};

bool is_reduction(OpKind op) {
  return op == OpKind::kAllReduce || op == OpKind::kReduce || op == OpKind::kReduceScatter;
}
bool is_rooted(OpKind op) {
  return op == OpKind::kBroadcast || op == OpKind::kReduce || op == OpKind::kGather || op == OpKind::kScatter;
}
bool has_inplace(OpKind op) {
  return op == OpKind::kReduce || op == OpKind::kGather || op == OpKind::kScatter || op == OpKind::kAllGather ||
         op == OpKind::kReduceScatter;
}

bool per_rank_blocks(OpKind op) {
  return op == OpKind::kGather || op == OpKind::kScatter || op == OpKind::kAllGather || op == OpKind::kAllGatherV ||
         op == OpKind::kReduceScatter || op == OpKind::kAllToAll;
}

// Per-rank counts for all_gatherv: varying, with zeros.
std::vector<size_t> v_counts(size_t count, int n) {
  std::vector<size_t> c(n);
  for (int r = 0; r < n; ++r) c[r] = (r % 3 == 1) ? 0 : count + static_cast<size_t>(r) * (count % 5 + 1);
  return c;
}

// Fills a reduction input of `elems` elements for `rank` (element index offset by `base` in the
// logical whole, so every rank's block b element i is value(rank, b*count+i)).
void fill_values(Buf& b, DType t, uint64_t seed, int rank, size_t elems, ReduceOp op) {
  for (size_t i = 0; i < elems; ++i) store(t, b.data(), i, static_cast<double>(small_value(seed, rank, i, op)));
}

// Compares `got` (elements of dtype) against `want`; returns "" or the first wrong element.
std::string compare_values(DType t, const void* got, const void* want, size_t elems, const std::string& where) {
  for (size_t i = 0; i < elems; ++i) {
    const double g = load(t, got, i), w = load(t, want, i);
    if (!(g == w)) return fmt::format("{}: element {} is {} but should be {}", where, i, g, w);
  }
  return "";
}
std::string compare_bytes(const void* got, const void* want, size_t bytes, size_t es, const std::string& where) {
  if (bytes == 0 || std::memcmp(got, want, bytes) == 0) return "";
  auto* g = static_cast<const unsigned char*>(got);
  auto* w = static_cast<const unsigned char*>(want);
  size_t i = 0;
  while (g[i] == w[i]) ++i;
  return fmt::format("{}: element {} (byte {}) differs: got byte 0x{:02x}, want 0x{:02x}", where, i / es, i, g[i], w[i]);
}

// Runs one case; returns "" when every element of every rank is right and the context saw no violation.
std::string run_case(const Case& c) {
  const int n = c.world;
  const size_t es = dtype_size(c.dtype), cnt = c.count;
  const OpKind op = c.info->op;
  const uint64_t seed = mix(static_cast<uint64_t>(op) * 131 + n * 17 + cnt * 3 + static_cast<uint64_t>(c.dtype) * 7 +
                            static_cast<uint64_t>(c.redop) * 5 + c.root);
  const std::vector<size_t> vcounts = v_counts(cnt, n);
  size_t vtotal = 0;
  for (size_t v : vcounts) vtotal += v;

  std::vector<Buf> send(n), recv(n);
  std::vector<CollArgs> args(n);
  std::vector<std::vector<unsigned char>> send_before(n);
  std::vector<char> check_send(n, 0);
  // Expected results per rank (empty Buf = nothing to check on that rank).
  std::vector<Buf> want(n);
  bool bytewise = !is_reduction(op);

  for (int r = 0; r < n; ++r) {
    CollArgs& a = args[r];
    a.op = op;
    a.count = cnt;
    a.dtype = c.dtype;
    a.redop = c.redop;
    a.root = c.root;
    const uint64_t rs = hash3(seed, r, 12345);
    switch (op) {
      case OpKind::kAllReduce:
        recv[r] = Buf(cnt * es);
        fill_values(recv[r], c.dtype, seed, r, cnt, c.redop);
        a.recv = recv[r].data();
        break;
      case OpKind::kBroadcast:
        recv[r] = Buf(cnt * es);
        recv[r].fill_bytes(rs);  // root: the data; others: garbage to be overwritten
        a.recv = recv[r].data();
        break;
      case OpKind::kReduce:
        if (r == c.root && c.inplace) {
          recv[r] = Buf(cnt * es);
          fill_values(recv[r], c.dtype, seed, r, cnt, c.redop);
          a.send = a.recv = recv[r].data();
        } else {
          send[r] = Buf(cnt * es);
          fill_values(send[r], c.dtype, seed, r, cnt, c.redop);
          a.send = send[r].data();
          check_send[r] = 1;
          if (r == c.root) {
            recv[r] = Buf(cnt * es);
            recv[r].fill_bytes(rs);
            a.recv = recv[r].data();
          }
        }
        break;
      case OpKind::kGather:
        if (r == c.root) {
          recv[r] = Buf(cnt * n * es);
          recv[r].fill_bytes(rs);
          a.recv = recv[r].data();
        }
        if (r == c.root && c.inplace) {
          a.send = static_cast<char*>(recv[r].data()) + r * cnt * es;  // own block already in place
        } else {
          send[r] = Buf(cnt * es);
          send[r].fill_bytes(rs + 1);
          a.send = send[r].data();
          check_send[r] = 1;
        }
        break;
      case OpKind::kScatter:
        if (r == c.root) {
          send[r] = Buf(cnt * n * es);
          send[r].fill_bytes(rs + 1);
          a.send = send[r].data();
          check_send[r] = !c.inplace;
        }
        if (r == c.root && c.inplace) {
          a.recv = static_cast<char*>(send[r].data()) + r * cnt * es;
        } else {
          recv[r] = Buf(cnt * es);
          recv[r].fill_bytes(rs);
          a.recv = recv[r].data();
        }
        break;
      case OpKind::kAllGather:
        recv[r] = Buf(cnt * n * es);
        recv[r].fill_bytes(rs);
        if (c.inplace) {
          // This rank's data sits in its own block of recv.
          Buf tmp(cnt * es);
          tmp.fill_bytes(rs + 1);
          if (cnt) std::memcpy(static_cast<char*>(recv[r].data()) + r * cnt * es, tmp.data(), cnt * es);
          a.send = static_cast<char*>(recv[r].data()) + r * cnt * es;
        } else {
          send[r] = Buf(cnt * es);
          send[r].fill_bytes(rs + 1);
          a.send = send[r].data();
          check_send[r] = 1;
        }
        a.recv = recv[r].data();
        break;
      case OpKind::kAllGatherV:
        send[r] = Buf(vcounts[r] * es);
        send[r].fill_bytes(rs + 1);
        recv[r] = Buf(vtotal * es);
        recv[r].fill_bytes(rs);
        a.send = send[r].data();
        a.recv = recv[r].data();
        a.counts = &vcounts;
        check_send[r] = 1;
        break;
      case OpKind::kReduceScatter:
        send[r] = Buf(cnt * n * es);
        fill_values(send[r], c.dtype, seed, r, cnt * n, c.redop);
        a.send = send[r].data();
        if (c.inplace) {
          a.recv = static_cast<char*>(send[r].data()) + r * cnt * es;
        } else {
          recv[r] = Buf(cnt * es);
          recv[r].fill_bytes(rs);
          a.recv = recv[r].data();
          check_send[r] = 1;
        }
        break;
      case OpKind::kAllToAll:
        send[r] = Buf(cnt * n * es);
        send[r].fill_bytes(rs + 1);
        recv[r] = Buf(cnt * n * es);
        recv[r].fill_bytes(rs);
        a.send = send[r].data();
        a.recv = recv[r].data();
        check_send[r] = 1;
        break;
      case OpKind::kBarrier:
      case OpKind::kSend:
      case OpKind::kRecv:
        break;
    }
    if (check_send[r]) send_before[r] = send[r].copy();
  }

  // Expected outputs, from the inputs as generated (before the collective runs).
  auto input_bytes = [&](int r) -> const unsigned char* {  // movement: rank r's contribution
    if (op == OpKind::kAllGather && c.inplace) return static_cast<const unsigned char*>(args[r].send);
    if (op == OpKind::kGather && r == c.root && c.inplace) return static_cast<const unsigned char*>(args[r].send);
    return static_cast<const unsigned char*>(send[r].data());
  };
  for (int r = 0; r < n; ++r) {
    switch (op) {
      case OpKind::kAllReduce:
      case OpKind::kReduce: {
        if (op == OpKind::kReduce && r != c.root) break;
        want[r] = Buf(cnt * es);
        for (size_t i = 0; i < cnt; ++i) {
          double v = static_cast<double>(small_value(seed, 0, i, c.redop));
          for (int p = 1; p < n; ++p) v = combine(c.redop, v, static_cast<double>(small_value(seed, p, i, c.redop)));
          store(c.dtype, want[r].data(), i, v);
        }
        break;
      }
      case OpKind::kReduceScatter: {
        want[r] = Buf(cnt * es);
        for (size_t i = 0; i < cnt; ++i) {
          const size_t g = r * cnt + i;
          double v = static_cast<double>(small_value(seed, 0, g, c.redop));
          for (int p = 1; p < n; ++p) v = combine(c.redop, v, static_cast<double>(small_value(seed, p, g, c.redop)));
          store(c.dtype, want[r].data(), i, v);
        }
        break;
      }
      case OpKind::kBroadcast:
        want[r] = Buf(cnt * es);
        if (cnt) std::memcpy(want[r].data(), recv[c.root].data(), cnt * es);
        break;
      case OpKind::kGather:
        if (r != c.root) break;
        want[r] = Buf(cnt * n * es);
        for (int p = 0; p < n; ++p)
          if (cnt) std::memcpy(static_cast<char*>(want[r].data()) + p * cnt * es, input_bytes(p), cnt * es);
        break;
      case OpKind::kScatter:
        want[r] = Buf(cnt * es);
        if (cnt) std::memcpy(want[r].data(), static_cast<const char*>(send[c.root].data()) + r * cnt * es, cnt * es);
        break;
      case OpKind::kAllGather:
        want[r] = Buf(cnt * n * es);
        for (int p = 0; p < n; ++p)
          if (cnt) std::memcpy(static_cast<char*>(want[r].data()) + p * cnt * es, input_bytes(p), cnt * es);
        break;
      case OpKind::kAllGatherV: {
        want[r] = Buf(vtotal * es);
        size_t off = 0;
        for (int p = 0; p < n; ++p) {
          if (vcounts[p]) std::memcpy(static_cast<char*>(want[r].data()) + off * es, send[p].data(), vcounts[p] * es);
          off += vcounts[p];
        }
        break;
      }
      case OpKind::kAllToAll:
        want[r] = Buf(cnt * n * es);
        for (int p = 0; p < n; ++p)
          if (cnt)
            std::memcpy(static_cast<char*>(want[r].data()) + p * cnt * es,
                        static_cast<const char*>(send[p].data()) + r * cnt * es, cnt * es);
        break;
      default:
        break;
    }
  }

  // Barrier: no rank may leave before every rank has entered.
  std::atomic<int> entered{0};
  std::vector<char> left_early(n, 0);

  ThreadWorld world(n);
  world.set_chunk_bytes(c.chunk);
  auto result = world.run([&](AlgoContext& ctx) {
    const int r = ctx.rank();
    if (op == OpKind::kBarrier) entered.fetch_add(1);
    c.info->run(ctx, args[r]);
    if (op == OpKind::kBarrier && entered.load() != n) left_early[r] = 1;
  });
  if (!result.ok()) return "context reported: " + result.summary();
  if (n == 1 && result.messages != 0) return fmt::format("world 1 sent {} message(s); it must send none", result.messages);

  for (int r = 0; r < n; ++r) {
    if (left_early[r]) return fmt::format("rank {} left the barrier before every rank entered", r);
    if (!send[r].guards_ok()) return fmt::format("rank {} wrote outside its send buffer", r);
    if (!recv[r].guards_ok()) return fmt::format("rank {} wrote outside its recv buffer", r);
    if (check_send[r] && send[r].copy() != send_before[r]) return fmt::format("rank {} modified its send buffer", r);
    if (want[r].bytes() == 0) continue;  // nothing to check on this rank (count 0, or not the root)
    const void* got = args[r].recv;
    const std::string where = fmt::format("rank {}", r);
    std::string err = bytewise ? compare_bytes(got, want[r].data(), want[r].bytes(), es, where)
                               : compare_values(c.dtype, got, want[r].data(), want[r].bytes() / es, where);
    if (!err.empty()) return err;
  }
  return "";
}

struct Sweep {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // Under a sanitizer, without the large count: an out-of-bounds or overlapping access shows at chunk and
  // block boundaries, which 1023 elements in 40-byte chunks cross at every world size and dtype. The large
  // count (real chunk sizes, several per block) runs in the release build; here it took most of the time.
  // Worlds up to 4 (3 the odd one, 4 the power of two): 5 and 8 take the same code paths with more ranks,
  // and are left to the release build as the multi-process sweeps are (scripts/test.sh).
  std::vector<int> worlds = {1, 2, 3, 4};
  std::vector<size_t> counts = {0, 1, 7, 1023};
#else
  std::vector<int> worlds = {1, 2, 3, 4, 5, 8};
  std::vector<size_t> counts = {0, 1, 7, 1023, 262147};
#endif
};

size_t chunk_for(size_t count) {
  if (count >= 10000) return 16 << 10;  // several chunks per block at every world size
  if (count >= 1000) return 40;          // many small, element-misaligned-for-some-dtypes chunks
  if (count >= 7) return 8;
  return 0;  // let the algorithm choose
}

std::vector<DType> dtypes_for(OpKind op, size_t count) {
  if (op == OpKind::kBarrier) return {DType::kFloat32};
  if (is_reduction(op)) {
    if (count > 100000) return {DType::kFloat32, DType::kBFloat16, DType::kInt64};
    return {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16, DType::kInt32, DType::kInt64};
  }
  // Movement depends only on the element size; the large count covers sizes 1, 2, 4 and 8.
  if (count > 100000) return {DType::kUInt8, DType::kBFloat16, DType::kFloat32, DType::kFloat64};
  return {DType::kUInt8, DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16, DType::kInt32, DType::kInt64};
}

std::vector<ReduceOp> redops_for(OpKind op, size_t count, DType t) {
  if (!is_reduction(op)) return {ReduceOp::kSum};
  if (count > 100000 && t != DType::kFloat32) return {ReduceOp::kSum};
  return {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProd};
}

class AlgorithmSweep : public ::testing::TestWithParam<size_t> {};

TEST_P(AlgorithmSweep, EveryElementMatchesReference) {
  const AlgorithmInfo& info = algorithm_table()[GetParam()];
  const Sweep sweep;
  int failures = 0, cases = 0;
  for (int n : sweep.worlds) {
    for (size_t count : sweep.counts) {
      if (info.op == OpKind::kBarrier && count != 0) continue;
      CollArgs probe;
      probe.op = info.op;
      probe.count = count;
      if (info.applicable != nullptr && !info.applicable(probe, n)) continue;
      std::set<int> roots = {0};
      if (is_rooted(info.op)) roots = {0, n - 1, n / 2};
      for (DType t : dtypes_for(info.op, count)) {
        for (ReduceOp redop : redops_for(info.op, count, t)) {
          for (int root : roots) {
            // A middle root (rotation of the tree) does not depend on the element type.
            if (root != 0 && root != n - 1 && t != DType::kFloat32 && t != DType::kUInt8) continue;
            for (bool inplace : {false, true}) {
              if (inplace && !has_inplace(info.op)) continue;
              // In-place handling does not depend on the element type.
              if (inplace && t != DType::kFloat32 && t != DType::kUInt8) continue;
              // Ops whose buffers hold `count` per rank (x world) keep the large case near 262147 in total.
              size_t cnt = count;
              if (count > 100000 && per_rank_blocks(info.op)) cnt = (count / n) | 1;
              const Case c{&info, n, cnt, t, redop, root, inplace, chunk_for(cnt)};
              ++cases;
              const std::string err = run_case(c);
              if (!err.empty()) {
                ADD_FAILURE() << c.str() << "\n  " << err;
                if (++failures >= 5) return;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 0);
}

std::string param_name(const ::testing::TestParamInfo<size_t>& p) {
  const AlgorithmInfo& info = algorithm_table()[p.param];
  return fmt::format("{}_{}", op_name(info.op), algo_name(info.algo));
}

INSTANTIATE_TEST_SUITE_P(Table, AlgorithmSweep, ::testing::Range<size_t>(0, algorithm_table().size()), param_name);

// The default chunk choice (no TRIDENT_CHUNK_BYTES) splits a large message into several chunks.
TEST(AlgorithmDefaults, LargeMessagesUseDefaultChunking) {
  // 3 ranks x 1.5 MiB blocks: above the 1 MiB single-chunk limit for the ring's blocks and the trees.
  for (Algo algo : {Algo::kRing, Algo::kTree}) {
    for (OpKind op : {OpKind::kAllReduce, OpKind::kBroadcast}) {
      const AlgorithmInfo* info = find_algorithm(op, algo);
      ASSERT_NE(info, nullptr);
      const Case c{info, 3, 3 * ((size_t{3} << 20) / 2 / 4) + 3, DType::kFloat32, ReduceOp::kSum, 2, false, 0};
      EXPECT_EQ(run_case(c), "") << c.str();
    }
  }
}

TEST(AlgorithmRegistry, EveryCollectiveHasAnAlgorithmAndLookupsAgree) {
  for (OpKind op : {OpKind::kBroadcast, OpKind::kReduce, OpKind::kAllReduce, OpKind::kGather, OpKind::kScatter,
                    OpKind::kAllGather, OpKind::kAllGatherV, OpKind::kReduceScatter, OpKind::kAllToAll,
                    OpKind::kBarrier}) {
    const auto algos = algorithms_for(op);
    EXPECT_FALSE(algos.empty()) << op_name(op);
    for (const AlgorithmInfo* a : algos) {
      EXPECT_EQ(a->op, op);
      EXPECT_EQ(find_algorithm(op, a->algo), a) << op_name(op) << " " << algo_name(a->algo);
    }
  }
  EXPECT_EQ(find_algorithm(OpKind::kBarrier, Algo::kRing), nullptr);
  EXPECT_EQ(find_algorithm(OpKind::kSend, Algo::kDirect), nullptr);
  std::set<std::pair<int, int>> seen;
  for (const auto& a : algorithm_table())
    EXPECT_TRUE(seen.insert({static_cast<int>(a.op), static_cast<int>(a.algo)}).second)
        << "duplicate " << op_name(a.op) << " " << algo_name(a.algo);
}

TEST(AlgorithmRegistry, CostsAreZeroAtWorldOneAndGrowWithSize) {
  const LinkCost link;
  for (const auto& a : algorithm_table()) {
    const std::string name = fmt::format("{} {}", op_name(a.op), algo_name(a.algo));
    EXPECT_EQ(a.cost(1 << 20, 1).time(link), 0.0) << name;
    for (int n : {2, 3, 8}) {
      const Cost small = a.cost(8, n), big = a.cost(64 << 20, n);
      EXPECT_GT(small.alpha_terms, 0.0) << name << " world " << n;
      EXPECT_GE(small.beta_bytes, 0.0) << name;
      EXPECT_GE(big.time(link), small.time(link)) << name << " world " << n;
    }
  }
}

// The cost model ranks the textbook choices: recursive doubling beats ring for 8 bytes, and ring beats
// recursive doubling and tree for 64 MiB.
TEST(AlgorithmRegistry, CostModelPrefersLatencyAlgorithmsSmallAndBandwidthAlgorithmsLarge) {
  const LinkCost link;
  auto t = [&](Algo algo, size_t bytes) { return find_algorithm(OpKind::kAllReduce, algo)->cost(bytes, 8).time(link); };
  EXPECT_LT(t(Algo::kRecursiveDoubling, 8), t(Algo::kRing, 8));
  EXPECT_LT(t(Algo::kRing, 64 << 20), t(Algo::kRecursiveDoubling, 64 << 20));
  EXPECT_LT(t(Algo::kRing, 64 << 20), t(Algo::kTree, 64 << 20));
  EXPECT_LT(t(Algo::kRecursiveHalving, 64 << 20), t(Algo::kTree, 64 << 20));
  // Two ranks: one exchange wins for tiny messages; the pipelined ring (reduction overlapped) for large.
  auto t2 = [&](Algo algo, size_t bytes) { return find_algorithm(OpKind::kAllReduce, algo)->cost(bytes, 2).time(link); };
  EXPECT_LT(t2(Algo::kRecursiveDoubling, 8), t2(Algo::kRing, 8));
  EXPECT_LT(t2(Algo::kRing, 64 << 20), t2(Algo::kRecursiveDoubling, 64 << 20));
}

TEST(AlgorithmRegistry, PowerOfTwoOnlyAlgorithmsSayWhereTheyApply) {
  CollArgs a;
  for (OpKind op : {OpKind::kAllGather, OpKind::kReduceScatter}) {
    for (const AlgorithmInfo* info : algorithms_for(op)) {
      if (info->applicable == nullptr) continue;
      a.op = op;
      EXPECT_TRUE(info->applicable(a, 4));
      EXPECT_FALSE(info->applicable(a, 6));
    }
  }
}

TEST(AlgorithmRegistry, SizeBytesFollowNcclTests) {
  CollArgs a;
  a.count = 10;
  a.dtype = DType::kFloat32;
  a.op = OpKind::kAllReduce;
  EXPECT_EQ(size_bytes(a, 4), 40u);
  a.op = OpKind::kAllGather;
  EXPECT_EQ(size_bytes(a, 4), 160u);
  std::vector<size_t> counts = {1, 2, 3};
  a.op = OpKind::kAllGatherV;
  a.counts = &counts;
  EXPECT_EQ(size_bytes(a, 3), 24u);
  a.op = OpKind::kBarrier;
  EXPECT_EQ(size_bytes(a, 3), 0u);
}

}  // namespace
}  // namespace trident
