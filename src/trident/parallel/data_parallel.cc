#include "trident/parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/kernels/cpu/ops.h"

namespace trident::parallel {

Strategy parse_strategy(const std::string& n) {
  if (n == "ddp") return Strategy::kDdp;
  if (n == "zero1") return Strategy::kZero1;
  if (n == "zero2") return Strategy::kZero2;
  TRIDENT_THROW(InvalidArgument, "unknown data-parallel strategy '{}'; use ddp, zero1 or zero2", n);
}

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kDdp: return "ddp";
    case Strategy::kZero1: return "zero1";
    case Strategy::kZero2: return "zero2";
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

DataParallel::DataParallel(nn::Model& model, std::shared_ptr<ProcessGroup> pg, DataParallelOptions options)
    : model_(model), pg_(std::move(pg)), options_(options), rank_(pg_->rank()), world_(pg_->size()) {
  const size_t n = model_.num_params();
  padded_ = (n + world_ - 1) / world_ * world_;
  if (options_.strategy == Strategy::kDdp) {
    shard_begin_ = 0;
    shard_end_ = n;
  } else {
    size_t s = padded_ / world_;
    shard_begin_ = std::min(n, rank_ * s);
    shard_end_ = std::min(n, (rank_ + 1) * s);
  }
  // Buckets in reverse parameter order (the order backward produces gradients). A bucket is a contiguous
  // range of the flat buffer because parameters are laid out in order.
  const auto& params = model_.parameters();
  bucket_of_param_.assign(params.size(), -1);
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
  for (auto& b : buckets_) b.pending = b.params;
  model_.set_grad_ready_hook([this](size_t idx) { on_grad_ready(idx); });

  // Optimizer state for this rank's shard only.
  exp_avg_.assign(shard_end_ - shard_begin_, 0.0f);
  exp_avg_sq_.assign(shard_end_ - shard_begin_, 0.0f);
  decay_mask_.assign(n, 0);
  for (const auto& p : params)
    if (p.weight_decay) std::fill(decay_mask_.begin() + p.offset, decay_mask_.begin() + p.offset + p.numel, 1);
  if (options_.strategy == Strategy::kZero2 && padded_ != n) padded_grads_.assign(padded_, 0.0f);
  if (rank_ == 0)
    log_info("data parallel: {} on {} ranks, {} parameters ({} padded), {} gradient buckets of <= {} MiB",
             strategy_name(options_.strategy), world_, n, padded_, buckets_.size(),
             options_.bucket_bytes / double(1 << 20));
}

DataParallel::~DataParallel() {
  model_.set_grad_ready_hook(nullptr);
  for (auto& b : buckets_)
    if (b.work) {
      try {
        b.work->wait();
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
  pg_->broadcast(model_.param_data(), n, DType::kFloat32, 0);
  account("broadcast", rank_ == 0 ? static_cast<double>(n) * 4 : 0.0);
}

void DataParallel::launch(Bucket& b) {
  if (world_ == 1 || options_.strategy == Strategy::kZero2) return;  // zero2 reduce-scatters after backward
  float* g = model_.grad_data() + b.begin;
  const size_t count = b.end - b.begin;
  b.work = pg_->all_reduce_async(g, count, DType::kFloat32, ReduceOp::kAvg);
  account("all_reduce", 2.0 * (world_ - 1) / world_ * count * 4);
}

void DataParallel::on_grad_ready(size_t idx) {
  if (!require_sync_) return;
  int bi = bucket_of_param_[idx];
  if (bi < 0) return;
  Bucket& b = buckets_[bi];
  if (--b.pending == 0 && options_.overlap) {
    launch(b);
    launched_any_ = true;
  }
}

void DataParallel::finish_gradient_sync() {
  if (!require_sync_) return;
  const size_t n = model_.num_params();
  for (auto& b : buckets_)
    if (!b.work && world_ > 1 && options_.strategy != Strategy::kZero2) launch(b);  // not overlapped
  for (auto& b : buckets_) {
    if (b.work) b.work->wait();
    b.work.reset();
    b.pending = b.params;
  }
  if (options_.strategy == Strategy::kZero2 && world_ > 1) {
    // Each rank keeps only its shard of the averaged gradients.
    const size_t s = padded_ / world_;
    float* grads = model_.grad_data();
    float* src = grads;
    if (!padded_grads_.empty()) {
      std::memcpy(padded_grads_.data(), grads, n * sizeof(float));
      std::fill(padded_grads_.begin() + n, padded_grads_.end(), 0.0f);
      src = padded_grads_.data();
    }
    std::vector<float> shard(s);
    pg_->reduce_scatter(src, shard.data(), s, DType::kFloat32, ReduceOp::kAvg);
    std::memcpy(grads + shard_begin_, shard.data(), (shard_end_ - shard_begin_) * sizeof(float));
    account("reduce_scatter", static_cast<double>(world_ - 1) / world_ * padded_ * 4);
  }
}

double DataParallel::clip_grad_norm(float max_norm) {
  const float* g = model_.grad_data();
  double sq = 0;
  if (options_.strategy == Strategy::kZero2 && world_ > 1) {
    sq = kernels::cpu::sum_squares(g + shard_begin_, shard_end_ - shard_begin_);
    pg_->all_reduce(&sq, 1, DType::kFloat64, ReduceOp::kSum);
  } else {
    sq = kernels::cpu::sum_squares(g, model_.num_params());
  }
  double norm = std::sqrt(sq);
  if (max_norm > 0) {
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      if (options_.strategy == Strategy::kZero2)
        kernels::cpu::scale_inplace(model_.grad_data() + shard_begin_, static_cast<float>(coef), shard_end_ - shard_begin_);
      else
        kernels::cpu::scale_inplace(model_.grad_data(), static_cast<float>(coef), model_.num_params());
    }
  }
  return norm;
}

void DataParallel::step(float lr) {
  ++step_count_;
  float* p = model_.param_data();
  const float* g = model_.grad_data();
  const auto& c = options_.adamw;
  // Runs of equal decay flag inside the shard.
  for (size_t i = shard_begin_; i < shard_end_;) {
    size_t j = i;
    const uint8_t flag = decay_mask_[i];
    while (j < shard_end_ && decay_mask_[j] == flag) ++j;
    kernels::cpu::adamw_update(p + i, g + i, exp_avg_.data() + (i - shard_begin_), exp_avg_sq_.data() + (i - shard_begin_),
                               j - i, lr, c.beta1, c.beta2, c.eps, flag ? c.weight_decay : 0.0f, step_count_);
    i = j;
  }
  if (options_.strategy != Strategy::kDdp && world_ > 1) {
    const size_t n = model_.num_params(), s = padded_ / world_;
    std::vector<float> mine(s, 0.0f), all(padded_);
    std::memcpy(mine.data(), p + shard_begin_, (shard_end_ - shard_begin_) * sizeof(float));
    pg_->all_gather(mine.data(), all.data(), s, DType::kFloat32);
    std::memcpy(p, all.data(), n * sizeof(float));
    account("all_gather", static_cast<double>(world_ - 1) / world_ * padded_ * 4);
  }
  last_stats_ = stats_;
  stats_ = CommStats{};
}

MemoryReport DataParallel::memory() const {
  MemoryReport m;
  const double n = static_cast<double>(model_.num_params());
  m.bytes["parameters"] = n * 4;  // float32 parameters are also the master weights on CPU
  m.bytes["gradients"] = n * 4;   // the model's flat gradient buffer (zero2: only the shard is meaningful)
  m.bytes["optimizer_state"] = static_cast<double>(exp_avg_.size() + exp_avg_sq_.size()) * 4;
  m.bytes["master_weights"] = 0;
  m.bytes["comm_buffers"] = static_cast<double>(padded_grads_.size()) * 4;
  return m;
}

nlohmann::json DataParallel::report() const {
  nlohmann::json j;
  j["strategy"] = strategy_name(options_.strategy);
  j["world"] = world_;
  j["buckets"] = buckets_.size();
  for (auto& [k, v] : memory().bytes) j["memory_bytes"][k] = v;
  for (auto& [k, v] : last_stats_.bytes) j["comm_bytes_per_step"][k] = v;
  for (auto& [k, v] : last_stats_.calls) j["comm_calls_per_step"][k] = v;
  return j;
}

void DataParallel::gather_optimizer_state(std::vector<float>* m, std::vector<float>* v, int64_t* step) {
  const size_t n = model_.num_params();
  *step = step_count_;
  if (options_.strategy == Strategy::kDdp || world_ == 1) {
    *m = exp_avg_;
    *v = exp_avg_sq_;
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
  exp_avg_.assign(m.begin() + static_cast<long>(shard_begin_), m.begin() + static_cast<long>(shard_end_));
  exp_avg_sq_.assign(v.begin() + static_cast<long>(shard_begin_), v.begin() + static_cast<long>(shard_end_));
  step_count_ = step;
}

}  // namespace trident::parallel
