#include "trident/nn/layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "trident/core/error.h"

namespace trident::nn {

// ---------------------------------------------------------------------------------------------------
// Buffers

void LayerActs::resize(const kernels::DeviceOps& ops, const std::vector<size_t>& sizes) {
  if (bufs_.size() != sizes.size()) bufs_.resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) bufs_[i].resize(ops, sizes[i]);
}

float* LayerActs::at_least(const kernels::DeviceOps& ops, size_t slot, size_t n) {
  if (bufs_.size() <= slot) bufs_.resize(slot + 1);
  if (bufs_[slot].size() < n) bufs_[slot].resize(ops, n);
  return bufs_[slot].data();
}

size_t LayerActs::bytes() const {
  size_t b = 0;
  for (const auto& x : bufs_) b += x.size() * sizeof(float);
  return b;
}

// ---------------------------------------------------------------------------------------------------
// Norms, Linear

void Norm::forward(const LayerEnv& e, float* out, float* mean, float* rstd, const float* inp, int N, int C) const {
  if (kind == NormKind::kRmsNorm) e.ops.rmsnorm_forward(out, rstd, inp, e.P(w), N, C, eps);
  else e.ops.layernorm_forward(out, mean, rstd, inp, e.P(w), e.P(b), N, C, eps);
}

void Norm::backward(const LayerEnv& e, float* dinp, const float* dout, const float* inp, const float* mean,
                    const float* rstd, int N, int C) const {
  if (kind == NormKind::kRmsNorm) e.ops.rmsnorm_backward(dinp, e.G(w), dout, inp, e.P(w), rstd, N, C);
  else e.ops.layernorm_backward(dinp, e.G(w), e.G(b), dout, inp, e.P(w), mean, rstd, N, C);
  e.fire(b);
  e.fire(w);
}

void Linear::forward(const LayerEnv& e, float* out, const float* inp, int N, int C, int OC) const {
  if (mode == Parallelism::kRow && e.parallel()) {
    // Partial sums over this rank's input columns, all-reduced, then the (replicated) bias once.
    e.ops.linear_forward(out, inp, e.P(w), nullptr, N, C, OC, e.precision);
    e.all_reduce_sum(out, static_cast<size_t>(N) * OC);
    if (b >= 0) e.ops.add_2d(out, OC, out, OC, e.P(b), 0, N, OC);
    return;
  }
  e.ops.linear_forward(out, inp, e.P(w), e.P(b), N, C, OC, e.precision);
}

void Linear::backward(const LayerEnv& e, float* dinp, const float* dout, const float* inp, int N, int C, int OC,
                      const float* dinp_mul) const {
  // Column-parallel: every rank's input gradient is partial (its output rows only), so a factor applies
  // after the sum.
  const bool partial = mode == Parallelism::kColumn && e.parallel();
  e.ops.linear_backward(dinp, e.G(w), e.G(b), dout, inp, e.P(w), N, C, OC, 0.0f, e.precision,
                        partial ? nullptr : dinp_mul);
  if (mode == Parallelism::kColumn) e.all_reduce_sum(dinp, static_cast<size_t>(N) * C);
  if (partial && dinp_mul) e.ops.mul(dinp, dinp, dinp_mul, static_cast<size_t>(N) * C);
  e.fire(b);
  e.fire(w);
}

int LinearGroup::rows() const {
  int r = 0;
  for (const auto& p : parts) r += p.rows;
  return r;
}

namespace {
// Whether the parts' weights (and so their gradients, laid out alike) follow each other without a gap.
bool contiguous(const LayerEnv& e, const std::vector<LinearGroup::Part>& parts, int C) {
  for (size_t i = 1; i < parts.size(); ++i)
    if (e.P(parts[i].w) != e.P(parts[i - 1].w) + static_cast<size_t>(parts[i - 1].rows) * C ||
        e.G(parts[i].w) != e.G(parts[i - 1].w) + static_cast<size_t>(parts[i - 1].rows) * C)
      return false;
  return true;
}
}  // namespace

void LinearGroup::forward(const LayerEnv& e, float* out, const float* inp, int N, int C) const {
  const int R = rows();
  if (contiguous(e, parts, C)) {
    e.ops.linear_forward(out, inp, e.P(parts[0].w), nullptr, N, C, R, e.precision);
    return;
  }
  int off = 0;
  for (const auto& p : parts) {
    e.ops.gemm(false, true, N, p.rows, C, 1.0f, inp, C, e.P(p.w), C, 0.0f, out + off, R, e.precision);
    off += p.rows;
  }
}

