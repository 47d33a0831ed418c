// Devices and their op tables: one model and one training stack, run on the CPU or on a CUDA GPU.
//
// A DeviceOps is a table of function pointers: the memory operations (alloc, free, copies between host
// and device, memset, synchronize) and every kernel of kernels/cpu/ops.h with the same signature and
// conventions. Tables are written with designated initializers (.alloc = ...), so a misordered entry does
// not compile; a missing one is null, which the device tests find (every pointer after `device` non-null).
// Code that runs on either device calls ops.linear_forward(...) instead of a kernel by name.
// Pointers passed to a table's kernels are memory of ITS device (alloc()); host_* arguments of the copies
// are host memory. The CPU table calls the kernels of kernels/cpu/ops.h (so CPU results are those
// kernels' results, bit for bit). The CUDA table lives in trident_cuda (cuda/device_ops.cc), which
// registers it when linked in (register_device below), so this layer never depends on CUDA.
//
// Ownership: tables are static and live for the process; DeviceMemory owns one allocation.
// Blocking: the CPU table is synchronous. The CUDA table queues work on the legacy default stream;
// to_host and the kernels that return a host value (cross_entropy_forward_backward, sum_squares) or
// validate indices (embedding_forward) block until the device is done, as cuda/ops.h documents.
// Thread-safety: device_ops() is safe from any thread; kernels as their own headers say. No timeouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "trident/core/error.h"
#include "trident/kernels/cpu/ops.h"

namespace trident::kernels {

enum class Device : uint8_t { kCpu = 0, kCuda = 1 };

const char* device_name(Device d);  // "cpu" | "cuda"
// "cpu" | "cuda" -> Device; anything else throws InvalidArgument naming the choices.
Device parse_device(const std::string& name);

// The device asked for cannot be used here: this build lacks it (`reason` says what was looked for at
// configure time) or no device of that kind is visible (`reason` names the probe's result and
// CUDA_VISIBLE_DEVICES).
class DeviceUnavailable : public Error {
 public:
  DeviceUnavailable(const std::string& what, Device device, std::string reason)
      : Error(what), device(device), reason(std::move(reason)) {}
  Device device;
  std::string reason;
};

struct DeviceOps {
  Device device;

  // ---- memory (bytes; alloc returns 64-byte aligned, zero-filled memory; free(nullptr) is a no-op) ----
  void* (*alloc)(size_t bytes);
  void (*free)(void* p);
  void (*to_device)(void* dst, const void* host_src, size_t bytes);
  void (*to_host)(void* host_dst, const void* src, size_t bytes);
  void (*copy)(void* dst, const void* src, size_t bytes);  // within the device
  void (*memset_zero)(void* p, size_t bytes);
  void (*synchronize)();  // waits for all queued work

  // ---- kernels: the signatures and conventions of kernels/cpu/ops.h ----
  void (*gemm)(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc, cpu::Precision p);
  void (*linear_forward)(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                         cpu::Precision p);
  void (*linear_backward)(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, int N, int C, int OC, float dinp_beta, cpu::Precision p,
                          const float* dinp_mul);
  void (*gelu_forward)(float* out, const float* inp, size_t n, cpu::GeluKind kind);
  void (*gelu_forward_and_grad)(float* out, float* grad, const float* inp, size_t n, cpu::GeluKind kind);
  void (*gelu_backward)(float* dinp, const float* inp, const float* dout, size_t n, cpu::GeluKind kind);
  void (*mul)(float* out, const float* a, const float* b, size_t n);
  void (*add)(float* out, const float* a, const float* b, size_t n);
  void (*add_inplace)(float* acc, const float* x, size_t n);
  void (*layernorm_forward)(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                            const float* bias, int N, int C, float eps);
  void (*layernorm_backward)(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* weight, const float* mean, const float* rstd, int N, int C);
  void (*softmax_forward)(float* out, const float* inp, int N, int C);
  // p: the precision of the model's products. The CPU computes attention in float32 at both; CUDA takes
  // its tensor-core kernels for kBFloat16 (cuda/ops.h).
  void (*attention_forward)(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, cpu::Precision p);
  void (*attention_backward)(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             int B, int T, int C, int NH, cpu::Precision p);
  void (*embedding_forward)(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                            int C, int V);
  void (*embedding_backward)(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C);
  double (*cross_entropy_forward_backward)(float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                                           float dscale);
  void (*adamw_update)(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
                       float beta2, float eps, float weight_decay, int64_t t);
  double (*sum_squares)(const float* x, size_t n);
  void (*scale_inplace)(float* x, float a, size_t n);
  void (*to_bf16)(uint16_t* out, const float* in, size_t n);
  void (*from_bf16)(float* out, const uint16_t* in, size_t n);

