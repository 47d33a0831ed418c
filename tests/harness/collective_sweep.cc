#include "harness/collective_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "harness/keep_freed_memory.h"
#include "harness/multiproc.h"
#include "trident/comm/algorithms/algorithm.h"
#include "trident/core/error.h"

namespace trident::testing {
namespace {

const bool kKeepFreedMemory = keep_freed_memory();

// ---- typed access through double (all test values are exactly representable) ----
double load(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kFloat64: return static_cast<const double*>(p)[i];
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kFloat16: return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kUInt8: return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}
void store_v(void* p, DType t, size_t i, double v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(p)[i] = v; break;
    case DType::kBFloat16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::kFloat16: static_cast<uint16_t*>(p)[i] = float_to_fp16(static_cast<float>(v)); break;
    case DType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DType::kUInt8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
  }
}

// Input of `rank` at element i, for a given seed and op: small integers; for prod, +-1 and 2.
double input(int rank, size_t i, uint32_t seed, ReduceOp op, DType t) {
  uint64_t h = (static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ULL) ^ (i * 0xBF58476D1CE4E5B9ULL) ^ seed;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBULL;
  h ^= h >> 29;
  if (t == DType::kUInt8) return static_cast<double>(h % 251);
  if (op == ReduceOp::kProd) {
    int k = static_cast<int>(h % 4);
    return k == 0 ? 2.0 : (k == 1 ? -1.0 : 1.0);
  }
  return static_cast<double>(static_cast<int>(h % 11) - 5);
}

// Reference reduction of all ranks' inputs at element i, rounded as the backend rounds.
double expected_reduce(int size, size_t i, uint32_t seed, ReduceOp op, DType t) {
  double acc = input(0, i, seed, op, t);
  for (int r = 1; r < size; ++r) {
    double v = input(r, i, seed, op, t);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
    }
  }
  if (op == ReduceOp::kAvg && size > 1) {
    switch (t) {
      case DType::kFloat32: return static_cast<float>(acc) / static_cast<float>(size);
      case DType::kBFloat16: return bf16_to_float(float_to_bf16(static_cast<float>(acc) / static_cast<float>(size)));
      case DType::kFloat16: return fp16_to_float(float_to_fp16(static_cast<float>(acc) / static_cast<float>(size)));
      case DType::kFloat64: return acc / size;
      default: return static_cast<double>(static_cast<int64_t>(acc) / size);  // truncation toward zero
    }
  }
  return acc;
}

struct Sweep {
  int rank, size;
  ProcessGroup& pg;
  const SweepOptions& opts;
  long checked = 0;
  long collectives = 0;

  void expect_eq(const void* buf, DType t, size_t i, double want, const std::string& what) {
    double got = load(buf, t, i);
    ++checked;
    if (got != want && !(std::isnan(got) && std::isnan(want)))
      rank_fail(fmt::format("rank {}: {}: element {} is {}, expected {}", rank, what, i, got, want));
  }

  std::vector<Algo> algos(OpKind op) {
    std::vector<Algo> out{Algo::kAuto};
    if (opts.all_algorithms)
      for (auto* a : algorithms_for(op)) out.push_back(a->algo);
    return out;
  }

  // A call's buffer, one guard byte past the end (0xCD): private memory, or the group's registered memory
  // (opts.shared_buffers, where the group has it), fresh for every call.
  struct Buf {
    std::vector<uint8_t> own;
    std::shared_ptr<RegisteredBuffer> shm;
    uint8_t* p = nullptr;
    size_t bytes = 0;
    uint8_t* data() { return p; }
    uint8_t& operator[](size_t i) { return p[i]; }
    std::vector<uint8_t> contents() const { return std::vector<uint8_t>(p, p + bytes); }
  };
  Buf buffer(size_t elems, DType t) {
    Buf b;
    b.bytes = elems * dtype_size(t) + 1;
    if (opts.shared_buffers) b.shm = pg.alloc_shared(b.bytes);
    if (b.shm) {
      b.p = static_cast<uint8_t*>(b.shm->data());
    } else {
      b.own.resize(b.bytes);
      b.p = b.own.data();
    }
    std::memset(b.p, 0xCD, b.bytes);
    return b;
  }

