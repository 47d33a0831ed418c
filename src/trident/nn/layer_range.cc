#include "trident/nn/layer_range.h"

#include <algorithm>

#include "trident/core/error.h"

namespace trident::nn {

struct LayerRange::Saved {
  int B = 0, T = 0;
  uint64_t seq = 0;
  kernels::DeviceArray<int32_t> tokens;                // first range: for the embedding backward
  std::vector<kernels::DeviceArray<float>> xs;         // input of each unit, and the range's output
  std::vector<LayerActs> units;                        // per unit (empty under checkpointing)
  kernels::DeviceArray<float> lnf, lnf_mean, lnf_rstd;  // last range
  kernels::DeviceArray<float> logits;                  // last range: dloss/dlogits after a kept forward
  size_t bytes() const {
    size_t b = tokens.size() * sizeof(int32_t);
    for (const auto& x : xs) b += x.size() * sizeof(float);
    for (const auto& u : units) b += u.bytes();
    b += (lnf.size() + lnf_mean.size() + lnf_rstd.size() + logits.size()) * sizeof(float);
    return b;
  }
};

LayerRange::LayerRange(std::optional<Embedding> embedding, std::vector<std::unique_ptr<Layer>> units,
                       std::vector<int> unit_layers, std::optional<LmHead> head, int n_layer, int n_embd,
                       bool activation_checkpointing)
    : embedding_(std::move(embedding)),
      units_(std::move(units)),
      unit_layers_(std::move(unit_layers)),
      head_(std::move(head)),
      n_layer_(n_layer),
      C_(n_embd),
      ckpt_(activation_checkpointing) {
  TRIDENT_CHECK(units_.size() == unit_layers_.size(), InvalidArgument,
                "LayerRange: {} units but {} first layers", units_.size(), unit_layers_.size());
}

LayerRange::~LayerRange() = default;

std::unique_ptr<LayerRange::Saved> LayerRange::take() {
  if (spare_) return std::move(spare_);
  return std::make_unique<Saved>();
}

void LayerRange::put_back(std::unique_ptr<Saved> a) { spare_ = std::move(a); }

double LayerRange::forward(const LayerEnv& e, int mb, const int32_t* tokens, const int32_t* targets,
                           const float* input, float* output, int B, int T, float loss_scale, bool keep,
                           float* logits_host) {
  if (auto old = saved_.find(mb); keep && old != saved_.end()) {
    // A microbatch run forward again before its backward (a step abandoned by an exception): drop the old.
    bytes_ -= old->second->bytes();
    saved_.erase(old);
  }
  const kernels::DeviceOps& ops = e.ops;
  const int N = B * T, C = C_;
  const size_t NC = static_cast<size_t>(N) * C;
  const size_t U = units_.size();
  const bool per_unit = keep && !ckpt_;
  std::unique_ptr<Saved> acts = take();
  Saved& a = *acts;
  a.B = B;
  a.T = T;
  a.seq = ++seq_;
  a.xs.resize(U + 1);
  for (auto& x : a.xs) x.resize(ops, NC);
  if (per_unit) a.units.resize(U);
  else a.units.clear();

  if (embedding_) {
    if (keep) {
      a.tokens.resize(ops, static_cast<size_t>(N));
      ops.copy(a.tokens.data(), tokens, sizeof(int32_t) * N);
    }
    e.block(0, Model::BlockEvent::kBeforeForward);
    embedding_->forward(e, a.xs[0].data(), tokens, B, T, C);
    e.block(0, Model::BlockEvent::kAfterForward);
  } else {
    TRIDENT_CHECK(input != nullptr, InvalidArgument, "forward of microbatch {}: input is null", mb);
    ops.copy(a.xs[0].data(), input, sizeof(float) * NC);
  }
  for (size_t u = 0; u < U; ++u) {
    LayerActs& ua = per_unit ? a.units[u] : shared_;
    units_[u]->alloc(e, ua, N);
    e.block(unit_block(u), Model::BlockEvent::kBeforeForward);
    units_[u]->forward(e, a.xs[u].data(), ua, a.xs[u + 1].data(), B, T, false);
    e.block(unit_block(u), Model::BlockEvent::kAfterForward);
    if (!per_unit) {
      shared_seq_ = a.seq;
      shared_unit_ = u;
    }
  }
  double loss = 0;
  if (head_) {
    a.lnf.resize(ops, NC);
    a.lnf_mean.resize(ops, head_->lnf.has_mean() ? N : 0);  // RMSNorm keeps rstd only
    a.lnf_rstd.resize(ops, N);
    a.logits.resize(ops, static_cast<size_t>(N) * head_->vl);
    const int hb = n_layer_ + 1;
    e.block(hb, Model::BlockEvent::kBeforeForward);
    head_->forward(e, a.logits.data(), a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), a.xs.back().data(), N, C);
    e.block(hb, Model::BlockEvent::kAfterForward);
    if (logits_host != nullptr) head_->gather_logits(e, logits_host, a.logits.data(), N);
    if (targets != nullptr)
      loss = head_->loss(e, keep ? a.logits.data() : nullptr, a.logits.data(), targets, N,
                         loss_scale / static_cast<float>(N)) /
             N;
  } else {
    TRIDENT_CHECK(output != nullptr, InvalidArgument, "forward of microbatch {}: output is null", mb);
    ops.copy(output, a.xs.back().data(), sizeof(float) * NC);
  }
  if (keep) {
    bytes_ += a.bytes();
    peak_ = std::max(peak_, bytes_);
    saved_[mb] = std::move(acts);
  } else {
    put_back(std::move(acts));
  }
  return loss;
}