  // ---- strided copies and the tensor-parallel layers' steps (kernels/device.cc has the CPU reference) ----
  // dst[r * ldd + c] = src[r * lds + c] for r < rows, c < cols (both in the device).
  void (*copy_2d)(float* dst, size_t ldd, const float* src, size_t lds, size_t rows, size_t cols);
  // out[r * ldo + c] = a[r * lda + c] + b[r * ldb + c]; ldb 0 broadcasts one row of b; out may alias a.
  // dst[r * ldd + c] = value for r < rows, c < cols (the padded vocabulary's logits: -inf).
  void (*fill_2d)(float* dst, size_t ldd, float value, size_t rows, size_t cols);
  void (*add_2d)(float* out, size_t ldo, const float* a, size_t lda, const float* b, size_t ldb, size_t rows,
                 size_t cols);
  // Vocab-parallel embedding over the rows [v0, v0 + vl) of a [V, C] table: out[i] = wte_shard[tokens[i] - v0]
  // for tokens in the shard, else 0 (the caller all-reduces). Tokens outside [0, V) throw InvalidArgument.
  void (*embedding_shard_forward)(float* out, const int32_t* tokens, const float* wte_shard, int64_t v0, int64_t vl,
                                  int64_t V, int N, int C);
  // dwte_shard[tokens[i] - v0] += dout[i] for the tokens in the shard (in position order on the CPU).
  void (*embedding_shard_backward)(float* dwte_shard, const float* dout, const int32_t* tokens, int64_t v0,
                                   int64_t vl, int N, int C);
  // Vocab-parallel softmax cross-entropy over logits[N, vl] (columns [v0, v0 + vl) of [N, V]), in three
  // passes around the caller's two all-reduces:
  // 1. mx[N] = local row maxima (all-reduce max follows). Targets outside [0, V) throw InvalidArgument.
  void (*ce_shard_max)(float* mx, const float* logits, const int32_t* targets, int N, int64_t vl, int64_t V);
  // 2. st[0, N) = local sums of exp(logit - mx), st[N, 2N) = the target's logit when in the shard, else 0
  //    (all-reduce sum follows); dlogits (nullable, may alias logits) = the exps.
  void (*ce_shard_sumexp)(float* st, float* dlogits, const float* logits, const float* mx, const int32_t* targets,
                          int N, int64_t vl, int64_t v0);
  // 3. Returns the sum over rows of -log softmax[target]; dlogits (nullable) = (softmax - onehot) * dscale.
  double (*ce_shard_finish)(float* dlogits, const float* st, const float* mx, const int32_t* targets, int N,
                            int64_t vl, int64_t v0, float dscale);

