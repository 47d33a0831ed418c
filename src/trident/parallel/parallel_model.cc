// ParallelModel: layout validation, the shard plan, chunks (Stages) running nn's layers with
// per-microbatch activations, logical <-> shard copies.
#include "trident/parallel/parallel_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include <fmt/ranges.h>

#include "trident/core/error.h"
#include "trident/core/timeline.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/nn/models.h"

namespace trident::parallel {

namespace kc = kernels::cpu;
using kernels::AlignedFloats;

namespace {

// Roles of parameters that are not per layer (ShardSpec::field with layer == -1).
enum GlobalField { kWte = 100, kWpe, kLnfW, kLnfB, kLmHead, kWteCopy };
// GPT per-layer fields (nn/gpt.cc's registration order).
enum GptField { kLn1W = 0, kLn1B, kAttnW, kAttnB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kMprojW, kMprojB };
// MLP per-layer fields.
enum MlpField { kMlpW = 0, kMlpB };

std::vector<int> divisors_of(int64_t g, int limit) {
  std::vector<int> out;
  for (int d = 1; d <= limit && d <= g; ++d)
    if (g % d == 0) out.push_back(d);
  return out;
}

ShardSpec whole(std::string name, std::vector<int64_t> shape, bool replicated = true) {
  ShardSpec s;
  s.name = std::move(name);
  s.shape = shape;
  s.full_shape = shape;
  const int64_t rows = shape[0];
  s.full_cols = shape.size() > 1 ? shape[1] : 1;
  s.ncols = s.full_cols;
  s.row_ranges = {{0, rows}};
  s.replicated = replicated;
  return s;
}

// Rows of a [R, cols] (or 1-D [R]) tensor: the given ranges.
ShardSpec rows_of(std::string name, std::vector<int64_t> full_shape, std::vector<std::pair<int64_t, int64_t>> ranges) {
  ShardSpec s;
  s.name = std::move(name);
  s.full_shape = full_shape;
  int64_t n = 0;
  for (auto& r : ranges) n += r.second;
  s.shape = full_shape;
  s.shape[0] = n;
  s.full_cols = full_shape.size() > 1 ? full_shape[1] : 1;
  s.ncols = s.full_cols;
  s.row_ranges = std::move(ranges);
  return s;
}

// Columns [c0, c0 + n) of a [R, cols] tensor.
ShardSpec cols_of(std::string name, std::vector<int64_t> full_shape, int64_t c0, int64_t n) {
  ShardSpec s;
  s.name = std::move(name);
  s.full_shape = full_shape;
  s.shape = {full_shape[0], n};
  s.full_cols = full_shape[1];
  s.col0 = c0;
  s.ncols = n;
  s.row_ranges = {{0, full_shape[0]}};
  return s;
}

// Copies between a local shard and the full tensor.
void copy_slice(const ShardSpec& s, float* local, float* full, bool to_local) {
  int64_t i = 0;
  for (const auto& [b, cnt] : s.row_ranges)
    for (int64_t r = b; r < b + cnt; ++r, ++i) {
      float* l = local + i * s.ncols;
      float* f = full + r * s.full_cols + s.col0;
      if (to_local) std::memcpy(l, f, sizeof(float) * s.ncols);
      else std::memcpy(f, l, sizeof(float) * s.ncols);
    }
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// Offsets as FlatModel::add_param assigns them.
std::vector<size_t> plan_offsets(const std::vector<ShardSpec>& specs, size_t* total) {
  std::vector<size_t> off(specs.size());
  size_t next = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    off[i] = next;
    next = kernels::align_floats(next + static_cast<size_t>(numel_of(specs[i].shape)));
  }
  *total = next;
  return off;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Activations

struct ParallelModel::MbActs {
  int B = 0, T = 0;
  std::vector<int32_t> tokens;            // first stage: for the embedding backward
  std::vector<AlignedFloats> xs;          // input of each unit, and the chunk's output
  std::vector<nn::LayerActs> units;       // saved per unit (empty with checkpointing)
  AlignedFloats lnf, lnf_mean, lnf_rstd;  // last stage
  AlignedFloats logits;                   // last stage: dloss/dlogits (local vocab columns) after forward
  size_t bytes() const {
    size_t b = tokens.size() * sizeof(int32_t);
    for (const auto& x : xs) b += x.size() * sizeof(float);
    for (const auto& u : units) b += u.bytes();
    b += (lnf.size() + lnf_mean.size() + lnf_rstd.size() + logits.size()) * sizeof(float);
    return b;
  }
};

// ---------------------------------------------------------------------------------------------------
// Chunk: one virtual stage of this rank.

class ParallelModel::Chunk final : public Stage {
 public:
  Chunk(ParallelModel* m, int c, bool first, bool last) : m_(m), c_(c), first_(first), last_(last) {}

  bool is_first() const override { return first_; }
  bool is_last() const override { return last_; }
  size_t activation_numel(int B, int T) const override {
    return static_cast<size_t>(B) * T * static_cast<size_t>(m_->cfg_.n_embd);
  }
  double forward(int mb, const int32_t* tokens, const int32_t* targets, const float* input, float* output, int B,
                 int T, float loss_scale, bool keep) override {
    return run(mb, tokens, targets, input, output, B, T, loss_scale, keep, nullptr);
  }
  void backward(int mb, const float* doutput, float* dinput) override;
  size_t activation_bytes() const override { return bytes_; }
  size_t peak_activation_bytes() const override { return peak_; }
  void reset_peak() override { peak_ = bytes_; }

  double run(int mb, const int32_t* tokens, const int32_t* targets, const float* input, float* output, int B, int T,
             float loss_scale, bool keep, float* full_logits);

 private:
  ParallelModel* m_;
  int c_;
  bool first_, last_;
  std::map<int, std::unique_ptr<MbActs>> saved_;
  nn::LayerActs scratch_units_;  // unit activations when not kept (evaluation, checkpointing recompute)
  size_t bytes_ = 0, peak_ = 0;
};

double ParallelModel::Chunk::run(int mb, const int32_t* tokens, const int32_t* targets, const float* input,
                                 float* output, int B, int T, float loss_scale, bool keep, float* full_logits) {
  ParallelModel& m = *m_;
  const auto& cfg = m.cfg_;
  TRIDENT_CHECK(B > 0 && T > 0, InvalidArgument, "stage forward: batch {} x {} must be positive", B, T);
  TRIDENT_CHECK(T <= cfg.block_size, InvalidArgument,
                "stage forward: sequence length {} exceeds block_size {}; crop the input or raise block_size", T,
                cfg.block_size);
  TRIDENT_CHECK(!first_ || tokens != nullptr, InvalidArgument, "stage forward (first stage): tokens is null");
  TRIDENT_CHECK(first_ || input != nullptr, InvalidArgument, "stage forward (chunk {}): input is null", c_);
  TRIDENT_CHECK(!last_ || targets != nullptr || full_logits != nullptr, InvalidArgument,
                "stage forward (last stage): targets is null");
  TRIDENT_CHECK(last_ || output != nullptr, InvalidArgument, "stage forward (chunk {}): output is null", c_);
  TRIDENT_CHECK(!keep || !saved_.count(mb), InvalidArgument,
                "stage forward (chunk {}): microbatch {} already ran forward and not yet backward", c_, mb);
  const int N = B * T, C = cfg.n_embd;
  const size_t NC = static_cast<size_t>(N) * C;
  const auto units = m.chunk_units(c_);
  const bool ckpt = cfg.activation_checkpointing || !keep;

  auto acts = std::make_unique<MbActs>();
  MbActs& a = *acts;
  a.B = B;
  a.T = T;
  a.xs.resize(units.size() + 1);
  for (auto& x : a.xs) x.resize(NC);
  if (!ckpt) a.units.resize(units.size());

  const nn::LayerEnv e = m.env(mb, c_);
  if (first_) {
    if (keep) a.tokens.assign(tokens, tokens + N);
    m.embedding_.forward(e, a.xs[0].data(), tokens, B, T, C);
  } else {
    std::memcpy(a.xs[0].data(), input, sizeof(float) * NC);
  }
  const auto& layers = m.units_[c_];
  for (size_t u = 0; u < units.size(); ++u) {
    nn::LayerActs& ua = ckpt ? scratch_units_ : a.units[u];
    layers[u]->alloc(e, ua, N);
    layers[u]->forward(e, a.xs[u].data(), ua, a.xs[u + 1].data(), B, T, false);
  }
  double loss = 0;
  if (last_) {
    a.lnf.resize(NC);
    a.lnf_mean.resize(N);
    a.lnf_rstd.resize(N);
    a.logits.resize(static_cast<size_t>(N) * m.vl_);
    m.lm_head_.forward(e, a.logits.data(), a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), a.xs.back().data(), N,
                       C);
    if (full_logits != nullptr) m.lm_head_.gather_logits(e, full_logits, a.logits.data(), N);
    if (targets != nullptr)
      loss = m.lm_head_.loss(e, keep ? a.logits.data() : nullptr, a.logits.data(), targets, N,
                             loss_scale / static_cast<float>(N)) /
             N;
  } else {
    std::memcpy(output, a.xs.back().data(), sizeof(float) * NC);
  }
  if (keep) {
    bytes_ += a.bytes();
    peak_ = std::max(peak_, bytes_);
    saved_[mb] = std::move(acts);
  }
  return loss;
}

void ParallelModel::Chunk::backward(int mb, const float* doutput, float* dinput) {
  ParallelModel& m = *m_;
  const auto& cfg = m.cfg_;
  auto it = saved_.find(mb);
  TRIDENT_CHECK(it != saved_.end(), InvalidArgument,
                "stage backward (chunk {}): microbatch {} has no saved activations; run forward(keep=true) first",
                c_, mb);
  TRIDENT_CHECK(last_ || doutput != nullptr, InvalidArgument, "stage backward (chunk {}): doutput is null", c_);
  TRIDENT_CHECK(first_ || dinput != nullptr, InvalidArgument, "stage backward (chunk {}): dinput is null", c_);
  MbActs& a = *it->second;
  const int B = a.B, T = a.T, N = B * T, C = cfg.n_embd;
  const size_t NC = static_cast<size_t>(N) * C;
  const auto units = m.chunk_units(c_);
  const nn::LayerEnv e = m.env(mb, c_);
  float* dres = m.scratch(0, NC);
  if (last_) {
    m.lm_head_.backward(e, dres, m.scratch(1, NC), a.logits.data(), a.lnf.data(), a.xs.back().data(),
                        a.lnf_mean.data(), a.lnf_rstd.data(), N, C);
  } else {
    std::memcpy(dres, doutput, sizeof(float) * NC);
  }
  const auto& layers = m.units_[c_];
  for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
    nn::LayerActs* ua = nullptr;
    if (cfg.activation_checkpointing) {
      ua = &scratch_units_;
      layers[u]->alloc(e, *ua, N);
      layers[u]->forward(e, a.xs[u].data(), *ua, m.scratch(2, NC), B, T, true);
    } else {
      ua = &a.units[u];
    }
    layers[u]->backward(e, dres, a.xs[u].data(), *ua, B, T);
  }
  if (first_) {
    m.embedding_.backward(e, dres, a.tokens.data(), B, T, C);
  } else {
    std::memcpy(dinput, dres, sizeof(float) * NC);
  }
  bytes_ -= a.bytes();
  saved_.erase(it);
}

// ---------------------------------------------------------------------------------------------------
// Layout and plan

std::pair<int, int> ParallelModel::stage_layer_range(const nlohmann::json& config, const ModelLayout& layout,
                                                     int s) {
  const nn::ModelConfig cfg = nn::ModelConfig::from_json(config);
  const int S = layout.pp_size * layout.virtual_stages, L = cfg.n_layer;
  TRIDENT_CHECK(s >= 0 && s < S, InvalidArgument, "virtual stage {} is outside [0, {})", s, S);
  if (!layout.stage_layers.empty()) {
    int first = 0;
    for (int i = 0; i < s; ++i) first += layout.stage_layers[i];
    return {first, first + layout.stage_layers[s]};
  }
  const int base = L / S, extra = L % S;
  const int first = s * base + std::min(s, extra);
  return {first, first + base + (s < extra ? 1 : 0)};
}

void ParallelModel::validate_layout(const nlohmann::json& config, const ModelLayout& l) {
  const nn::ModelConfig cfg = nn::ModelConfig::from_json(config);
  TRIDENT_CHECK(l.tp_size >= 1 && l.tp_rank >= 0 && l.tp_rank < l.tp_size, InvalidArgument,
                "model layout: tp_rank {} of tp_size {} is invalid (need tp_size >= 1, 0 <= tp_rank < tp_size)",
                l.tp_rank, l.tp_size);
  TRIDENT_CHECK(l.pp_size >= 1 && l.pp_rank >= 0 && l.pp_rank < l.pp_size, InvalidArgument,
                "model layout: pp_rank {} of pp_size {} is invalid (need pp_size >= 1, 0 <= pp_rank < pp_size)",
                l.pp_rank, l.pp_size);
  TRIDENT_CHECK(l.virtual_stages >= 1, InvalidArgument, "model layout: virtual_stages {} must be >= 1",
                l.virtual_stages);
  const int S = l.pp_size * l.virtual_stages, L = cfg.n_layer, T = l.tp_size;
  if (l.stage_layers.empty()) {
    TRIDENT_CHECK(S == 1 || S <= L, InvalidArgument,
                  "model layout: {} pipeline stages x {} virtual stages = {} stages exceed n_layer {}; use "
                  "pp_size * virtual_stages <= {} (or list stage_layers explicitly)",
                  l.pp_size, l.virtual_stages, S, L, L);
  } else {
    TRIDENT_CHECK(static_cast<int>(l.stage_layers.size()) == S, InvalidArgument,
                  "model layout: stage_layers has {} entries; it needs one per virtual stage (pp_size {} x "
                  "virtual_stages {} = {})",
                  l.stage_layers.size(), l.pp_size, l.virtual_stages, S);
    int sum = 0;
    for (int x : l.stage_layers) {
      TRIDENT_CHECK(x >= 0, InvalidArgument, "model layout: stage_layers [{}] has a negative entry",
                    fmt::join(l.stage_layers, ", "));
      sum += x;
    }
    TRIDENT_CHECK(sum == L, InvalidArgument, "model layout: stage_layers [{}] sum to {}; they must sum to n_layer {}",
                  fmt::join(l.stage_layers, ", "), sum, L);
  }
  if (T == 1) return;
  const int64_t V = cfg.vocab_size;
  if (cfg.kind == "gpt") {
    const int64_t g = std::gcd<int64_t, int64_t>(cfg.n_head, V);
    TRIDENT_CHECK(cfg.n_head % T == 0, InvalidArgument,
                  "model layout: tensor-parallel size {} does not divide n_head {} (each rank holds whole heads); "
                  "tensor-parallel sizes that work with n_head {} and vocab_size {}: {}",
                  T, cfg.n_head, cfg.n_head, V, fmt::join(divisors_of(g, 1 << 20), ", "));
    TRIDENT_CHECK(cfg.n_embd % T == 0 && (4 * cfg.n_embd) % T == 0, InvalidArgument,
                  "model layout: tensor-parallel size {} does not divide n_embd {}", T, cfg.n_embd);
    TRIDENT_CHECK(V % T == 0, InvalidArgument,
                  "model layout: tensor-parallel size {} does not divide vocab_size {} (the embedding and head are "
                  "split by vocabulary rows); pad vocab_size to a multiple of {} (e.g. {}) or use a tensor-parallel "
                  "size in {{{}}}",
                  T, V, T, (V + T - 1) / T * T, fmt::join(divisors_of(g, 1 << 20), ", "));
  } else {
    const int64_t g = std::gcd<int64_t, int64_t>(cfg.n_embd, V);
    TRIDENT_CHECK(cfg.n_embd % T == 0, InvalidArgument,
                  "model layout: tensor-parallel size {} does not divide n_embd {} (the MLP's layers are split by "
                  "columns); tensor-parallel sizes that work: {}",
                  T, cfg.n_embd, fmt::join(divisors_of(g, 1 << 20), ", "));
    TRIDENT_CHECK(V % T == 0, InvalidArgument,
                  "model layout: tensor-parallel size {} does not divide vocab_size {} (the embedding and head are "
                  "split by vocabulary rows); pad vocab_size to a multiple of {} (e.g. {}) or use a tensor-parallel "
                  "size in {{{}}}",
                  T, V, T, (V + T - 1) / T * T, fmt::join(divisors_of(g, 1 << 20), ", "));
  }
}

std::vector<ShardSpec> ParallelModel::shard_plan(const nlohmann::json& config, const ModelLayout& l) {
  validate_layout(config, l);
  const nn::ModelConfig cfg = nn::ModelConfig::from_json(config);
  const bool gpt = cfg.kind == "gpt";
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, T = l.tp_size, t = l.tp_rank;
  const int64_t Cl = C / T;
  const ShardRange vr = shard_range(V, l.tp_rank, l.tp_size);
  const int P = l.pp_size, S = P * l.virtual_stages;
  const std::string pre = gpt ? "transformer." : "";
  std::vector<ShardSpec> out;
  auto push = [&](ShardSpec s, int chunk, int layer, int field) {
    s.chunk = chunk;
    s.layer = layer;
    s.field = field;
    out.push_back(std::move(s));
  };
  auto wte_spec = [&]() { return rows_of(pre + "wte.weight", {V, C}, {{vr.begin, vr.size()}}); };
  for (int c = 0; c < l.virtual_stages; ++c) {
    const int s = c * P + l.pp_rank;
    const auto [l0, l1] = stage_layer_range(config, l, s);
    if (s == 0) {
      push(wte_spec(), c, -1, kWte);
      push(whole(pre + "wpe.weight", {cfg.block_size, C}), c, -1, kWpe);
    }
    for (int layer = l0; layer < l1; ++layer) {
      if (gpt) {
        const std::string p = "transformer.h." + std::to_string(layer) + ".";
        push(whole(p + "ln_1.weight", {C}), c, layer, kLn1W);
        if (cfg.bias) push(whole(p + "ln_1.bias", {C}), c, layer, kLn1B);
        const std::vector<std::pair<int64_t, int64_t>> qkv = {{t * Cl, Cl}, {C + t * Cl, Cl}, {2 * C + t * Cl, Cl}};
        push(rows_of(p + "attn.c_attn.weight", {3 * C, C}, qkv), c, layer, kAttnW);
        if (cfg.bias) push(rows_of(p + "attn.c_attn.bias", {3 * C}, qkv), c, layer, kAttnB);
        push(cols_of(p + "attn.c_proj.weight", {C, C}, t * Cl, Cl), c, layer, kProjW);
        if (cfg.bias) push(whole(p + "attn.c_proj.bias", {C}), c, layer, kProjB);
        push(whole(p + "ln_2.weight", {C}), c, layer, kLn2W);
        if (cfg.bias) push(whole(p + "ln_2.bias", {C}), c, layer, kLn2B);
        push(rows_of(p + "mlp.c_fc.weight", {4 * C, C}, {{t * 4 * Cl, 4 * Cl}}), c, layer, kFcW);
        if (cfg.bias) push(rows_of(p + "mlp.c_fc.bias", {4 * C}, {{t * 4 * Cl, 4 * Cl}}), c, layer, kFcB);
        push(cols_of(p + "mlp.c_proj.weight", {C, 4 * C}, t * 4 * Cl, 4 * Cl), c, layer, kMprojW);
        if (cfg.bias) push(whole(p + "mlp.c_proj.bias", {C}), c, layer, kMprojB);
      } else {
        const std::string p = "layers." + std::to_string(layer) + ".";
        if ((layer - l0) % 2 == 0) {  // column-parallel
          push(rows_of(p + "weight", {C, C}, {{t * Cl, Cl}}), c, layer, kMlpW);
          if (cfg.bias) push(rows_of(p + "bias", {C}, {{t * Cl, Cl}}), c, layer, kMlpB);
        } else {  // row-parallel
          push(cols_of(p + "weight", {C, C}, t * Cl, Cl), c, layer, kMlpW);
          if (cfg.bias) push(whole(p + "bias", {C}), c, layer, kMlpB);
        }
      }
    }
    if (s == S - 1) {
      push(whole(pre + "ln_f.weight", {C}), c, -1, kLnfW);
      if (cfg.bias) push(whole(pre + "ln_f.bias", {C}), c, -1, kLnfB);
      if (!gpt && !cfg.tie_embeddings) {
        push(rows_of("lm_head.weight", {V, C}, {{vr.begin, vr.size()}}), c, -1, kLmHead);
      } else if (P > 1) {
        ShardSpec copy = wte_spec();
        copy.tied_copy = true;
        push(std::move(copy), c, -1, kWteCopy);
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Model

ParallelModel::ParallelModel(nn::ModelConfig cfg, ModelLayout layout, std::shared_ptr<ProcessGroup> tp_group,
                             std::shared_ptr<ProcessGroup> embedding_group)
    : FlatModel(std::move(cfg)), layout_(std::move(layout)), tp_(tp_group), embedding_group_(std::move(embedding_group)) {
  TRIDENT_CHECK(ops().device == kernels::Device::kCpu, Unsupported,
                "ParallelModel: tensor and pipeline parallelism run on the CPU only for now (device {}): the "
                "chunks keep activations in host memory and the tensor-parallel layers' vocab and bias steps are "
                "host loops; use device cpu",
                cfg_.device);
  TRIDENT_CHECK(tp_.size() == layout_.tp_size, InvalidArgument,
                "ParallelModel: the tensor-parallel group has {} ranks but the layout says tp_size {}; pass the "
                "rank's TP group (null only when tp_size is 1)",
                tp_.size(), layout_.tp_size);
  TRIDENT_CHECK(tp_.size() == 1 || tp_.rank() == layout_.tp_rank, InvalidArgument,
                "ParallelModel: this rank is rank {} of its tensor-parallel group but the layout says tp_rank {}",
                tp_.rank(), layout_.tp_rank);
  const nlohmann::json j = cfg_.to_json();
  specs_ = shard_plan(j, layout_);
  layer_idx_.assign(cfg_.n_layer, {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1});
  for (const auto& s : specs_) {
    const int idx = add_param(s.name, s.shape);
    if (s.layer >= 0) {
      layer_idx_[s.layer][s.field] = idx;
      continue;
    }
    switch (s.field) {
      case kWte: wte_ = idx; break;
      case kWpe: wpe_ = idx; break;
      case kLnfW: lnf_w_ = idx; break;
      case kLnfB: lnf_b_ = idx; break;
      case kLmHead:
      case kWteCopy: head_ = idx; break;
      default: break;
    }
  }
  finalize_params();
  const ShardRange vr = shard_range(cfg_.vocab_size, layout_.tp_rank, layout_.tp_size);
  v0_ = vr.begin;
  vl_ = vr.size();
  const int S = layout_.pp_size * layout_.virtual_stages;
  for (int c = 0; c < layout_.virtual_stages; ++c) {
    const int s = virtual_stage(c);
    if (s == S - 1 && head_ < 0) head_ = wte_;  // tied head on the rank that also holds the embedding
    chunks_.push_back(std::make_unique<Chunk>(this, c, s == 0, s == S - 1));
  }
  // nn's layers over the slices registered above.
  const int64_t V = cfg_.vocab_size;
  embedding_ = nn::Embedding{wte_, wpe_, V, v0_, vl_};
  // The shared wte (tied head on a rank that also holds the embedding) is final only after the embedding.
  lm_head_ = nn::LmHead{nn::LayerNorm{lnf_w_, lnf_b_}, head_, head_ != wte_, V, v0_, vl_};
  units_.resize(chunks_.size());
  for (int c = 0; c < num_chunks(); ++c)
    for (const auto& [first, count] : chunk_units(c)) {
      if (cfg_.kind == "gpt") {
        const auto& ix = layer_idx_[first];
        nn::GptBlock::Params p;
        p.ln1 = {ix[kLn1W], ix[kLn1B]};
        p.attn = {ix[kAttnW], ix[kAttnB]};
        p.proj = {ix[kProjW], ix[kProjB]};
        p.ln2 = {ix[kLn2W], ix[kLn2B]};
        p.fc = {ix[kFcW], ix[kFcB]};
        p.mproj = {ix[kMprojW], ix[kMprojB]};
        units_[c].push_back(std::make_unique<nn::GptBlock>(p, cfg_.n_embd, cfg_.n_head));
      } else {
        std::vector<nn::MlpLayers::Params> ls;
        for (int l = first; l < first + count; ++l) ls.push_back({layer_idx_[l][kMlpW], layer_idx_[l][kMlpB]});
        units_[c].push_back(std::make_unique<nn::MlpLayers>(std::move(ls), cfg_.n_embd));
      }
    }
}

nn::LayerEnv ParallelModel::env(int mb, int c) {
  nn::LayerEnv e{ops(), *this};
  e.tp = &tp_;
  e.workspace = &workspace_;
  e.precision = cfg_.precision();
  e.gelu = cfg_.gelu_kind();
  e.microbatch = mb;
  e.chunk = c;
  return e;
}

ParallelModel::~ParallelModel() = default;

Stage& ParallelModel::chunk(int c) {
  TRIDENT_CHECK(c >= 0 && c < num_chunks(), InvalidArgument, "ParallelModel::chunk({}): this rank has {} chunks", c,
                num_chunks());
  return *chunks_[c];
}

std::pair<int, int> ParallelModel::chunk_layers(int c) const {
  return stage_layer_range(cfg_.to_json(), layout_, virtual_stage(c));
}

std::vector<std::pair<int, int>> ParallelModel::chunk_units(int c) const {
  const auto [l0, l1] = chunk_layers(c);
  std::vector<std::pair<int, int>> out;
  // The deep MLP's layers pair up (column- then row-parallel) under tensor parallelism.
  const int span = cfg_.kind == "mlp" && tp_.size() > 1 ? 2 : 1;
  for (int l = l0; l < l1; l += span) out.emplace_back(l, std::min(span, l1 - l));
  return out;
}

float* ParallelModel::scratch(int slot, size_t n) {
  if (scratch_.size() <= static_cast<size_t>(slot)) scratch_.resize(slot + 1);
  return nn::ensure_size(scratch_[slot], n);
}

double ParallelModel::run_chunks(const int32_t* inputs, const int32_t* targets, int B, int T, bool backward,
                                 float loss_scale, float* full_logits) {
  TRIDENT_CHECK(layout_.pp_size == 1, InvalidArgument,
                "ParallelModel: forward_backward/forward_logits run the whole model in one process, but this rank "
                "holds pipeline rank {} of {}; drive chunk(c) with the pipeline engine (parallel/pipeline.h)",
                layout_.pp_rank, layout_.pp_size);
  check_batch(inputs, B, T);
  const size_t NC = static_cast<size_t>(B) * T * cfg_.n_embd;
  const int nc = num_chunks();
  std::vector<AlignedFloats> acts(nc + 1);
  for (auto& a : acts) a.resize(NC);
  double loss = 0;
  for (int c = 0; c < nc; ++c)
    loss = chunks_[c]->run(0, inputs, targets, c == 0 ? nullptr : acts[c].data(), acts[c + 1].data(), B, T,
                           loss_scale, backward, full_logits);
  if (backward)
    for (int c = nc - 1; c >= 0; --c)
      chunks_[c]->backward(0, c == nc - 1 ? nullptr : acts[c + 1].data(), c == 0 ? nullptr : acts[c].data());
  return loss;
}

float ParallelModel::forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T, bool backward,
                                      float loss_scale) {
  TRIDENT_CHECK(targets != nullptr, InvalidArgument, "model: targets is null");
  return static_cast<float>(run_chunks(inputs, targets, B, T, backward, loss_scale, nullptr));
}

void ParallelModel::forward_logits(const int32_t* inputs, int B, int T, float* logits) {
  TRIDENT_CHECK(logits != nullptr, InvalidArgument, "model: logits is null");
  run_chunks(inputs, nullptr, B, T, false, 1.0f, logits);
}

void ParallelModel::sync_tied_gradients() {
  if (!embedding_group_ || embedding_group_->size() <= 1) return;
  const int idx = wte_ >= 0 ? wte_ : head_;
  TRIDENT_CHECK(idx >= 0, InvalidArgument,
                "sync_tied_gradients: this rank holds neither the embedding nor the tied head; pass a null "
                "embedding_group on such ranks");
  const size_t n = params_[idx].numel;
  const int W = embedding_group_->size();
  ScopedSpan span(SpanKind::kComm, "all_reduce(embedding)", -1, -1, 2.0 * (W - 1) / W * n * sizeof(float));
  embedding_group_->all_reduce(G(idx), n, DType::kFloat32, ReduceOp::kSum);
}

void ParallelModel::load_from_full(const nn::Model& full) {
  TRIDENT_CHECK(full.kind() == cfg_.kind, InvalidArgument, "load_from_full: the full model is a '{}', this is a '{}'",
                full.kind(), cfg_.kind);
  std::map<std::string, const nn::Parameter*> by_name;
  for (const auto& p : full.parameters()) by_name[p.name] = &p;
  float* src = const_cast<nn::Model&>(full).param_data();
  for (size_t i = 0; i < specs_.size(); ++i) {
    const auto& s = specs_[i];
    auto it = by_name.find(s.name);
    TRIDENT_CHECK(it != by_name.end(), InvalidArgument,
                  "load_from_full: the full model has no parameter '{}'; build it from the same config", s.name);
    TRIDENT_CHECK(it->second->shape == s.full_shape, InvalidArgument,
                  "load_from_full: '{}' has shape [{}] in the full model, expected [{}]; build it from the same config",
                  s.name, fmt::join(it->second->shape, ", "), fmt::join(s.full_shape, ", "));
    copy_slice(s, P(static_cast<int>(i)), src + it->second->offset, true);
  }
}

void ParallelModel::gather_impl(nn::Model* full, ProcessGroup& group, int root, bool grads) {
  const int n = group.size();
  int64_t header[3] = {layout_.tp_rank, layout_.pp_rank, static_cast<int64_t>(num_params())};
  std::vector<int64_t> headers(3 * static_cast<size_t>(n));
  group.all_gather(header, headers.data(), 3, DType::kInt64);
  int64_t maxn = 0;
  for (int r = 0; r < n; ++r) maxn = std::max(maxn, headers[3 * r + 2]);
  std::vector<float> send(maxn, 0.0f);
  const float* mine = grads ? grads_ : values_.data();
  std::copy(mine, mine + num_params(), send.begin());
  const bool is_root = group.rank() == root;
  std::vector<float> recv(is_root ? static_cast<size_t>(maxn) * n : 0);
  group.gather(send.data(), is_root ? recv.data() : nullptr, maxn, DType::kFloat32, root);
  if (!is_root) return;
  TRIDENT_CHECK(full != nullptr, InvalidArgument, "gather_to_full: the root needs a full model to write into");
  std::map<std::string, const nn::Parameter*> by_name;
  for (const auto& p : full->parameters()) by_name[p.name] = &p;
  float* dst = grads ? full->grad_data() : full->param_data();
  const nlohmann::json j = cfg_.to_json();
  for (int r = 0; r < n; ++r) {
    ModelLayout l = layout_;
    l.tp_rank = static_cast<int>(headers[3 * r]);
    l.pp_rank = static_cast<int>(headers[3 * r + 1]);
    const auto specs = shard_plan(j, l);
    size_t total = 0;
    const auto offs = plan_offsets(specs, &total);
    TRIDENT_CHECK(static_cast<int64_t>(total) == headers[3 * r + 2], InvalidArgument,
                  "gather_to_full: rank {} sent {} floats but its layout (tp_rank {}, pp_rank {}) has {}; do all "
                  "ranks use the same config and layout sizes?",
                  r, headers[3 * r + 2], l.tp_rank, l.pp_rank, total);
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].tied_copy) continue;
      auto it = by_name.find(specs[i].name);
      TRIDENT_CHECK(it != by_name.end() && it->second->shape == specs[i].full_shape, InvalidArgument,
                    "gather_to_full: the full model has no parameter '{}' of shape [{}]; build it from the same config",
                    specs[i].name, fmt::join(specs[i].full_shape, ", "));
      copy_slice(specs[i], recv.data() + static_cast<size_t>(r) * maxn + offs[i], dst + it->second->offset, false);
    }
  }
}

void ParallelModel::gather_to_full(nn::Model* full, ProcessGroup& group, int root) {
  gather_impl(full, group, root, false);
}
void ParallelModel::gather_grads_to_full(nn::Model* full, ProcessGroup& group, int root) {
  gather_impl(full, group, root, true);
}

double ParallelModel::grad_sum_squares() const {
  double s = 0;
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].tied_copy) continue;
    if (specs_[i].replicated && layout_.tp_rank != 0) continue;
    s += kc::sum_squares(grads_ + params_[i].offset, params_[i].numel);
  }
  return s;
}

std::unique_ptr<ParallelModel> make_parallel_model(const nlohmann::json& model_config, const ModelLayout& layout,
                                                   std::shared_ptr<ProcessGroup> tp_group,
                                                   std::shared_ptr<ProcessGroup> embedding_group) {
  const nn::ModelConfig cfg = nn::ModelConfig::from_json(model_config);
  ParallelModel::validate_layout(model_config, layout);
  auto m = std::make_unique<ParallelModel>(cfg, layout, std::move(tp_group), std::move(embedding_group));
  m->load_from_full(*nn::make_model(model_config));
  return m;
}

}  // namespace trident::parallel
