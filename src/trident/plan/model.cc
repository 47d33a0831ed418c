#include "trident/plan/model.h"

#include <algorithm>
#include <utility>

#include "trident/core/error.h"

namespace trident::plan {

double ModelSpec::params_per_layer() const {
  const double h = hidden;
  const double hd = double(hidden) / heads;
  const double kvw = kv() * hd;  // width of K and V projections
  double attn = 2 * h * h + 2 * h * kvw;
  double mlp = (gated_mlp ? 3.0 : 2.0) * h * ffn();
  double extra;
  if (gated_mlp) {
    extra = 2 * h;  // two RMSNorm weights, no biases (LLaMA)
  } else {
    extra = (h + 2 * kvw) + h + ffn() + h + 4 * h;  // qkv, out, fc, proj biases + 2 LayerNorms
  }
  return attn + mlp + extra;
}

TokenTraffic layer_traffic_per_token(const ModelSpec& m, int tp, double a, double o) {
  const double C = m.hidden, hd = C / m.heads, kvC = m.kv() * hd;
  const double F = double(m.ffn()) / tp, Ct = C / tp, kvt = kvC / tp;
  const double Q = Ct + 2 * kvt;                     // this rank's q, k, v columns
  auto cv = [&](double n) { return o > 0 ? n * (a + o) : 0.0; };  // read float32, write the rounded copy
  // A linear layer's output: with a bias, trident fills the bias rows and the GEMM adds onto them (beta 1).
  auto out = [&](double n) { return m.bias ? 3 * n * a : n * a; };
  auto dbias = [&](double n) { return m.bias ? n * a : 0.0; };
  const double norm_f = 2 * C * a, norm_b = 5 * C * a, residual = 3 * C * a;  // norm backward: dx pass + params pass
  TokenTraffic t;
  if (!m.gated_mlp) {
    // ln1, qkv, attention (its operands rounded), proj, residual, ln2, fc, GELU (value and derivative), proj2, residual.
    t.forward = norm_f + cv(C) + out(Q) + cv(Q) + C * a + cv(Ct) + out(C) + residual + norm_f + cv(C) + out(F) +
                3 * F * a + cv(F) + out(C) + residual;
    // proj2, GELU's product, fc, ln2 + residual, proj, attention, qkv, ln1 + residual.
    t.backward = cv(C) + cv(F) + F * a + dbias(C) + 3 * F * a + cv(F) + cv(C) + C * a + dbias(F) + norm_b + residual +
                 cv(C) + cv(Ct) + Ct * a + dbias(C) + cv(Q) + cv(Ct) + Q * a + C * a + cv(Q) + cv(C) + C * a +
                 dbias(Q) + norm_b + residual;
  } else {
    // Grouped-query attention copies the shared key/value heads out to every query head and back.
    const bool expand = m.kv() < m.heads;
    const double full = expand ? 3 * Ct : Q;
    const double rope = 2 * (Ct + kvt) * a;  // q and k rotated in place
    t.forward = norm_f + cv(C) + Q * a + rope + (expand ? (Q + full) * a : 0.0) + cv(full) + Ct * a + cv(Ct) + C * a +
                residual + norm_f + cv(C) + 2 * F * a + 3 * F * a + cv(F) + C * a + residual;
    t.backward = cv(C) + cv(F) + F * a + 5 * F * a + cv(2 * F) + cv(C) + C * a + norm_b + residual + cv(C) + cv(Ct) +
                 Ct * a + cv(full) + cv(Ct) + full * a + (expand ? (full + Q) * a : 0.0) + rope + cv(Q) + cv(C) +
                 C * a + norm_b + residual;
  }
  return t;
}

TokenTraffic head_traffic_per_token(const ModelSpec& m, int tp, double a, double o) {
  const double C = m.hidden, V = double(m.vocab) / tp;
  auto cv = [&](double n) { return o > 0 ? n * (a + o) : 0.0; };
  return {2 * C * a + cv(C) + V * a + 4 * V * a, 5 * C * a + cv(V) + cv(C) + C * a};
}

double ModelSpec::embedding_params() const {
  return double(vocab) * hidden + (learned_positions ? double(seq) * hidden : 0.0);
}

double ModelSpec::head_params() const { return tied_embeddings ? 0.0 : double(vocab) * hidden; }

double ModelSpec::total_params() const {
  const double final_norm = gated_mlp ? hidden : 2.0 * hidden;
  return layers * params_per_layer() + embedding_params() + head_params() + final_norm;
}

double ModelSpec::matmul_params() const { return layers * params_per_layer() + double(vocab) * hidden; }

namespace {
ModelSpec gpt2(const char* name, int L, int h, int a) {
  ModelSpec m;
  m.name = name;
  m.layers = L;
  m.hidden = h;
  m.heads = a;
  m.vocab = 50257;
  m.seq = 1024;
  m.tokenizer = "gpt2";
  return m;
}
ModelSpec llama(const char* name, int L, int h, int a, int kv, int ffn, int seq) {
  ModelSpec m;
  m.name = name;
  m.layers = L;
  m.hidden = h;
  m.heads = a;
  m.kv_heads = kv;
  m.ffn_hidden = ffn;
  m.gated_mlp = true;
  m.vocab = 32000;
  m.seq = seq;
  m.tied_embeddings = false;
  m.learned_positions = false;
  m.arch = "llama";
  m.bias = false;
  m.norm_eps = 1e-6;
  return m;
}
ModelSpec alias(ModelSpec m, std::string name) {
  m.aliases.push_back(std::move(name));
  return m;
}
// The Hugging Face configs' values: vocabulary, theta, epsilon, tying and Llama 3's rope_scaling.
ModelSpec hf(ModelSpec m, int vocab, double theta, double eps, bool tied) {
  m.vocab = vocab;
  m.rope_theta = theta;
  m.norm_eps = eps;
  m.tied_embeddings = tied;
  return m;
}
ModelSpec llama3_scaling(ModelSpec m, double factor) {
  m.rope_factor = factor;
  m.rope_low_freq_factor = 1.0;
  m.rope_high_freq_factor = 4.0;
  m.rope_original_max_positions = 8192;
  return m;
}
const std::vector<ModelSpec>& presets() {
  static const std::vector<ModelSpec> p = [] {
    ModelSpec gpt3 = gpt2("gpt3-175b", 96, 12288, 96);
    gpt3.seq = 2048;
    return std::vector<ModelSpec>{
        alias(gpt2("gpt2-124m", 12, 768, 12), "gpt2"),
        alias(gpt2("gpt2-350m", 24, 1024, 16), "gpt2-medium"),
        alias(gpt2("gpt2-774m", 36, 1280, 20), "gpt2-large"),
        alias(gpt2("gpt2-1.5b", 48, 1600, 25), "gpt2-xl"),
        hf(llama("tinyllama-1.1b", 22, 2048, 32, 4, 5632, 2048), 32000, 10000.0, 1e-5, false),
        llama3_scaling(hf(llama("llama3.2-1b", 16, 2048, 32, 8, 8192, 131072), 128256, 500000.0, 1e-5, true), 32.0),
        hf(llama("llama2-7b", 32, 4096, 32, 0, 11008, 4096), 32000, 10000.0, 1e-5, false),
        hf(llama("llama3-8b", 32, 4096, 32, 8, 14336, 8192), 128256, 500000.0, 1e-5, false),
        llama("llama-7b", 32, 4096, 32, 0, 11008, 2048),
        llama("llama-13b", 40, 5120, 40, 0, 13824, 2048),
        llama("llama-65b", 80, 8192, 64, 0, 22016, 2048),
        llama("llama-70b", 80, 8192, 64, 8, 28672, 4096),
        gpt3};
  }();
  return p;
}
}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> v;
  for (const auto& m : presets()) v.push_back(m.name);
  return v;
}

