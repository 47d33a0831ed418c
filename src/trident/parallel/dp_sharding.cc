#include "trident/parallel/dp_sharding.h"

#include <algorithm>

#include "trident/comm/collective.h"
#include "trident/core/error.h"
#include "trident/core/timeline.h"
#include "trident/nn/flat_model.h"
#include "trident/parallel/dp_storage.h"

namespace trident::parallel {

Strategy parse_strategy(const std::string& n) {
  if (n == "ddp") return Strategy::kDdp;
  if (n == "zero1") return Strategy::kZero1;
  if (n == "zero2") return Strategy::kZero2;
  if (n == "zero3") return Strategy::kZero3;
  TRIDENT_THROW(InvalidArgument, "unknown data-parallel strategy '{}'; use ddp, zero1, zero2 or zero3", n);
}

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kDdp: return "ddp";
    case Strategy::kZero1: return "zero1";
    case Strategy::kZero2: return "zero2";
    case Strategy::kZero3: return "zero3";
  }
  return "?";
}

double CommStats::total() const {
  double t = 0;
  for (auto& [k, v] : bytes) t += v;
  return t;
}

namespace detail {

void DpContext::account(OpKind op, double size_bytes) {
  const std::string kind = op_name(op);
  stats.bytes[kind] += bus_bytes(op, size_bytes, world);
  stats.calls[kind] += 1;
}

void DpContext::release(float* p, size_t count) const {
  if (on_cpu()) nn::release_pages(p, count);
  else ops.memset_zero(p, count * sizeof(float));
}

}  // namespace detail

namespace {

char* bytes(void* p) { return static_cast<char*>(p); }

}  // namespace

void ShardingStrategy::scatter_state(const kernels::DeviceOps& mem, const float* full, float* state) const {
  mem.memset_zero(state, state_numel_ * sizeof(float));
  for (const auto& p : owned_) mem.copy(state + p.offset, full + p.flat_begin, p.count * sizeof(float));
}

std::shared_ptr<Work> ShardingStrategy::gather_param_unit(size_t, StoragePolicy&) {
  TRIDENT_THROW(Unsupported, "data parallel: {} keeps whole parameters; there is no unit to gather",
                strategy_name(kind()));
}

void ShardingStrategy::gather_state_range(const float* state, size_t begin, size_t count, float* dst) {
  const ShardUnit* u = nullptr;
  for (const auto& x : units_)
    if (x.begin <= begin && begin < x.end) u = &x;
  TRIDENT_CHECK(u != nullptr && begin + count <= u->end, InvalidArgument,
                "data parallel {}: elements [{}, {}) are not inside one unit of the shards", strategy_name(kind()),
                begin, begin + count);
  const size_t end = begin + count;
  std::vector<size_t> counts(static_cast<size_t>(c_.world));
  for (int r = 0; r < c_.world; ++r) {  // rank r's piece is [u.begin + r piece, + piece), clipped to the unit
    const size_t lo = std::min(u->end, u->begin + static_cast<size_t>(r) * u->piece);
    const size_t hi = std::min(u->end, lo + u->piece);
    counts[static_cast<size_t>(r)] = std::max(lo, begin) < std::min(hi, end) ? std::min(hi, end) - std::max(lo, begin) : 0;
  }
  const size_t mine_lo = std::min(u->end, u->begin + static_cast<size_t>(c_.rank) * u->piece);
  const size_t from = std::max(mine_lo, begin);
  const float* send = state + u->shard_offset + (from > mine_lo ? from - mine_lo : 0);
  c_.pg->all_gatherv(send, dst, counts, DType::kFloat32);
}

void ShardingStrategy::build_units(const std::vector<GradBucket>& buckets) {
  const int N = c_.world;
  units_.resize(buckets.size());
  counts_.resize(buckets.size());
  owned_.clear();
  size_t off = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    ShardUnit& u = units_[i];
    u.begin = buckets[i].begin;
    u.end = buckets[i].end;
    const size_t L = u.end - u.begin;
    u.piece = (L + N - 1) / N;
    u.shard_offset = off;
    off += u.piece;
    const size_t lo = std::min(L, c_.rank * u.piece), hi = std::min(L, (c_.rank + 1) * u.piece);
    u.mine_begin = u.begin + lo;
    u.mine_count = hi - lo;
    counts_[i].resize(N);
    for (int r = 0; r < N; ++r) counts_[i][r] = std::min(L, (r + 1) * u.piece) - std::min(L, r * u.piece);
    owned_.push_back({u.mine_begin, u.mine_count, u.shard_offset});
  }
  shard_numel_ = state_numel_ = off;
}

