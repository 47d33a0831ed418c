// Transformer model shapes and the closed-form formulas of the planner: parameter counts, model FLOPs
// per iteration, memory per rank (params / grads / optimizer / master weights / activations) under
// DDP, ZeRO 1-3, TP, PP and activation checkpointing, and pipeline bubbles.
//
// Pure functions on values: no ownership, no blocking, thread-safe, no timeouts. Sources are cited at
// each formula and collected in docs/PLANNER.md.
#pragma once

#include <string>
#include <vector>

namespace trident::plan {

// Named shapes are ONE catalog (model_preset): `trident plan`, `trident simulate` and `trident train --model
// NAME` read the same entries (train takes an entry's architecture, shapes and rotary settings).
struct ModelSpec {
  std::string name = "custom";
  std::vector<std::string> aliases;  // other names of the same entry (gpt2 for gpt2-124m, ...)
  std::string arch = "gpt";          // trident's architecture (nn/arch/): gpt | llama
  bool transformer = true;           // attention blocks (false: trident's deep MLP, which the planner does not model)
  int layers = 12;
  int hidden = 768;
  int heads = 12;
  int kv_heads = 0;     // 0 = heads (no grouped-query attention)
  int ffn_hidden = 0;   // 0 = 4 * hidden
  bool gated_mlp = false;  // SwiGLU (LLaMA): three ffn matrices instead of two
  int vocab = 50257;
  int seq = 1024;
  bool tied_embeddings = true;    // GPT-2 ties the LM head to the token embedding
  bool learned_positions = true;  // GPT-2 learns position embeddings; LLaMA uses RoPE
  bool bias = true;               // biases in the linear layers and norms (GPT-2: yes; LLaMA: none)
  std::string tokenizer;          // trident's tokenizer of the family's released models ("" = none built in)
  double rope_theta = 10000.0;    // rotary base (LLaMA)
  double norm_eps = 1e-5;         // LayerNorm / RMSNorm epsilon
  // Llama 3.1's rope_scaling (factor 0: none).
  double rope_factor = 0, rope_low_freq_factor = 0, rope_high_freq_factor = 0;
  int rope_original_max_positions = 0;

  int kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * hidden; }
  double params_per_layer() const;   // attention + MLP + 2 norms
  double embedding_params() const;   // token (+ position) embedding
  double head_params() const;        // LM head when untied (0 when tied)
  double total_params() const;
  // Parameters that take part in matmuls for every token: layers + the LM head (vocab x hidden).
  double matmul_params() const;
};

// Named presets: gpt2-124m (gpt2), gpt2-350m (gpt2-medium), gpt2-774m (gpt2-large), gpt2-1.5b (gpt2-xl),
// tinyllama-1.1b, llama3.2-1b, llama2-7b, llama3-8b, llama-7b, llama-13b, llama-65b, llama-70b, gpt3-175b (by
// name or alias). Throws InvalidArgument listing them when unknown; find_model_preset returns null instead.
ModelSpec model_preset(const std::string& name);
const ModelSpec* find_model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

enum class Recompute { kNone, kSelective, kFull };
enum class Precision { kFp32, kMixed };  // kMixed: bf16/fp16 params, grads, activations + fp32 master
enum class Schedule { kGPipe, k1F1B, kInterleaved };

const char* to_string(Recompute r);
const char* to_string(Precision p);
const char* to_string(Schedule s);
bool parse_recompute(const std::string& s, Recompute* out);
bool parse_schedule(const std::string& s, Schedule* out);
bool parse_precision(const std::string& s, Precision* out);

// ---- FLOPs (Kaplan et al. 2020; Narayanan et al. 2021 "Efficient large-scale LM training" eq. 3;
// PaLM appendix B for the attention term) ----
// Model FLOPs of one iteration over `tokens` tokens: 6 * matmul_params * tokens + 12 * L * h * s * tokens
// (forward 2N + 4Lhs per token, backward twice the forward). Recomputation is NOT counted (MFU's
// definition); hardware_flops_per_iteration adds it: full recompute one more forward of the layers
// (-> 8N), selective the attention core (4 L h s per token).
double model_flops_per_iteration(const ModelSpec& m, double tokens);
double hardware_flops_per_iteration(const ModelSpec& m, double tokens, Recompute r);

