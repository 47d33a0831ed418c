// The CUDA GPT: nn/gpt.cc's forward and backward, kernel for kernel, on device buffers.
#include "trident/cuda/gpt.h"

#include "trident/kernels/aligned.h"

namespace trident::cuda {

struct Gpt::Acts {
  // fch keeps the c_fc pre-activation (the CPU model keeps gelu' there instead; same gradient).
  DeviceBuffer<float> ln1, ln1_mean, ln1_rstd, qkv, atty, lse, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
};

Gpt::Gpt(GptConfig c, cudaStream_t stream) : cfg_(c), s_(stream) {
  TRIDENT_CHECK(c.n_layer >= 0 && c.n_head > 0 && c.n_embd > 0 && c.n_embd % c.n_head == 0 && c.block_size > 0 &&
                    c.vocab_size > 0,
                InvalidArgument,
                "cuda gpt: bad config (n_layer {}, n_head {}, n_embd {}, block_size {}, vocab_size {}); n_embd must "
                "be divisible by n_head and every size positive",
                c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size);
  const int64_t C = c.n_embd, V = c.vocab_size, L = c.n_layer;
  wte_ = add_param("transformer.wte.weight", {V, C});
  wpe_ = add_param("transformer.wpe.weight", {c.block_size, C});
  layers_.resize(L);
  for (int l = 0; l < L; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    auto& lp = layers_[l];
    lp.ln1_w = add_param(p + "ln_1.weight", {C});
    if (c.bias) lp.ln1_b = add_param(p + "ln_1.bias", {C});
    lp.attn_w = add_param(p + "attn.c_attn.weight", {3 * C, C});
    if (c.bias) lp.attn_b = add_param(p + "attn.c_attn.bias", {3 * C});
    lp.proj_w = add_param(p + "attn.c_proj.weight", {C, C});
    if (c.bias) lp.proj_b = add_param(p + "attn.c_proj.bias", {C});
    lp.ln2_w = add_param(p + "ln_2.weight", {C});
    if (c.bias) lp.ln2_b = add_param(p + "ln_2.bias", {C});
    lp.fc_w = add_param(p + "mlp.c_fc.weight", {4 * C, C});
    if (c.bias) lp.fc_b = add_param(p + "mlp.c_fc.bias", {4 * C});
    lp.mproj_w = add_param(p + "mlp.c_proj.weight", {C, 4 * C});
    if (c.bias) lp.mproj_b = add_param(p + "mlp.c_proj.bias", {C});
  }
  lnf_w_ = add_param("transformer.ln_f.weight", {C});
  if (c.bias) lnf_b_ = add_param("transformer.ln_f.bias", {C});
  num_ = kernels::align_floats(params_.back().offset + params_.back().numel);
  values_ = DeviceBuffer<float>(num_);
  grads_ = DeviceBuffer<float>(num_);
  values_.zero();
  grads_.zero();
}

Gpt::~Gpt() = default;

int Gpt::add_param(std::string name, std::vector<int64_t> shape) {
  GptParam p;
  p.name = std::move(name);
  p.numel = 1;
  for (auto d : shape) p.numel *= static_cast<size_t>(d);
  p.shape = std::move(shape);
  p.offset = params_.empty() ? 0 : kernels::align_floats(params_.back().offset + params_.back().numel);
  params_.push_back(std::move(p));
  return static_cast<int>(params_.size()) - 1;
}

void Gpt::zero_grad() { TRIDENT_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, grads_.bytes(), s_)); }

void Gpt::copy_params_from_host(const float* host) {
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(values_.data(), host, values_.bytes(), cudaMemcpyHostToDevice, s_));
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(s_));
}

void Gpt::ensure(int B, int T) {
  const size_t N = static_cast<size_t>(B) * T, C = cfg_.n_embd, L = cfg_.n_layer;
  if (N == cap_n_) return;
  cap_n_ = N;
  acts_.clear();
  for (size_t l = 0; l < L; ++l) {
    auto a = std::make_unique<Acts>();
    a->ln1 = DeviceBuffer<float>(N * C);
    a->ln1_mean = DeviceBuffer<float>(N);
    a->ln1_rstd = DeviceBuffer<float>(N);
    a->qkv = DeviceBuffer<float>(N * 3 * C);
    a->atty = DeviceBuffer<float>(N * C);
    a->lse = DeviceBuffer<float>(N * cfg_.n_head);
    a->res2 = DeviceBuffer<float>(N * C);
    a->ln2 = DeviceBuffer<float>(N * C);
    a->ln2_mean = DeviceBuffer<float>(N);
    a->ln2_rstd = DeviceBuffer<float>(N);
    a->fch = DeviceBuffer<float>(N * 4 * C);
    a->fch_gelu = DeviceBuffer<float>(N * 4 * C);
    acts_.push_back(std::move(a));
  }
  xs_.clear();
  for (size_t l = 0; l <= L; ++l) xs_.emplace_back(N * C);
  lnf_ = DeviceBuffer<float>(N * C);
  lnf_mean_ = DeviceBuffer<float>(N);
  lnf_rstd_ = DeviceBuffer<float>(N);
  logits_ = DeviceBuffer<float>(N * cfg_.vocab_size);
  dres_ = DeviceBuffer<float>(N * C);
  dc_ = DeviceBuffer<float>(N * C);
  dqkv_ = DeviceBuffer<float>(N * 3 * C);
  dfch_ = DeviceBuffer<float>(N * 4 * C);
}

