// Token shards on disk: llm.c's format, and nanoGPT's headerless train.bin / val.bin.
//
// llm.c shard: a header of 256 little-endian int32 (header[0] = magic, header[1] = version, header[2] =
// number of tokens, the rest 0), then the tokens, little-endian:
//   magic 20240520, version 1: uint16 tokens (llm.c's GPT-2 shards). Written when the vocabulary has at
//                              most 65,536 tokens.
//   magic 20240520, version 2: uint32 tokens (trident's, for larger vocabularies such as Llama 3's 128,256;
//                              llm.c's GPT-2 loader refuses it as a bad version). Written above 65,536
//                              tokens, or when asked (TokenizeOptions::shard_version).
//   magic 20240801, version 7: uint32 tokens (llm.c's llama-3 shards, dev/data/data_common.py); read only.
// File names follow llm.c: <name>_train_000000.bin, <name>_val_000000.bin, ...
// nanoGPT: a file named train.bin or val.bin without that header is a flat uint16 array (np.memmap).
// Any other file that does not start with the magic is refused (so a corrupt header is never read as
// tokens).
//
// A token source is a .bin file or a folder holding .bin files. In a folder, files whose name contains
// "val" form the validation split and the others the training split, each in sorted name order; a folder
// without val files, or a single file, is split as nanoGPT splits text (the first 90% train).
//
// Ownership: ShardSet owns its memory maps (move-only). Blocking: open() maps the files and reads every
// token once through a small buffer (to check ids against the vocabulary without keeping pages resident);
// ShardWriter writes each shard atomically when it is full. Thread-safety: const access is safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trident/data/file_io.h"
#include "trident/data/tokenizer.h"

namespace trident::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersionU16 = 1;
inline constexpr int32_t kShardVersionU32 = 2;
inline constexpr int32_t kLlmcLlama3Magic = 20240801;  // with version 7: uint32 tokens
inline constexpr int32_t kLlmcLlama3Version = 7;
inline constexpr size_t kShardHeaderInts = 256;

// The shard version that holds a vocabulary's ids: `want` 0 picks 1 when vocab_size <= 65536, else 2;
// `want` 1 or 2 forces that one. Throws InvalidArgument naming both numbers when version 1 cannot hold
// the vocabulary, or for another `want`.
int shard_version_for(int vocab_size, int want = 0);

// Whether `source` names token shards (a .bin file, or a folder with at least one .bin file).
bool is_token_source(const std::string& source);

struct Shard {
  std::string path;
  io::MappedFile map;
  const uint8_t* data = nullptr;  // the tokens, `width` bytes each; points into map (aligned: the header is 1024 bytes)
  uint32_t width = 2;             // 2 (uint16 tokens) or 4 (uint32)
  size_t count = 0;
  bool val = false;               // belongs to the validation split

  int32_t at(size_t i) const;
  void copy(size_t begin, size_t n, int32_t* out) const;  // tokens [begin, begin + n); the caller checks bounds
};

// Opens one shard; throws IoError naming the file for a bad magic or version, a token count that does not
// match the file size (truncated, or tokens of another width), or a file that is neither llm.c's nor nanoGPT's.
Shard open_shard(const std::string& path);

// The shards of a source: training shards first, then validation shards (see the header comment).
// Throws InvalidArgument naming the shard and position of the first token id >= vocab_size (uint32 ids
// compared unsigned).
std::vector<Shard> open_token_source(const std::string& source, int vocab_size);

// Streams tokens into shards of at most `shard_tokens` tokens each (llm.c's format, `version` 1 or 2). Ids
// must be >= 0, and below 65536 in version 1; throws InvalidArgument otherwise.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string name, std::string split, size_t shard_tokens,
              int version = kShardVersionU16);
  void append(const int32_t* ids, size_t n);
  // Writes the last, partial shard. Returns the paths of every shard written.
  std::vector<std::string> finish();
  uint64_t tokens() const { return total_; }

 private:
  void flush();
  std::string dir_, name_, split_;
  size_t shard_tokens_;
  int version_;
  size_t width_;
  std::vector<uint8_t> buf_;  // tokens packed at width_ bytes
  size_t buffered_ = 0;
  std::vector<std::string> written_;
  uint64_t total_ = 0;
};

// `trident tokenize`: text -> shards. Each source file (data/dataset.h: list_source_files) is a document,
// preceded by the tokenizer's document_separator() where it has one (llm.c). The text streams through in
// blocks of `block_bytes` cut at ByteBpe::is_neutral_cut positions (so BPE ids equal those of encoding each
// document whole, unless a block holds no such cut), each
// block encoded on `threads` threads. The last `val_fraction` of the source bytes (from the first such cut
// at or after that point) go to the val shards, the rest to the train shards: nanoGPT's split.
// Memory: one block of text, its ids, and one shard of tokens; nothing grows with the corpus.
struct TokenizeOptions {
  std::string source;
  std::string out_dir;
  std::string name;                  // shard name prefix ("" = the source's file or folder name)
  size_t shard_tokens = 100'000'000; // llm.c's fineweb shards
  double val_fraction = 0.1;
  size_t block_bytes = 32u << 20;
  int threads = 0;
  int shard_version = 0;             // 0: automatic (shard_version_for); 1 or 2 forces it
};
struct TokenizeResult {
  uint64_t bytes = 0, train_tokens = 0, val_tokens = 0, documents = 0;
  int shard_version = 0;
  double seconds = 0;
  std::vector<std::string> shards;
};
TokenizeResult tokenize_to_shards(const Tokenizer& tok, const TokenizeOptions& opts);

}  // namespace trident::data
