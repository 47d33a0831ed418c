#include "trident/parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/core/timeline.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/nn/flat_model.h"

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

double MemoryReport::total() const {
  double t = 0;
  for (auto& [k, v] : bytes) t += v;
  return t;
}

namespace {

constexpr size_t kChunk = 2048;  // elements converted at a time through stack scratch

// bf16 values stored at byte offset 2L of the float32 range p[0, L) widened in place to p[0, L). Forward in
// chunks, each read (into scratch) before it is written: writing float i (bytes [4i, 4i+4)) overwrites only
// bf16 elements j <= i (bytes [2L+2j, 2L+2j+2)), all read by then. memcpy keeps the compiler from
// reordering the typed loads and stores across each other.
void widen_in_place(float* p, size_t L) {
  char* base = reinterpret_cast<char*>(p);
  uint16_t h[kChunk];
  float f[kChunk];
  for (size_t i = 0; i < L; i += kChunk) {
    const size_t w = std::min(kChunk, L - i);
    std::memcpy(h, base + 2 * L + 2 * i, 2 * w);
    kernels::cpu::from_bf16(f, h, w);
    std::memcpy(base + 4 * i, f, 4 * w);
  }
}

// float32 p[0, L) rounded to bf16 in place into the first 2L bytes (forward: writing bf16 i, bytes
// [2i, 2i+2), overwrites only floats j <= i/2, already read).
void narrow_in_place(float* p, size_t L) {
  char* base = reinterpret_cast<char*>(p);
  uint16_t h[kChunk];
  float f[kChunk];
  for (size_t i = 0; i < L; i += kChunk) {
    const size_t w = std::min(kChunk, L - i);
    std::memcpy(f, base + 4 * i, 4 * w);
    kernels::cpu::to_bf16(h, f, w);
    std::memcpy(base + 2 * i, h, 2 * w);
  }
}

double sum_squares_bf16(const uint16_t* x, size_t n) {
  float f[kChunk];
  double s = 0;
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t w = std::min(kChunk, n - i);
    kernels::cpu::from_bf16(f, x + i, w);
    s += kernels::cpu::sum_squares(f, w);
  }
  return s;
}

double resident(const void* p, size_t bytes) { return static_cast<double>(nn::resident_bytes(p, bytes)); }

}  // namespace