  void run(OpKind op, Algo algo, DType t, ReduceOp rop, size_t n, int root, uint32_t seed) {
    CallOptions o;
    o.algo = algo;
    const size_t es = dtype_size(t);
    std::string what = fmt::format("{} algo={} dtype={} op={} count={} root={} world={}", op_name(op), algo_name(algo),
                                   dtype_name(t), reduce_op_name(rop), n, root, size);
    CollArgs probe;
    probe.op = op;
    probe.count = n;
    probe.dtype = t;
    probe.redop = rop;
    if (algo != Algo::kAuto && opts.all_algorithms) {
      const AlgorithmInfo* info = find_algorithm(op, algo);
      if (info->applicable && !info->applicable(probe, size)) return;
    }
    ++collectives;
    switch (op) {
      case OpKind::kAllReduce: {
        auto src = buffer(n, t), dst = buffer(n, t);
        for (size_t i = 0; i < n; ++i) store_v(src.data(), t, i, input(rank, i, seed, rop, t));
        bool inplace = (seed & 1) == 0;
        if (inplace) pg.all_reduce(src.data(), n, t, rop, o);
        else pg.all_reduce(src.data(), dst.data(), n, t, rop, o);
        const void* out = inplace ? src.data() : dst.data();
        for (size_t i = 0; i < n; ++i) expect_eq(out, t, i, expected_reduce(size, i, seed, rop, t), what);
        TRIDENT_RANK_CHECK((inplace ? src : dst)[n * es] == 0xCD, "{}: wrote past the end", what);
        break;
      }
      case OpKind::kReduce: {
        auto src = buffer(n, t), dst = buffer(n, t);
        for (size_t i = 0; i < n; ++i) store_v(src.data(), t, i, input(rank, i, seed, rop, t));
        const auto copy = src.contents();
        pg.reduce(src.data(), dst.data(), n, t, rop, root, o);
        TRIDENT_RANK_CHECK(src.contents() == copy, "{}: the send buffer was modified", what);
        if (rank == root)
          for (size_t i = 0; i < n; ++i) expect_eq(dst.data(), t, i, expected_reduce(size, i, seed, rop, t), what);
        break;
      }
      case OpKind::kBroadcast: {
        auto buf = buffer(n, t);
        if (rank == root)
          for (size_t i = 0; i < n; ++i) store_v(buf.data(), t, i, input(root, i, seed, rop, t));
        pg.broadcast(buf.data(), n, t, root, o);
        for (size_t i = 0; i < n; ++i) expect_eq(buf.data(), t, i, input(root, i, seed, rop, t), what);
        break;
      }
      case OpKind::kAllGather: {
        auto src = buffer(n, t), dst = buffer(n * size, t);
        for (size_t i = 0; i < n; ++i) store_v(src.data(), t, i, input(rank, i, seed, rop, t));
        pg.all_gather(src.data(), dst.data(), n, t, o);
        for (int r = 0; r < size; ++r)
          for (size_t i = 0; i < n; ++i) expect_eq(dst.data(), t, r * n + i, input(r, i, seed, rop, t), what);
        TRIDENT_RANK_CHECK(dst[n * size * es] == 0xCD, "{}: wrote past the end", what);
        break;
      }
      case OpKind::kAllGatherV: {
        std::vector<size_t> counts(size);
        for (int r = 0; r < size; ++r) counts[r] = (r % 3 == 1) ? 0 : n + static_cast<size_t>(r);  // some ranks send nothing
        size_t total = 0;
        for (auto c : counts) total += c;
        auto src = buffer(counts[rank], t), dst = buffer(total, t);
        for (size_t i = 0; i < counts[rank]; ++i) store_v(src.data(), t, i, input(rank, i, seed, rop, t));
        pg.all_gatherv(src.data(), dst.data(), counts, t, o);
        size_t off = 0;
        for (int r = 0; r < size; ++r) {
          for (size_t i = 0; i < counts[r]; ++i) expect_eq(dst.data(), t, off + i, input(r, i, seed, rop, t), what);
          off += counts[r];
        }
        break;
      }
      case OpKind::kReduceScatter: {
        auto src = buffer(n * size, t), dst = buffer(n, t);
        for (size_t i = 0; i < n * size; ++i) store_v(src.data(), t, i, input(rank, i, seed, rop, t));
        pg.reduce_scatter(src.data(), dst.data(), n, t, rop, o);
        for (size_t i = 0; i < n; ++i)
          expect_eq(dst.data(), t, i, expected_reduce(size, rank * n + i, seed, rop, t), what);
        break;
      }
      case OpKind::kGather: {
        auto src = buffer(n, t), dst = buffer(n * size, t);
        for (size_t i = 0; i < n; ++i) store_v(src.data(), t, i, input(rank, i, seed, rop, t));
        pg.gather(src.data(), dst.data(), n, t, root, o);
        if (rank == root)
          for (int r = 0; r < size; ++r)
            for (size_t i = 0; i < n; ++i) expect_eq(dst.data(), t, r * n + i, input(r, i, seed, rop, t), what);
        break;
      }
      case OpKind::kScatter: {
        auto src = buffer(n * size, t), dst = buffer(n, t);
        if (rank == root)
          for (size_t i = 0; i < n * size; ++i) store_v(src.data(), t, i, input(1000 + static_cast<int>(i / std::max<size_t>(n, 1)), i, seed, rop, t));
        pg.scatter(src.data(), dst.data(), n, t, root, o);
        for (size_t i = 0; i < n; ++i)
          expect_eq(dst.data(), t, i, input(1000 + rank, rank * n + i, seed, rop, t), what);
        break;
      }
      case OpKind::kAllToAll: {
        auto src = buffer(n * size, t), dst = buffer(n * size, t);
        // Block j of rank r's input carries (r, j).
        for (int j = 0; j < size; ++j)
          for (size_t i = 0; i < n; ++i) store_v(src.data(), t, j * n + i, input(rank * 100 + j, i, seed, rop, t));
        const bool inplace = (seed & 1) == 0;  // every other call: send == recv
        if (inplace) pg.all_to_all(src.data(), src.data(), n, t, o);
        else pg.all_to_all(src.data(), dst.data(), n, t, o);
        const void* out = inplace ? src.data() : dst.data();
        for (int j = 0; j < size; ++j)
          for (size_t i = 0; i < n; ++i) expect_eq(out, t, j * n + i, input(j * 100 + rank, i, seed, rop, t), what);
        break;
      }
      case OpKind::kBarrier:
        pg.barrier(o);
        break;
      default:
        break;
    }
  }
};

