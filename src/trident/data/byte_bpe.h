// Byte-level BPE: the one engine behind the gpt2 and llama3 tokenizers. Each source (data/gpt2_bpe.h,
// data/llama3_bpe.h) reads its files into a ByteBpeVocab (token bytes, merges, pre-tokenization pattern);
// this class encodes and decodes with it.
//
// encode(text):
//   1. Pre-tokenization by the vocabulary's pattern through PCRE2 (UTF + UCP, JIT). Bytes that are not
//      valid UTF-8 match no class (PCRE2_MATCH_INVALID_UTF); each run of them becomes one piece of its own,
//      so ANY byte string encodes, and decode(encode(b)) == b.
//   2. A piece that is itself a regular token maps to it when ignore_merges is set (tiktoken; Llama 3's
//      tokenizer.json). Otherwise its bytes start as one-byte tokens and merges apply one at a time: the
//      adjacent pair of lowest rank, leftmost among equals (tiktoken's and Hugging Face's order; for
//      GPT-2's merges it equals encoder.py's "every occurrence of the best pair").
//   Pieces' ids are cached per call (and per thread): text repeats words. Special tokens are never produced
//   from text (their literal spelling encodes as text, as tiktoken's encode(disallowed_special=())).
// Large inputs are split at neutral cuts (is_neutral_cut) and encoded on several threads; the result is
// identical to a single-threaded encode.
//
// Ownership: immutable after construction (share it through a shared_ptr). Blocking: never (the sources
// read files). Thread-safety: const methods are safe concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace trident::data {

// What a source reads from its files.
struct ByteBpeVocab {
  std::string name;                      // "gpt2" | "llama3": names the tokenizer in errors
  std::string path;                      // the folder or file it was read from
  uint64_t fingerprint = 0;              // FNV-1a 64 of the files
  std::string pattern;                   // PCRE2 pre-tokenization pattern
  std::vector<std::string> token_bytes;  // id -> raw bytes, every id in [0, size)
  int32_t regular_tokens = 0;            // ids >= this are special tokens (decoded, never encoded)
  struct Merge {
    int32_t left, right, merged, rank;
  };
  std::vector<Merge> merges;   // the lowest rank wins where a pair repeats
  bool ignore_merges = false;  // see step 2 above
};

// GPT-2's bytes_to_unicode alphabet, which byte-level vocabularies (encoder.json, tokenizer.json) spell
// tokens in: appends the raw bytes of `token` to `out`; false when a character is outside the alphabet.
bool byte_level_to_bytes(std::string_view token, std::string& out);

class ByteBpe {
 public:
  // Throws InvalidArgument naming vocab.path for a byte without a one-byte regular token or a merge whose
  // ids are out of range, and Error when PCRE2 rejects the pattern.
  explicit ByteBpe(ByteBpeVocab vocab);
  ~ByteBpe();
  ByteBpe(const ByteBpe&) = delete;  // by_bytes_ views the vocabulary's strings in place
  ByteBpe& operator=(const ByteBpe&) = delete;

  const std::string& name() const { return v_.name; }
  const std::string& path() const { return v_.path; }
  uint64_t fingerprint() const { return v_.fingerprint; }
  int vocab_size() const { return static_cast<int>(v_.token_bytes.size()); }
  int32_t regular_tokens() const { return v_.regular_tokens; }
  // The id of a token given by its bytes (e.g. "<|end_of_text|>"); -1 when none.
  int32_t find(std::string_view bytes) const;

  // `threads` <= 0: hardware concurrency for inputs of a few MB and more, else one thread.
  std::vector<int32_t> encode(std::string_view text, int threads = 0) const;
  void encode_append(std::string_view text, std::vector<int32_t>& out) const;  // one thread
  // Throws InvalidArgument for an id outside [0, vocab_size).
  std::string decode(const int32_t* ids, size_t n) const;
  const std::string& token_bytes(int32_t id) const { return v_.token_bytes.at(static_cast<size_t>(id)); }

  // Whether cutting `text` before position p leaves the pieces of both sides unchanged, under GPT-2's and
  // Llama 3's patterns: text[p-1] is "\n" between two printable ASCII characters other than space. No
  // alternative matches across it (Llama 3's " ?[^\s\p{L}\p{N}]+[\r\n]*" may end with the "\n" but stops
  // before the printable character), and the "\n" ends a piece whatever follows (a longer whitespace run
  // would not: \s+(?!\S) looks past the cut).
  static bool is_neutral_cut(std::string_view text, size_t p);
  // The pre-tokenization alone (for tests): the pieces of `text` in order; their concatenation is `text`.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Regex;
  using Cache = std::unordered_map<std::string, std::vector<int32_t>>;
  void bpe_piece(std::string_view piece, std::vector<int32_t>& out, Cache& cache) const;
  template <typename F>
  void for_each_piece(std::string_view text, F&& f) const;
  // (rank, merged id) of the pair, or {INT32_MAX, -1}.
  std::pair<int32_t, int32_t> merge_of(int32_t left, int32_t right) const;

  ByteBpeVocab v_;
  int32_t byte_id_[256] = {};                                         // byte -> its one-byte token
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left, right) -> (rank, merged)
  std::unordered_map<std::string_view, int32_t> by_bytes_;            // regular and special tokens' bytes -> id
  std::unique_ptr<Regex> re_;
};

}  // namespace trident::data
