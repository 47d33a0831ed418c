// The layers of trident's language models, written once for one process and for Megatron-LM tensor
// parallelism: the token embedding (with or without learned positions), the norms (LayerNorm, RMSNorm),
// Linear and groups of Linears whose outputs concatenate (q | k | v, gate | up), the GPT block (attention +
// GELU MLP), the Llama block (rotary embeddings, grouped-query attention, SwiGLU), the deep MLP's residual
// GELU layers and the head (final norm, the LM head, cross-entropy). The architectures (nn/arch/) declare
// the models' parameters and build these layers over them; nn/layer_range.h runs a contiguous range of them
// (the whole model in one process, a pipeline stage of a tensor/pipeline-parallel shard).
//
// A layer reads its parameters and adds its gradients through shaped views into its model's flat buffers
// (parameter indices into FlatModel::parameters(); -1 = absent), calls the kernels through the model's
// device op table (kernels/device.h) and fires the model's grad-ready hook for each of its parameters the
// moment the gradient is final (in descending index order, as model.h requires).
//
// Tensor parallelism is a property of a layer given a TpGroup (the collectives it needs; nn cannot see a
// ProcessGroup, so parallel/tensor_parallel.h implements this interface over one). With no group, or a
// group of one rank, every layer runs exactly the single-process kernels (bit-identical results), so the
// single-process model is the TP = 1 case of this code. With T > 1 ranks (rank t):
// - column-parallel Linear: this rank holds a block of output rows (and of the bias); forward is local
//   (Megatron's f: identity), backward all-reduces the input gradient;
// - row-parallel Linear: this rank holds a block of input columns; forward all-reduces the partial outputs
//   and adds the whole bias once (Megatron's g), backward is local;
// - GPT block: c_attn column-parallel by heads, attention on the local heads, attn.c_proj row-parallel;
//   c_fc column-parallel, GELU local, mlp.c_proj row-parallel. 2 all-reduces of N*C in forward, 2 in backward;
// - Llama block: q, k, v column-parallel by heads (k and v by key/value heads when T divides n_kv_head;
//   otherwise every rank holds them whole, uses the key/value heads its query heads read, and their weight
//   gradients, partial on each rank, are all-reduced over the group, as Megatron does); o_proj row-parallel;
//   gate and up column-parallel, SwiGLU local, down_proj row-parallel. The same all-reduces as the GPT;
// - deep MLP: layers pair up (i column-parallel, i+1 row-parallel; x_{i+1}[:, cols] = x_i[:, cols] + gelu
//   is local), one all-reduce of 2*N*C forward and one of N*C backward per pair; an unpaired layer is
//   column-parallel with one all-reduce each way;
// - vocab-parallel embedding (rows [v0, v0 + vl) of wte; lookup, all-reduce, + wpe) and head (local
//   logits [N, vl], d ln_f all-reduced) with the vocab-parallel cross-entropy that never gathers logits.
// Norms and row-parallel biases are replicated (identical gradients on every TP rank). Every step of
// every path, the T > 1 ones included (bias broadcast, column scatter, the vocab-parallel lookup and
// cross-entropy), is a call of the op table, so the layers run on any device the table exists for.
//
// Ownership: a layer holds indices only; its activations are LayerActs the caller owns (one per saved
// microbatch, or one shared set under activation checkpointing). Blocking: forward/backward block on the
// group's collectives (its deadline applies; failures throw from the call). Thread-safety: one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/kernels/device.h"
#include "trident/nn/flat_model.h"

namespace trident::nn {

// The tensor-parallel collectives a layer needs, on float32 buffers in the memory of the layers' device (an
// implementation whose transport reads host memory stages them). microbatch/chunk label the
// implementation's trace spans (-1: none).
class TpGroup {
 public:
  virtual ~TpGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_reduce_sum(float* buf, size_t n, int microbatch = -1, int chunk = -1) = 0;
  virtual void all_reduce_max(float* buf, size_t n, int microbatch = -1, int chunk = -1) = 0;
  // recv[size * n] = every rank's send[n], in rank order.
  virtual void all_gather(const float* send, float* recv, size_t n, int microbatch = -1, int chunk = -1) = 0;
};

// Buffers of one device, by slot: a layer's saved activations, or a model's backward workspace.
class LayerActs {
 public:
  // Sizes the buffers (slot i gets sizes[i] floats); buffers already of that size are kept.
  void resize(const kernels::DeviceOps& ops, const std::vector<size_t>& sizes);
  float* operator[](size_t slot) { return bufs_[slot].data(); }
  // Slot `slot` with at least n floats (grows, never shrinks; contents undefined after growth).
  float* at_least(const kernels::DeviceOps& ops, size_t slot, size_t n);
  size_t bytes() const;