DataParallel::DataParallel(nn::Model& model, std::shared_ptr<ProcessGroup> pg, DataParallelOptions options)
    : model_(model), pg_(std::move(pg)), options_(options), rank_(pg_->rank()), world_(pg_->size()) {
  TRIDENT_CHECK(options_.storage_dtype == DType::kFloat32 || options_.storage_dtype == DType::kBFloat16, InvalidArgument,
                "data parallel: storage dtype {} is not supported; use float32 or bfloat16 (--param_dtype)",
                dtype_name(options_.storage_dtype));
  const size_t n = model_.num_params();
  padded_ = (n + world_ - 1) / world_ * world_;
  if (options_.strategy == Strategy::kDdp) {
    shard_begin_ = 0;
    shard_end_ = n;
  } else if (options_.strategy == Strategy::kZero1) {
    size_t s = padded_ / world_;
    shard_begin_ = std::min(n, rank_ * s);
    shard_end_ = std::min(n, (rank_ + 1) * s);
  }
  const auto& params = model_.parameters();
  bucket_of_param_.assign(params.size(), -1);
  if (options_.strategy == Strategy::kZero3) {
    build_zero3_units();
  } else if (options_.strategy == Strategy::kZero2) {
    // Fixed-size chunks of the flat buffer from the top, each a multiple of N elements, so only the lowest
    // (partial) chunk has padding: the shard is padded/N elements and the volumes are exactly the
    // textbook's. A chunk is ready when every parameter overlapping it is.
    const size_t n = model_.num_params();
    size_t C = std::max<size_t>(16, options_.bucket_bytes / sizeof(float));
    C = (C + world_ - 1) / world_ * world_;
    for (size_t hi = n; hi > 0;) {
      const size_t lo = hi > C ? hi - C : 0;
      buckets_.push_back(Bucket{lo, hi, 0, 0, nullptr});
      hi = lo;
    }
    param_buckets_.resize(params.size());
    for (size_t k = 0; k < params.size(); ++k) {
      const auto& p = params[k];
      // Buckets are in descending order: bucket i covers [n - (i+1)C, n - iC) (the last one from 0).
      auto index_of = [&](size_t e) { return static_cast<int>((n - 1 - e) / C); };
      if (p.numel == 0) continue;
      const int first = index_of(p.offset + p.numel - 1), last = index_of(p.offset);
      param_buckets_[k] = {first, last};
      for (int b = first; b <= last; ++b) buckets_[b].params++;
      bucket_of_param_[k] = first;
    }
  } else {
    // Buckets in reverse parameter order (the order backward produces gradients). A bucket is a contiguous
    // range of the flat buffer because parameters are laid out in order.
    const size_t cap = std::max<size_t>(1, options_.bucket_bytes / sizeof(float));
    for (size_t k = params.size(); k-- > 0;) {
      const auto& p = params[k];
      size_t lo = p.offset, hi = p.offset + p.numel;
      if (buckets_.empty() || buckets_.back().end - buckets_.back().begin >= cap) {
        buckets_.push_back(Bucket{lo, hi, 0, 0, nullptr});
      }
      Bucket& b = buckets_.back();
      b.begin = std::min(b.begin, lo);
      b.end = std::max(b.end, hi);
      b.params++;
      bucket_of_param_[k] = static_cast<int>(buckets_.size() - 1);
    }
    // The first bucket also covers the alignment padding after the last parameter, and each bucket the
    // padding between its parameters and the next bucket's, so buckets tile [0, n) exactly.
    if (!buckets_.empty()) {
      buckets_.front().end = n;
      for (size_t i = 1; i < buckets_.size(); ++i) buckets_[i].end = buckets_[i - 1].begin;
      buckets_.back().begin = 0;
    }
  }
  for (auto& b : buckets_) b.pending = b.params;
  timings_.assign(buckets_.size(), BucketTiming{});
  if (sharded_grads()) build_units_from_buckets();
  if (bf16() && options_.strategy != Strategy::kZero3) {
    if (model_.blocks().empty()) always_materialized_ = true;  // no hooks: the model stays materialised
    else build_param_units();
  }
  model_.set_grad_ready_hook([this](size_t idx) { on_grad_ready(idx); });

  // Optimizer state for this rank's shard only.
  const size_t opt_n = sharded_grads() ? shard_numel_ : shard_end_ - shard_begin_;
  exp_avg_.assign(opt_n, 0.0f);
  exp_avg_sq_.assign(opt_n, 0.0f);
  {
    std::vector<uint8_t> mask(n, 0);
    for (const auto& p : params)
      if (p.weight_decay) std::fill(mask.begin() + p.offset, mask.begin() + p.offset + p.numel, 1);
    for (size_t i = 0; i < n;) {
      size_t j = i;
      while (j < n && mask[j] == mask[i]) ++j;
      decay_segments_.push_back({i, j, mask[i] != 0});
      i = j;
    }
  }
  // Gradients in the group's registered memory: the peers read (and all-reduce writes) them directly.
  const bool share_grads = options_.shared_gradients && world_ > 1 && n > 0;
  if (sharded_grads() && !bf16()) shard_grads_.assign(shard_numel_, 0.0f);
  if (options_.strategy == Strategy::kZero3 && !bf16()) shard_params_.assign(shard_numel_, 0.0f);
  if (bf16()) {
    const bool zero3 = options_.strategy == Strategy::kZero3;
    master_.assign(sharded_grads() ? shard_numel_ : shard_end_ - shard_begin_, 0.0f);
    params16_.assign(zero3 ? shard_numel_ : padded_, 0);
    if (share_grads && !sharded_grads())
      gradients_shared_ = grads16_.assign_shared(shared_buffer(n * sizeof(uint16_t)), n);
    if (!gradients_shared_) grads16_.assign(sharded_grads() ? shard_numel_ : n, 0);
    rs_stage_.clear();  // bf16 reduce-scatters read their own unit's float32 range (2x the bf16 bytes)
    stage16_.resize(units_.size());
    for (size_t i = 0; i < units_.size(); ++i) {
      const size_t L = units_[i].end - units_[i].begin;
      if (world_ * units_[i].piece > 2 * L) stage16_[i].assign(world_ * units_[i].piece, 0);  // tiny unit
    }
  }
  if (share_grads && (!bf16() || sharded_grads()))  // the model's gradient buffer is what is reduced
    if (auto buf = shared_buffer(n * sizeof(float)))
      gradients_shared_ = model_.adopt_grad_storage(static_cast<float*>(buf->data()), buf);
  // Released gradient pages read back as zero: zero_grad need not write (and re-fault) them.
  if (sharded_grads() || bf16()) model_.set_zero_grad_releases_pages(true);
  if (block_hooks()) {
    param_state_.assign(punits_.size(), ParamState::kGathered);  // the model's buffer holds everything now
    gather_work_.resize(punits_.size());
    model_.set_block_hook([this](int b, nn::Model::BlockEvent e) { on_block(b, e); });
  }
  if (rank_ == 0)
    log_info("data parallel: {} on {} ranks, {} parameters ({} padded), {} gradient buckets of <= {} MiB, {} storage{}",
             strategy_name(options_.strategy), world_, n, sharded_grads() ? shard_numel_ * world_ : padded_,
             buckets_.size(), options_.bucket_bytes / double(1 << 20), dtype_name(options_.storage_dtype),
             gradients_shared_ ? ", gradients in shared memory (reduced in place, zero copy)" : "");
}

std::shared_ptr<RegisteredBuffer> DataParallel::shared_buffer(size_t bytes) {
  try {
    return pg_->alloc_shared(bytes);
  } catch (const Error& e) {
    log_warn("data parallel: gradients stay in private memory: {} bytes of registered memory could not be had ({})",
             bytes, e.what());
    return nullptr;
  }
}