const ModelSpec* find_model_preset(const std::string& name) {
  for (const auto& m : presets()) {
    if (m.name == name) return &m;
    for (const auto& a : m.aliases)
      if (a == name) return &m;
  }
  return nullptr;
}

ModelSpec model_preset(const std::string& name) {
  if (const ModelSpec* m = find_model_preset(name)) return *m;
  std::string known;
  for (auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  TRIDENT_THROW(InvalidArgument, "--model: unknown preset '{}'; known: {} (or give --layers --hidden --heads --vocab --seq)",
                name, known);
}

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}
const char* to_string(Precision p) { return p == Precision::kFp32 ? "fp32" : "mixed"; }
const char* to_string(Schedule s) {
  switch (s) {
    case Schedule::kGPipe: return "gpipe";
    case Schedule::k1F1B: return "1f1b";
    case Schedule::kInterleaved: return "interleaved";
  }
  return "?";
}
bool parse_recompute(const std::string& s, Recompute* out) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
    if (s == to_string(r)) return *out = r, true;
  return false;
}
bool parse_schedule(const std::string& s, Schedule* out) {
  for (Schedule r : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kInterleaved})
    if (s == to_string(r)) return *out = r, true;
  return false;
}
bool parse_precision(const std::string& s, Precision* out) {
  if (s == "fp32") return *out = Precision::kFp32, true;
  if (s == "mixed" || s == "bf16" || s == "fp16") return *out = Precision::kMixed, true;
  return false;
}