// ---- Memory traffic of the elementwise kernels (norms, residual adds, bias fills and sums, activation
// functions, rotary embeddings, key/value head copies, operand rounding, the classifier's softmax and
// cross-entropy), as trident's kernels move it: each kernel reads its inputs and writes its outputs once.
// Attention's and the GEMMs' own operand reads are not counted (their time is the FLOP rate's). ----
struct TokenTraffic {
  double forward = 0, backward = 0;  // bytes per token
};
// `activation_bytes`: bytes of a stored activation (4: float32, 2: bfloat16). `operand_copy_bytes`: bytes
// of the rounded copy a GEMM or attention call makes of each float32 operand (2: trident's bf16 GEMMs on
// float32 activations; 0: the GEMMs read the activations as they are). Column-parallel widths (q/k/v, MLP,
// vocabulary) are divided by `tp`; the hidden width (norms, residuals, row-parallel outputs) is not.
TokenTraffic layer_traffic_per_token(const ModelSpec& m, int tp, double activation_bytes, double operand_copy_bytes);
// The final norm, the LM head's output, softmax + cross-entropy (three passes over the logits and the
// gradient written in place) and the head's backward.
TokenTraffic head_traffic_per_token(const ModelSpec& m, int tp, double activation_bytes, double operand_copy_bytes);

// ---- Memory (Rajbhandari et al. 2020 "ZeRO" sec. 3.1 & 5; Korthikanti et al. 2022 table 2) ----
// Bytes per rank. The first six fields are the device's (GPU) memory; host_* are what optimizer offload
// keeps in the host's memory instead.
struct MemoryBreakdown {
  double params = 0;       // working copy (bf16 in mixed precision, fp32 otherwise)
  double grads = 0;
  double optimizer = 0;    // Adam m and v (fp32)
  double master = 0;       // fp32 master weights (mixed precision only)
  double activations = 0;  // stored activations of the in-flight microbatches (+ logits)
  double buffers = 0;      // ZeRO-3 gathered-parameter buffers
  double host_optimizer = 0;  // Adam m and v in host memory (optimizer offload)
  double host_master = 0;     // fp32 master weights in host memory (optimizer offload, mixed precision)
  double total() const { return params + grads + optimizer + master + activations + buffers; }  // the device's
  double host_total() const { return host_optimizer + host_master; }
};

// Model-state bytes per rank for `psi` parameters held by this rank's model-parallel shard, data-parallel
// degree `dp`, ZeRO stage 0..3 and Adam. Mixed: 2 + 2 + 12 bytes/param (ZeRO's K = 12: fp32 master,
// m, v); fp32: 4 + 4 + 8. Stage 1 shards optimizer+master, 2 also grads, 3 also params:
//   16 psi; 4 psi + 12 psi/N; 2 psi + 14 psi/N; 16 psi/N   (mixed precision).
// `offload` (ZeRO-Offload, Ren et al. 2021; trident's --offload optimizer): the optimizer state and the
// master weights, sharded as above, move from the device to the host (host_optimizer, host_master); the
// device keeps parameters and gradients: mixed 4 psi (ZeRO-2: 2 psi + 2 psi/N), fp32 8 psi (the float32
// parameters are their own master and stay).
MemoryBreakdown model_state_bytes(double psi, int dp, int zero_stage, Precision p, bool offload = false);

struct ActivationConfig {
  int micro_batch = 1;
  int tp = 1;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::kNone;
  Precision precision = Precision::kMixed;
};
// Activation bytes ONE transformer layer stores for ONE microbatch (Korthikanti et al., 16-bit
// activations; doubled for fp32):
//   none:      s b h (34 + 5 a s / h)             at t = 1
//              s b h (10 + 24/t + 5 a s/(h t))    TP without sequence parallelism
//              s b h (34/t + 5 a s/(h t))         TP with sequence parallelism
//   selective: s b h (10 + 24/t)  (SP: 34 s b h / t)   -- attention core recomputed
//   full:      2 s b h            (SP: 2 s b h / t)    -- only each layer's input kept
double activation_bytes_per_layer(const ModelSpec& m, const ActivationConfig& c);

// Microbatches whose activations the FIRST pipeline stage holds at its peak: GPipe m, 1F1B min(P, m),
// interleaved P * (1 + (P-1)/(P v)) capped at m*v (Korthikanti et al. sec. 4.2.3), 1 without PP.
double inflight_microbatches(Schedule s, int pp, int microbatches, int interleave);

// ---- Pipeline bubble (Huang et al. 2019 GPipe; Narayanan et al. 2021 sec. 2.2) ----
// Fraction of the total step time that is idle: (P-1)/(v m + P-1) (v = 1 for GPipe and 1F1B).
double bubble_fraction(int pp, int microbatches, int interleave = 1);
// Bubble over the ideal (no-bubble) time: (P-1)/(v m).
double bubble_over_ideal(int pp, int microbatches, int interleave = 1);

}  // namespace trident::plan
