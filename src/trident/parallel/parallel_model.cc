// ParallelModel: layout validation, the shard plan (nn/model_spec.h's declarations sliced by rank), chunks
// (Stages over nn::LayerRange), logical <-> shard copies.
#include "trident/parallel/parallel_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>

#include <fmt/ranges.h>

#include "trident/comm/collective.h"
#include "trident/core/error.h"
#include "trident/core/timeline.h"
#include "trident/nn/arch/architecture.h"
#include "trident/nn/layer_range.h"
#include "trident/nn/models.h"

namespace trident::parallel {

using kernels::AlignedFloats;

namespace {

// Rank t's slice (of T) of one declared parameter.
ShardSpec spec_of(const nn::ParamDecl& d, int64_t t, int64_t T) {
  ShardSpec s;
  s.name = d.name;
  s.full_shape = d.shape;
  s.shape = d.shape;
  s.full_cols = d.shape.size() > 1 ? d.shape[1] : 1;
  s.ncols = s.full_cols;
  s.layer = d.layer;
  s.role = d.role;
  s.tied_copy = d.role == nn::Role::kWteCopy;
  s.decl = d;
  switch (d.split) {
    case nn::Split::kReplicated:
      s.row_ranges = {{0, d.shape[0]}};
      s.replicated = true;
      break;
    case nn::Split::kRows: {
      // Block t of each of the row sections (c_attn: q, k and v separately).
      const int64_t section = d.shape[0] / d.sections, per = section / T;
      for (int k = 0; k < d.sections; ++k) s.row_ranges.emplace_back(k * section + t * per, per);
      s.shape[0] = per * d.sections;
      break;
    }
    case nn::Split::kCols: {
      const int64_t per = s.full_cols / T;
      s.shape = {d.shape[0], per};
      s.col0 = t * per;
      s.ncols = per;
      s.row_ranges = {{0, d.shape[0]}};
      break;
    }
  }
  return s;
}

// Copies between a local shard and the full tensor (host memory).
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

// A model's flat buffer (values or gradients) readable on the host: the buffer itself on the CPU, else a
// copy in `staging`.
float* host_view(nn::Model& m, bool grads, std::vector<float>& staging) {
  float* p = grads ? m.grad_data() : m.param_data();
  if (m.device() == kernels::Device::kCpu) return p;
  staging.resize(m.num_params());
  kernels::device_ops(m.device()).to_host(staging.data(), p, staging.size() * sizeof(float));
  return staging.data();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Chunk: one virtual stage of this rank, the Stage face of an nn::LayerRange. The Stage's buffers are host
// memory; on another device they are copied through the chunk's own device buffers.

class ParallelModel::Chunk final : public Stage {
 public:
  Chunk(ParallelModel* m, int c, std::unique_ptr<nn::LayerRange> range) : m_(m), c_(c), range_(std::move(range)) {}

  bool is_first() const override { return range_->is_first(); }
  bool is_last() const override { return range_->is_last(); }
  size_t activation_numel(int B, int T) const override {
    return static_cast<size_t>(B) * T * static_cast<size_t>(m_->cfg_.n_embd);
  }
  double forward(int mb, const int32_t* tokens, const int32_t* targets, const float* input, float* output, int B,
                 int T, float loss_scale, bool keep) override {
    return run(mb, tokens, targets, input, output, B, T, loss_scale, keep, nullptr);
  }
  void backward(int mb, const float* doutput, float* dinput) override {
    const size_t NC = backward_numel(mb);
    const nn::LayerEnv e = m_->env(mb, c_);
    float* din = dinput == nullptr || host() ? dinput : dev(act_out_, NC);
    range_->backward(e, mb, doutput == nullptr ? nullptr : in(act_in_, doutput, NC), din);
    if (din != dinput) m_->ops().to_host(dinput, din, NC * sizeof(float));
  }
  size_t activation_bytes() const override { return range_->activation_bytes(); }
  size_t peak_activation_bytes() const override { return range_->peak_activation_bytes(); }
  void reset_peak() override { range_->reset_peak(); }

  double run(int mb, const int32_t* tokens, const int32_t* targets, const float* input, float* output, int B, int T,
             float loss_scale, bool keep, float* full_logits) {
    const size_t N = static_cast<size_t>(B) * T, NC = activation_numel(B, T);
    if (is_first()) TRIDENT_CHECK(tokens != nullptr, InvalidArgument, "stage forward (chunk {}): tokens is null", c_);
    else TRIDENT_CHECK(input != nullptr, InvalidArgument, "stage forward (chunk {}): input is null", c_);
    if (!is_last()) TRIDENT_CHECK(output != nullptr, InvalidArgument, "stage forward (chunk {}): output is null", c_);
    const nn::LayerEnv e = m_->env(mb, c_);
    const int32_t* tok = tokens == nullptr ? nullptr : m_->on_device(tokens_, tokens, N);
    const int32_t* tgt = targets == nullptr ? nullptr : m_->on_device(targets_, targets, N);
    float* out = output == nullptr || host() ? output : dev(act_out_, NC);
    const double loss = range_->forward(e, mb, tok, tgt, input == nullptr ? nullptr : in(act_in_, input, NC), out, B,
                                        T, loss_scale, keep, full_logits);
    if (out != output) m_->ops().to_host(output, out, NC * sizeof(float));
    if (keep) shapes_[mb] = NC;
    return loss;
  }

 private:
  bool host() const { return m_->ops().device == kernels::Device::kCpu; }
  float* dev(kernels::DeviceArray<float>& buf, size_t n) {
    if (buf.size() < n) buf.resize(m_->ops(), n);
    return buf.data();
  }
  // A host activation on the device (itself on the CPU).
  const float* in(kernels::DeviceArray<float>& buf, const float* h, size_t n) {
    if (host()) return h;
    float* d = dev(buf, n);
    m_->ops().to_device(d, h, n * sizeof(float));
    return d;
  }
  size_t backward_numel(int mb) {
    auto it = shapes_.find(mb);
    TRIDENT_CHECK(it != shapes_.end(), InvalidArgument,
                  "stage backward (chunk {}): microbatch {} has no saved activations; run forward(keep=true) first",
                  c_, mb);
    const size_t n = it->second;
    shapes_.erase(it);
    return n;
  }

  ParallelModel* m_;
  int c_;
  std::unique_ptr<nn::LayerRange> range_;
  std::map<int, size_t> shapes_;  // activation floats of each microbatch held
  kernels::DeviceArray<int32_t> tokens_, targets_;
  kernels::DeviceArray<float> act_in_, act_out_;  // device copies of host activations (devices other than the CPU)
};

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
  if (T > 1) nn::architecture(cfg.kind).check_tp(cfg, T);
}

std::vector<ShardSpec> ParallelModel::shard_plan(const nlohmann::json& config, const ModelLayout& l) {
  validate_layout(config, l);
  const nn::ModelConfig cfg = nn::ModelConfig::from_json(config);
  const int P = l.pp_size, S = P * l.virtual_stages;
  std::vector<ShardSpec> out;
  for (int c = 0; c < l.virtual_stages; ++c) {
    const int s = c * P + l.pp_rank;
    const auto [l0, l1] = stage_layer_range(config, l, s);
    // The last stage keeps its own copy of the tied wte when the embedding lives on another pipeline rank.
    for (const auto& d : nn::declare_params(cfg, l0, l1, s == 0, s == S - 1, P > 1, l.tp_size)) {
      ShardSpec spec = spec_of(d, l.tp_rank, l.tp_size);
      spec.chunk = c;
      out.push_back(std::move(spec));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Model

ParallelModel::ParallelModel(nn::ModelConfig cfg, ModelLayout layout, std::shared_ptr<ProcessGroup> tp_group,
                             std::shared_ptr<ProcessGroup> embedding_group)
    : FlatModel(std::move(cfg)),
      layout_(std::move(layout)),
      tp_(tp_group, ops()),
      embedding_group_(std::move(embedding_group)),
      ix_(cfg_.n_layer) {
  TRIDENT_CHECK(tp_.size() == layout_.tp_size, InvalidArgument,
                "ParallelModel: the tensor-parallel group has {} ranks but the layout says tp_size {}; pass the "
                "rank's TP group (null only when tp_size is 1)",
                tp_.size(), layout_.tp_size);
  TRIDENT_CHECK(tp_.size() == 1 || tp_.rank() == layout_.tp_rank, InvalidArgument,
                "ParallelModel: this rank is rank {} of its tensor-parallel group but the layout says tp_rank {}",
                tp_.rank(), layout_.tp_rank);
  const nlohmann::json j = cfg_.to_json();
  specs_ = shard_plan(j, layout_);
  for (const auto& s : specs_) ix_.set(s.layer, s.role, add_param(s.name, s.shape));
  finalize_params();
  for (size_t i = 0; i < specs_.size(); ++i)
    init_param(static_cast<int>(i), specs_[i].decl, specs_[i].row_ranges, specs_[i].col0, specs_[i].ncols);
  finish_init();
  const ShardRange vr = shard_range(cfg_.vocab_size, layout_.tp_rank, layout_.tp_size);
  v0_ = vr.begin;
  vl_ = vr.size();
  // Each chunk: nn's layers over the slices registered above, run by the single-process model's driver.
  const int S = layout_.pp_size * layout_.virtual_stages, T = layout_.tp_size;
  for (int c = 0; c < layout_.virtual_stages; ++c) {
    const int s = virtual_stage(c);
    const auto [l0, l1] = chunk_layers(c);
    std::vector<int> firsts;
    for (const auto& span : nn::unit_spans(cfg_, l0, l1, T)) firsts.push_back(span.first);
    std::optional<nn::Embedding> embedding;
    std::optional<nn::LmHead> head;
    if (s == 0) embedding = nn::make_embedding(cfg_, ix_, v0_, vl_);
    if (s == S - 1) head = nn::make_head(cfg_, ix_, v0_, vl_);
    auto range = std::make_unique<nn::LayerRange>(std::move(embedding), nn::build_units(cfg_, ix_, l0, l1, T),
                                                  std::move(firsts), std::move(head), cfg_.n_layer, cfg_.n_embd,
                                                  cfg_.activation_checkpointing);
    chunks_.push_back(std::make_unique<Chunk>(this, c, std::move(range)));
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
  // An untied head (the Llama's lm_head) shares nothing with the embedding.
  if (!cfg_.tied() || !embedding_group_ || embedding_group_->size() <= 1) return;
  const int idx = ix_.wte >= 0 ? ix_.wte : ix_.head;
  TRIDENT_CHECK(idx >= 0, InvalidArgument,
                "sync_tied_gradients: this rank holds neither the embedding nor the tied head; pass a null "
                "embedding_group on such ranks");
  const size_t n = params_[idx].numel;
  ScopedSpan span(SpanKind::kComm, "all_reduce(embedding)", -1, -1,
                  bus_bytes(OpKind::kAllReduce, static_cast<double>(n * sizeof(float)), embedding_group_->size()));
  if (n > 0) embedding_group_->all_reduce(G(idx), n, DType::kFloat32, ReduceOp::kSum);
}

void ParallelModel::load_from_full(const nn::Model& full) {
  TRIDENT_CHECK(full.kind() == cfg_.kind, InvalidArgument, "load_from_full: the full model is a '{}', this is a '{}'",
                full.kind(), cfg_.kind);
  std::map<std::string, const nn::Parameter*> by_name;
  for (const auto& p : full.parameters()) by_name[p.name] = &p;
  std::vector<float> full_host, mine_host;
  const float* src = host_view(const_cast<nn::Model&>(full), false, full_host);
  // This shard's values written on the host: the buffer itself on the CPU, else a copy uploaded after.
  float* dst = values_.data();
  if (ops().device != kernels::Device::kCpu) {
    mine_host.assign(num_params(), 0.0f);
    dst = mine_host.data();
  }
  for (size_t i = 0; i < specs_.size(); ++i) {
    const auto& s = specs_[i];
    auto it = by_name.find(s.name);
    TRIDENT_CHECK(it != by_name.end(), InvalidArgument,
                  "load_from_full: the full model has no parameter '{}'; build it from the same config", s.name);
    TRIDENT_CHECK(it->second->shape == s.full_shape, InvalidArgument,
                  "load_from_full: '{}' has shape [{}] in the full model, expected [{}]; build it from the same config",
                  s.name, fmt::join(it->second->shape, ", "), fmt::join(s.full_shape, ", "));
    copy_slice(s, dst + params_[i].offset, const_cast<float*>(src) + it->second->offset, true);
  }
  if (dst != values_.data()) ops().to_device(values_.data(), dst, num_params() * sizeof(float));
}

void ParallelModel::gather_impl(nn::Model* full, ProcessGroup& group, int root, bool grads) {
  const int n = group.size();
  int64_t header[3] = {layout_.tp_rank, layout_.pp_rank, static_cast<int64_t>(num_params())};
  std::vector<int64_t> headers(3 * static_cast<size_t>(n));
  group.all_gather(header, headers.data(), 3, DType::kInt64);
  int64_t maxn = 0;
  for (int r = 0; r < n; ++r) maxn = std::max(maxn, headers[3 * r + 2]);
  std::vector<float> send(maxn, 0.0f);
  ops().to_host(send.data(), grads ? grads_ : values_.data(), num_params() * sizeof(float));
  const bool is_root = group.rank() == root;
  std::vector<float> recv(is_root ? static_cast<size_t>(maxn) * n : 0);
  group.gather(send.data(), is_root ? recv.data() : nullptr, maxn, DType::kFloat32, root);
  if (!is_root) return;
  TRIDENT_CHECK(full != nullptr, InvalidArgument, "gather_to_full: the root needs a full model to write into");
  std::map<std::string, const nn::Parameter*> by_name;
  for (const auto& p : full->parameters()) by_name[p.name] = &p;
  std::vector<float> full_host;
  float* dst = host_view(*full, grads, full_host);
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
  if (!full_host.empty())
    kernels::device_ops(full->device())
        .to_device(grads ? full->grad_data() : full->param_data(), full_host.data(), full_host.size() * sizeof(float));
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
    s += ops().sum_squares(grads_ + params_[i].offset, params_[i].numel);
  }
  return s;
}

std::unique_ptr<ParallelModel> make_parallel_model(const nlohmann::json& model_config, const ModelLayout& layout,
                                                   std::shared_ptr<ProcessGroup> tp_group,
                                                   std::shared_ptr<ProcessGroup> embedding_group) {
  const nn::ModelConfig cfg = nn::ModelConfig::from_json(model_config);
  ParallelModel::validate_layout(model_config, layout);
  return std::make_unique<ParallelModel>(cfg, layout, std::move(tp_group), std::move(embedding_group));
}

}  // namespace trident::parallel