void LinearGroup::backward(const LayerEnv& e, float* dinp, const float* dout, const float* inp, int N, int C) const {
  const int R = rows();
  bool reduce = false;
  for (const auto& p : parts) reduce = reduce || (p.reduce_grad && e.parallel());
  if (!reduce && contiguous(e, parts, C)) {
    e.ops.linear_backward(dinp, e.G(parts[0].w), nullptr, dout, inp, e.P(parts[0].w), N, C, R, 0.0f, e.precision,
                          nullptr);
  } else {
    int off = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Part& p = parts[i];
      const size_t n = static_cast<size_t>(p.rows) * C;
      // d W_i = dout_i^T inp (into the gradient, or into scratch to be summed over the group first).
      if (p.reduce_grad && e.parallel()) {
        float* dw = e.scratch(kReduceSlot, n);
        e.ops.gemm(true, false, p.rows, C, N, 1.0f, dout + off, R, inp, C, 0.0f, dw, C, e.precision);
        e.all_reduce_sum(dw, n);
        e.ops.add_inplace(e.G(p.w), dw, n);
      } else {
        e.ops.gemm(true, false, p.rows, C, N, 1.0f, dout + off, R, inp, C, 1.0f, e.G(p.w), C, e.precision);
      }
      e.ops.gemm(false, false, N, C, p.rows, 1.0f, dout + off, R, e.P(p.w), C, i == 0 ? 0.0f : 1.0f, dinp, C,
                 e.precision);
      off += p.rows;
    }
  }
  e.all_reduce_sum(dinp, static_cast<size_t>(N) * C);
  for (size_t i = parts.size(); i-- > 0;) e.fire(parts[i].w);
}

// ---------------------------------------------------------------------------------------------------
// GPT block

namespace {
enum GptBuf { kLn1, kLn1Mean, kLn1Rstd, kQkv, kAtty, kLse, kRes2, kLn2, kLn2Mean, kLn2Rstd, kFch, kFchGelu };

void push_ids(std::vector<size_t>& v, std::initializer_list<int> ids) {
  for (int i : ids)
    if (i >= 0) v.push_back(static_cast<size_t>(i));
}
}  // namespace

GptBlock::GptBlock(Params p, int n_embd, int n_head) : p_(p), C_(n_embd), H_(n_head) {
  p_.attn.mode = p_.fc.mode = Parallelism::kColumn;
  p_.proj.mode = p_.mproj.mode = Parallelism::kRow;
}

std::vector<size_t> GptBlock::params() const {
  std::vector<size_t> v;
  push_ids(v, {p_.ln1.w, p_.ln1.b, p_.attn.w, p_.attn.b, p_.proj.w, p_.proj.b, p_.ln2.w, p_.ln2.b, p_.fc.w, p_.fc.b,
               p_.mproj.w, p_.mproj.b});
  return v;
}

void GptBlock::alloc(const LayerEnv& e, LayerActs& a, size_t n) const {
  const size_t C = C_, Cl = C / e.tp_size(), Hl = H_ / e.tp_size();
  // fch holds gelu'(c_fc output) after the forward (the pre-activation itself is not needed).
  a.resize(e.ops, {n * C, n, n, n * 3 * Cl, n * Cl, n * Hl, n * C, n * C, n, n, n * 4 * Cl, n * 4 * Cl});
}

void GptBlock::forward(const LayerEnv& e, const float* x, LayerActs& a, float* out, int B, int T, bool) const {
  const int N = B * T, C = C_, Cl = C / e.tp_size(), Hl = H_ / e.tp_size();
  const size_t NC = static_cast<size_t>(N) * C;
  p_.ln1.forward(e, a[kLn1], a[kLn1Mean], a[kLn1Rstd], x, N, C);
  p_.attn.forward(e, a[kQkv], a[kLn1], N, C, 3 * Cl);
  e.ops.attention_forward(a[kAtty], a[kLse], a[kQkv], B, T, Cl, Hl, e.precision);
  p_.proj.forward(e, a[kRes2], a[kAtty], N, Cl, C);
  e.ops.add_inplace(a[kRes2], x, NC);
  p_.ln2.forward(e, a[kLn2], a[kLn2Mean], a[kLn2Rstd], a[kRes2], N, C);
  p_.fc.forward(e, a[kFch], a[kLn2], N, C, 4 * Cl);
  // fch becomes gelu'(pre-activation): all the backward needs of it.
  e.ops.gelu_forward_and_grad(a[kFchGelu], a[kFch], a[kFch], static_cast<size_t>(N) * 4 * Cl, e.gelu);
  p_.mproj.forward(e, out, a[kFchGelu], N, 4 * Cl, C);
  e.ops.add_inplace(out, a[kRes2], NC);
}

