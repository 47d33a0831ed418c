// The options and actions of `trident import` / `trident export` (train/hf.h), shared with their aliases
// `trident gpt2 import --hf` / `trident gpt2 export --hf`.
#pragma once

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "trident/core/error.h"
#include "trident/data/tokenizer.h"
#include "trident/train/checkpoint.h"
#include "trident/train/hf.h"

namespace trident::cli {

struct HfImportArgs {
  std::string hf, out, tokenizer, tokenizer_path;
  int block_size = 0, vocab_multiple = 128;
};

// --hf (unless the caller adds its own), --out, --block_size, --vocab_multiple, --tokenizer, --tokenizer_path.
inline void add_hf_import_options(CLI::App* sub, HfImportArgs& a, bool with_hf = true) {
  if (with_hf) sub->add_option("--hf", a.hf, "Hugging Face model folder: config.json + safetensors")->required();
  sub->add_option("--out", a.out, "out_dir for the checkpoint (ckpt-00000000)")->required();
  sub->add_option("--block_size,--block-size", a.block_size,
                  "context length (default: config.json's max_position_embeddings; gpt2: n_positions)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--vocab_multiple,--vocab-multiple", a.vocab_multiple,
                  "pad the vocabulary rows with zeros to a multiple of this (llm.c: 128)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--tokenizer", a.tokenizer,
                  "tokenizer to record: byte | gpt2 | sentencepiece | llama3 (default: found in the folder)");
  sub->add_option("--tokenizer_path,--tokenizer-path", a.tokenizer_path,
                  "its file or folder (sentencepiece/llama3: tokenizer.model or tokenizer.json)");
}

inline void run_hf_import(const HfImportArgs& a) {
  train::HfImportOptions o;
  o.hf_dir = a.hf;
  o.out_dir = a.out;
  o.block_size = a.block_size;
  o.vocab_multiple = a.vocab_multiple;
  if (!a.tokenizer.empty())
    o.tokenizer = data::Tokenizer::create(data::parse_tokenizer_kind(a.tokenizer), a.tokenizer_path).to_json();
  else if (!a.tokenizer_path.empty())
    TRIDENT_THROW(InvalidArgument, "--tokenizer_path '{}' needs --tokenizer KIND", a.tokenizer_path);
  std::string note;
  const std::string dir = train::import_hf(o, &note);
  if (!note.empty()) std::fprintf(stderr, "trident: warning: %s\n", note.c_str());
  std::printf("checkpoint: %s\n", dir.c_str());
}

struct HfExportArgs {
  std::string checkpoint, hf;
  int vocab_size = 0;
};

inline void add_hf_export_options(CLI::App* sub, HfExportArgs& a, bool with_hf = true) {
  sub->add_option("--checkpoint", a.checkpoint, "checkpoint folder, its checkpoint.json, or an out_dir")->required();
  if (with_hf) sub->add_option("--hf", a.hf, "output folder: config.json + model.safetensors")->required();
  sub->add_option("--vocab_size,--vocab-size", a.vocab_size,
                  "rows to keep (default: the imported config.json's vocab_size, else the tokenizer's)")
      ->check(CLI::NonNegativeNumber);
}

inline train::LoadedCheckpoint load_for_export(const std::string& path) {
  const std::string dir = train::find_checkpoint(path);
  if (dir.empty()) TRIDENT_THROW(InvalidArgument, "--checkpoint '{}': no checkpoint found there", path);
  return train::load_checkpoint(dir, false);
}

inline void run_hf_export(const HfExportArgs& a) {
  auto ck = load_for_export(a.checkpoint);
  train::export_hf(ck, a.hf, a.vocab_size);
  std::printf("wrote %s (config.json, model.safetensors)\n", a.hf.c_str());
}

}  // namespace trident::cli
