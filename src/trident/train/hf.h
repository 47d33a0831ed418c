// Hugging Face model folders in and out of trident checkpoints: Llama-family models and GPT-2.
//
// A folder is config.json plus model.safetensors, or shards model-0000k-of-0000n.safetensors named by
// model.safetensors.index.json ("weight_map": tensor -> shard). Tensors may be F32, F16 or BF16 (F64 is read
// too); all become float32. Supported model_type values, each one descriptor (names, shapes and layouts of
// every tensor as config.json implies them; config keys both ways) in hf.cc:
//   llama    LlamaForCausalLM. trident's Llama uses Hugging Face's names and layouts (nn.Linear [out, in];
//            q/k are not permuted: both rotate halves), so only the vocabulary rows change. Model config
//            {"kind": "llama", n_layer, n_head, n_kv_head, n_embd, intermediate_size, block_size, vocab_size,
//            bias false, rope_theta, norm_eps, rope_scaling (null or llama3's), tie_embeddings}.
//   mistral  the same skeleton when sliding_window is null or >= max_position_embeddings (exported as llama).
//   gpt2     GPT2LMHeadModel (a GPT2Model file's names without "transformer." too); Conv1D weights [in, out]
//            become nn.Linear's [out, in]; the causal-mask buffers attn.bias / attn.masked_bias are ignored.
// Anything else is refused naming the key: another model_type (qwen2: its q/k/v projections have biases),
// attention_bias or mlp_bias true, head_dim != hidden_size / num_attention_heads, hidden_act other than silu,
// rope_scaling other than llama3, num_attention_heads not a multiple of num_key_value_heads, ...
//
// Import checks everything first (config.json, every shard's header and data, every tensor's presence and
// shape against config.json, finiteness) and only then writes: a failed import writes nothing under out_dir.
// The checkpoint is out_dir/ckpt-00000000 (step 0, no optimizer state; written atomically, checkpoint.h);
// vocabulary rows (embedding, an untied head) are padded with zeros up to a multiple of vocab_multiple
// (llm.c: GPT-2's 50257 -> 50304), and config.json is kept in the checkpoint (CheckpointMeta::hf_config).
// Export writes config.json and model.safetensors (F32) that transformers' from_pretrained loads, rows
// cropped to the vocabulary config.json had at import (else the tokenizer's); a tied head is left out as
// save_pretrained does. Import then export gives back every tensor bit for bit in float32.
//
// Errors: HfError (an InvalidArgument) with the key or tensor, what was found and what was expected as
// fields; a corrupt safetensors file is read_safetensors' IoError naming the file and what is wrong.
// Ownership: functions; no state. Blocking: synchronous file I/O. Thread-safety: reentrant.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "trident/core/error.h"
#include "trident/train/checkpoint.h"

namespace trident::train {

// A Hugging Face folder or config that trident cannot take as it is. `key`: the config key ("model_type",
// "rope_scaling.rope_type"), tensor ("model.layers.0.mlp.up_proj.weight"), file ("model.safetensors") or
// option ("block_size") at fault.
class HfError : public InvalidArgument {
 public:
  HfError(const std::string& what, std::string key, std::string found, std::string expected)
      : InvalidArgument(what), key(std::move(key)), found(std::move(found)), expected(std::move(expected)) {}
  std::string key, found, expected;
};

struct HfImportOptions {
  std::string hf_dir;        // config.json + safetensors
  std::string out_dir;       // the checkpoint goes to out_dir/ckpt-00000000
  int block_size = 0;        // 0: max_position_embeddings (gpt2: n_positions; a smaller one crops wpe)
  int vocab_multiple = 128;
  // Tokenizer::to_json() to record; null: gpt2's for gpt2, the folder's tokenizer.model (SentencePiece)
  // when there is one, else byte-level (and `note` says so: give one with --tokenizer).
  nlohmann::json tokenizer;
};
// Returns the checkpoint folder; `note`, when given, receives a line for the user about the tokenizer ("" if
// none).
std::string import_hf(const HfImportOptions& o, std::string* note = nullptr);

// Writes `dir`/config.json and `dir`/model.safetensors. `vocab` 0: the config.json recorded at import, else
// the ids the model predicts (its valid_vocab_size), else the checkpoint tokenizer's vocabulary.
void export_hf(const LoadedCheckpoint& ckpt, const std::string& dir, int vocab = 0);

// The trident model config a Hugging Face config.json maps to (vocab padded to vocab_multiple; block_size 0:
// the folder's); throws HfError naming the key.
nlohmann::json hf_to_model_config(const nlohmann::json& hf_config, int block_size = 0, int vocab_multiple = 128);
// Every tensor of a folder (model.safetensors or the shards of model.safetensors.index.json), float32.
std::map<std::string, Tensor32> read_hf_tensors(const std::string& dir);

// `trident gpt2 import --safetensors FILE`: one GPT-2 state dict without config.json. The shapes come from
// the tensors; n_head 0: GPT-2's for the width (768: 12, 1024: 16, 1280: 20, 1600: 25).
struct Gpt2ImportOptions {
  std::string safetensors;
  std::string out_dir;
  int n_head = 0;
  int vocab_multiple = 128;
  nlohmann::json tokenizer;  // Tokenizer::to_json() of the gpt2 tokenizer
};
std::string import_gpt2(const Gpt2ImportOptions& o);
// `trident gpt2 export --out FILE`: one safetensors file in GPT2LMHeadModel's naming with lm_head.weight
// (a copy of wte), so that load_state_dict(strict=True) takes it; rows cropped to `vocab`.
void export_gpt2(const LoadedCheckpoint& ckpt, const std::string& out_path, int vocab);

}  // namespace trident::train