// Parameter units: one per run of parameters (in flat order) owned by the same block, a parameter being
// owned by the first block that lists it; punits_ highest offset first (backward's order), tiling [0, n).
void DataParallel::build_param_units() {
  const auto& params = model_.parameters();
  const auto blocks = model_.blocks();
  const char* who = options_.strategy == Strategy::kZero3 ? "zero3" : "bfloat16 storage";
  TRIDENT_CHECK(!blocks.empty(), InvalidArgument,
                "zero3: model kind '{}' does not describe its blocks (nn::Model::blocks()); use zero2, or implement "
                "blocks() and set_block_hook() for it",
                model_.kind());
  const size_t n = model_.num_params();
  std::vector<int> owner(params.size(), -1);
  for (size_t b = 0; b < blocks.size(); ++b)
    for (size_t k : blocks[b].params) {
      TRIDENT_CHECK(k < params.size(), InvalidArgument, "{}: block {} lists parameter {} of {}", who, blocks[b].name, k,
                    params.size());
      if (owner[k] < 0) owner[k] = static_cast<int>(b);
    }
  for (size_t k = 0; k < params.size(); ++k)
    TRIDENT_CHECK(owner[k] >= 0 || params[k].numel == 0, InvalidArgument,
                  "{}: parameter '{}' is in none of the model's blocks, so nothing would materialise it before use; "
                  "list it in the block that reads it (nn::Model::blocks())",
                  who, params[k].name);
  std::vector<size_t> order(params.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return params[a].offset < params[b].offset; });
  // Ascending runs first.
  struct Run {
    size_t begin;
    int owner;
    std::vector<size_t> params;
  };
  std::vector<Run> runs;
  for (size_t k : order) {
    if (runs.empty() || runs.back().owner != owner[k]) runs.push_back({params[k].offset, owner[k], {}});
    runs.back().params.push_back(k);
  }
  const size_t U = runs.size();
  punits_.clear();
  punit_params_.clear();
  std::vector<int> unit_of(params.size(), -1);
  for (size_t i = U; i-- > 0;) {  // reverse: punits_[0] is the highest range
    punits_.emplace_back(i == 0 ? 0 : runs[i].begin, i + 1 == U ? n : runs[i + 1].begin);
    punit_params_.push_back(static_cast<int>(runs[i].params.size()));
    for (size_t k : runs[i].params) unit_of[k] = static_cast<int>(punits_.size() - 1);
  }
  block_units_.assign(blocks.size(), {});
  last_fwd_.assign(U, -1);
  last_bwd_.assign(U, -1);
  for (size_t b = 0; b < blocks.size(); ++b) {
    auto& us = block_units_[b];
    for (size_t k : blocks[b].params) us.push_back(static_cast<size_t>(unit_of[k]));
    std::sort(us.begin(), us.end());
    us.erase(std::unique(us.begin(), us.end()), us.end());
    for (size_t u : us) {
      last_fwd_[u] = std::max(last_fwd_[u], static_cast<int>(b));
      if (last_bwd_[u] < 0) last_bwd_[u] = static_cast<int>(b);  // lowest block index reading u
    }
  }
  punit_of_param_ = std::move(unit_of);
}

// zero3: the gradient buckets are the parameter units.
void DataParallel::build_zero3_units() {
  build_param_units();
  buckets_.clear();
  for (size_t i = 0; i < punits_.size(); ++i)
    buckets_.push_back(Bucket{punits_[i].first, punits_[i].second, 0, punit_params_[i], nullptr});
  bucket_of_param_ = punit_of_param_;
}

void DataParallel::build_units_from_buckets() {
  const size_t n = model_.num_params();
  units_.resize(buckets_.size());
  counts_.resize(buckets_.size());
  size_t off = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    ShardUnit& u = units_[i];
    u.begin = buckets_[i].begin;
    u.end = buckets_[i].end;
    const size_t L = u.end - u.begin;
    u.piece = (L + world_ - 1) / world_;
    u.shard_offset = off;
    off += u.piece;
    const size_t lo = std::min(L, rank_ * u.piece), hi = std::min(L, (rank_ + 1) * u.piece);
    u.mine_begin = u.begin + lo;
    u.mine_count = hi - lo;
    counts_[i].resize(world_);
    for (int r = 0; r < world_; ++r)
      counts_[i][r] = std::min(L, (r + 1) * u.piece) - std::min(L, r * u.piece);
    // The reduce-scatter reads world*piece elements from u.begin: past the unit's end this reads the next
    // (higher, already reduced) unit's gradients into padding lanes; past the buffer it needs staging.
    if (u.begin + world_ * u.piece > n) rs_stage_.resize(std::max(rs_stage_.size(), world_ * u.piece));
  }
  shard_numel_ = off;
}

DataParallel::~DataParallel() {
  model_.set_grad_ready_hook(nullptr);
  if (block_hooks()) model_.set_block_hook(nullptr);
  if (sharded_grads() || bf16()) model_.set_zero_grad_releases_pages(false);
  for (auto& b : buckets_)
    if (b.work) {
      try {
        b.work->wait();
      } catch (const std::exception&) {
      }
    }
  for (auto& w : gather_work_)
    if (w) {
      try {
        w->wait();
      } catch (const std::exception&) {
      }
    }
}

void DataParallel::account(const std::string& kind, double bytes) {
  stats_.bytes[kind] += bytes;
  stats_.calls[kind] += 1;
}

void DataParallel::broadcast_parameters() {
  const size_t n = model_.num_params();
  const bool owns_state = options_.strategy == Strategy::kZero3 || bf16();
  if (owns_state && sharded_) {
    // Parameters live in the shards (bf16: the master copy): rank 0's full model is gathered first, then
    // broadcast.
    gather_full_parameters();
  }
  pg_->broadcast(model_.param_data(), n, DType::kFloat32, 0);
  account("broadcast", rank_ == 0 ? static_cast<double>(n) * 4 : 0.0);
  if (owns_state) {
    sharded_ = false;  // re-take the shards from the broadcast values
    materialized_ = false;
    ensure_sharded();
  }
}

