// nanoGPT's GPT on one GPU: the model of nn/gpt.cc (forward and hand-written backward) with the CUDA
// kernels of ops.h, and the SAME flat parameter layout: the same names, registration order, shapes and
// offsets (each parameter starts at a multiple of 16 floats), so nn::Model::param_data() can be copied
// to param_data() here byte for byte and gradients compared the same way. Dropout 0 only.
//
// Ownership: the model owns its device buffers (parameters, gradients, activations for one (B, T), and
// scratch). Blocking: forward_backward synchronizes `stream` (it returns the loss); everything else is
// asynchronous on the stream given at construction. Thread-safety: one thread at a time. No timeouts.
// Built only where nvcc is found (TRIDENT_HAVE_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/cuda/device.h"
#include "trident/cuda/ops.h"

namespace trident::cuda {

struct GptConfig {
  int n_layer = 6;
  int n_head = 6;
  int n_embd = 384;
  int block_size = 256;
  int vocab_size = 0;
  bool bias = true;
  GeluKind gelu = GeluKind::kExact;
  Precision precision = Precision::kFloat32;  // of the GEMMs (bf16: operands rounded, float32 accumulate)
};

struct GptParam {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // elements into param_data()/grad_data()
  size_t numel = 0;
};

class Gpt {
 public:
  explicit Gpt(GptConfig c, cudaStream_t stream = nullptr);  // parameters zero: load them (copy_from_host)
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const std::vector<GptParam>& parameters() const { return params_; }
  size_t num_params() const { return num_; }  // flat size including alignment padding
  float* param_data() { return values_.data(); }
  float* grad_data() { return grads_.data(); }
  void zero_grad();
  // Copies num_params() floats from host memory laid out as nn::Model::param_data().
  void copy_params_from_host(const float* host);

  // inputs, targets: DEVICE int32 [B, T]. Returns the mean cross-entropy; with backward, gradients of
  // loss_scale * mean loss ACCUMULATE into grad_data() (as the CPU model).
  float forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T, bool backward,
                         float loss_scale = 1.0f);

 private:
  struct Acts;
  int add_param(std::string name, std::vector<int64_t> shape);
  float* P(int idx) { return idx < 0 ? nullptr : values_.data() + params_[idx].offset; }
  float* G(int idx) { return idx < 0 ? nullptr : grads_.data() + params_[idx].offset; }
  void ensure(int B, int T);
  void block_forward(int l, const float* x, Acts& a, float* out, int B, int T);
  void block_backward(int l, float* dres, const float* x, Acts& a, int B, int T);

  GptConfig cfg_;
  cudaStream_t s_;
  std::vector<GptParam> params_;
  size_t num_ = 0;
  DeviceBuffer<float> values_, grads_;
  struct Layer {
    int ln1_w = -1, ln1_b = -1, attn_w = -1, attn_b = -1, proj_w = -1, proj_b = -1;
    int ln2_w = -1, ln2_b = -1, fc_w = -1, fc_b = -1, mproj_w = -1, mproj_b = -1;
  };
  std::vector<Layer> layers_;
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  size_t cap_n_ = 0;
  std::vector<std::unique_ptr<Acts>> acts_;
  std::vector<DeviceBuffer<float>> xs_;
  DeviceBuffer<float> lnf_, lnf_mean_, lnf_rstd_, logits_, dres_, dc_, dqkv_, dfch_;
};

}  // namespace trident::cuda