void LayerRange::backward(const LayerEnv& e, int mb, const float* doutput, float* dinput) {
  auto it = saved_.find(mb);
  TRIDENT_CHECK(it != saved_.end(), InvalidArgument,
                "backward: microbatch {} has no saved activations; run its forward with keep first", mb);
  TRIDENT_CHECK(is_last() || doutput != nullptr, InvalidArgument, "backward of microbatch {}: doutput is null", mb);
  TRIDENT_CHECK(is_first() || dinput != nullptr, InvalidArgument, "backward of microbatch {}: dinput is null", mb);
  const kernels::DeviceOps& ops = e.ops;
  Saved& a = *it->second;
  const int B = a.B, T = a.T, N = B * T, C = C_;
  const size_t NC = static_cast<size_t>(N) * C;
  float* dres = e.scratch(kDresSlot, NC);
  if (head_) {
    const int hb = n_layer_ + 1;
    e.block(hb, Model::BlockEvent::kBeforeBackward);
    head_->backward(e, dres, e.scratch(kDlnfSlot, NC), a.logits.data(), a.lnf.data(), a.xs.back().data(),
                    a.lnf_mean.data(), a.lnf_rstd.data(), N, C);
    e.block(hb, Model::BlockEvent::kAfterBackward);
  } else {
    ops.copy(dres, doutput, sizeof(float) * NC);
  }
  for (size_t u = units_.size(); u-- > 0;) {
    const int blk = unit_block(u);
    LayerActs* ua = &shared_;
    if (!a.units.empty()) {
      ua = &a.units[u];
    } else if (shared_seq_ != a.seq || shared_unit_ != u) {
      // Checkpointing: this unit's forward again (the shared set holds another unit's activations).
      e.block(blk, Model::BlockEvent::kBeforeRecompute);
      units_[u]->alloc(e, shared_, N);
      units_[u]->forward(e, a.xs[u].data(), shared_, e.scratch(kRecomputeSlot, NC), B, T, true);
      shared_seq_ = a.seq;
      shared_unit_ = u;
      e.block(blk, Model::BlockEvent::kAfterRecompute);
    }
    e.block(blk, Model::BlockEvent::kBeforeBackward);
    units_[u]->backward(e, dres, a.xs[u].data(), *ua, B, T);
    e.block(blk, Model::BlockEvent::kAfterBackward);
  }
  if (embedding_) {
    e.block(0, Model::BlockEvent::kBeforeBackward);
    embedding_->backward(e, dres, a.tokens.data(), B, T, C);
    e.block(0, Model::BlockEvent::kAfterBackward);
  } else {
    ops.copy(dinput, dres, sizeof(float) * NC);
  }
  bytes_ -= a.bytes();
  std::unique_ptr<Saved> done = std::move(it->second);
  saved_.erase(it);
  put_back(std::move(done));
}

}  // namespace trident::nn