void Gpt::block_forward(int l, const float* x, Acts& a, float* out, int B, int T) {
  const int N = B * T, C = cfg_.n_embd;
  const auto& lp = layers_[l];
  const auto prec = cfg_.precision;
  const size_t nc = static_cast<size_t>(N) * C;
  cuda::layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, P(lp.ln1_w), P(lp.ln1_b), N, C,
                          1e-5f, s_);
  cuda::linear_forward(a.qkv.data(), a.ln1.data(), P(lp.attn_w), P(lp.attn_b), N, C, 3 * C, prec, s_);
  cuda::attention_forward(a.atty.data(), a.lse.data(), a.qkv.data(), B, T, C, cfg_.n_head, s_);
  cuda::linear_forward(a.res2.data(), a.atty.data(), P(lp.proj_w), P(lp.proj_b), N, C, C, prec, s_);
  cuda::add_inplace(a.res2.data(), x, nc, s_);
  cuda::layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), P(lp.ln2_w),
                          P(lp.ln2_b), N, C, 1e-5f, s_);
  cuda::linear_forward(a.fch.data(), a.ln2.data(), P(lp.fc_w), P(lp.fc_b), N, C, 4 * C, prec, s_);
  cuda::gelu_forward(a.fch_gelu.data(), a.fch.data(), 4 * nc, cfg_.gelu, s_);
  cuda::linear_forward(out, a.fch_gelu.data(), P(lp.mproj_w), P(lp.mproj_b), N, 4 * C, C, prec, s_);
  cuda::add_inplace(out, a.res2.data(), nc, s_);
}

void Gpt::block_backward(int l, float* dres, const float* x, Acts& a, int B, int T) {
  const int N = B * T, C = cfg_.n_embd;
  const auto& lp = layers_[l];
  const auto prec = cfg_.precision;
  float* dc = dc_.data();
  float* dfch = dfch_.data();
  cuda::linear_backward(dfch, G(lp.mproj_w), G(lp.mproj_b), dres, a.fch_gelu.data(), P(lp.mproj_w), N, 4 * C, C,
                        0.0f, prec, s_);
  cuda::gelu_backward(dfch, a.fch.data(), dfch, static_cast<size_t>(N) * 4 * C, cfg_.gelu, s_);
  cuda::linear_backward(dc, G(lp.fc_w), G(lp.fc_b), dfch, a.ln2.data(), P(lp.fc_w), N, C, 4 * C, 0.0f, prec, s_);
  cuda::layernorm_backward(dres, G(lp.ln2_w), G(lp.ln2_b), dc, a.res2.data(), P(lp.ln2_w), a.ln2_mean.data(),
                           a.ln2_rstd.data(), N, C, s_);
  cuda::linear_backward(dc, G(lp.proj_w), G(lp.proj_b), dres, a.atty.data(), P(lp.proj_w), N, C, C, 0.0f, prec, s_);
  cuda::attention_backward(dqkv_.data(), dc, a.qkv.data(), a.atty.data(), a.lse.data(), B, T, C, cfg_.n_head, s_);
  cuda::linear_backward(dc, G(lp.attn_w), G(lp.attn_b), dqkv_.data(), a.ln1.data(), P(lp.attn_w), N, C, 3 * C, 0.0f,
                        prec, s_);
  cuda::layernorm_backward(dres, G(lp.ln1_w), G(lp.ln1_b), dc, x, P(lp.ln1_w), a.ln1_mean.data(), a.ln1_rstd.data(),
                           N, C, s_);
}

float Gpt::forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T, bool backward,
                            float loss_scale) {
  TRIDENT_CHECK(B > 0 && T > 0 && T <= cfg_.block_size, InvalidArgument,
                "cuda gpt: batch {} x {} tokens; T must lie in [1, block_size = {}]", B, T, cfg_.block_size);
  TRIDENT_CHECK(inputs && targets, InvalidArgument, "cuda gpt: inputs and targets must be device int32 [B, T]");
  ensure(B, T);
  const int N = B * T, C = cfg_.n_embd, L = cfg_.n_layer, V = cfg_.vocab_size;
  const auto prec = cfg_.precision;
  cuda::embedding_forward(xs_[0].data(), inputs, P(wte_), P(wpe_), B, T, C, V, s_);
  for (int l = 0; l < L; ++l) block_forward(l, xs_[l].data(), *acts_[l], xs_[l + 1].data(), B, T);
  cuda::layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), xs_[L].data(), P(lnf_w_), P(lnf_b_), N, C,
                          1e-5f, s_);
  cuda::linear_forward(logits_.data(), lnf_.data(), P(wte_), nullptr, N, C, V, prec, s_);
  const double sum = cuda::cross_entropy_forward_backward(backward ? logits_.data() : nullptr, logits_.data(), targets,
                                                          N, V, loss_scale / static_cast<float>(N), s_);
  if (backward) {
    cuda::linear_backward(dc_.data(), G(wte_), nullptr, logits_.data(), lnf_.data(), P(wte_), N, C, V, 0.0f, prec,
                          s_);
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(dres_.data(), 0, dres_.bytes(), s_));
    cuda::layernorm_backward(dres_.data(), G(lnf_w_), G(lnf_b_), dc_.data(), xs_[L].data(), P(lnf_w_),
                             lnf_mean_.data(), lnf_rstd_.data(), N, C, s_);
    for (int l = L - 1; l >= 0; --l) block_backward(l, dres_.data(), xs_[l].data(), *acts_[l], B, T);
    cuda::embedding_backward(G(wte_), G(wpe_), dres_.data(), inputs, B, T, C, s_);
  }
  return static_cast<float>(sum / N);
}

}  // namespace trident::cuda