void DataParallel::launch(Bucket& b) {
  const size_t bi = static_cast<size_t>(&b - buckets_.data());
  b.launched_ns = Timeline::now_ns();
  b.launched = true;
  if (bf16()) {
    if (sharded_grads()) {
      // Round the bucket's float32 gradients to bf16 in place (first half of its range), zero the padding
      // lanes up to world x piece, and reduce-scatter (avg) in bf16 into the bf16 shard.
      const ShardUnit& u = units_[bi];
      const size_t L = u.end - u.begin, total = world_ * u.piece;
      float* g = model_.grad_data() + u.begin;
      narrow_in_place(g, L);
      uint16_t* src = reinterpret_cast<uint16_t*>(g);
      if (!stage16_[bi].empty()) {
        std::memcpy(stage16_[bi].data(), src, L * 2);
        src = stage16_[bi].data();
      }
      std::fill(src + L, src + total, uint16_t{0});
      b.work = pg_->reduce_scatter_async(src, grads16_.data() + u.shard_offset, u.piece, DType::kBFloat16, ReduceOp::kAvg);
      account("reduce_scatter", static_cast<double>(world_ - 1) * u.piece * 2);
      return;
    }
    // ddp/zero1: round into the persistent bf16 gradients, hand the float32 pages back, all-reduce in place.
    const size_t count = b.end - b.begin;
    kernels::cpu::to_bf16(grads16_.data() + b.begin, model_.grad_data() + b.begin, count);
    nn::release_pages(model_.grad_data() + b.begin, count);
    b.grads_released = true;
    if (world_ == 1) return;
    b.work = pg_->all_reduce_async(grads16_.data() + b.begin, count, DType::kBFloat16, ReduceOp::kAvg);
    account("all_reduce", 2.0 * (world_ - 1) / world_ * count * 2);
    return;
  }
  if (sharded_grads()) {
    const ShardUnit& u = units_[bi];
    const float* src = model_.grad_data() + u.begin;
    if (u.begin + world_ * u.piece > model_.num_params()) {
      std::memcpy(rs_stage_.data(), src, (u.end - u.begin) * sizeof(float));
      std::fill(rs_stage_.begin() + static_cast<long>(u.end - u.begin), rs_stage_.begin() + static_cast<long>(world_ * u.piece),
                0.0f);
      src = rs_stage_.data();
    }
    b.work = pg_->reduce_scatter_async(src, shard_grads_.data() + u.shard_offset, u.piece, DType::kFloat32, ReduceOp::kAvg);
    account("reduce_scatter", static_cast<double>(world_ - 1) * u.piece * 4);
    return;
  }
  if (world_ == 1) return;
  float* g = model_.grad_data() + b.begin;
  const size_t count = b.end - b.begin;
  b.work = pg_->all_reduce_async(g, count, DType::kFloat32, ReduceOp::kAvg);
  account("all_reduce", 2.0 * (world_ - 1) / world_ * count * 4);
}

// zero2/3: hands back the full-gradient pages of every bucket whose reduce-scatter has finished (waiting
// for all of them when `wait`).
void DataParallel::release_finished_grads(bool wait) {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (!b.work || b.grads_released) continue;
    if (wait) b.work->wait();
    else if (!b.work->completed()) continue;
    b.work->wait();  // rethrows a failure
    nn::release_pages(model_.grad_data() + b.begin, b.end - b.begin);
    b.grads_released = true;
  }
}

void DataParallel::on_grad_ready(size_t idx) {
  if (!require_sync_) return;
  if (window_begin_ns_ == 0) window_begin_ns_ = Timeline::now_ns();  // backward of the syncing micro-step
  int first = bucket_of_param_[idx], last = first;
  if (first < 0) return;
  if (!param_buckets_.empty()) std::tie(first, last) = param_buckets_[idx];
  for (int bi = first; bi <= last; ++bi) {
    Bucket& b = buckets_[bi];
    if (--b.pending == 0 && options_.overlap) {
      launch(b);
      launched_any_ = true;
    }
  }
  if (sharded_grads()) release_finished_grads(false);
}

void DataParallel::finish_gradient_sync() {
  if (!require_sync_) return;
  const int64_t window_end = Timeline::now_ns();  // backward is over (before any non-overlapped launch)
  for (auto& b : buckets_)
    if (!b.launched && (world_ > 1 || sharded_grads() || bf16())) launch(b);  // not overlapped
  if (sharded_grads()) release_finished_grads(true);
  for (auto& b : buckets_)
    if (b.work) b.work->wait();
  record_overlap(window_end, Timeline::now_ns());
  for (auto& b : buckets_) {
    b.work.reset();
    b.launched_ns = 0;
    b.grads_released = false;
    b.launched = false;
    b.pending = b.params;
  }
}

// One synced step's overlap: every bucket's collective has finished (its Work is still held).
void DataParallel::record_overlap(int64_t window_end, int64_t sync_end) {
  OverlapStats o;
  o.window_begin_ns = window_begin_ns_ != 0 ? std::min(window_begin_ns_, window_end) : window_end;
  o.window_end_ns = window_end;
  o.sync_end_ns = sync_end;
  o.steps = 1;
  int64_t comm = 0, hidden = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    BucketTiming& t = timings_[i];
    if (!b.work) {
      t = BucketTiming{};
      continue;
    }
    t.launched_ns = b.launched_ns;
    t.started_ns = b.work->started_ns() != 0 ? b.work->started_ns() : b.launched_ns;
    t.finished_ns = std::max(b.work->finished_ns(), t.started_ns);
    comm += t.finished_ns - t.started_ns;
    hidden += std::max<int64_t>(0, std::min(t.finished_ns, window_end) - std::max(t.started_ns, o.window_begin_ns));
  }
  o.backward_s = static_cast<double>(window_end - o.window_begin_ns) * 1e-9;
  o.comm_s = static_cast<double>(comm) * 1e-9;
  o.hidden_s = static_cast<double>(hidden) * 1e-9;
  o.exposed_s = static_cast<double>(sync_end - window_end) * 1e-9;
  last_overlap_ = o;
  overlap_totals_.backward_s += o.backward_s;
  overlap_totals_.comm_s += o.comm_s;
  overlap_totals_.hidden_s += o.hidden_s;
  overlap_totals_.exposed_s += o.exposed_s;
  overlap_totals_.steps += 1;
  window_begin_ns_ = 0;
}