 private:
  std::vector<kernels::DeviceArray<float>> bufs_;
};

// What a layer's forward and backward run with.
struct LayerEnv {
  const kernels::DeviceOps& ops;
  FlatModel& model;              // parameters, gradients, grad-ready hook
  TpGroup* tp = nullptr;         // null: no tensor parallelism
  LayerActs* workspace = nullptr;  // backward scratch shared by the layers (slots as each layer documents)
  kernels::cpu::Precision precision = kernels::cpu::Precision::kFloat32;
  kernels::cpu::GeluKind gelu = kernels::cpu::GeluKind::kExact;
  int microbatch = -1, chunk = -1;  // labels of the collectives' trace spans

  bool parallel() const { return tp != nullptr && tp->size() > 1; }
  int tp_size() const { return parallel() ? tp->size() : 1; }
  int tp_rank() const { return parallel() ? tp->rank() : 0; }
  // In-place sum over the group (no-op without tensor parallelism).
  void all_reduce_sum(float* buf, size_t n) const {
    if (parallel()) tp->all_reduce_sum(buf, n, microbatch, chunk);
  }
  float* P(int idx) const { return model.P(idx); }
  float* G(int idx) const { return model.G(idx); }
  void fire(int idx) const { model.fire(idx); }
  float* scratch(size_t slot, size_t n) const { return workspace->at_least(ops, slot, n); }
  void block(int b, Model::BlockEvent ev) const { model.block_event(b, ev); }
};

// Workspace slots: 0..5 the units' backward (and the MLP's tensor-parallel forward), kCeSlot0/1 the head's
// vocab-parallel loss and logits gather; layer_range.h's driver uses 8..10.
inline constexpr size_t kCeSlot0 = 6, kCeSlot1 = 7;

enum class Parallelism : uint8_t { kNone, kColumn, kRow };

enum class NormKind : uint8_t { kLayerNorm, kRmsNorm };

// LayerNorm (out = (x - mean) rstd w + b) or RMSNorm (out = x rstd w, no mean, no bias) over C, with eps.
struct Norm {
  NormKind kind = NormKind::kLayerNorm;
  int w = -1, b = -1;
  float eps = 1e-5f;
  // Statistics saved per row for backward: mean and rstd (LayerNorm), rstd (RMSNorm).
  bool has_mean() const { return kind == NormKind::kLayerNorm; }
  // mean: unused (may be null) for RMSNorm.
  void forward(const LayerEnv& e, float* out, float* mean, float* rstd, const float* inp, int N, int C) const;
  // dinp += d inp; fires b then w.
  void backward(const LayerEnv& e, float* dinp, const float* dout, const float* inp, const float* mean,
                const float* rstd, int N, int C) const;
};

// Linear [OC, C] (PyTorch layout). C and OC are this rank's: the local rows (column-parallel) or
// columns (row-parallel) of the weight.
struct Linear {
  int w = -1, b = -1;
  Parallelism mode = Parallelism::kNone;
  void forward(const LayerEnv& e, float* out, const float* inp, int N, int C, int OC) const;
  // dinp = dout W (column-parallel: all-reduced); fires b then w.
  // dinp_mul (nullable, N x C): the input gradient is multiplied by it elementwise (an activation's
  // derivative), fused into the product on the CPU.
  void backward(const LayerEnv& e, float* dinp, const float* dout, const float* inp, int N, int C, int OC,
                const float* dinp_mul = nullptr) const;
};

// Column-parallel Linears over one input whose outputs concatenate in part order: out[N, sum of rows] holds
// each row's part 0 | part 1 | ... (q | k | v, gate | up). Parts registered one after another with no padding
// between them (each rows x C a multiple of 16 floats) form one [sum of rows, C] weight and run as one GEMM;
// otherwise each part is a GEMM of its own into its columns. A part with reduce_grad holds the whole tensor
// on every rank of the tensor-parallel group and gets only a partial gradient on each: its weight gradient is
// all-reduced over the group before it is added (workspace slot kReduceSlot).
struct LinearGroup {
  struct Part {
    int w = -1;
    int rows = 0;  // this rank's rows
    bool reduce_grad = false;
  };
  std::vector<Part> parts;
  int rows() const;
  void forward(const LayerEnv& e, float* out, const float* inp, int N, int C) const;
  // dinp = dout [W_0; W_1; ...] (all-reduced over the group); fires the parts' weights in reverse order.
  void backward(const LayerEnv& e, float* dinp, const float* dout, const float* inp, int N, int C) const;
};
inline constexpr size_t kReduceSlot = 11;

// One residual block between x_l and x_{l+1} (a GPT block, one or two MLP layers).
class Layer {
 public:
  virtual ~Layer() = default;
  // Sizes `a` for N positions (per this rank's shard).
  virtual void alloc(const LayerEnv& e, LayerActs& a, size_t N) const = 0;
  // x [N, C] -> out [N, C]. recompute: the forward again inside backward (activation checkpointing); the
  // layer refreshes what its backward reads and may leave `out` unwritten.
  virtual void forward(const LayerEnv& e, const float* x, LayerActs& a, float* out, int B, int T,
                       bool recompute) const = 0;
  // dres: d out on entry, d x on return. Fires the layer's parameters' hooks.
  virtual void backward(const LayerEnv& e, float* dres, const float* x, LayerActs& a, int B, int T) const = 0;
  // Parameter indices the layer reads, in registration order (a model's blocks()).
  virtual std::vector<size_t> params() const = 0;
};

// nanoGPT's Block: x + attn(ln_1(x)), then + mlp(ln_2(.)). n_embd and n_head are the full model's.
// Workspace slots used by backward: 0 (N*C), 1 (N*3C/T), 2 (N*4C/T), 3 (N*C/T).
class GptBlock final : public Layer {
 public:
  struct Params {
    Norm ln1, ln2;
    Linear attn, proj, fc, mproj;
  };
  GptBlock(Params p, int n_embd, int n_head);
  void alloc(const LayerEnv& e, LayerActs& a, size_t N) const override;
  void forward(const LayerEnv& e, const float* x, LayerActs& a, float* out, int B, int T,
               bool recompute) const override;
  void backward(const LayerEnv& e, float* dres, const float* x, LayerActs& a, int B, int T) const override;
  std::vector<size_t> params() const override;

