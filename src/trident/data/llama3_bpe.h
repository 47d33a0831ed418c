// Llama 3's tokenizer: tiktoken-style byte-level BPE (data/byte_bpe.h) with 128,000 regular tokens and 256
// special tokens after them (<|begin_of_text|> = 128000, <|end_of_text|> = 128001, ... 128255).
//
// Files (either one; a folder holding tokenizer.json, tokenizer.model or original/tokenizer.model in that
// order of preference also works):
//   tokenizer.model   tiktoken's format, Meta's release: one "BASE64_TOKEN_BYTES RANK" line per token, ranks
//                     0..N-1. A pair of tokens merges when their concatenation is a token, at that token's
//                     rank (tiktoken's rule). The 256 special tokens are Llama 3.1's names, appended at N.
//   tokenizer.json    Hugging Face's: model.type BPE with a byte-level vocab and merges (in rank order),
//                     special tokens from added_tokens. Refused: a normalizer, or a pre-tokenizer Split whose
//                     regex is not Llama 3's (another model's byte-level BPE, e.g. GPT-2's or Qwen's), or a
//                     vocabulary outside the byte-level alphabet (Llama 2's SentencePiece-style BPE).
// Both give the same ids (tested). A piece that is a whole token maps to it (tiktoken; ignore_merges).
//
// Pre-tokenization: Llama 3's pattern
//     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with \s spelled as tiktoken's (Rust's Unicode White_Space: tab, LF, VT, FF, CR, U+0085 and the Z
// category), the tokenizer Llama 3 was trained with. The npm package llama3-tokenizer-js (the reference in
// tests) uses JavaScript's \s, which differs on U+0085 (not space there) and U+FEFF (space there), and
// spells (?i:...) as [sS]... (so U+017F and U+212A, which case-fold to s and k, match here and in tiktoken
// only). Special tokens are never produced from text; token shards put <|begin_of_text|> before each
// document (llm.c's fineweb.py for llama-3).
//
// Ownership: load returns an immutable engine (shared). Blocking: load reads one file (about 2 MB, or 9 MB
// of JSON). Thread-safety: see data/byte_bpe.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/data/byte_bpe.h"

namespace trident::data {

struct Llama3Bpe {
  static constexpr int32_t kBeginOfText = 128000;
  static constexpr int32_t kEndOfText = 128001;
  static constexpr int kSpecialTokens = 256;
  static constexpr const char* kPattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
      R"(| ?[^\t\n\x{0B}\f\r\x{85}\p{Z}\p{L}\p{N}]+[\r\n]*|[\t\n\x{0B}\f\r\x{85}\p{Z}]*[\r\n]+)"
      R"(|[\t\n\x{0B}\f\r\x{85}\p{Z}]+(?![^\t\n\x{0B}\f\r\x{85}\p{Z}])|[\t\n\x{0B}\f\r\x{85}\p{Z}]+)";
  // Llama 3's pattern as its tokenizer.json spells it (checked against a file's pre-tokenizer).
  static constexpr const char* kHfPattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
      R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

  // `path`: tokenizer.model, tokenizer.json or a folder (see above). Throws IoError / InvalidArgument
  // naming the file and what is wrong with it.
  static std::shared_ptr<const ByteBpe> load(const std::string& path);
  // The 256 special tokens' names in id order (Llama 3.1's: <|begin_of_text|>, <|end_of_text|>,
  // <|reserved_special_token_0|>, ... <|eot_id|>, <|python_tag|>, <|reserved_special_token_3..247|>).
  static std::vector<std::string> special_tokens();
};

}  // namespace trident::data