void GptBlock::backward(const LayerEnv& e, float* dres, const float* x, LayerActs& a, int B, int T) const {
  const int N = B * T, C = C_, Cl = C / e.tp_size(), Hl = H_ / e.tp_size();
  float* dc = e.scratch(0, static_cast<size_t>(N) * C);
  float* dqkv = e.scratch(1, static_cast<size_t>(N) * 3 * Cl);
  float* dfch = e.scratch(2, static_cast<size_t>(N) * 4 * Cl);
  float* datty = e.scratch(3, static_cast<size_t>(N) * Cl);
  // mlp.c_proj (row-parallel): its bias gradient is the column sum of the replicated dres.
  // d(pre-activation) = (dres W) * gelu'(pre-activation), the product fused into the GEMM.
  p_.mproj.backward(e, dfch, dres, a[kFchGelu], N, 4 * Cl, C, a[kFch]);
  p_.fc.backward(e, dc, dfch, a[kLn2], N, C, 4 * Cl);
  p_.ln2.backward(e, dres, dc, a[kRes2], a[kLn2Mean], a[kLn2Rstd], N, C);
  p_.proj.backward(e, datty, dres, a[kAtty], N, Cl, C);
  e.ops.attention_backward(dqkv, datty, a[kQkv], a[kAtty], a[kLse], B, T, Cl, Hl, e.precision);
  p_.attn.backward(e, dc, dqkv, a[kLn1], N, C, 3 * Cl);
  p_.ln1.backward(e, dres, dc, x, a[kLn1Mean], a[kLn1Rstd], N, C);
}

// ---------------------------------------------------------------------------------------------------
// Rotary tables and the Llama block

RopeTable::RopeTable(int head_dim, int max_positions, double theta, const nlohmann::json& scaling) {
  TRIDENT_CHECK(head_dim >= 2 && head_dim % 2 == 0, InvalidArgument,
                "rotary embeddings need an even head dimension >= 2, got {}", head_dim);
  const int half = head_dim / 2;
  inv_freq_.resize(half);
  for (int i = 0; i < half; ++i) inv_freq_[i] = 1.0 / std::pow(theta, 2.0 * i / head_dim);
  if (scaling.is_object()) {
    // Llama 3.1 (Hugging Face's _compute_llama3_parameters): long wavelengths divided by `factor`, short ones
    // kept, the band between interpolated.
    const double factor = scaling.at("factor").get<double>();
    const double lo = scaling.at("low_freq_factor").get<double>();
    const double hi = scaling.at("high_freq_factor").get<double>();
    const double old_len = scaling.at("original_max_position_embeddings").get<double>();
    const double lo_wavelen = old_len / lo, hi_wavelen = old_len / hi;
    for (double& f : inv_freq_) {
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen > lo_wavelen) {
        f /= factor;
      } else if (wavelen >= hi_wavelen) {
        const double smooth = (old_len / wavelen - lo) / (hi - lo);
        f = (1.0 - smooth) * f / factor + smooth * f;
      }
    }
  }
  cos_.resize(static_cast<size_t>(max_positions) * half);
  sin_.resize(cos_.size());
  for (int p = 0; p < max_positions; ++p)
    for (int i = 0; i < half; ++i) {
      const double a = p * inv_freq_[i];
      cos_[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(a));
      sin_[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(a));
    }
}

std::pair<const float*, const float*> RopeTable::on(const kernels::DeviceOps& ops) const {
  if (ops.device == kernels::Device::kCpu) return {cos_.data(), sin_.data()};
  if (dev_ops_ != &ops) {
    dcos_.resize(ops, cos_.size());
    dsin_.resize(ops, sin_.size());
    ops.to_device(dcos_.data(), cos_.data(), cos_.size() * sizeof(float));
    ops.to_device(dsin_.data(), sin_.data(), sin_.size() * sizeof(float));
    dev_ops_ = &ops;
  }
  return {dcos_.data(), dsin_.data()};
}