 private:
  Params p_;
  int C_, H_;
};

// Rotary embedding tables (Hugging Face's rotate-half layout): cos and sin of position p times each of the
// head's hd/2 inverse frequencies, for p < max_positions, computed once on the host in double precision
// (Llama 3.1's rope_scaling applied to the frequencies) and copied to a device on first use there. Shared
// by the blocks of one model. Not thread-safe (one model, one thread).
class RopeTable {
 public:
  // theta: the base; scaling: null or {"rope_type": "llama3", ...} (validated by the architecture).
  RopeTable(int head_dim, int max_positions, double theta, const nlohmann::json& scaling);
  // [max_positions, hd/2] tables in the memory of ops' device.
  const float* cos(const kernels::DeviceOps& ops) const { return on(ops).first; }
  const float* sin(const kernels::DeviceOps& ops) const { return on(ops).second; }
  // The inverse frequencies (tests compare them with Hugging Face's).
  const std::vector<double>& inv_freq() const { return inv_freq_; }

 private:
  std::pair<const float*, const float*> on(const kernels::DeviceOps& ops) const;
  std::vector<double> inv_freq_;
  std::vector<float> cos_, sin_;
  mutable const kernels::DeviceOps* dev_ops_ = nullptr;
  mutable kernels::DeviceArray<float> dcos_, dsin_;
};

// A Llama decoder layer (Hugging Face's LlamaDecoderLayer): h = x + o(attn(rope(q), rope(k), v)) with q, k, v
// of rmsnorm(x), then out = h + down(silu(gate(rmsnorm(h))) * up(rmsnorm(h))); no biases. n_head query heads
// share n_kv_head key/value heads (group = n_head / n_kv_head consecutive query heads per key/value head).
// Workspace slots used by backward: 0 (N*C), 1 (N*3*Hl*hd), 2 (N*2*I/T), 3 (N*Hl*hd), 4 (N*I/T),
// 5 (N*(Hl+2KVl)*hd), kReduceSlot.
class LlamaBlock final : public Layer {
 public:
  struct Params {
    Norm attn_norm, mlp_norm;
    LinearGroup qkv;      // q_proj | k_proj | v_proj, rows as this rank holds them
    Linear o;             // row-parallel
    LinearGroup gate_up;  // gate_proj | up_proj
    Linear down;          // row-parallel
  };
  // n_embd, n_head, n_kv_head and intermediate the full model's; kv_split: the key/value heads are split over
  // the tensor-parallel ranks (else every rank holds all of them).
  LlamaBlock(Params p, int n_embd, int n_head, int n_kv_head, int intermediate, bool kv_split,
             std::shared_ptr<const RopeTable> rope);
  void alloc(const LayerEnv& e, LayerActs& a, size_t N) const override;
  void forward(const LayerEnv& e, const float* x, LayerActs& a, float* out, int B, int T,
               bool recompute) const override;
  void backward(const LayerEnv& e, float* dres, const float* x, LayerActs& a, int B, int T) const override;
  std::vector<size_t> params() const override;