double DataParallel::clip_grad_norm(float max_norm) {
  double sq = 0;
  if (bf16()) {
    // The norm of the bf16 gradients; the scale is applied in float32 by step() (no second rounding).
    if (sharded_grads()) {
      for (const auto& u : units_) sq += sum_squares_bf16(grads16_.data() + u.shard_offset, u.mine_count);
      if (world_ > 1) pg_->all_reduce(&sq, 1, DType::kFloat64, ReduceOp::kSum);
    } else {
      sq = sum_squares_bf16(grads16_.data(), model_.num_params());
    }
    const double norm = std::sqrt(sq);
    clip_coef_ = 1.0f;
    if (max_norm > 0) {
      const double coef = max_norm / (norm + 1e-6);
      if (coef < 1.0) clip_coef_ = static_cast<float>(coef);
    }
    return norm;
  }
  if (sharded_grads()) {
    for (const auto& u : units_) sq += kernels::cpu::sum_squares(shard_grads_.data() + u.shard_offset, u.mine_count);
    if (world_ > 1) pg_->all_reduce(&sq, 1, DType::kFloat64, ReduceOp::kSum);
  } else {
    sq = kernels::cpu::sum_squares(model_.grad_data(), model_.num_params());
  }
  double norm = std::sqrt(sq);
  if (max_norm > 0) {
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      if (sharded_grads())
        kernels::cpu::scale_inplace(shard_grads_.data(), static_cast<float>(coef), shard_grads_.size());
      else
        kernels::cpu::scale_inplace(model_.grad_data(), static_cast<float>(coef), model_.num_params());
    }
  }
  return norm;
}

// AdamW over `count` elements whose flat indices start at flat_begin (decay flag per flat run).
void DataParallel::adamw_range(float* p, const float* g, float* m, float* v, size_t flat_begin, size_t count,
                               float lr) {
  const auto& c = options_.adamw;
  const size_t flat_end = flat_begin + count;
  auto it = std::upper_bound(decay_segments_.begin(), decay_segments_.end(), flat_begin,
                             [](size_t x, const Segment& s) { return x < s.end; });
  for (; it != decay_segments_.end() && it->begin < flat_end; ++it) {
    const size_t i = std::max(it->begin, flat_begin), j = std::min(it->end, flat_end);
    if (i >= j) continue;
    const size_t o = i - flat_begin;
    kernels::cpu::adamw_update(p + o, g + o, m + o, v + o, j - i, lr, c.beta1, c.beta2, c.eps,
                               it->decay ? c.weight_decay : 0.0f, step_count_);
  }
}

void DataParallel::adamw_bf16(float* master, const uint16_t* g16, float* m, float* v, uint16_t* out16,
                              size_t flat_begin, size_t count, float lr) {
  float g[kChunk];
  for (size_t o = 0; o < count; o += kChunk) {
    const size_t w = std::min(kChunk, count - o);
    kernels::cpu::from_bf16(g, g16 + o, w);
    if (clip_coef_ != 1.0f) kernels::cpu::scale_inplace(g, clip_coef_, w);
    adamw_range(master + o, g, m + o, v + o, flat_begin + o, w, lr);
    kernels::cpu::to_bf16(out16 + o, master + o, w);
  }
}

void DataParallel::step(float lr) {
  ++step_count_;
  float* p = model_.param_data();
  if (bf16()) {
    ensure_sharded();
    if (block_hooks()) release_all_units();  // materialised float32 copies are stale after the update
    const size_t n = model_.num_params();
    if (options_.strategy == Strategy::kZero3) {
      for (const auto& u : units_) {
        const size_t o = u.shard_offset;
        adamw_bf16(master_.data() + o, grads16_.data() + o, exp_avg_.data() + o, exp_avg_sq_.data() + o,
                   params16_.data() + o, u.mine_begin, u.mine_count, lr);
      }
    } else if (options_.strategy == Strategy::kZero2) {
      std::vector<uint16_t> mine(shard_numel_, 0);
      for (const auto& u : units_) {
        const size_t o = u.shard_offset;
        adamw_bf16(master_.data() + o, grads16_.data() + o, exp_avg_.data() + o, exp_avg_sq_.data() + o, mine.data() + o,
                   u.mine_begin, u.mine_count, lr);
      }
      std::vector<std::shared_ptr<Work>> works;
      for (size_t i = 0; i < units_.size(); ++i) {
        const auto& u = units_[i];
        works.push_back(
            pg_->all_gatherv_async(mine.data() + u.shard_offset, params16_.data() + u.begin, counts_[i], DType::kBFloat16));
        if (world_ > 1) account("all_gather", static_cast<double>(world_ - 1) * u.piece * 2);
      }
      for (auto& w : works) w->wait();
    } else if (options_.strategy == Strategy::kZero1) {
      const size_t s = padded_ / world_;
      std::vector<uint16_t> mine(s, 0);
      adamw_bf16(master_.data(), grads16_.data() + shard_begin_, exp_avg_.data(), exp_avg_sq_.data(), mine.data(),
                 shard_begin_, shard_end_ - shard_begin_, lr);
      if (world_ > 1) {
        pg_->all_gather(mine.data(), params16_.data(), s, DType::kBFloat16);
        account("all_gather", static_cast<double>(world_ - 1) / world_ * padded_ * 2);
      } else {
        std::memcpy(params16_.data() + shard_begin_, mine.data(), (shard_end_ - shard_begin_) * 2);
      }
    } else {
      adamw_bf16(master_.data(), grads16_.data(), exp_avg_.data(), exp_avg_sq_.data(), params16_.data(), 0, n, lr);
    }
    clip_coef_ = 1.0f;
    if (always_materialized_) kernels::cpu::from_bf16(p, params16_.data(), n);
    last_stats_ = stats_;
    stats_ = CommStats{};
    return;
  }
  if (options_.strategy == Strategy::kZero3) {
    ensure_sharded();
    // Gathered copies are stale after the update.
    release_all_units();
    for (const auto& u : units_) {
      const size_t o = u.shard_offset;
      adamw_range(shard_params_.data() + o, shard_grads_.data() + o, exp_avg_.data() + o, exp_avg_sq_.data() + o,
                  u.mine_begin, u.mine_count, lr);
    }
  } else if (options_.strategy == Strategy::kZero2) {
    std::vector<float> mine(shard_numel_, 0.0f);
    for (const auto& u : units_) {
      const size_t o = u.shard_offset;
      adamw_range(p + u.mine_begin, shard_grads_.data() + o, exp_avg_.data() + o, exp_avg_sq_.data() + o, u.mine_begin,
                  u.mine_count, lr);
      std::memcpy(mine.data() + o, p + u.mine_begin, u.mine_count * sizeof(float));
    }
    if (world_ > 1) {
      std::vector<std::shared_ptr<Work>> works;
      for (size_t i = 0; i < units_.size(); ++i) {
        const auto& u = units_[i];
        works.push_back(pg_->all_gatherv_async(mine.data() + u.shard_offset, p + u.begin, counts_[i], DType::kFloat32));
        account("all_gather", static_cast<double>(world_ - 1) * u.piece * 4);
      }
      for (auto& w : works) w->wait();
    }
  } else {
    const float* g = model_.grad_data();
    adamw_range(p + shard_begin_, g + shard_begin_, exp_avg_.data(), exp_avg_sq_.data(), shard_begin_,
                shard_end_ - shard_begin_, lr);
    if (options_.strategy != Strategy::kDdp && world_ > 1) {
      const size_t n = model_.num_params(), s = padded_ / world_;
      if (padded_ == n) {
        // In place: this rank's block of the flat buffer is its updated shard (no staging, no allocation).
        pg_->all_gather(p + shard_begin_, p, s, DType::kFloat32);
      } else {  // the buffer is shorter than world x shard: gather through a padded staging buffer
        std::vector<float> mine(s, 0.0f), all(padded_);
        std::memcpy(mine.data(), p + shard_begin_, (shard_end_ - shard_begin_) * sizeof(float));
        pg_->all_gather(mine.data(), all.data(), s, DType::kFloat32);
        std::memcpy(p, all.data(), n * sizeof(float));
      }
      account("all_gather", static_cast<double>(world_ - 1) / world_ * padded_ * 4);
    }
  }
  last_stats_ = stats_;
  stats_ = CommStats{};
}

