#include "trident/data/byte_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <exception>
#include <thread>

#include "trident/core/error.h"
#include "trident/data/tokenizer.h"

namespace trident::data {

namespace {
// GPT-2's bytes_to_unicode() inverted: code point of a byte's printable stand-in -> byte (-1: none).
const std::vector<int>& unicode_to_bytes() {
  static const std::vector<int> u2b = [] {
    std::vector<int> m(512, -1);
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      m[direct ? static_cast<uint32_t>(b) : 256 + n++] = b;
    }
    return m;
  }();
  return u2b;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
}  // namespace

bool byte_level_to_bytes(std::string_view token, std::string& out) {
  const auto& u2b = unicode_to_bytes();
  for (uint32_t cp : decode_utf8(token)) {
    if (cp >= u2b.size() || u2b[cp] < 0) return false;
    out.push_back(static_cast<char>(u2b[cp]));
  }
  return true;
}

struct ByteBpe::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

ByteBpe::~ByteBpe() = default;

ByteBpe::ByteBpe(ByteBpeVocab vocab) : v_(std::move(vocab)) {
  const int32_t n = vocab_size();
  TRIDENT_CHECK(v_.regular_tokens >= 256 && v_.regular_tokens <= n, InvalidArgument,
                "{} tokenizer: '{}' has {} regular tokens of {}; a byte-level BPE needs at least the 256 bytes",
                v_.name, v_.path, v_.regular_tokens, n);
  by_bytes_.reserve(static_cast<size_t>(n) * 2);
  for (int32_t id = 0; id < n; ++id) by_bytes_.emplace(v_.token_bytes[static_cast<size_t>(id)], id);  // first wins
  for (int b = 0; b < 256; ++b) byte_id_[b] = -1;
  for (int32_t id = 0; id < v_.regular_tokens; ++id) {
    const std::string& t = v_.token_bytes[static_cast<size_t>(id)];
    if (t.size() == 1 && byte_id_[static_cast<unsigned char>(t[0])] < 0)
      byte_id_[static_cast<unsigned char>(t[0])] = id;
  }
  for (int b = 0; b < 256; ++b) {
    if (byte_id_[b] < 0)
      TRIDENT_THROW(InvalidArgument, "{} tokenizer: '{}' has no token for byte {}", v_.name, v_.path, b);
  }
  merges_.reserve(v_.merges.size() * 2);
  for (const auto& m : v_.merges) {
    for (int32_t id : {m.left, m.right, m.merged}) {
      if (id < 0 || id >= v_.regular_tokens) {
        TRIDENT_THROW(InvalidArgument,
                      "{} tokenizer: '{}': merge of rank {} names id {}, not a regular token in [0, {})", v_.name,
                      v_.path, m.rank, id, v_.regular_tokens);
      }
    }
    auto [it, fresh] = merges_.emplace(pair_key(m.left, m.right), std::make_pair(m.rank, m.merged));
    if (!fresh && m.rank < it->second.first) it->second = {m.rank, m.merged};
  }
  v_.merges.clear();
  v_.merges.shrink_to_fit();

  re_ = std::make_unique<Regex>();
  int err = 0;
  PCRE2_SIZE off = 0;
  re_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(v_.pattern.c_str()), PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
  if (re_->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    TRIDENT_THROW(Error, "{} tokenizer: PCRE2 rejects the pattern at {}: {}", v_.name, off,
                  reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(re_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
}

int32_t ByteBpe::find(std::string_view bytes) const {
  auto it = by_bytes_.find(bytes);
  return it == by_bytes_.end() ? -1 : it->second;
}

std::pair<int32_t, int32_t> ByteBpe::merge_of(int32_t left, int32_t right) const {
  auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? std::make_pair(INT32_MAX, -1) : it->second;
}

bool ByteBpe::is_neutral_cut(std::string_view t, size_t p) {
  if (p < 2 || p >= t.size() || t[p - 1] != '\n') return false;
  auto printable = [](char ch) {
    auto c = static_cast<unsigned char>(ch);
    return c > 0x20 && c < 0x7F;
  };
  return printable(t[p]) && printable(t[p - 2]);
}

template <typename F>
void ByteBpe::for_each_piece(std::string_view text, F&& f) const {
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
      TRIDENT_THROW(Error, "{} tokenizer: PCRE2 match failed with code {}", v_.name, rc);
    }
    if (b > pos) f(text.substr(pos, b - pos));  // a run of bytes that are not valid UTF-8
    if (e > b) f(text.substr(b, e - b));
    pos = std::max(e, b + (e == b ? 1 : 0));
    if (rc < 0) break;
  }
  pcre2_match_data_free(md);
}

std::vector<std::string_view> ByteBpe::split(std::string_view text) const {
  std::vector<std::string_view> out;
  for_each_piece(text, [&](std::string_view p) { out.push_back(p); });
  return out;
}

void ByteBpe::bpe_piece(std::string_view piece, std::vector<int32_t>& out, Cache& cache) const {
  if (v_.ignore_merges) {
    int32_t id = find(piece);
    if (id >= 0 && id < v_.regular_tokens) {
      out.push_back(id);
      return;
    }
  }
  auto hit = cache.find(std::string(piece));
  if (hit != cache.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<int32_t> word(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) word[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  std::vector<int32_t> next;
  // Each round finds the lowest rank r (leftmost), then merges left to right every pair of rank r: the
  // same as merging one pair at a time as long as no merge creates a pair of rank <= r beside it (which
  // the one-at-a-time order would take next). When one does, the round stops and a new one scans.
  while (word.size() > 1) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      int32_t r = merge_of(word[i], word[i + 1]).first;
      if (r < best) best = r, at = i;
    }
    if (best == INT32_MAX) break;
    next.assign(word.begin(), word.begin() + static_cast<std::ptrdiff_t>(at));
    bool stop = false;
    for (size_t i = at; i < word.size();) {
      if (!stop && i + 1 < word.size()) {
        auto [r, merged] = merge_of(word[i], word[i + 1]);
        if (r == best) {
          if (!next.empty() && merge_of(next.back(), merged).first <= best) stop = true;
          if (i + 2 < word.size() && merge_of(merged, word[i + 2]).first <= best) stop = true;
          next.push_back(merged);
          i += 2;
          continue;
        }
      }
      next.push_back(word[i++]);
    }
    word.swap(next);
  }
  out.insert(out.end(), word.begin(), word.end());
  if (cache.size() < (1u << 20)) cache.emplace(std::string(piece), std::move(word));
}

void ByteBpe::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  Cache cache;
  for_each_piece(text, [&](std::string_view p) { bpe_piece(p, out, cache); });
}

std::vector<int32_t> ByteBpe::encode(std::string_view text, int threads) const {
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

std::string ByteBpe::decode(const int32_t* ids, size_t n) const {
  std::string out;
  out.reserve(n * 4);
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      TRIDENT_THROW(InvalidArgument, "token id {} is outside the {} vocabulary [0, {})", ids[i], v_.name, vocab_size());
    }
    out += v_.token_bytes[static_cast<size_t>(ids[i])];
  }
  return out;
}

}  // namespace trident::data