namespace {
enum LlamaBuf { kXn, kRstd1, kQkvKv, kQkvFull, kLAtty, kLLse, kLRes2, kXn2, kRstd2, kGateUp, kSwi };
}  // namespace

LlamaBlock::LlamaBlock(Params p, int n_embd, int n_head, int n_kv_head, int intermediate, bool kv_split,
                       std::shared_ptr<const RopeTable> rope)
    : p_(std::move(p)),
      C_(n_embd),
      H_(n_head),
      KV_(n_kv_head),
      I_(intermediate),
      hd_(n_embd / n_head),
      kv_split_(kv_split),
      rope_(std::move(rope)) {
  p_.o.mode = p_.down.mode = Parallelism::kRow;
}

std::vector<size_t> LlamaBlock::params() const {
  std::vector<size_t> v;
  push_ids(v, {p_.attn_norm.w});
  for (const auto& q : p_.qkv.parts) push_ids(v, {q.w});
  push_ids(v, {p_.o.w, p_.mlp_norm.w});
  for (const auto& q : p_.gate_up.parts) push_ids(v, {q.w});
  push_ids(v, {p_.down.w});
  return v;
}

LlamaBlock::Local LlamaBlock::local(const LayerEnv& e) const {
  const int T = e.tp_size(), t = e.tp_rank();
  Local l;
  l.heads = H_ / T;
  l.kv_heads = kv_split_ ? KV_ / T : KV_;
  l.inter = I_ / T;
  l.h0 = t * l.heads;
  l.kv0 = kv_split_ ? t * l.kv_heads : 0;
  l.expand = H_ != KV_;
  return l;
}

void LlamaBlock::alloc(const LayerEnv& e, LayerActs& a, size_t n) const {
  const Local l = local(e);
  const size_t C = C_, hd = hd_, q = static_cast<size_t>(l.heads) * hd, kv = static_cast<size_t>(l.kv_heads) * hd;
  a.resize(e.ops, {n * C, n, n * (q + 2 * kv), l.expand ? n * 3 * q : 0, n * q, n * l.heads, n * C, n * C, n,
                   n * 2 * l.inter, n * l.inter});
}

void LlamaBlock::forward(const LayerEnv& e, const float* x, LayerActs& a, float* out, int B, int T, bool) const {
  const Local l = local(e);
  const int N = B * T, C = C_, q = l.heads * hd_;
  const size_t NC = static_cast<size_t>(N) * C;
  p_.attn_norm.forward(e, a[kXn], nullptr, a[kRstd1], x, N, C);
  p_.qkv.forward(e, a[kQkvKv], a[kXn], N, C);
  // Positions count from 0 in each window (row r of the batch is position r % T).
  e.ops.rope(a[kQkvKv], rope_->cos(e.ops), rope_->sin(e.ops), N, T, p_.qkv.rows(), l.heads + l.kv_heads, hd_, false);
  const float* qkv = a[kQkvKv];
  if (l.expand) {
    e.ops.kv_expand(a[kQkvFull], a[kQkvKv], N, l.heads, l.kv_heads, hd_, l.h0, H_ / KV_, l.kv0);
    qkv = a[kQkvFull];
  }
  e.ops.attention_forward(a[kLAtty], a[kLLse], qkv, B, T, q, l.heads, e.precision);
  p_.o.forward(e, a[kLRes2], a[kLAtty], N, q, C);
  e.ops.add_inplace(a[kLRes2], x, NC);
  p_.mlp_norm.forward(e, a[kXn2], nullptr, a[kRstd2], a[kLRes2], N, C);
  p_.gate_up.forward(e, a[kGateUp], a[kXn2], N, C);
  e.ops.swiglu_forward(a[kSwi], a[kGateUp], N, l.inter);
  p_.down.forward(e, out, a[kSwi], N, l.inter, C);
  e.ops.add_inplace(out, a[kLRes2], NC);
}

