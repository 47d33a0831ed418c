// A token dataset from a text file or a folder of text files, tokenized once into a memory-mapped cache.
//
// Sources: a file, or a folder whose regular files (recursively; symlinks and hidden names skipped) are
// concatenated in sorted path order. Binary files (a NUL byte in the first 8 KiB, e.g. fortune's strfile
// *.dat indexes) are skipped, and where both "X" and "X.u8" are regular files only "X.u8" (the UTF-8
// copy) is used. On Debian the *.u8 fortunes are symlinks, so the plain files are the ones read.
//
// Cache: <cache_dir>/tokens-<hash of the source path>-<tokenizer>.bin holds a header (magic, token width,
// count, FNV-1a 64 of the source contents and names, tokenizer fingerprint and JSON, checksum of the
// tokens) and the token ids (uint16 when the vocabulary fits, else int32). It is reused when the source
// checksum and tokenizer match and rebuilt (atomically) otherwise. An empty cache_dir keeps tokens in memory.
//
// Split (nanoGPT): the first int(n * 0.9) tokens are "train", the rest "val".
//
// Token shards (data/token_shards.h: llm.c's *.bin with uint16 or uint32 tokens, nanoGPT's
// train.bin/val.bin) are memory-mapped, not cached or copied: the dataset is their concatenation (training
// shards, then validation shards, which then form the "val" split), so memory does not grow with the
// corpus. The tokenizer is the given one.
//
// Ownership: TokenDataset shares its mapping among copies (cheap to copy); TokenSpan holds a copy. Blocking: open() reads the whole source. Thread-safety: const access is safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trident/data/tokenizer.h"

namespace trident::data {

// The files a source path stands for, in the order they are concatenated.
std::vector<std::string> list_source_files(const std::string& source);

struct DatasetOptions {
  std::string source;                    // file or folder
  TokenizerKind tokenizer = TokenizerKind::kChar;
  std::optional<Tokenizer> tokenizer_override;  // e.g. the checkpoint's: encode with exactly this vocabulary
  std::string cache_dir;                 // "" = no cache file (tokens kept in memory)
  std::string tokenizer_path;            // gpt2: folder of encoder.json + vocab.bpe; sentencepiece: .model;
                                         // llama3: tokenizer.model or tokenizer.json
};

enum class Split { kTrain, kVal };
Split parse_split(const std::string& name);  // "train" | "val"
const char* split_name(Split s);

struct TokenSpan;

class TokenDataset {
 public:
  static TokenDataset open(const DatasetOptions& opts);

  size_t size() const;
  int32_t at(size_t i) const;
  void copy(size_t begin, size_t n, int32_t* out) const;
  const Tokenizer& tokenizer() const;
  TokenSpan span(Split s) const;
  size_t train_size() const;  // int(size * 0.9)

  const std::string& cache_path() const;  // "" when not cached
  bool cache_hit() const;                 // true when an existing cache file was reused
  uint64_t source_checksum() const;
  const std::vector<std::string>& files() const;

 struct Impl;  // opaque

 private:
  std::shared_ptr<const Impl> impl_;
};

// A contiguous range of a dataset's tokens (keeps the dataset alive).
struct TokenSpan {
  TokenDataset dataset;
  size_t begin = 0;
  size_t size = 0;
  int32_t at(size_t i) const;
  void copy(size_t offset, size_t n, int32_t* out) const;  // tokens [offset, offset+n) of the span
};

}  // namespace trident::data