const std::vector<DType> kAllTypes = {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16,
                                      DType::kInt32,   DType::kInt64,   DType::kUInt8};
const std::vector<ReduceOp> kAllOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProd};

}  // namespace

void run_collective_sweep(ProcessGroup& group, const SweepOptions& opts) {
  ProcessGroup* pg = &group;
  const int rank = group.rank(), size = group.size();
  Sweep s{rank, size, *pg, opts};
  uint32_t seed = 1;
  const std::vector<OpKind> reducing = {OpKind::kAllReduce, OpKind::kReduce, OpKind::kReduceScatter};
  const std::vector<OpKind> moving = {OpKind::kBroadcast, OpKind::kGather, OpKind::kScatter, OpKind::kAllGather,
                                      OpKind::kAllGatherV, OpKind::kAllToAll};
  const std::vector<size_t> small = {0, 1, 7, 1023};
  const size_t large = (size_t(1) << 20) + 3;
  std::vector<int> roots = {0};
  if (size > 1) roots.push_back(size - 1);
  for (OpKind op : reducing) {
    for (Algo algo : s.algos(op)) {
      for (DType t : kAllTypes) {
        if (t == DType::kUInt8) continue;
        for (ReduceOp rop : kAllOps)
          for (size_t n : small)
            for (int root : (op == OpKind::kReduce ? roots : std::vector<int>{0})) s.run(op, algo, t, rop, n, root, ++seed);
      }
      if (opts.large)
        for (DType t : {DType::kFloat32, DType::kBFloat16})
        s.run(op, algo, t, ReduceOp::kSum, op == OpKind::kReduceScatter ? large / size : large, 0, ++seed);
    }
  }
  for (OpKind op : moving) {
    for (Algo algo : s.algos(op)) {
      for (DType t : kAllTypes)
        for (size_t n : small)
          for (int root : roots) s.run(op, algo, t, ReduceOp::kSum, n, root, ++seed);
      size_t n = (op == OpKind::kAllGather || op == OpKind::kAllToAll || op == OpKind::kGather ||
                  op == OpKind::kScatter || op == OpKind::kAllGatherV)
                     ? large / size
                     : large;
      if (opts.large) s.run(op, algo, DType::kFloat32, ReduceOp::kSum, n, size - 1, ++seed);
    }
  }
  for (Algo algo : s.algos(OpKind::kBarrier)) s.run(OpKind::kBarrier, algo, DType::kFloat32, ReduceOp::kSum, 0, 0, ++seed);
  TRIDENT_RANK_CHECK(s.collectives > 100, "only {} collectives ran", s.collectives);
  // Tagged point-to-point, received in the opposite order of sending.
  if (size > 1) {
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    std::vector<int32_t> a(7, rank), b(1023, rank * 2), ra(7), rb(1023);
    auto w1 = pg->send_async(a.data(), a.size(), DType::kInt32, next, 1);
    auto w2 = pg->send_async(b.data(), b.size(), DType::kInt32, next, 2);
    pg->recv(rb.data(), rb.size(), DType::kInt32, prev, 2);
    pg->recv(ra.data(), ra.size(), DType::kInt32, prev, 1);
    w1->wait();
    w2->wait();
    for (auto v : ra) TRIDENT_RANK_CHECK(v == prev, "p2p tag 1 got {} want {}", v, prev);
    for (auto v : rb) TRIDENT_RANK_CHECK(v == prev * 2, "p2p tag 2 got {} want {}", v, prev * 2);
  }
  pg->barrier();
}


}  // namespace trident::testing
