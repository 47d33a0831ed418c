#include "trident/data/tokenizer.h"

#include <algorithm>
#include <filesystem>

#include "trident/core/error.h"
#include "trident/core/json_int.h"
#include "trident/data/file_io.h"
#include "trident/data/gpt2_bpe.h"
#include "trident/data/llama3_bpe.h"
#include "trident/data/sentencepiece_model.h"

namespace trident::data {

TokenizerKind parse_tokenizer_kind(std::string_view name) {
  if (name == "char") return TokenizerKind::kChar;
  if (name == "byte") return TokenizerKind::kByte;
  if (name == "gpt2") return TokenizerKind::kGpt2;
  if (name == "sentencepiece") return TokenizerKind::kSentencePiece;
  if (name == "llama3") return TokenizerKind::kLlama3;
  TRIDENT_THROW(InvalidArgument, "unknown tokenizer '{}'; allowed: char, byte, gpt2, sentencepiece, llama3", name);
}

const char* tokenizer_kind_name(TokenizerKind k) {
  switch (k) {
    case TokenizerKind::kChar: return "char";
    case TokenizerKind::kByte: return "byte";
    case TokenizerKind::kGpt2: return "gpt2";
    case TokenizerKind::kSentencePiece: return "sentencepiece";
    case TokenizerKind::kLlama3: return "llama3";
  }
  return "?";
}

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    uint8_t b = p[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0, min = 0;
    if ((b & 0xE0) == 0xC0) len = 2, cp = b & 0x1F, min = 0x80;
    else if ((b & 0xF0) == 0xE0) len = 3, cp = b & 0x0F, min = 0x800;
    else if ((b & 0xF8) == 0xF0) len = 4, cp = b & 0x07, min = 0x10000;
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (ok && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (ok) {
      out.push_back(cp);
      i += len;
    } else {
      out.push_back(0xDC00u + b);  // surrogateescape
      ++i;
    }
  }
  return out;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out.push_back(static_cast<char>(cp - 0xDC00));
  } else if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

Tokenizer Tokenizer::byte_level() { return Tokenizer(); }

Tokenizer Tokenizer::gpt2(const std::string& path) {
  Tokenizer t(TokenizerKind::kGpt2);
  t.bpe_ = Gpt2Bpe::load(path);
  return t;
}

Tokenizer Tokenizer::llama3(const std::string& path) {
  Tokenizer t(TokenizerKind::kLlama3);
  t.bpe_ = Llama3Bpe::load(path);
  return t;
}

Tokenizer Tokenizer::sentencepiece(const std::string& model_path) {
  Tokenizer t(TokenizerKind::kSentencePiece);
  t.sp_ = SentencePieceModel::load(model_path);
  return t;
}

Tokenizer Tokenizer::create(TokenizerKind kind, const std::string& path) {
  switch (kind) {
    case TokenizerKind::kByte: return byte_level();
    case TokenizerKind::kGpt2: return gpt2(path);
    case TokenizerKind::kSentencePiece: return sentencepiece(path);
    case TokenizerKind::kLlama3: return llama3(path);
    case TokenizerKind::kChar: break;
  }
  TRIDENT_THROW(InvalidArgument, "the char tokenizer is built from its corpus (Tokenizer::char_level)");
}

int Tokenizer::vocab_size() const {
  switch (kind_) {
    case TokenizerKind::kByte: return 256;
    case TokenizerKind::kGpt2:
    case TokenizerKind::kLlama3: return bpe_->vocab_size();
    case TokenizerKind::kSentencePiece: return sp_->vocab_size();
    case TokenizerKind::kChar: break;
  }
  return static_cast<int>(chars_.size());
}

int32_t Tokenizer::end_of_text() const {
  if (kind_ == TokenizerKind::kGpt2) return Gpt2Bpe::kEndOfText;
  if (kind_ == TokenizerKind::kSentencePiece) return sp_->eos_id();
  if (kind_ == TokenizerKind::kLlama3) return bpe_->find("<|end_of_text|>");
  return -1;
}

int32_t Tokenizer::document_separator() const {
  if (kind_ == TokenizerKind::kLlama3) return bpe_->find("<|begin_of_text|>");
  return end_of_text();
}

Tokenizer Tokenizer::char_level(std::string_view corpus) {
  std::vector<uint32_t> cps = decode_utf8(corpus);
  std::sort(cps.begin(), cps.end());
  cps.erase(std::unique(cps.begin(), cps.end()), cps.end());
  return char_level_from_vocab(std::move(cps));
}

Tokenizer Tokenizer::char_level_from_vocab(std::vector<uint32_t> cps) {
  std::sort(cps.begin(), cps.end());
  cps.erase(std::unique(cps.begin(), cps.end()), cps.end());
  Tokenizer t(TokenizerKind::kChar);
  t.chars_ = std::move(cps);
  t.build_index();
  return t;
}

Tokenizer::Tokenizer(TokenizerKind k) : kind_(k) {}

void Tokenizer::build_index() {
  bmp_index_.assign(0x10000, -1);
  astral_index_.clear();
  for (size_t i = 0; i < chars_.size(); ++i) {
    if (chars_[i] < 0x10000) bmp_index_[chars_[i]] = static_cast<int32_t>(i);
    else astral_index_[chars_[i]] = static_cast<int32_t>(i);
  }
}

nlohmann::json Tokenizer::to_json() const {
  nlohmann::json j;
  j["kind"] = tokenizer_kind_name(kind_);
  j["vocab_size"] = vocab_size();
  if (kind_ == TokenizerKind::kChar) {
    j["code_points"] = chars_;  // integers: safe for any byte (surrogate-escaped ones are not valid UTF-8)
  } else if (kind_ == TokenizerKind::kGpt2) {
    j["dir"] = bpe_->path();
    j["fnv1a64"] = io::hex64(bpe_->fingerprint());
  } else if (kind_ == TokenizerKind::kSentencePiece) {
    j["model"] = sp_->path();
    j["fnv1a64"] = io::hex64(sp_->fingerprint());
  } else if (kind_ == TokenizerKind::kLlama3) {
    j["model"] = bpe_->path();
    j["fnv1a64"] = io::hex64(bpe_->fingerprint());
  }
  return j;
}

Tokenizer Tokenizer::from_json(const nlohmann::json& j) {
  try {
    TokenizerKind k = parse_tokenizer_kind(j.at("kind").get<std::string>());
    if (k == TokenizerKind::kByte) return byte_level();
    if (k == TokenizerKind::kGpt2 || k == TokenizerKind::kSentencePiece || k == TokenizerKind::kLlama3) {
      const bool gpt = k == TokenizerKind::kGpt2;
      std::string path = j.at(gpt ? "dir" : "model").get<std::string>();
      const std::string want = j.at("fnv1a64").get<std::string>();
      std::error_code ec;
      if (gpt && !std::filesystem::exists(path, ec) && !Gpt2Bpe::default_dir().empty()) path = Gpt2Bpe::default_dir();
      Tokenizer t = create(k, path);
      std::string have = io::hex64(t.bpe_ ? t.bpe_->fingerprint() : t.sp_->fingerprint());
      if (have != want) {
        TRIDENT_THROW(InvalidArgument,
                      "{} tokenizer: '{}' has checksum {} but the checkpoint or cache was made with {} (checksum {}); "
                      "restore those files",
                      tokenizer_kind_name(k), path, have, j.at(gpt ? "dir" : "model").get<std::string>(), want);
      }
      return t;
    }
    std::vector<uint32_t> cps;
    if (!json_int::to_ints(j.at("code_points"), &cps))
      TRIDENT_THROW(InvalidArgument, "tokenizer: code_points must be a list of integers in [0, 2^32)");
    Tokenizer t = char_level_from_vocab(cps);
    if (t.chars_.size() != cps.size()) TRIDENT_THROW(InvalidArgument, "tokenizer: code_points are not unique");
    if (j.contains("vocab_size")) {
      int vocab = 0;
      if (!json_int::to_int(j["vocab_size"], &vocab) || vocab != t.vocab_size())
        TRIDENT_THROW(InvalidArgument, "tokenizer: vocab_size {} does not match {} code points", j["vocab_size"].dump(),
                      t.vocab_size());
    }
    return t;
  } catch (const nlohmann::json::exception& e) {
    TRIDENT_THROW(InvalidArgument, "malformed tokenizer description: {}", e.what());
  }
}

uint64_t Tokenizer::fingerprint() const {
  uint64_t h = io::fnv1a64(tokenizer_kind_name(kind_));
  if (bpe_ || sp_) {
    const uint64_t files = bpe_ ? bpe_->fingerprint() : sp_->fingerprint();
    return io::fnv1a64(&files, sizeof files, h);
  }
  return io::fnv1a64(chars_.data(), chars_.size() * sizeof(uint32_t), h);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, int threads) const {
  if (bpe_) return bpe_->encode(text, threads);
  if (kind_ == TokenizerKind::kSentencePiece) return sp_->encode(text, threads);
  std::vector<int32_t> out;
  if (kind_ == TokenizerKind::kByte) {
    out.resize(text.size());
    for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<uint8_t>(text[i]);
    return out;
  }
  std::vector<uint32_t> cps = decode_utf8(text);
  out.resize(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    uint32_t cp = cps[i];
    int32_t id = -1;
    if (cp < 0x10000) {
      id = bmp_index_[cp];
    } else {
      auto it = astral_index_.find(cp);
      if (it != astral_index_.end()) id = it->second;
    }
    if (id < 0) {
      std::string ch;
      append_utf8(cp, ch);
      TRIDENT_THROW(InvalidArgument,
                    "character '{}' (U+{:04X}) at position {} is not in the tokenizer's vocabulary of {} characters; "
                    "use only characters of the training corpus, or the byte tokenizer",
                    ch, cp, i, chars_.size());
    }
    out[i] = id;
  }
  return out;
}

std::string Tokenizer::decode(const int32_t* ids, size_t n) const {
  if (bpe_) return bpe_->decode(ids, n);
  if (kind_ == TokenizerKind::kSentencePiece) return sp_->decode(ids, n);
  std::string out;
  out.reserve(n);
  int v = vocab_size();
  for (size_t i = 0; i < n; ++i) {
    int32_t id = ids[i];
    if (id < 0 || id >= v) TRIDENT_THROW(InvalidArgument, "token id {} is outside the vocabulary [0, {})", id, v);
    if (kind_ == TokenizerKind::kByte) out.push_back(static_cast<char>(id));
    else append_utf8(chars_[static_cast<size_t>(id)], out);
  }
  return out;
}

}  // namespace trident::data