// ---- zero3: parameter shards and the block schedule ----

void DataParallel::ensure_sharded() {
  if (sharded_ || (options_.strategy != Strategy::kZero3 && !bf16())) return;
  const float* p = model_.param_data();
  const size_t n = model_.num_params();
  if (!bf16()) {
    for (const auto& u : units_)
      std::memcpy(shard_params_.data() + u.shard_offset, p + u.mine_begin, u.mine_count * sizeof(float));
  } else if (sharded_grads()) {
    for (const auto& u : units_) {
      std::memcpy(master_.data() + u.shard_offset, p + u.mine_begin, u.mine_count * sizeof(float));
      if (options_.strategy == Strategy::kZero3)
        kernels::cpu::to_bf16(params16_.data() + u.shard_offset, p + u.mine_begin, u.mine_count);
    }
    if (options_.strategy == Strategy::kZero2) kernels::cpu::to_bf16(params16_.data(), p, n);
  } else {
    std::memcpy(master_.data(), p + shard_begin_, (shard_end_ - shard_begin_) * sizeof(float));
    kernels::cpu::to_bf16(params16_.data(), p, n);
  }
  sharded_ = true;
  materialized_ = false;
  if (always_materialized_) {
    kernels::cpu::from_bf16(model_.param_data(), params16_.data(), n);  // the model reads the bf16 values
    return;
  }
  for (auto& s : param_state_) s = ParamState::kGathered;
  gathered_ = n;
  release_all_units();
  peak_gathered_ = gathered_;
}

void DataParallel::gather_unit(size_t ui) {
  if (param_state_[ui] != ParamState::kReleased) return;
  if (options_.strategy != Strategy::kZero3) return;  // local bf16 source: widened when waited for
  const ShardUnit& u = units_[ui];
  if (bf16()) {
    // Into the upper half of the unit's float32 range; wait_unit widens it in place.
    uint16_t* dst = reinterpret_cast<uint16_t*>(model_.param_data() + u.begin) + (u.end - u.begin);
    gather_work_[ui] =
        pg_->all_gatherv_async(params16_.data() + u.shard_offset, dst, counts_[ui], DType::kBFloat16);
    account("all_gather", static_cast<double>(world_ - 1) * u.piece * 2);
  } else {
    gather_work_[ui] = pg_->all_gatherv_async(shard_params_.data() + u.shard_offset, model_.param_data() + u.begin,
                                              counts_[ui], DType::kFloat32);
    account("all_gather", static_cast<double>(world_ - 1) * u.piece * 4);
  }
  set_unit_state(ui, ParamState::kInFlight);
}

void DataParallel::set_unit_state(size_t ui, ParamState to) {
  const bool was = param_state_[ui] != ParamState::kReleased, now = to != ParamState::kReleased;
  const size_t n = punits_[ui].second - punits_[ui].first;
  if (now && !was) {
    gathered_ += n;
    peak_gathered_ = std::max(peak_gathered_, gathered_);
  } else if (was && !now) {
    gathered_ -= n;
  }
  param_state_[ui] = to;
}

void DataParallel::wait_unit(size_t ui) {
  gather_unit(ui);
  const auto [b, e] = punits_[ui];
  if (param_state_[ui] == ParamState::kInFlight) {
    gather_work_[ui]->wait();
    gather_work_[ui].reset();
    if (bf16()) widen_in_place(model_.param_data() + b, e - b);
    set_unit_state(ui, ParamState::kGathered);
  } else if (param_state_[ui] == ParamState::kReleased) {
    // bf16 ddp/zero1/zero2: from the local bf16 copy.
    kernels::cpu::from_bf16(model_.param_data() + b, params16_.data() + b, e - b);
    set_unit_state(ui, ParamState::kGathered);
  }
}

