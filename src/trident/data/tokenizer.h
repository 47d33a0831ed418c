// Character-level and byte-level tokenizers.
//
// char: the vocabulary is the sorted set of Unicode code points of the corpus (nanoGPT's shakespeare_char
//   prepare.py: chars = sorted(list(set(data)))); text is decoded as UTF-8, and bytes that are not valid
//   UTF-8 map to U+DC80..U+DCFF (Python's surrogateescape), so any byte string round-trips exactly.
// byte: 256 tokens, token = byte value.
// A tokenizer serializes to JSON (saved with checkpoints and in the dataset cache) and has a fingerprint.
//
// Ownership: value type. Blocking: never. Thread-safety: const methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace trident::data {

enum class TokenizerKind { kChar, kByte };
// "char" | "byte"; throws InvalidArgument naming the allowed values.
TokenizerKind parse_tokenizer_kind(std::string_view name);
const char* tokenizer_kind_name(TokenizerKind k);

// Splits UTF-8 text into code points with surrogateescape for invalid bytes; the inverse is encode_utf8.
std::vector<uint32_t> decode_utf8(std::string_view text);
void append_utf8(uint32_t cp, std::string& out);

class Tokenizer {
 public:
  Tokenizer() = default;  // byte-level
  static Tokenizer byte_level();
  static Tokenizer char_level(std::string_view corpus);
  // Vocabulary given as code points (sorted and unique after construction).
  static Tokenizer char_level_from_vocab(std::vector<uint32_t> code_points);
  static Tokenizer from_json(const nlohmann::json& j);  // throws InvalidArgument on a malformed description
  nlohmann::json to_json() const;

  TokenizerKind kind() const { return kind_; }
  int vocab_size() const { return kind_ == TokenizerKind::kByte ? 256 : static_cast<int>(chars_.size()); }
  const std::vector<uint32_t>& code_points() const { return chars_; }  // char-level vocabulary
  uint64_t fingerprint() const;

  // Throws InvalidArgument naming the first character that is not in the vocabulary.
  std::vector<int32_t> encode(std::string_view text) const;
  // Throws InvalidArgument for an id outside [0, vocab_size).
  std::string decode(const int32_t* ids, size_t n) const;
  std::string decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), ids.size()); }

 private:
  explicit Tokenizer(TokenizerKind k);
  void build_index();
  TokenizerKind kind_ = TokenizerKind::kByte;
  std::vector<uint32_t> chars_;
  std::vector<int32_t> bmp_index_;  // code point < 0x10000 -> id, -1 when absent
  std::unordered_map<uint32_t, int32_t> astral_index_;
};

}  // namespace trident::data