namespace {

// Every rank holds and updates everything; buckets are all-reduced (avg) in place.
class Ddp : public ShardingStrategy {
 public:
  using ShardingStrategy::ShardingStrategy;
  Strategy kind() const override { return Strategy::kDdp; }

  BucketLayout layout(size_t first_cap, size_t cap, const BucketLayout*) override {
    shard_begin_ = 0;
    shard_end_ = c_.n;
    own_range();
    return reverse_order_buckets(c_.model.parameters(), c_.n, first_cap, cap);
  }

  std::shared_ptr<Work> reduce(size_t, GradBucket& b, StoragePolicy& s) override {
    void* src = s.all_reduce_source(b);
    if (c_.world == 1) return nullptr;
    const size_t count = b.end - b.begin;
    c_.account(OpKind::kAllReduce, static_cast<double>(count * s.elem()));
    return c_.pg->all_reduce_async(src, count, s.dtype(), ReduceOp::kAvg);
  }

  double grad_sq_norm(StoragePolicy& s) override { return s.sum_squares(s.full_grads(), c_.n); }

  void update(StoragePolicy& s, float lr) override {
    s.update(owned_[0], bytes(s.params_full()) + owned_[0].flat_begin * s.elem(), lr);
  }

  void gather_state(const kernels::DeviceOps& mem, const float* state, float* full) override {
    mem.copy(full, state, c_.n * sizeof(float));
  }

 protected:
  void own_range() {
    owned_ = {{shard_begin_, shard_end_ - shard_begin_, 0}};
    state_numel_ = shard_end_ - shard_begin_;
  }
};

// ddp's buckets and all-reduce; each rank owns one contiguous N-th of the (padded) flat buffer, updates
// it and all-gathers the parameters.
class Zero1 : public Ddp {
 public:
  using Ddp::Ddp;
  Strategy kind() const override { return Strategy::kZero1; }

  BucketLayout layout(size_t first_cap, size_t cap, const BucketLayout*) override {
    const size_t s = c_.padded / c_.world;
    shard_begin_ = std::min(c_.n, c_.rank * s);
    shard_end_ = std::min(c_.n, (c_.rank + 1) * s);
    own_range();
    return reverse_order_buckets(c_.model.parameters(), c_.n, first_cap, cap);
  }

  void update(StoragePolicy& st, float lr) override {
    const size_t e = st.elem(), s = c_.padded / c_.world, n = c_.n;
    char* full = bytes(st.params_full());
    const OwnedPiece& mine = owned_[0];
    if (c_.world == 1 || st.params_full_capacity() >= c_.padded) {
      // In place: this rank's block of the stored buffer is its updated shard (no staging).
      st.update(mine, full + shard_begin_ * e, lr);
      if (c_.world == 1) return;
      ScopedSpan span(SpanKind::kComm, "all_gather(dp params)");
      c_.pg->all_gather(full + shard_begin_ * e, full, s, st.dtype());
    } else {  // the buffer is shorter than world x shard: gather through padded staging
      kernels::DeviceArray<char> stage(c_.ops, s * e), all(c_.ops, c_.padded * e);
      st.update(mine, stage.data(), lr);
      {
        ScopedSpan span(SpanKind::kComm, "all_gather(dp params)");
        c_.pg->all_gather(stage.data(), all.data(), s, st.dtype());
      }
      c_.ops.copy(full, all.data(), n * e);
    }
    c_.account(OpKind::kAllGather, static_cast<double>(c_.padded * e));
  }

  void gather_state(const kernels::DeviceOps& mem, const float* state, float* full) override {
    const size_t s = c_.padded / c_.world;
    kernels::DeviceArray<float> stage(mem, s), all(mem, c_.padded);
    mem.copy(stage.data(), state, state_numel_ * sizeof(float));
    c_.pg->all_gather(stage.data(), all.data(), s, DType::kFloat32);
    mem.copy(full, all.data(), c_.n * sizeof(float));
  }
};

// Buckets are fixed-size chunks of the flat buffer (a multiple of N elements, counted from the top, so
// only the lowest chunk is padded: the shard is exactly padded/N elements), reduce-scattered (avg) into
// this rank's gradient shard; the bucket's full-gradient pages then go back. AdamW on the shard, then the
// parameters are all-gathered unit by unit.
class Zero2 : public ShardingStrategy {
 public:
  using ShardingStrategy::ShardingStrategy;
  Strategy kind() const override { return Strategy::kZero2; }