void LlamaBlock::backward(const LayerEnv& e, float* dres, const float* x, LayerActs& a, int B, int T) const {
  const Local l = local(e);
  const int N = B * T, C = C_, q = l.heads * hd_;
  const size_t n = static_cast<size_t>(N);
  float* dc = e.scratch(0, n * C);
  float* dgu = e.scratch(2, n * 2 * l.inter);
  float* dswi = e.scratch(4, n * l.inter);
  float* datty = e.scratch(3, n * q);
  // down_proj (row-parallel): local input gradient.
  p_.down.backward(e, dswi, dres, a[kSwi], N, l.inter, C);
  e.ops.swiglu_backward(dgu, dswi, a[kGateUp], N, l.inter);
  p_.gate_up.backward(e, dc, dgu, a[kXn2], N, C);
  p_.mlp_norm.backward(e, dres, dc, a[kLRes2], nullptr, a[kRstd2], N, C);
  p_.o.backward(e, datty, dres, a[kLAtty], N, q, C);
  float* dqkv = e.scratch(5, n * p_.qkv.rows());
  if (l.expand) {
    float* dfull = e.scratch(1, n * 3 * q);
    e.ops.attention_backward(dfull, datty, a[kQkvFull], a[kLAtty], a[kLLse], B, T, q, l.heads, e.precision);
    e.ops.kv_reduce(dqkv, dfull, N, l.heads, l.kv_heads, hd_, l.h0, H_ / KV_, l.kv0);
  } else {
    e.ops.attention_backward(dqkv, datty, a[kQkvKv], a[kLAtty], a[kLLse], B, T, q, l.heads, e.precision);
  }
  e.ops.rope(dqkv, rope_->cos(e.ops), rope_->sin(e.ops), N, T, p_.qkv.rows(), l.heads + l.kv_heads, hd_, true);
  p_.qkv.backward(e, dc, dqkv, a[kXn], N, C);
  p_.attn_norm.backward(e, dres, dc, x, nullptr, a[kRstd1], N, C);
}

// ---------------------------------------------------------------------------------------------------
// Deep MLP layers

namespace {
// One layer: gelu'(h) or h; under TP pairs also y = x_{i+1}[:, cols] and gelu'(h_{i+1}).
enum MlpBuf { kH, kY, kG2Grad };
}  // namespace

MlpLayers::MlpLayers(std::vector<Params> layers, int n_embd) : l_(std::move(layers)), C_(n_embd) {
  TRIDENT_CHECK(l_.size() == 1 || l_.size() == 2, InvalidArgument, "MlpLayers: {} layers; a unit holds 1 or 2",
                l_.size());
}

std::vector<size_t> MlpLayers::params() const {
  std::vector<size_t> v;
  for (const auto& p : l_) push_ids(v, {p.w, p.b});
  return v;
}

void MlpLayers::alloc(const LayerEnv& e, LayerActs& a, size_t n) const {
  const size_t C = C_, Cl = C / e.tp_size();
  TRIDENT_CHECK(e.parallel() || l_.size() == 1, InvalidArgument,
                "MlpLayers: a unit of {} layers needs tensor parallelism (pairs are a column + row split)", l_.size());
  // Single process: h (the pre-activation). TP: gelu'(h_i) local; x_{i+1}[:, cols]; gelu'(h_{i+1}).
  if (!e.parallel()) a.resize(e.ops, {n * C});
  else if (l_.size() == 2) a.resize(e.ops, {n * Cl, n * Cl, n * C});
  else a.resize(e.ops, {n * Cl, 0, 0});
}

