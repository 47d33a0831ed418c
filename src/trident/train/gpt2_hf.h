// GPT-2 state dicts in Hugging Face's naming, in and out of trident checkpoints.
//
// Hugging Face's GPT2LMHeadModel names its tensors transformer.wte.weight, transformer.wpe.weight,
// transformer.h.{i}.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj}.{weight,bias},
// transformer.ln_f.{weight,bias} and lm_head.weight (tied to wte); GPT2Model files (the hub's
// model.safetensors) have the same names without "transformer.". Its attention and MLP layers are Conv1D:
// their weights are stored [in, out], the transpose of nn.Linear's [out, in], which trident's GPT (nanoGPT's
// names) uses. The attn.bias / attn.masked_bias buffers (causal masks) are not parameters and are ignored.
//
// Import reads such a file into a logical trident checkpoint (step 0, no optimizer state, the gpt2
// tokenizer): wte rows are padded with zeros up to a multiple of vocab_multiple (llm.c: 50257 -> 50304).
// Training starts from it with `--init_from DIR` in any layout (DDP, ZeRO, TP, PP: the checkpoint is
// sharded on load as every trident checkpoint is), and `sample`/`eval` read it directly.
// Export writes a checkpoint back in GPT2LMHeadModel's naming with Conv1D layouts and wte cropped to the
// tokenizer's vocabulary, so that PyTorch GPT-2 code loads it with load_state_dict.
//
// Ownership: functions; no state. Blocking: synchronous file I/O. Thread-safety: reentrant.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "trident/train/checkpoint.h"

namespace trident::train {

// trident (nanoGPT) names and layouts from a Hugging Face GPT-2 state dict; `padded_vocab` >= the file's
// vocabulary pads wte. Throws InvalidArgument naming a missing or mis-shaped tensor.
std::map<std::string, Tensor32> gpt2_from_hf(const std::map<std::string, Tensor32>& hf, int padded_vocab);
// The inverse: Hugging Face names and Conv1D layouts, wte cropped to `vocab` rows, lm_head.weight = wte.
std::map<std::string, Tensor32> gpt2_to_hf(const std::map<std::string, Tensor32>& trident, int vocab);

struct Gpt2ImportOptions {
  std::string safetensors;     // the Hugging Face file
  std::string out_dir;         // the checkpoint goes to out_dir/ckpt-00000000
  int n_head = 0;              // 0: GPT-2's for the file's width (768: 12, 1024: 16, 1280: 20, 1600: 25)
  int vocab_multiple = 128;
  nlohmann::json tokenizer;    // Tokenizer::to_json() of the gpt2 tokenizer
};
// Returns the checkpoint folder.
std::string import_gpt2(const Gpt2ImportOptions& o);
// Writes `ckpt` (a GPT with biases) to a safetensors file in Hugging Face's naming, cropped to `vocab`.
void export_gpt2(const LoadedCheckpoint& ckpt, const std::string& out_path, int vocab);

}  // namespace trident::train