void DataParallel::release_unit(size_t ui) {
  if (param_state_[ui] == ParamState::kReleased) return;
  if (param_state_[ui] == ParamState::kInFlight) wait_unit(ui);
  const auto [b, e] = punits_[ui];
  nn::release_pages(model_.param_data() + b, e - b);
  set_unit_state(ui, ParamState::kReleased);
}

void DataParallel::release_all_units() {
  for (size_t u = 0; u < punits_.size(); ++u) release_unit(u);
  materialized_ = false;
}

void DataParallel::write_master_to_model() {
  float* p = model_.param_data();
  const size_t n = model_.num_params();
  for (size_t u = 0; u < punits_.size(); ++u)  // no gather may still be writing into the buffer
    if (param_state_[u] == ParamState::kInFlight) wait_unit(u);
  if (options_.strategy == Strategy::kDdp) {
    std::memcpy(p, master_.data(), n * sizeof(float));
  } else if (options_.strategy == Strategy::kZero1) {
    const size_t s = padded_ / world_;
    std::vector<float> mine(s, 0.0f), all(padded_);
    std::memcpy(mine.data(), master_.data(), (shard_end_ - shard_begin_) * sizeof(float));
    pg_->all_gather(mine.data(), all.data(), s, DType::kFloat32);
    std::memcpy(p, all.data(), n * sizeof(float));
  } else {
    for (size_t i = 0; i < units_.size(); ++i)
      pg_->all_gatherv(master_.data() + units_[i].shard_offset, p + units_[i].begin, counts_[i], DType::kFloat32);
  }
}

void DataParallel::gather_full_parameters() {
  if (bf16()) {
    // The float32 master weights, materialised for forward-only passes until the next backward or step().
    ensure_sharded();
    write_master_to_model();
    for (size_t u = 0; u < punits_.size(); ++u)
      if (param_state_[u] == ParamState::kReleased) set_unit_state(u, ParamState::kGathered);
    materialized_ = !punits_.empty();
    return;
  }
  if (options_.strategy != Strategy::kZero3) return;
  ensure_sharded();
  for (size_t u = 0; u < units_.size(); ++u) gather_unit(u);
  for (size_t u = 0; u < units_.size(); ++u) wait_unit(u);
  materialized_ = true;
}

void DataParallel::on_block(int b, nn::Model::BlockEvent e) {
  using E = nn::Model::BlockEvent;
  ensure_sharded();
  const int K = static_cast<int>(block_units_.size());
  if (b < 0 || b >= K) return;
  const auto& mine = block_units_[b];
  switch (e) {
    case E::kBeforeForward:
      if (materialized_) return;
      for (size_t u : mine) wait_unit(u);
      if (b + 1 < K)
        for (size_t u : block_units_[b + 1]) gather_unit(u);  // prefetch
      return;
    case E::kAfterForward:
      if (materialized_) return;
      for (size_t u : mine)
        if (last_fwd_[u] == b) release_unit(u);
      return;
    case E::kBeforeRecompute:
    case E::kBeforeBackward:
      if (materialized_) {
        // A backward pass after a checkpoint's full gather: back to shards, keeping what this block reads
        // (bf16: the buffer holds the master weights, so this block re-materialises its bf16 values too).
        materialized_ = false;
        for (size_t u = 0; u < punits_.size(); ++u)
          if (bf16() || std::find(mine.begin(), mine.end(), u) == mine.end()) release_unit(u);
      }
      for (size_t u : mine) wait_unit(u);
      if (b > 0)
        for (size_t u : block_units_[b - 1]) gather_unit(u);  // prefetch the next block of the backward pass
      return;
    case E::kAfterRecompute:
      return;
    case E::kAfterBackward:
      if (materialized_) return;
      for (size_t u : mine)
        if (last_bwd_[u] == b) release_unit(u);
      return;
  }
}

// ---- accounting ----

MemoryReport DataParallel::memory() const {
  MemoryReport m;
  const double n = static_cast<double>(model_.num_params());
  if (bf16()) {
    double gathered = 0;  // float32 working copies of the parameters materialised now
    if (always_materialized_ || !sharded_) gathered = n;
    else
      for (size_t u = 0; u < punits_.size(); ++u)
        if (param_state_[u] != ParamState::kReleased)
          gathered += static_cast<double>(punits_[u].second - punits_[u].first);
    double stage = 0;
    for (const auto& s : stage16_) stage += static_cast<double>(s.size()) * 2;
    m.bytes["parameters"] = static_cast<double>(params16_.size()) * 2 + gathered * 4;
    m.bytes["gradients"] = static_cast<double>(grads16_.size()) * 2;
    m.bytes["master_weights"] = static_cast<double>(master_.size()) * 4;
    m.bytes["optimizer_state"] = static_cast<double>(exp_avg_.size() + exp_avg_sq_.size()) * 4;
    m.bytes["comm_buffers"] = stage;
    return m;
  }
  if (options_.strategy == Strategy::kZero3) {
    double gathered = 0;
    for (size_t u = 0; u < units_.size(); ++u)
      if (!sharded_ || param_state_[u] != ParamState::kReleased) gathered += static_cast<double>(units_[u].end - units_[u].begin);
    m.bytes["parameters"] = (static_cast<double>(shard_params_.size()) + gathered) * 4;
  } else {
    m.bytes["parameters"] = n * 4;  // float32 parameters are also the master weights on CPU
  }
  // zero2/3: the gradient shard (the model's full buffer is released bucket by bucket).
  m.bytes["gradients"] = sharded_grads() ? static_cast<double>(shard_grads_.size()) * 4 : n * 4;
  m.bytes["optimizer_state"] = static_cast<double>(exp_avg_.size() + exp_avg_sq_.size()) * 4;
  m.bytes["master_weights"] = 0;
  m.bytes["comm_buffers"] = static_cast<double>(rs_stage_.size()) * 4;
  return m;
}