void MlpLayers::forward(const LayerEnv& e, const float* x, LayerActs& a, float* out, int B, int T,
                        bool recompute) const {
  const int N = B * T, C = C_;
  const size_t NC = static_cast<size_t>(N) * C;
  if (!e.parallel()) {
    // The recompute refreshes only h (what the backward reads).
    e.ops.linear_forward(a[kH], x, e.P(l_[0].w), e.P(l_[0].b), N, C, C, e.precision);
    if (recompute) return;
    e.ops.gelu_forward(out, a[kH], NC, e.gelu);
    e.ops.add_inplace(out, x, NC);
    return;
  }
  const int Cl = C / e.tp_size(), c0 = e.tp_rank() * Cl;
  const bool pair = l_.size() == 2;
  float* h = a[kH];
  float* g = e.scratch(4, static_cast<size_t>(N) * Cl);
  e.ops.linear_forward(h, x, e.P(l_[0].w), e.P(l_[0].b), N, C, Cl, e.precision);
  e.ops.gelu_forward_and_grad(g, h, h, static_cast<size_t>(N) * Cl, e.gelu);
  float* z = e.scratch(5, 2 * NC);
  float* z1 = pair ? z + NC : z;  // layer i's GELU output scattered into its columns
  e.ops.memset_zero(z1, sizeof(float) * NC);
  e.ops.copy_2d(z1 + c0, C, g, Cl, N, Cl);
  if (!pair) {
    e.all_reduce_sum(z1, NC);
    e.ops.add(out, z1, x, NC);
    return;
  }
  float* y = a[kY];
  e.ops.add_2d(y, Cl, g, Cl, x + c0, C, N, Cl);
  // Layer i+1's partial output and layer i's scattered output in one all-reduce.
  e.ops.linear_forward(z, y, e.P(l_[1].w), nullptr, N, Cl, C, e.precision);
  e.all_reduce_sum(z, 2 * NC);
  if (l_[1].b >= 0) e.ops.add_2d(z, C, z, C, e.P(l_[1].b), 0, N, C);
  e.ops.add_inplace(z1, x, NC);  // x_{i+1} = gelu(h_i) + x_i
  e.ops.gelu_forward_and_grad(out, a[kG2Grad], z, NC, e.gelu);
  e.ops.add_inplace(out, z1, NC);  // x_{i+2} = gelu(h_{i+1}) + x_{i+1}
}

void MlpLayers::backward(const LayerEnv& e, float* dres, const float* x, LayerActs& a, int B, int T) const {
  const int N = B * T, C = C_;
  const size_t NC = static_cast<size_t>(N) * C;
  if (!e.parallel()) {
    float* dh = e.scratch(0, NC);
    e.ops.gelu_backward(dh, a[kH], dres, NC, e.gelu);
    // d x_l = d x_{l+1} (residual) + dh W: accumulate into dres.
    e.ops.linear_backward(dres, e.G(l_[0].w), e.G(l_[0].b), dh, x, e.P(l_[0].w), N, C, C, 1.0f, e.precision,
                          nullptr);
    e.fire(l_[0].b);
    e.fire(l_[0].w);
    return;
  }
  const int Cl = C / e.tp_size(), c0 = e.tp_rank() * Cl;
  const size_t NCl = static_cast<size_t>(N) * Cl;
  const bool pair = l_.size() == 2;
  float* dg = e.scratch(0, NCl);
  float* dy = e.scratch(1, NCl);
  e.ops.copy_2d(dg, Cl, dres + c0, C, N, Cl);
  if (pair) {
    float* dh2 = e.scratch(2, NC);
    e.ops.mul(dh2, dres, a[kG2Grad], NC);
    e.ops.linear_backward(dy, e.G(l_[1].w), e.G(l_[1].b), dh2, a[kY], e.P(l_[1].w), N, Cl, C, 0.0f, e.precision,
                          nullptr);
    e.fire(l_[1].b);
    e.fire(l_[1].w);
    e.ops.add_inplace(dg, dy, NCl);
  }
  e.ops.mul(dg, dg, a[kH], NCl);  // d h_i (local columns)
  float* dxp = e.scratch(3, NC);
  e.ops.linear_backward(dxp, e.G(l_[0].w), e.G(l_[0].b), dg, x, e.P(l_[0].w), N, C, Cl, 0.0f, e.precision,
                        nullptr);
  if (pair) e.ops.add_2d(dxp + c0, C, dxp + c0, C, dy, Cl, N, Cl);
  e.all_reduce_sum(dxp, NC);
  e.ops.add_inplace(dres, dxp, NC);
  e.fire(l_[0].b);
  e.fire(l_[0].w);
}

// ---------------------------------------------------------------------------------------------------
// Embedding and head

void Embedding::forward(const LayerEnv& e, float* out, const int32_t* tokens, int B, int T, int C) const {
  if (!e.parallel()) {
    e.ops.embedding_forward(out, tokens, e.P(wte), e.P(wpe), B, T, C, static_cast<int>(V));
    return;
  }
  const int N = B * T;
  e.ops.embedding_shard_forward(out, tokens, e.P(wte), v0, vl, V, N, C);
  e.all_reduce_sum(out, static_cast<size_t>(N) * C);
  if (wpe < 0) return;
  // + wpe[position], one batch row at a time.
  for (int b = 0; b < B; ++b) {
    float* o = out + static_cast<size_t>(b) * T * C;
    e.ops.add_2d(o, C, o, C, e.P(wpe), C, T, C);
  }
}