double model_flops_per_iteration(const ModelSpec& m, double tokens) {
  return 6.0 * m.matmul_params() * tokens + 12.0 * m.layers * double(m.hidden) * m.seq * tokens;
}

double hardware_flops_per_iteration(const ModelSpec& m, double tokens, Recompute r) {
  double f = model_flops_per_iteration(m, tokens);
  const double attn_fwd = 4.0 * m.layers * double(m.hidden) * m.seq * tokens;
  if (r == Recompute::kFull) f += 2.0 * m.layers * m.params_per_layer() * tokens + attn_fwd;
  if (r == Recompute::kSelective) f += attn_fwd;
  return f;
}

MemoryBreakdown model_state_bytes(double psi, int dp, int zero_stage, Precision p, bool offload) {
  MemoryBreakdown b;
  const double n = std::max(1, dp);
  const bool mixed = p == Precision::kMixed;
  const double wb = mixed ? 2 : 4;  // working params and grads
  b.params = wb * psi;
  b.grads = wb * psi;
  b.optimizer = 8 * psi;  // Adam m, v in fp32
  b.master = mixed ? 4 * psi : 0;
  if (zero_stage >= 1) {
    b.optimizer /= n;
    b.master /= n;
  }
  if (zero_stage >= 2) b.grads /= n;
  if (zero_stage >= 3) b.params /= n;
  if (offload) {
    b.host_optimizer = std::exchange(b.optimizer, 0.0);
    b.host_master = std::exchange(b.master, 0.0);
  }
  return b;
}

double activation_bytes_per_layer(const ModelSpec& m, const ActivationConfig& c) {
  const double s = m.seq, b = c.micro_batch, h = m.hidden, a = m.heads, t = std::max(1, c.tp);
  const double sbh = s * b * h;
  double coeff = 0;
  switch (c.recompute) {
    case Recompute::kNone:
      coeff = c.sequence_parallel ? 34.0 / t + 5 * a * s / (h * t) : 10 + 24.0 / t + 5 * a * s / (h * t);
      break;
    case Recompute::kSelective: coeff = c.sequence_parallel ? 34.0 / t : 10 + 24.0 / t; break;
    case Recompute::kFull: coeff = c.sequence_parallel ? 2.0 / t : 2.0; break;
  }
  return sbh * coeff * (c.precision == Precision::kFp32 ? 2.0 : 1.0);
}

double inflight_microbatches(Schedule s, int pp, int microbatches, int interleave) {
  if (pp <= 1) return 1;
  switch (s) {
    case Schedule::kGPipe: return microbatches;
    case Schedule::k1F1B: return std::min(pp, microbatches);
    case Schedule::kInterleaved: {
      const double v = std::max(1, interleave);
      return std::min(pp * (1 + (pp - 1) / (pp * v)), double(microbatches));
    }
  }
  return 1;
}

double bubble_fraction(int pp, int microbatches, int interleave) {
  if (pp <= 1) return 0;
  const double v = std::max(1, interleave);
  return (pp - 1) / (v * microbatches + pp - 1);
}

double bubble_over_ideal(int pp, int microbatches, int interleave) {
  if (pp <= 1) return 0;
  return (pp - 1) / (double(std::max(1, interleave)) * microbatches);
}

}  // namespace trident::plan