MemoryReport DataParallel::resident_memory() const {
  MemoryReport m;
  auto res = [](const std::vector<float>& v) { return static_cast<double>(nn::resident_bytes(v.data(), v.size() * 4)); };
  const size_t n = model_.num_params();
  auto& model = const_cast<nn::Model&>(model_);
  m.bytes["parameters"] = static_cast<double>(nn::resident_bytes(model.param_data(), n * 4)) + res(shard_params_);
  m.bytes["gradients"] = static_cast<double>(nn::resident_bytes(model.grad_data(), n * 4)) + res(shard_grads_);
  m.bytes["optimizer_state"] = res(exp_avg_) + res(exp_avg_sq_);
  m.bytes["master_weights"] = res(master_);
  m.bytes["comm_buffers"] = res(rs_stage_);
  m.bytes["parameters"] += resident(params16_.data(), params16_.size() * 2);
  m.bytes["gradients"] += resident(grads16_.data(), grads16_.size() * 2);
  for (const auto& s : stage16_) m.bytes["comm_buffers"] += resident(s.data(), s.size() * 2);
  return m;
}

nlohmann::json DataParallel::report() const {
  nlohmann::json j;
  j["strategy"] = strategy_name(options_.strategy);
  j["storage_dtype"] = dtype_name(options_.storage_dtype);
  j["world"] = world_;
  j["buckets"] = buckets_.size();
  j["gradients_shared"] = gradients_shared_;
  for (auto& [k, v] : memory().bytes) j["memory_bytes"][k] = v;
  for (auto& [k, v] : resident_memory().bytes) j["resident_bytes"][k] = v;
  for (auto& [k, v] : last_stats_.bytes) j["comm_bytes_per_step"][k] = v;
  for (auto& [k, v] : last_stats_.calls) j["comm_calls_per_step"][k] = v;
  // Gradient collectives against backward, means over the synced steps (fraction: of the summed times).
  const OverlapStats& t = overlap_totals_;
  const double n = std::max(1, t.steps);
  j["overlap"] = {{"steps", t.steps},
                  {"comm_hidden_fraction", t.hidden_fraction()},
                  {"comm_s", t.comm_s / n},
                  {"comm_hidden_s", t.hidden_s / n},
                  {"comm_exposed_s", t.exposed_s / n},
                  {"backward_window_s", t.backward_s / n}};
  return j;
}

// ---- checkpoints ----

void DataParallel::gather_optimizer_state(std::vector<float>* m, std::vector<float>* v, int64_t* step) {
  gather_moments(m, v, step);
  if (bf16()) {
    // The float32 master weights into the model's buffer for the save that follows. The units stay marked
    // released (their pages hold the master weights until the next pass re-materialises the bf16 values
    // and releases them), so training after the save runs exactly as without it.
    ensure_sharded();
    write_master_to_model();
    for (size_t u = 0; u < punits_.size(); ++u)
      if (param_state_[u] == ParamState::kGathered) set_unit_state(u, ParamState::kReleased);
    materialized_ = false;
    return;
  }
  if (options_.strategy == Strategy::kZero3) gather_full_parameters();  // the save writes the whole model
}

void DataParallel::gather_moments(std::vector<float>* m, std::vector<float>* v, int64_t* step) {
  const size_t n = model_.num_params();
  *step = step_count_;
  if (options_.strategy == Strategy::kDdp || (world_ == 1 && !sharded_grads())) {
    *m = exp_avg_;
    *v = exp_avg_sq_;
    return;
  }
  if (sharded_grads()) {
    for (auto [src, dst] : {std::pair{&exp_avg_, m}, std::pair{&exp_avg_sq_, v}}) {
      dst->assign(n, 0.0f);
      for (size_t i = 0; i < units_.size(); ++i)
        pg_->all_gatherv(src->data() + units_[i].shard_offset, dst->data() + units_[i].begin, counts_[i],
                         DType::kFloat32);
    }
    return;
  }
  const size_t s = padded_ / world_;
  std::vector<float> mine(s, 0.0f), all(padded_);
  for (auto [src, dst] : {std::pair{&exp_avg_, m}, std::pair{&exp_avg_sq_, v}}) {
    std::fill(mine.begin(), mine.end(), 0.0f);
    std::copy(src->begin(), src->end(), mine.begin());
    pg_->all_gather(mine.data(), all.data(), s, DType::kFloat32);
    dst->assign(all.begin(), all.begin() + static_cast<long>(n));
  }
}

void DataParallel::load_optimizer_state(const std::vector<float>& m, const std::vector<float>& v, int64_t step) {
  const size_t n = model_.num_params();
  if (m.size() != n || v.size() != n)
    TRIDENT_THROW(InvalidArgument, "optimizer state has {} / {} elements; the model has {} parameters", m.size(),
                  v.size(), n);
  if (sharded_grads()) {
    std::fill(exp_avg_.begin(), exp_avg_.end(), 0.0f);
    std::fill(exp_avg_sq_.begin(), exp_avg_sq_.end(), 0.0f);
    for (const auto& u : units_) {
      std::copy_n(m.begin() + static_cast<long>(u.mine_begin), u.mine_count, exp_avg_.begin() + static_cast<long>(u.shard_offset));
      std::copy_n(v.begin() + static_cast<long>(u.mine_begin), u.mine_count,
                  exp_avg_sq_.begin() + static_cast<long>(u.shard_offset));
    }
  } else {
    exp_avg_.assign(m.begin() + static_cast<long>(shard_begin_), m.begin() + static_cast<long>(shard_end_));
    exp_avg_sq_.assign(v.begin() + static_cast<long>(shard_begin_), v.begin() + static_cast<long>(shard_end_));
  }
  step_count_ = step;
}

}  // namespace trident::parallel