 private:
  struct Local {
    int heads, kv_heads, inter, h0, kv0;
    bool expand;  // grouped-query: k and v widened to one head per query head before attention
  };
  Local local(const LayerEnv& e) const;
  Params p_;
  int C_, H_, KV_, I_, hd_;
  bool kv_split_;
  std::shared_ptr<const RopeTable> rope_;
};

// 1 or 2 consecutive deep-MLP layers x_{k+1} = x_k + gelu(x_k W_k^T + b_k). Without tensor
// parallelism a unit is one layer (two are refused); with it, the first is column-parallel and the second
// (when present) row-parallel. Workspace slots used: 0..5.
class MlpLayers final : public Layer {
 public:
  struct Params {
    int w = -1, b = -1;
  };
  MlpLayers(std::vector<Params> layers, int n_embd);
  void alloc(const LayerEnv& e, LayerActs& a, size_t N) const override;
  void forward(const LayerEnv& e, const float* x, LayerActs& a, float* out, int B, int T,
               bool recompute) const override;
  void backward(const LayerEnv& e, float* dres, const float* x, LayerActs& a, int B, int T) const override;
  std::vector<size_t> params() const override;

 private:
  std::vector<Params> l_;
  int C_;
};

// x_0 = wte[token] (+ wpe[position] when the model learns positions: wpe >= 0). wte holds rows
// [v0, v0 + vl) of the full [V, C] table (all of it without tensor parallelism).
struct Embedding {
  int wte = -1, wpe = -1;
  int64_t V = 0, v0 = 0, vl = 0;
  void forward(const LayerEnv& e, float* out, const int32_t* tokens, int B, int T, int C) const;
  // Adds into the gradients of wte and wpe; fires wpe (if any) then wte.
  void backward(const LayerEnv& e, const float* dout, const int32_t* tokens, int B, int T, int C) const;
};

// The final norm, the LM head (weight: `head`, this rank's vocabulary rows [v0, v0 + vl)) and the
// cross-entropy.
struct LmHead {
  Norm lnf;
  int head = -1;
  bool fire_head = true;  // false when `head` is the embedding's own wte (final only after its backward)
  int64_t V = 0, v0 = 0, vl = 0;
  int64_t V_valid = 0;  // ids [V_valid, V) are padding: their logits are -inf (0: none)
  // lnf_out, mean (LayerNorm only; may be null otherwise), rstd: saved for backward; logits [N, vl].
  void forward(const LayerEnv& e, float* logits, float* lnf_out, float* mean, float* rstd, const float* x, int N,
               int C) const;
  // Sum over rows of -log softmax(logits)[target]; dlogits (nullable, may alias logits) = (softmax - onehot)
  // * dscale for this rank's columns.
  double loss(const LayerEnv& e, float* dlogits, const float* logits, const int32_t* targets, int N,
              float dscale) const;
  // dx = d x (overwritten) from dlogits; dlnf: N*C scratch.
  void backward(const LayerEnv& e, float* dx, float* dlnf, const float* dlogits, const float* lnf_out,
                const float* x, const float* mean, const float* rstd, int N, int C) const;
  // full[N, V] = the logits of every rank's vocabulary rows (an all-gather under tensor parallelism).
  void gather_logits(const LayerEnv& e, float* full_host, const float* logits, int N) const;
};

}  // namespace trident::nn