  BucketLayout layout(size_t, size_t cap, const BucketLayout*) override {
    const size_t N = static_cast<size_t>(c_.world);
    size_t C = std::max<size_t>(16, cap);
    C = (C + N - 1) / N * N;
    BucketLayout l = fixed_chunks(c_.model.parameters(), c_.n, C);
    build_units(l.buckets);
    return l;
  }

  std::shared_ptr<Work> reduce(size_t i, GradBucket&, StoragePolicy& s) override {
    const ShardUnit& u = units_[i];
    void* src = s.reduce_scatter_source(i, u);
    c_.account(OpKind::kReduceScatter, static_cast<double>(u.piece * static_cast<size_t>(c_.world) * s.elem()));
    return c_.pg->reduce_scatter_async(src, bytes(s.grad_shard()) + u.shard_offset * s.elem(), u.piece, s.dtype(),
                                       ReduceOp::kAvg);
  }

  double grad_sq_norm(StoragePolicy& s) override {
    double sq = 0;
    for (const auto& u : units_) sq += s.sum_squares(bytes(s.grad_shard()) + u.shard_offset * s.elem(), u.mine_count);
    if (c_.world > 1) {
      ScopedSpan span(SpanKind::kComm, "all_reduce(dp grad norm)");
      c_.pg->all_reduce(&sq, 1, DType::kFloat64, ReduceOp::kSum);
    }
    return sq;
  }

  void update(StoragePolicy& s, float lr) override {
    const size_t e = s.elem();
    char* full = bytes(s.params_full());
    if (c_.world == 1) {
      for (const auto& p : owned_) s.update(p, full + p.flat_begin * e, lr);
      return;
    }
    kernels::DeviceArray<char> mine(c_.ops, shard_numel_ * e);
    for (const auto& p : owned_) s.update(p, mine.data() + p.offset * e, lr);
    std::vector<std::shared_ptr<Work>> works;
    for (size_t i = 0; i < units_.size(); ++i) {
      const auto& u = units_[i];
      works.push_back(c_.pg->all_gatherv_async(mine.data() + u.shard_offset * e, full + u.begin * e, counts_[i], s.dtype()));
      c_.account(OpKind::kAllGather, static_cast<double>(u.piece * static_cast<size_t>(c_.world) * e));
    }
    ScopedSpan span(SpanKind::kComm, "all_gather(dp params)");
    for (auto& w : works) w->wait();
  }

  void gather_state(const kernels::DeviceOps&, const float* state, float* full) override {
    for (size_t i = 0; i < units_.size(); ++i)
      c_.pg->all_gatherv(state + units_[i].shard_offset, full + units_[i].begin, counts_[i], DType::kFloat32);
  }
};

// zero2's reduce-scatter, with the parameters sharded too: a bucket is a "unit" (the parameters one model
// block owns); each rank keeps only its piece of every unit and the model's flat parameter buffer is a
// working buffer into which DataParallel's block schedule gathers units (gather_param_unit) before use.
class Zero3 : public Zero2 {
 public:
  using Zero2::Zero2;
  Strategy kind() const override { return Strategy::kZero3; }

  BucketLayout layout(size_t, size_t, const BucketLayout* param_units) override {
    TRIDENT_CHECK(param_units != nullptr, InvalidArgument, "zero3: the parameter units must be built first");
    BucketLayout l = *param_units;
    build_units(l.buckets);
    return l;
  }

  void update(StoragePolicy& s, float lr) override {
    char* shard = bytes(s.params_shard());
    for (const auto& p : owned_) s.update(p, shard + p.offset * s.elem(), lr);
  }

  std::shared_ptr<Work> gather_param_unit(size_t ui, StoragePolicy& s) override {
    const ShardUnit& u = units_[ui];
    c_.account(OpKind::kAllGather, static_cast<double>(u.piece * static_cast<size_t>(c_.world) * s.elem()));
    return c_.pg->all_gatherv_async(bytes(s.params_shard()) + u.shard_offset * s.elem(), s.param_gather_dst(u),
                                    counts_[ui], s.dtype());
  }
};

}  // namespace

std::unique_ptr<ShardingStrategy> make_sharding(Strategy s, detail::DpContext& c) {
  switch (s) {
    case Strategy::kDdp: return std::make_unique<Ddp>(c);
    case Strategy::kZero1: return std::make_unique<Zero1>(c);
    case Strategy::kZero2: return std::make_unique<Zero2>(c);
    case Strategy::kZero3: return std::make_unique<Zero3>(c);
  }
  TRIDENT_THROW(InvalidArgument, "unknown data-parallel strategy");
}

}  // namespace trident::parallel