void Embedding::backward(const LayerEnv& e, const float* dout, const int32_t* tokens, int B, int T, int C) const {
  if (!e.parallel()) {
    e.ops.embedding_backward(e.G(wte), e.G(wpe), dout, tokens, B, T, C);
  } else {
    e.ops.embedding_shard_backward(e.G(wte), dout, tokens, v0, vl, B * T, C);
    float* dwpe = e.G(wpe);
    if (dwpe != nullptr)
      for (int b = 0; b < B; ++b) e.ops.add_2d(dwpe, C, dwpe, C, dout + static_cast<size_t>(b) * T * C, C, T, C);
  }
  e.fire(wpe);
  e.fire(wte);
}

void LmHead::forward(const LayerEnv& e, float* logits, float* lnf_out, float* mean, float* rstd, const float* x,
                     int N, int C) const {
  lnf.forward(e, lnf_out, mean, rstd, x, N, C);
  e.ops.linear_forward(logits, lnf_out, e.P(head), nullptr, N, C, static_cast<int>(vl), e.precision);
  // Padding ids take no probability (softmax exp(-inf) = 0): their gradients stay 0 and they are never sampled.
  const int64_t first_pad = V_valid > 0 ? std::max<int64_t>(V_valid - v0, 0) : vl;
  if (first_pad < vl)
    e.ops.fill_2d(logits + first_pad, static_cast<size_t>(vl), -INFINITY, static_cast<size_t>(N),
                  static_cast<size_t>(vl - first_pad));
}

double LmHead::loss(const LayerEnv& e, float* dlogits, const float* logits, const int32_t* targets, int N,
                    float dscale) const {
  if (!e.parallel())
    return e.ops.cross_entropy_forward_backward(dlogits, logits, targets, N, static_cast<int>(V), dscale);
  // Two all-reduces of per-row statistics; the logits themselves are never gathered.
  float* mx = e.scratch(kCeSlot0, static_cast<size_t>(N));
  float* st = e.scratch(kCeSlot1, 2 * static_cast<size_t>(N));  // [sum of exp | target logit]
  e.ops.ce_shard_max(mx, logits, targets, N, vl, V);
  e.tp->all_reduce_max(mx, static_cast<size_t>(N), e.microbatch, e.chunk);
  e.ops.ce_shard_sumexp(st, dlogits, logits, mx, targets, N, vl, v0);
  e.tp->all_reduce_sum(st, 2 * static_cast<size_t>(N), e.microbatch, e.chunk);
  return e.ops.ce_shard_finish(dlogits, st, mx, targets, N, vl, v0, dscale);
}

void LmHead::backward(const LayerEnv& e, float* dx, float* dlnf, const float* dlogits, const float* lnf_out,
                      const float* x, const float* mean, const float* rstd, int N, int C) const {
  // d lnf = dlogits head (this rank's vocabulary rows: partial, all-reduced); d head += dlogits^T lnf.
  e.ops.linear_backward(dlnf, e.G(head), nullptr, dlogits, lnf_out, e.P(head), N, C, static_cast<int>(vl), 0.0f,
                        e.precision, nullptr);
  e.all_reduce_sum(dlnf, static_cast<size_t>(N) * C);
  if (fire_head) e.fire(head);
  e.ops.memset_zero(dx, sizeof(float) * static_cast<size_t>(N) * C);
  lnf.backward(e, dx, dlnf, x, mean, rstd, N, C);
}

void LmHead::gather_logits(const LayerEnv& e, float* full, const float* logits, int N) const {
  if (!e.parallel()) {
    e.ops.to_host(full, logits, sizeof(float) * static_cast<size_t>(N) * V);
    return;
  }
  // Every rank's [N, vl] block, then its columns placed into [N, V] on the device, then one copy out.
  const int TP = e.tp->size();
  const size_t local = static_cast<size_t>(N) * vl;
  float* all = e.scratch(kCeSlot0, local * TP);
  float* whole = e.scratch(kCeSlot1, static_cast<size_t>(N) * V);
  e.tp->all_gather(logits, all, local, e.microbatch, e.chunk);
  for (int r = 0; r < TP; ++r) e.ops.copy_2d(whole + r * vl, V, all + r * local, vl, N, vl);
  e.ops.to_host(full, whole, sizeof(float) * static_cast<size_t>(N) * V);
}

}  // namespace trident::nn