  // ---- Llama-family layers: the signatures and conventions of kernels/cpu/ops.h ----
  // RMSNorm over the last dim C (Llama): out = inp * rstd * weight with rstd[r] = 1/sqrt(mean_c(inp[r,c]^2) + eps),
  // computed in float32 with a double or float accumulator; rstd[N] saved for backward (nullable in forward).
  void (*rmsnorm_forward)(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
  // dinp += d inp (ACCUMULATES, like layernorm_backward); dweight += sum over rows of dout * inp * rstd.
  void (*rmsnorm_backward)(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                           const float* rstd, int N, int C);
  // Rotary position embedding in place, Hugging Face's rotate-half layout: x holds N rows of `stride` floats; row r is
  // position p = r % T; heads h in [0, n_heads) start at x + r*stride + h*hd. For i < hd/2, with c = cos[p*(hd/2)+i],
  // s = sin[p*(hd/2)+i], a = x[i], b = x[i+hd/2]:  forward  x[i] = a*c - b*s, x[i+hd/2] = b*c + a*s;
  // inverse (the backward: rotation by -angle)  x[i] = a*c + b*s, x[i+hd/2] = b*c - a*s.
  // cos/sin: device tables [T_max, hd/2] (position-major), T <= T_max.
  void (*rope)(float* x, const float* cos, const float* sin, int N, int T, int stride, int n_heads, int hd,
               bool inverse);
  // SwiGLU: h[N, 2I] holds each row's [gate (I) | up (I)]; out[N, I] = silu(gate) * up, silu(g) = g * sigmoid(g).
  void (*swiglu_forward)(float* out, const float* h, int N, int I);
  // dh[N, 2I] (overwritten): d gate = dout * up * sig(g) * (1 + g * (1 - sig(g))), d up = dout * silu(g).
  void (*swiglu_backward)(float* dh, const float* dout, const float* h, int N, int I);
  // Grouped-query attention's key/value sharing, as multi-head attention's packed layout: src[N, (nh + 2*nkv)*hd] holds
  // each row's q (nh heads) | k (nkv heads) | v (nkv heads); dst[N, 3*nh*hd] = q | k | v with nh heads each, where
  // local q head j reads k and v of local kv head (h0 + j) / group - kv0 (h0: global index of the first local q head,
  // group = n_head / n_kv_head, kv0: global index of the first local kv head). The kv index is always in [0, nkv).
  void (*kv_expand)(float* dst, const float* src, int N, int nh, int nkv, int hd, int h0, int group, int kv0);
  // Its adjoint: dsrc[N, (nh + 2*nkv)*hd] (overwritten) from d dst[N, 3*nh*hd]: dq copied; d k (and d v) of each
  // local kv head = the sum of d k (d v) of the q heads that read it, summed in ascending j order (0 for a kv head
  // none reads).
  void (*kv_reduce)(float* dsrc, const float* ddst, int N, int nh, int nkv, int hd, int h0, int group, int kv0);

  // The device in words: "cpu", or CUDA's name of the current GPU with its compute capability, SMs and memory
  // ("NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79 GiB)"): what the planner's hardware catalog is matched against.
  std::string (*describe)();
  // The kernels this device runs a model with head dim `head_dim` (0: no attention) at precision `p`, in
  // words, for the startup log: the CPU's ISA choices, or CUDA's GEMM and attention paths.
  std::string (*kernel_summary)(int head_dim, cpu::Precision p);
};

// The op table of `d`. Throws DeviceUnavailable when this build has no such device or none is visible.
const DeviceOps& device_ops(Device d);
// Empty when device_ops(d) would succeed; otherwise why it throws.
std::string device_unavailable_reason(Device d);

// Called once per device by the layer that implements it (a static registrar in cuda/device_ops.cc).
// `probe` returns "" when a device is usable, else why not; `ops` is used only after an empty probe.
void register_device(Device d, const DeviceOps* ops, std::string (*probe)());

// One allocation of `count` elements of T in a device's memory, zero-filled, 64-byte aligned.
// Move-only; frees through the table it came from.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceOps& ops, size_t count)
      : ops_(&ops), p_(static_cast<T*>(count ? ops.alloc(count * sizeof(T)) : nullptr)), n_(count) {}
  ~DeviceArray() { reset(); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept
      : ops_(o.ops_), p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = o.ops_;
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  // Reallocates (zero-filled, contents dropped) unless it already holds exactly n elements.
  void resize(const DeviceOps& ops, size_t n) {
    if (n == n_ && ops_ == &ops) return;
    *this = DeviceArray(ops, n);
  }
  void reset() {
    if (p_) ops_->free(p_);
    p_ = nullptr;
    n_ = 0;
  }

 private:
  const DeviceOps* ops_ = nullptr;
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace trident::kernels
